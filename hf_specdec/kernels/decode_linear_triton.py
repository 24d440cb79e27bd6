"""Decode-shaped linear layers: ``y = x W^T (+ b)`` for one row of ``x``, where cuBLAS leaves bandwidth unused.

A decode step at b = 1 multiplies one row by each weight: a GEMV, bound by reading ``W`` once. For some
shapes cuBLAS's kernel leaves part of the GPU idle (on an H100 an 8B-shaped o_proj, 4096 x 4096, read at
2.0 TB/s with a split-K reduction after it, against 2.9 TB/s for gate/up). Two kernels, both

    acc[n, j] += W[n, k0 + j] * x[k0 + j]     for k0 = 0, BLOCK_K, ...
    y[n]       = sum_j acc[n, j] + b[n]       (float32 lanes, stored in x's dtype)

over a grid ``(cdiv(N, BLOCK_N),)`` (even a 2048-row weight spreads over every SM):

* ``_gemv_kernel``: each program loads its ``BLOCK_N`` rows into registers, a ``BLOCK_K`` tile at a time along
  the contiguous axis, the next tile in flight while one is summed; ``BLOCK_K >= K`` (``ONE_TILE``) loads the rows
  whole at once, no loop (what the small layers of the pair's draft and a narrow head run fastest). The first tile
  reads no other kernel's output, so under programmatic dependent launch (``pdl.py``) it loads before the wait.
* ``_gemv_tma_kernel``: the tiles come by TMA into shared memory in a K loop Triton software-pipelines
  (``num_stages``: tiles load ahead of the one summed; more bytes in flight a program than registers hold): an 8B
  o_proj in 11.3-11.4 us against cuBLAS's 12.5-12.7 (H200, two runs).

Neither reads the big weights at the copy rate: every one-row matmul (cuBLAS too) pays about 4-5 us a launch of
ramp and tail inside a graph, whatever the kernel (a persistent streaming GEMV and prefetching the weight into L2
first changed nothing: ``benchmarks/gemv_probes.py``, docs/kernels.md).

``N`` and ``K`` are runtime ints; the launch comes from ``gemv_config``, per GPU a table of the shapes where a
kernel beat cuBLAS (``benchmarks/decode_linear.py --sweep``, one launch of 40 in a graph, weights not in L2, PDL
off; us per call):

    weight (N x K)            H200: cuBLAS   GEMV                 H100: cuBLAS   GEMV
    8B o_proj 4096 x 4096           12.69    11.44 (TMA)                 16.30    14.85
    8B q/k/v 6144 x 4096            15.55    (15.35 TMA: cuBLAS)             cuBLAS
    8B gate/up 28672 x 4096         55.93    (54.93 TMA: cuBLAS)             cuBLAS
    8B lm_head 128256 x 4096       237.36    (232.44 TMA: cuBLAS)       368.81   351.12 (11-25)
    1B q/k/v 3072 x 2048             6.55     6.12 (TMA; 6.16 / 6.44)     7.31    (7.48: cuBLAS)
    1B o_proj 2048 x 2048            6.13     4.94                        6.41     5.72
    1B down 2048 x 8192             13.68    13.87 (11-28)               16.15    15.22
    1B lm_head 128256 x 2048       125.82    (158.14: cuBLAS) (11-28)   188.13   178.97 (11-25)
    pair target q/k/v 2560 x 1536    5.63    (5.45: cuBLAS) (11-28)       5.89     5.58
    pair target o_proj 1536 x 1536   6.54     3.95 (11-28)                5.36     4.10
    pair target down 1536 x 4096     8.40     6.88 (11-28)                9.51     7.29
    pair head fc 1536 x 3072         7.86     5.80 (11-28)                8.51     6.12
    pair draft q/k/v 1024 x 512      4.79     2.08                        3.56     2.49
    pair draft o_proj 512 x 512      3.09     1.68                        3.13     2.07
    pair draft gate/up 3072 x 512    4.02     2.90                        4.15     3.45
    pair draft down 512 x 1536       4.99     2.51                        5.09     2.75
    narrow head q/k/v 1536 x 512     3.85     2.30
    narrow head gate/up 2688 x 512   3.88     2.79
    narrow head down 512 x 1344      4.85     2.47
    narrow head fc 512 x 3072        7.22     3.23

(H200 2026-11-29 but where dated; H100 2026-11-27, the output layers 2026-11-25; "pair": the project's
``evals/build_pair.py`` models, whose draft head has the target's layer shapes; "narrow head": its head at hidden
size 512, H200 only.) A table lists a shape where a kernel won by 5% or more, or ran level and was listed before
(one launch where cuBLAS may add a split-K reduction). Elsewhere ``decode_linear_triton`` calls ``F.linear``
(cuBLAS) itself: gate/up (but the pair draft's), an 8B down_proj, 8B q/k/v, the pair target's q/k/v on an H200,
a 32k-token output layer, every output layer on an H200, any shape not measured, other GPUs, several rows,
float32, a weight or bias with a stride along its last dimension, a TMA launch's weight not 16-byte aligned.

A sweep of one's own GPU and model (``benchmarks/decode_linear.py --sweep --pdl off --sweep-pdl off --out FILE``)
is read instead of these tables for the shapes it holds when ``HF_SPECDEC_GEMV_TABLE=FILE``: the GEMV where it beat
cuBLAS by ``SWEEP_WIN``, cuBLAS elsewhere (on any GPU the file was swept on).
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import warnings
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .pdl import pdl_enabled, pdl_launch
from .pdl_triton import wait_for_previous_then_release_next

try:  # Triton 3.4 and later: host-side TMA descriptors
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover  (an older Triton: the TMA launches fall back to cuBLAS)
    TensorDescriptor = None

# Tuning knobs for benchmarks/decode_linear.py's sweep: {"block_n", "block_k", "num_warps", "num_stages"}.
LAUNCH_OVERRIDE: dict = {}


@triton.jit(do_not_specialize=["N", "K"])
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, N, K, stride_wn,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ONE_TILE: tl.constexpr,
                 USE_PDL: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_in = rn < N
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    # The weight is no kernel's output: its first tile loads before the PDL wait, beside the previous kernel.
    w = tl.load(w_ptrs, mask=n_in[:, None] & (rk < K)[None, :], other=0.0, eviction_policy="evict_first")
    wait_for_previous_then_release_next(USE_PDL)
    if ONE_TILE:  # BLOCK_K >= K: the program's rows in one load, every byte of them in flight at once
        x = tl.load(x_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
        y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + k0 + rk, mask=rk < K - k0, other=0.0).to(tl.float32)
            acc += w.to(tl.float32) * x[None, :]
            w_ptrs += BLOCK_K  # the next tile, in flight while this one is summed (none past the last)
            w = tl.load(w_ptrs, mask=n_in[:, None] & (rk < K - k0 - BLOCK_K)[None, :], other=0.0,
                        eviction_policy="evict_first")
        y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rn, mask=n_in, other=0.0).to(tl.float32)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=n_in)


@triton.jit(do_not_specialize=["N", "K"])
def _gemv_tma_kernel(x_ptr, w_desc, bias_ptr, y_ptr, N, K, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """The GEMV with its weight tiles brought by TMA (Hopper's tensor memory accelerator) into shared memory, the
    K loop software-pipelined over ``NUM_STAGES``: more bytes in flight a program than loads into registers hold."""
    n0 = tl.program_id(0) * BLOCK_N
    rk = tl.arange(0, BLOCK_K)
    wait_for_previous_then_release_next(USE_PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        w = w_desc.load([n0, k0])  # rows past N and columns past K read as zeros
        x = tl.load(x_ptr + k0 + rk, mask=rk < K - k0, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
    rn = n0 + tl.arange(0, BLOCK_N)
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)


# Per GPU, (N, K) -> launch for the weights where the GEMV won (benchmarks/decode_linear.py --sweep).
_MEASURED = {
    "H100": {  # swept with PDL off, 2026-11-27
        (4096, 4096): dict(block_n=1, block_k=256, num_warps=4, num_stages=4),  # 8B o_proj
        (2048, 2048): dict(block_n=1, block_k=256, num_warps=4, num_stages=4),  # 1B o_proj
        (2048, 8192): dict(block_n=1, block_k=512, num_warps=8, num_stages=1),  # 1B down_proj
        (2560, 1536): dict(block_n=2, block_k=512, num_warps=4, num_stages=2),  # pair target (a head's layer) q/k/v
        (1536, 1536): dict(block_n=1, block_k=512, num_warps=4, num_stages=1),  # pair target o_proj
        (1536, 4096): dict(block_n=1, block_k=256, num_warps=4, num_stages=1),  # pair target down_proj
        (1536, 3072): dict(block_n=1, block_k=512, num_warps=4, num_stages=2),  # pair head fc
        (1024, 512): dict(block_n=2, block_k=128, num_warps=8, num_stages=1),  # pair draft q/k/v
        (512, 512): dict(block_n=2, block_k=512, num_warps=4, num_stages=1),  # pair draft o_proj
        (3072, 512): dict(block_n=2, block_k=256, num_warps=2, num_stages=4),  # pair draft gate/up
        (512, 1536): dict(block_n=1, block_k=512, num_warps=8, num_stages=2),  # pair draft down_proj
    },
    "H200": {  # swept with PDL off, 2026-11-28; one-tile and TMA launches 2026-11-29
        (4096, 4096): dict(tma=True, block_n=8, block_k=256, num_warps=4, num_stages=4),  # 8B o_proj
        (3072, 2048): dict(tma=True, block_n=8, block_k=256, num_warps=4, num_stages=4),  # 1B q/k/v
        (2048, 8192): dict(block_n=1, block_k=512, num_warps=4, num_stages=1),  # 1B down_proj (level)
        (2048, 2048): dict(block_n=4, block_k=2048, num_warps=4, num_stages=1),  # 1B o_proj
        (1536, 1536): dict(block_n=1, block_k=512, num_warps=4, num_stages=2),  # pair target o_proj
        (1536, 4096): dict(block_n=1, block_k=256, num_warps=4, num_stages=2),  # pair target down_proj
        (1536, 3072): dict(block_n=1, block_k=512, num_warps=4, num_stages=2),  # pair head fc
        (1024, 512): dict(block_n=4, block_k=512, num_warps=8, num_stages=1),  # pair draft q/k/v
        (512, 512): dict(block_n=2, block_k=512, num_warps=8, num_stages=1),  # pair draft o_proj
        (3072, 512): dict(block_n=4, block_k=512, num_warps=8, num_stages=1),  # pair draft gate/up
        (512, 1536): dict(block_n=2, block_k=2048, num_warps=8, num_stages=1),  # pair draft down_proj
        # a narrow head of the pair (hidden 512): q/k/v and up, gate/up, down_proj, fc
        (1536, 512): dict(block_n=4, block_k=512, num_warps=8, num_stages=1),
        (2688, 512): dict(block_n=2, block_k=512, num_warps=4, num_stages=1),
        (512, 1344): dict(block_n=2, block_k=2048, num_warps=8, num_stages=1),
        (512, 3072): dict(block_n=4, block_k=4096, num_warps=8, num_stages=1),
    },
}
# An output layer over a large vocabulary (measured at 128256 tokens), by hidden size; none on an H200.
_OUTPUT_LAYER = {
    "H100": {
        4096: dict(block_n=4, block_k=1024, num_warps=4, num_stages=4),
        2048: dict(block_n=4, block_k=512, num_warps=2, num_stages=2),
    },
    "H200": {},
}


def measured_gpu(device: torch.device) -> Optional[str]:
    """Whose table applies: "H200" for Hopper with HBM3e (H200, GH200), "H100" for other NVIDIA Hopper GPUs."""
    if torch.version.hip is not None or torch.cuda.get_device_capability(device)[0] != 9:
        return None
    return "H200" if "H200" in torch.cuda.get_device_name(device) else "H100"


TABLE_ENV = "HF_SPECDEC_GEMV_TABLE"  # a decode_linear.py --sweep JSON of this GPU, read before the tables above
SWEEP_WIN = 1.05  # how much faster than cuBLAS a swept launch must be to be chosen


@functools.lru_cache(maxsize=None)
def swept_launches(path: str, gpu_name: str, pdl: str) -> dict:
    """(N, K) -> the launch (None: cuBLAS) of every one-row shape the sweep at ``path`` timed on ``gpu_name`` with
    PDL ``pdl`` ("on" / "off"). A file of another GPU gives nothing (with a warning): its timings are not this one's.
    Read once a process per path (a file rewritten meanwhile is not read again)."""
    try:
        with open(path) as fh:
            sweep = json.load(fh)
        launches = {(row["n"], row["k"]): (row["config"] if row["cublas_over_triton"] >= SWEEP_WIN else None)
                    for row in sweep["rows"] if row.get("rows") == 1 and row.get("pdl") == pdl and row.get("config")}
        for config in filter(None, launches.values()):  # a launch's keys, here rather than inside a captured forward
            missing = {"block_n", "block_k", "num_warps", "num_stages"} - set(config)
            if missing:
                raise KeyError(f"a launch without {sorted(missing)}: {config}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{TABLE_ENV}={path!r} is not a benchmarks/decode_linear.py --sweep result "
                         f"({type(exc).__name__}: {exc}). Write one with `python benchmarks/decode_linear.py --sweep "
                         f"--pdl off --sweep-pdl off --out FILE`, or unset {TABLE_ENV}.") from exc
    if sweep.get("gpu") != gpu_name:
        warnings.warn(f"{TABLE_ENV}={path!r} was swept on {sweep.get('gpu')!r}, not this {gpu_name!r}: it is not "
                      "used; the built-in tables are.", RuntimeWarning, stacklevel=3)
        return {}
    return launches


def gemv_config(n: int, k: int, device: torch.device) -> Optional[dict]:
    """The launch for an ``(n, k)`` weight where the kernel beat cuBLAS on this GPU, else None."""
    if LAUNCH_OVERRIDE:
        return dict(LAUNCH_OVERRIDE)
    path = os.environ.get(TABLE_ENV)
    if path:
        swept = swept_launches(path, torch.cuda.get_device_name(device), "on" if pdl_enabled(device) else "off")
        if (n, k) in swept:
            return dict(swept[(n, k)]) if swept[(n, k)] else None
    gpu = measured_gpu(device)
    if gpu is None:
        return None
    if n >= 65536:
        return _OUTPUT_LAYER[gpu].get(k)
    return _MEASURED[gpu].get((n, k))


def decode_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: the GEMV kernel for one half-precision row of a weight in its table."""
    N, K = weight.shape
    rows = x.numel() // K if K else 0
    cfg = None
    if (rows == 1 and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and weight.stride(1) == 1 and (bias is None or bias.stride(0) == 1)):  # strided: cuBLAS reads it as is
        cfg = gemv_config(N, K, x.device)
    if cfg is not None and cfg.get("tma") and not tma_readable(weight):
        cfg = None  # a misaligned view: cuBLAS reads it as is
    if cfg is None:
        return F.linear(x, weight, bias)
    x1 = x.reshape(K)
    if x1.stride(0) != 1:
        x1 = x1.contiguous()
    y = torch.empty(N, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(N, cfg["block_n"]),)
    launch = dict(num_warps=cfg["num_warps"], **pdl_launch(x.device))
    # Triton launches on the current device: a layer on another GPU (a split model) switches to its own.
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        if cfg.get("tma"):
            desc = TensorDescriptor(weight, [N, K], [weight.stride(0), 1], [cfg["block_n"], cfg["block_k"]])
            _gemv_tma_kernel[grid](x1, desc, bias if bias is not None else x1, y, N, K, HAS_BIAS=bias is not None,
                                   BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], NUM_STAGES=cfg["num_stages"],
                                   **launch)
        else:
            _gemv_kernel[grid](x1, weight, bias if bias is not None else weight, y, N, K, weight.stride(0),
                               HAS_BIAS=bias is not None, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"],
                               ONE_TILE=cfg["block_k"] >= K, num_stages=cfg["num_stages"], **launch)
    return y.reshape(*x.shape[:-1], N)


def tma_readable(weight: torch.Tensor) -> bool:
    """Whether a TMA descriptor can address ``weight``: a Triton that has them, a 16-byte aligned base and row
    stride (``K`` a multiple of 8 in half precision)."""
    return (TensorDescriptor is not None and weight.data_ptr() % 16 == 0
            and (weight.stride(0) * weight.element_size()) % 16 == 0)
