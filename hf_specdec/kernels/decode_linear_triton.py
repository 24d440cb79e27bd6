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

Since a launch pays that whatever it does, both kernels can also do a layer's pointwise work (constexpr flags):
``NORM`` the model's RMSNorm of the row before the matmul (each program sums the squares itself, from L2),
``GATED`` SiLU·up of a ``[gate; up]`` weight after it (a tile holds the gate and up rows of the same outputs),
``RESIDUAL`` the residual add; each rounds where the model's operations do (``decode_linear_reference``). Any
Hopper GPU runs them as one launch (``_FUSED``: the launches ``benchmarks/decode_linear_fused.py --sweep --wide``
chose on an H200, each faster than the launches it replaces, e.g. the 8B gate/up with its norm and SiLU·up 58.9
against 66.4 us); ``runner/one_token_layers.py`` calls them.

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
import triton
import triton.language as tl

from .decode_linear_reference import decode_linear_reference
from .pdl import pdl_enabled, pdl_launch
from .pdl_triton import wait_for_previous_then_release_next
from .rms_norm_triton import rms_norm_triton
from .silu_mul_triton import silu_mul_triton

try:  # Triton 3.4 and later: host-side TMA descriptors
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover  (an older Triton: the TMA launches fall back to cuBLAS)
    TensorDescriptor = None

# Tuning knobs for benchmarks/decode_linear.py's sweep: {"block_n", "block_k", "num_warps", "num_stages"}.
LAUNCH_OVERRIDE: dict = {}


@triton.jit
def _rms_scale(x_ptr, K, eps, BLOCK_K: tl.constexpr):
    """``1 / sqrt(mean(x^2) + eps)`` over the row, in float32: the model's RMSNorm before the matmul (NORM)."""
    rk = tl.arange(0, BLOCK_K)
    squares = tl.zeros((BLOCK_K,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + k0 + rk, mask=rk < K - k0, other=0.0).to(tl.float32)
        squares += x * x
    return 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)


@triton.jit
def _input_tile(x_ptr, norm_ptr, k0, rk, K, scale, NORM: tl.constexpr):
    """The row's columns ``k0 + rk`` in float32; with NORM, the RMSNorm's output there: scaled, rounded to the row's
    dtype, times the norm's weight, rounded again (``rms_norm_reference``)."""
    x = tl.load(x_ptr + k0 + rk, mask=rk < K - k0, other=0.0)
    if NORM:
        nw = tl.load(norm_ptr + k0 + rk, mask=rk < K - k0, other=0.0).to(tl.float32)
        x = ((x.to(tl.float32) * scale).to(x.dtype).to(tl.float32) * nw).to(x.dtype)
    return x.to(tl.float32)


@triton.jit
def _store_outputs(y, rows, in_range, bias_ptr, res_ptr, y_ptr, n0, N_OUT, HAS_BIAS: tl.constexpr,
                   GATED: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """``y``: the float32 sums of the tile's weight ``rows``. Adds the bias and rounds as the model's own operations
    do between them: ``silu(gate) * up`` with GATED (``silu_mul_reference``), then ``residual +`` with RESIDUAL; stores
    outputs ``n0 .. n0 + BLOCK_N``."""
    dtype = y_ptr.dtype.element_ty
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows, mask=in_range, other=0.0).to(tl.float32)
    if GATED:  # tile rows 2i and 2i + 1: output i's gate and up
        gate, up = tl.split(tl.reshape(y.to(dtype).to(tl.float32), (BLOCK_N, 2)))
        y = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up
    n = n0 + tl.arange(0, BLOCK_N)
    if RESIDUAL:
        y = y.to(dtype).to(tl.float32) + tl.load(res_ptr + n, mask=n < N_OUT, other=0.0).to(tl.float32)
    tl.store(y_ptr + n, y.to(dtype), mask=n < N_OUT)


@triton.jit
def tile_rows(n0, N_OUT, GATED: tl.constexpr, BLOCK_N: tl.constexpr):
    """The outputs ``n`` and weight rows of the row block at ``n0``: GATED, 2 BLOCK_N rows, gate row n and up row
    N_OUT + n side by side for each output n."""
    if GATED:
        i = tl.arange(0, 2 * BLOCK_N)
        n = n0 + i // 2
        rows = n + (i % 2) * N_OUT
    else:
        n = n0 + tl.arange(0, BLOCK_N)
        rows = n
    return n, rows


@triton.jit(do_not_specialize=["N_OUT", "K"])
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, norm_ptr, res_ptr, y_ptr, N_OUT, K, stride_wn, eps,
                 HAS_BIAS: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ONE_TILE: tl.constexpr, USE_PDL: tl.constexpr):
    n0 = tl.program_id(0) * BLOCK_N
    n, rows = tile_rows(n0, N_OUT, GATED, BLOCK_N)
    in_range = n < N_OUT
    rk = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wn + rk[None, :]
    # The weight is no kernel's output: its first tile loads before the PDL wait, beside the previous kernel.
    w = tl.load(w_ptrs, mask=in_range[:, None] & (rk < K)[None, :], other=0.0, eviction_policy="evict_first")
    wait_for_previous_then_release_next(USE_PDL)
    scale = _rms_scale(x_ptr, K, eps, BLOCK_K) if NORM else 1.0
    if ONE_TILE:  # BLOCK_K >= K: the program's rows in one load, every byte of them in flight at once
        y = tl.sum(w.to(tl.float32) * _input_tile(x_ptr, norm_ptr, 0, rk, K, scale, NORM)[None, :], axis=1)
    else:
        acc = tl.zeros((w.shape[0], BLOCK_K), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            acc += w.to(tl.float32) * _input_tile(x_ptr, norm_ptr, k0, rk, K, scale, NORM)[None, :]
            w_ptrs += BLOCK_K  # the next tile, in flight while this one is summed (none past the last)
            w = tl.load(w_ptrs, mask=in_range[:, None] & (rk < K - k0 - BLOCK_K)[None, :], other=0.0,
                        eviction_policy="evict_first")
        y = tl.sum(acc, axis=1)
    _store_outputs(y, rows, in_range, bias_ptr, res_ptr, y_ptr, n0, N_OUT, HAS_BIAS, GATED, RESIDUAL, BLOCK_N)


@triton.jit(do_not_specialize=["N_OUT", "K"])
def _gemv_tma_kernel(x_ptr, w_desc, bias_ptr, norm_ptr, res_ptr, y_ptr, N_OUT, K, eps, HAS_BIAS: tl.constexpr,
                     NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """The GEMV with its weight tiles brought by TMA (Hopper's tensor memory accelerator) into shared memory, the
    K loop software-pipelined over ``NUM_STAGES``: more bytes in flight a program than loads into registers hold.
    GATED: the descriptor is the weight as ``(2, N_OUT, K)``, a tile its gate and up rows of the same outputs."""
    n0 = tl.program_id(0) * BLOCK_N
    rk = tl.arange(0, BLOCK_K)
    wait_for_previous_then_release_next(USE_PDL)
    scale = _rms_scale(x_ptr, K, eps, BLOCK_K) if NORM else 1.0
    if GATED:
        acc2 = tl.zeros((2, BLOCK_N, BLOCK_K), tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            x = _input_tile(x_ptr, norm_ptr, k0, rk, K, scale, NORM)
            acc2 += w_desc.load([0, n0, k0]).to(tl.float32) * x[None, None, :]  # past N_OUT and K: zeros
        y = tl.reshape(tl.permute(tl.sum(acc2, axis=2), (1, 0)), (2 * BLOCK_N,))  # gate and up side by side
        i = tl.arange(0, 2 * BLOCK_N)
        n = n0 + i // 2
        rows = n + (i % 2) * N_OUT
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            acc += w_desc.load([n0, k0]).to(tl.float32) * _input_tile(x_ptr, norm_ptr, k0, rk, K, scale, NORM)[None, :]
        y = tl.sum(acc, axis=1)
        n = n0 + tl.arange(0, BLOCK_N)
        rows = n
    _store_outputs(y, rows, n < N_OUT, bias_ptr, res_ptr, y_ptr, n0, N_OUT, HAS_BIAS, GATED, RESIDUAL, BLOCK_N)


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
# Launches with a norm, SiLU·up or a residual add fused in, by weight (N x K); None would run the operations one by
# one (benchmarks/decode_linear_fused.py --sweep [--wide], H200 2026-11-29: us a call, fused / what it replaces).
_FUSED = {
    "H100": {},
    "H200": {
        (6144, 4096): dict(tma=True, block_n=16, block_k=512, num_warps=4, num_stages=3),  # 8B q/k/v 16.05 / 19.40
        (4096, 4096): dict(tma=True, block_n=8, block_k=256, num_warps=4, num_stages=4),  # 8B o_proj 11.51 / 12.63
        (28672, 4096): dict(tma=True, block_n=16, block_k=128, num_warps=4, num_stages=3),  # 8B gate/up 58.9 / 66.4
        (4096, 14336): dict(tma=True, block_n=4, block_k=512, num_warps=4, num_stages=3),  # 8B down 30.73 / 34.28
        (3072, 2048): dict(tma=True, block_n=8, block_k=512, num_warps=4, num_stages=3),  # 1B q/k/v 6.75 / 7.98
        (2048, 2048): dict(block_n=8, block_k=2048, num_warps=4, num_stages=1),  # 1B o_proj 5.14 / 6.28
        (16384, 2048): dict(tma=True, block_n=32, block_k=256, num_warps=4, num_stages=3),  # 1B gate/up 19.3 / 22.3
        (2048, 8192): dict(block_n=4, block_k=1024, num_warps=4, num_stages=1),  # 1B down_proj 14.08 / 15.17
    },
}
_FUSED_DEFAULT = dict(tma=True, block_n=16, block_k=256, num_warps=4, num_stages=4)  # a shape in neither table
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


def gemv_config(n: int, k: int, device: torch.device, fused: bool = False) -> Optional[dict]:
    """The launch for an ``(n, k)`` weight where the kernel beat cuBLAS on this GPU, else None. ``fused``: a launch
    with a norm, SiLU·up or a residual add in it (``_FUSED``), which any Hopper GPU runs (the unfused launches it
    saves are worth more than the few percent cuBLAS wins by on some shapes)."""
    if LAUNCH_OVERRIDE:
        return dict(LAUNCH_OVERRIDE)
    path = os.environ.get(TABLE_ENV)
    if path and not fused:
        swept = swept_launches(path, torch.cuda.get_device_name(device), "on" if pdl_enabled(device) else "off")
        if (n, k) in swept:
            return dict(swept[(n, k)]) if swept[(n, k)] else None
    gpu = measured_gpu(device)
    if gpu is None:
        return None
    if fused:  # a shape not swept fused: the plain GEMV's launch where one was swept (the small layers' one-tile
        table = _FUSED[gpu]  # launches), else the default
        launch = table[(n, k)] if (n, k) in table else _MEASURED[gpu].get((n, k), _FUSED_DEFAULT)
        return dict(launch) if launch is not None else None
    if n >= 65536:
        return _OUTPUT_LAYER[gpu].get(k)
    return _MEASURED[gpu].get((n, k))


def decode_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                         norm_weight: Optional[torch.Tensor] = None, eps: float = 0.0, gated: bool = False,
                         residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``decode_linear_reference``: one launch of a GEMV kernel for one half-precision row, with what is fused into
    it, where the tables hold a launch; else the same operations one by one (cuBLAS for the matmul)."""
    N, K = weight.shape
    n_out = N // 2 if gated else N
    fused = norm_weight is not None or gated or residual is not None
    cfg = None
    if _one_half_row(x, weight, bias, K) and _fusable(x, norm_weight, residual, gated, N, K, n_out):
        cfg = gemv_config(N, K, x.device, fused)
    if cfg is not None and cfg.get("tma") and not tma_readable(weight):
        cfg = None  # a misaligned view: cuBLAS reads it as is
    if cfg is None:
        return _unfused(x, weight, bias, norm_weight, eps, gated, residual)
    x1 = x.reshape(K)
    if x1.stride(0) != 1:
        x1 = x1.contiguous()
    y = torch.empty(n_out, dtype=x.dtype, device=x.device)
    extra = (bias if bias is not None else x1, norm_weight if norm_weight is not None else x1,
             residual.reshape(n_out) if residual is not None else x1, y, n_out, K)
    flags = dict(HAS_BIAS=bias is not None, NORM=norm_weight is not None, GATED=gated, RESIDUAL=residual is not None,
                 BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], num_warps=cfg["num_warps"], **pdl_launch(x.device))
    grid = (triton.cdiv(n_out, cfg["block_n"]),)
    # Triton launches on the current device: a layer on another GPU (a split model) switches to its own.
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        if cfg.get("tma"):
            shape, strides = ([2, n_out, K], [n_out * weight.stride(0), weight.stride(0), 1]) if gated else \
                ([N, K], [weight.stride(0), 1])
            desc = TensorDescriptor(weight, shape, strides, [2] * gated + [cfg["block_n"], cfg["block_k"]])
            _gemv_tma_kernel[grid](x1, desc, *extra, float(eps), NUM_STAGES=cfg["num_stages"], **flags)
        else:
            _gemv_kernel[grid](x1, weight, *extra, weight.stride(0), float(eps), ONE_TILE=cfg["block_k"] >= K,
                               num_stages=cfg["num_stages"], **flags)
    return y.reshape(*x.shape[:-1], n_out)


def _one_half_row(x, weight, bias, K) -> bool:
    """One row of a half-precision ``x`` and a weight (and bias) of its dtype without a stride along its last
    dimension (a strided one cuBLAS reads as is)."""
    return ((x.numel() // K if K else 0) == 1 and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and weight.stride(1) == 1 and (bias is None or bias.stride(0) == 1))


def _fusable(x, norm_weight, residual, gated, N, K, n_out) -> bool:
    """What is fused has the row's dtype and size, unstrided; a gated weight an even number of rows."""
    return ((norm_weight is None or (norm_weight.dtype == x.dtype and norm_weight.shape == (K,)
                                     and norm_weight.stride(0) == 1))
            and (residual is None or (residual.dtype == x.dtype and residual.numel() == n_out
                                      and residual.is_contiguous()))
            and (not gated or N % 2 == 0))


def _unfused(x, weight, bias, norm_weight, eps, gated, residual) -> torch.Tensor:
    """The fused launch's operations one by one: the norm and SiLU·up in their own kernels, the matmul in cuBLAS."""
    return decode_linear_reference(x, weight, bias, norm_weight, eps, gated, residual, rms_norm=rms_norm_triton,
                                   silu_mul=silu_mul_triton)


def tma_readable(weight: torch.Tensor) -> bool:
    """Whether a TMA descriptor can address ``weight``: a Triton that has them, a 16-byte aligned base and row
    stride (``K`` a multiple of 8 in half precision)."""
    return (TensorDescriptor is not None and weight.data_ptr() % 16 == 0
            and (weight.stride(0) * weight.element_size()) % 16 == 0)
