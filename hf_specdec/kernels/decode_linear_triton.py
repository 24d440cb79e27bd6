"""Decode-shaped linear layers: ``y = x W^T (+ b)`` for one row of ``x``, where cuBLAS leaves bandwidth unused.

A decode step at b = 1 multiplies one row by each weight: a GEMV, bound by reading ``W`` once. For some
shapes cuBLAS's kernel leaves part of an H100 idle (an 8B-shaped o_proj, 4096 x 4096, read at 2.0 TB/s with a
split-K reduction after it, against 2.9 TB/s for gate/up). ``_gemv_kernel``: every program owns ``BLOCK_N``
rows of ``W`` and walks ``K`` in tiles of ``BLOCK_K`` (the contiguous axis, so loads are wide), each lane
accumulating in float32:

    acc[n, j] += W[n, k0 + j] * x[k0 + j]     for k0 = 0, BLOCK_K, ...
    y[n]       = sum_j acc[n, j] + b[n]       (stored in x's dtype)

Grid ``(cdiv(N, BLOCK_N),)`` with ``BLOCK_N`` of 2-4: even a 2048-row weight spreads over every SM. ``N`` and
``K`` are runtime ints; the launch configuration comes from ``gemv_config``, a table of the shapes where the
kernel beat cuBLAS on an H100 (``benchmarks/decode_linear.py``; it sweeps through ``LAUNCH_OVERRIDE``):

    weight (N x K)            cuBLAS us   this kernel us   (one launch of 40 in a graph, weights not in L2)
    8B o_proj 4096 x 4096       16.72        14.49
    8B lm_head 128256 x 4096   368.81       351.12
    1B q/k/v 3072 x 2048         7.39         6.92
    1B o_proj 2048 x 2048        6.41         5.62
    1B down 2048 x 8192         16.39        14.84
    1B lm_head 128256 x 2048   188.13       178.97

Elsewhere ``decode_linear_triton`` calls ``F.linear`` (cuBLAS) itself: gate/up, an 8B down_proj and a 32k-token
output layer (0.96-1.01x at the sweep's best configuration, so no gain), 8B q/k/v (1.01x at its best, 0.84x at
the o_proj configuration: inside the model's step 25 us against cuBLAS's 21), any shape not measured, other
GPUs, several rows, float32, a weight or bias with a stride along its last dimension.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# Tuning knobs for benchmarks/decode_linear.py's sweep: {"block_n", "block_k", "num_warps", "num_stages"}.
LAUNCH_OVERRIDE: dict = {}


@triton.jit(do_not_specialize=["N", "K"])
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, N, K, stride_wn,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_in = rn < N
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_in = rk < K - k0
        x = tl.load(x_ptr + k0 + rk, mask=k_in, other=0.0).to(tl.float32)
        w = tl.load(w_ptrs, mask=n_in[:, None] & k_in[None, :], other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * x[None, :]
        w_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rn, mask=n_in, other=0.0).to(tl.float32)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=n_in)


# (N, K) -> launch, for the weights measured on an H100 (benchmarks/decode_linear.py), where the GEMV won.
_MEASURED = {
    (4096, 4096): dict(block_n=4, block_k=512, num_warps=8, num_stages=2),  # 8B o_proj
    (3072, 2048): dict(block_n=2, block_k=512, num_warps=2, num_stages=4),  # 1B q/k/v
    (2048, 2048): dict(block_n=2, block_k=512, num_warps=2, num_stages=4),  # 1B o_proj
    (2048, 8192): dict(block_n=4, block_k=1024, num_warps=4, num_stages=2),  # 1B down_proj
}
# An output layer over a large vocabulary (measured at 128256 tokens), by hidden size.
_OUTPUT_LAYER = {
    4096: dict(block_n=4, block_k=1024, num_warps=4, num_stages=4),
    2048: dict(block_n=4, block_k=512, num_warps=2, num_stages=2),
}


def gemv_config(n: int, k: int, device: torch.device) -> Optional[dict]:
    """The launch for an ``(n, k)`` weight where the kernel beat cuBLAS (measured on Hopper), else None."""
    if LAUNCH_OVERRIDE:
        return dict(LAUNCH_OVERRIDE)
    if torch.cuda.get_device_capability(device)[0] != 9:
        return None
    if n >= 65536:
        return _OUTPUT_LAYER.get(k)
    return _MEASURED.get((n, k))


def decode_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: the GEMV kernel for one half-precision row of a weight in its table."""
    N, K = weight.shape
    rows = x.numel() // K if K else 0
    cfg = None
    if (rows == 1 and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and weight.stride(1) == 1 and (bias is None or bias.stride(0) == 1)):  # strided: cuBLAS reads it as is
        cfg = gemv_config(N, K, x.device)
    if cfg is None:
        return F.linear(x, weight, bias)
    x1 = x.reshape(K)
    if x1.stride(0) != 1:
        x1 = x1.contiguous()
    y = torch.empty(N, dtype=x.dtype, device=x.device)
    # Triton launches on the current device: a layer on another GPU (a split model) switches to its own.
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _gemv_kernel[(triton.cdiv(N, cfg["block_n"]),)](
            x1, weight, bias if bias is not None else weight, y, N, K, weight.stride(0),
            HAS_BIAS=bias is not None, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"],
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y.reshape(*x.shape[:-1], N)
