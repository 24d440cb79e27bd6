"""Programmatic dependent launch (PDL): on Hopper a kernel starts while the kernel before it finishes.

A decode step at b = 1 is a chain of short kernels, each waiting for the previous one to drain before its
own blocks are scheduled. Launched with PDL (``launch_pdl=True``), a kernel's blocks may start as soon as
every block of the previous kernel has called ``gdc_launch_dependents`` (or exited); ``gdc_wait`` then blocks
until the previous kernel has finished and its writes are visible. Work that reads nothing an earlier kernel
wrote (a GEMV's first weight tile) goes before the wait and overlaps the previous kernel's tail.

The rule every kernel here follows, so that chains stay safe: **wait before trigger**. A kernel calls
``gdc_wait`` before it reads anything another kernel wrote, stores anything or calls ``gdc_launch_dependents``
(``pdl_triton.wait_for_previous_then_release_next``, the one place that does both); so a kernel that may start is
one whose predecessors have all finished. Only our kernels launch this way. Inductor's own PDL
(``TORCHINDUCTOR_ENABLE_PDL=1``, off by default) does not follow that rule everywhere (a kernel may load before
its wait, or not wait when the kernel just before it wrote nothing it reads), and in a probe (H100, 4 layers of
an 8B-shaped target) it changed the logits at b = 32, cause not found; switching ours on and off beside it left
them bit-identical at b = 1 and 32. The runner never turns Inductor's on (a user who sets it gets it; the compile
cache keys on it). ``benchmarks/pdl_check.py`` repeats that probe.

Off by default: ``HF_SPECDEC_PDL=1`` turns it on, on compute capability 9.0 and later. It is read at each
launch (under CUDA graphs: at capture), not compiled into Inductor's code, which calls our kernels as opaque ops.
Timed with both ours and Inductor's on (docs/changes.md, "Output layers"): at b = 1 an 8B-shaped target step
went from 4.80 to 4.66 ms and a 1B-shaped draft step from 1.24 to 1.16 ms (H200), but at b = 32 an H100 was
slower (7.60 -> 8.00 ms). Ours alone (H200, one machine, Inductor's autotuning off): b = 1 target 4.76 -> 4.69 ms,
draft 1.29 -> 1.28 ms; b = 32 target 5.71 -> 6.12 ms (the combine's blocks start early and wait beside the
attention); tokens bit-identical. Again with the fused attention, whose b = 32 launch has no combine (2026-11-29):
b = 1 target 4.55 -> 4.52 ms, round k = 4 9.60 -> 9.36; b = 32 target 5.74 -> 5.78, round 13.36 -> 13.27; tokens
bit-identical. The b = 32 loss is gone, the rest within a run's spread. So it stays off.
"""
from __future__ import annotations

import os

import torch

ENV = "HF_SPECDEC_PDL"
_ON = {"1", "true", "yes", "on"}


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with PDL: ``HF_SPECDEC_PDL=1``, an NVIDIA GPU of compute capability 9.0
    or later, compiled kernels (not Triton's interpreter) and a Triton with grid dependency control."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    if os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _ON:
        return False
    if os.environ.get(ENV, "0").strip().lower() not in _ON:
        return False
    try:
        import triton.language as tl
    except ImportError:
        return False
    return hasattr(tl.extra.cuda, "gdc_wait") and torch.cuda.get_device_capability(device)[0] >= 9


def pdl_launch(device: torch.device) -> dict:
    """Launch keywords of a kernel with a ``USE_PDL`` constexpr: PDL on where ``pdl_enabled``, else off."""
    return {"USE_PDL": True, "launch_pdl": True} if pdl_enabled(device) else {"USE_PDL": False}


def inductor_pdl() -> bool:
    """Whether Inductor's own kernels launch with PDL (its ``triton.enable_pdl``, from ``TORCHINDUCTOR_ENABLE_PDL``)."""
    import torch._inductor.config as inductor_config

    return bool(getattr(inductor_config.triton, "enable_pdl", False))
