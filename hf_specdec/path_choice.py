"""Which execution a call gets: the runner (bucketed, with CUDA graphs and compile where they
run) or the ragged eager path, and why. A request the fast path cannot serve exactly goes
to the eager path and ``spec_metrics.fast_path`` says so: never wrong output."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .cache import model_devices
from .config import SpecConfig
from .tensor_parallel import tp_size
from .runner import graphs_supported
from .runner.bucket_state import MAX_EOS_IDS
from .runner.graph_logits import GraphLogits, graph_safe_logits


@dataclass
class PathChoice:
    bucketed: bool
    graphs: bool
    compile: bool
    logits: Optional[GraphLogits]
    label: str


def choose_path(spec: SpecConfig, device: torch.device, logits_processor, generation_config, streamer,
                eos_ids: list[int], models: tuple = ()) -> PathChoice:
    """``models``: the target (and draft); a model on other GPUs than the inputs runs without graphs."""
    on_cuda = device.type == "cuda"
    if spec.cuda_graphs and not on_cuda:
        raise ValueError(f"SpecConfig(cuda_graphs=True) needs CUDA tensors; the inputs are on {device}. "
                         "Move the models and inputs to a GPU or drop cuda_graphs=True.")
    if spec.compile and not on_cuda:
        raise ValueError(f"SpecConfig(compile=True) compiles for CUDA graphs; the inputs are on {device}. "
                         "Drop compile=True.")
    if spec.bucketed is False:
        return PathChoice(False, False, False, None, "eager: SpecConfig(bucketed=False)")
    if spec.bucketed is None and not on_cuda and spec.num_speculative_tokens:  # k = 0 exists only on the runner
        return PathChoice(False, False, False, None, f"eager: no CUDA device (inputs on {device})")
    logits, reason = graph_safe_logits(logits_processor)
    if reason is None:
        reason = _unsupported(generation_config, streamer, eos_ids)
    if reason is not None:
        if spec.num_speculative_tokens == 0:
            raise ValueError(f"num_speculative_tokens=0 runs on the bucketed runner, which cannot serve this "
                             f"request: {reason}.")
        return PathChoice(False, False, False, None, f"eager: {reason}")
    graphs, why_not = on_cuda and spec.cuda_graphs is not False, None
    if graphs:
        why_not = graphs_supported(spec.generator) or spread_over_devices(models, device)
        if why_not is not None:
            if spec.cuda_graphs or spec.compile:
                raise ValueError(f"SpecConfig(cuda_graphs/compile=True) cannot be honoured: {why_not}.")
            graphs = False
    compile = graphs and spec.compile is not False and (spec.compile or _compile_by_default(models))
    label = "graphs+compile" if compile else "graphs" if graphs else "bucketed"
    if why_not is not None:
        label = f"bucketed: {why_not}"
    return PathChoice(True, graphs, compile, logits, label)


def _unsupported(generation_config, streamer, eos_ids: list[int]) -> Optional[str]:
    if generation_config.output_logits:
        return "output_logits keeps each step's raw logits, which the round's graphs do not keep"
    if streamer is not None:
        return "a streamer needs each token on the host"
    if len(eos_ids) > MAX_EOS_IDS:
        return f"{len(eos_ids)} EOS ids (the fast path handles {MAX_EOS_IDS})"
    return None


def spread_over_devices(models: tuple, device: torch.device) -> Optional[str]:
    """Why a round cannot be one CUDA graph: a graph records one GPU's stream, so every model must compute
    on the inputs' device only (a ``device_map`` split or a draft on another GPU runs without graphs)."""
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        return (f"the inputs are on {device} but the current CUDA device is {torch.cuda.current_device()} (graphs "
                f"capture the current device's stream): call torch.cuda.set_device({device.index}) first")
    for name, model in zip(("target", "draft"), models):
        devices = model_devices(model) if model is not None else {device}
        if devices != {device}:
            where = ", ".join(sorted(str(d) for d in devices))
            return f"CUDA graphs capture one GPU; the {name} runs on {where}, the inputs on {device}"
    return None


def _compile_by_default(models: tuple) -> bool:
    """On, except for tensor-parallel models: torch.compile over DTensor shards is not verified yet
    (SpecConfig(compile=True) still asks for it; docs/parallel.md)."""
    return all(tp_size(m) == 1 for m in models)
