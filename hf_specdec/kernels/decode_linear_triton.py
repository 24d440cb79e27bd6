"""Decode-shaped linear layers: ``y = x W^T (+ b)`` for one row of ``x``, where cuBLAS leaves bandwidth unused.

A decode step at b = 1 multiplies one row by each weight: a GEMV, bound by reading ``W`` once. For some
shapes cuBLAS's kernel leaves part of an H100 idle (an 8B-shaped o_proj, 4096 x 4096, read at 2.0 TB/s with a
split-K reduction after it, against 2.9 TB/s for gate/up). ``_gemv_kernel``: every program owns ``BLOCK_N``
rows of ``W`` and walks ``K`` in tiles of ``BLOCK_K`` (the contiguous axis, so loads are wide), each lane
accumulating in float32:

    acc[n, j] += W[n, k0 + j] * x[k0 + j]     for k0 = 0, BLOCK_K, ...
    y[n]       = sum_j acc[n, j] + b[n]       (stored in x's dtype)

A gated MLP's down projection takes two more steps into the same launch (``decode_linear_fused_triton``): the
row is read as ``[gate, up]`` and ``act(gate) * up`` is computed per tile as it is loaded (the activation kernel
before it goes), and the layer's residual is added to ``y`` before the store (the add kernel after it goes). The
activation rounds where the unfused modules round; the residual's sum rounds once (twice after a bias), as cuBLAS's
``addmm`` rounds it where several rows run, so both paths agree (``decode_linear_fused_reference``).

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

from .decode_linear_reference import gated_input

# Tuning knobs for benchmarks/decode_linear.py's sweep: {"block_n", "block_k", "num_warps", "num_stages"}.
LAUNCH_OVERRIDE: dict = {}


@triton.jit
def _gated(g, u, dtype: tl.constexpr, GATE_ACT: tl.constexpr):
    """``act(g) * u`` rounded as the unfused modules round it: the activation, then the product, to ``dtype``."""
    g = g.to(tl.float32)
    if GATE_ACT == 1:  # silu
        a = g / (1.0 + tl.exp(-g))
    else:  # gelu, tanh approximation: 0.5 g (1 + tanh(z)) = g / (1 + exp(-2z)), with no cancellation for g < 0
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = g / (1.0 + tl.exp(-2.0 * z))
    return (a.to(dtype).to(tl.float32) * u.to(tl.float32)).to(dtype).to(tl.float32)


@triton.jit(do_not_specialize=["N", "K"])
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, residual_ptr, y_ptr, N, K, stride_wn,
                 HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, GATE_ACT: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_in = rn < N
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_in = rk < K - k0
        if GATE_ACT == 0:
            x = tl.load(x_ptr + k0 + rk, mask=k_in, other=0.0).to(tl.float32)
        else:  # x is [gate, up], 2K wide
            g = tl.load(x_ptr + k0 + rk, mask=k_in, other=0.0)
            u = tl.load(x_ptr + K + k0 + rk, mask=k_in, other=0.0)
            x = _gated(g, u, x_ptr.dtype.element_ty, GATE_ACT)
        w = tl.load(w_ptrs, mask=n_in[:, None] & k_in[None, :], other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * x[None, :]
        w_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rn, mask=n_in, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:  # the sum rounds once, as cuBLAS's addmm rounds it; after a bias, as linear then add do
        if HAS_BIAS:
            y = y.to(y_ptr.dtype.element_ty).to(tl.float32)
        y += tl.load(residual_ptr + rn, mask=n_in, other=0.0).to(tl.float32)
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
    return decode_linear_fused_triton(x, weight, bias, None, "")


def decode_linear_fused_triton(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                               residual: Optional[torch.Tensor], gate_act: str) -> torch.Tensor:
    """``decode_linear_fused_reference``: one launch for a row of a weight in the table (the gated activation read
    with the row, the residual added to the result), else the reference's steps with the residual in cuBLAS's
    epilogue (``addmm``, half precision, no bias)."""
    N, K = weight.shape
    width = 2 * K if gate_act else K
    rows = x.numel() // width if width else 0
    cfg = None
    if (rows == 1 and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and weight.stride(1) == 1 and (bias is None or bias.stride(0) == 1)  # strided: cuBLAS reads it as is
            and (residual is None or residual.dtype == x.dtype)):
        cfg = gemv_config(N, K, x.device)
    if cfg is None:
        return _unfused(x, weight, bias, residual, gate_act)
    x1 = x.reshape(width)
    if x1.stride(0) != 1:
        x1 = x1.contiguous()
    r1 = residual.reshape(N).contiguous() if residual is not None else None
    y = torch.empty(N, dtype=x.dtype, device=x.device)
    # Triton launches on the current device: a layer on another GPU (a split model) switches to its own.
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _gemv_kernel[(triton.cdiv(N, cfg["block_n"]),)](
            x1, weight, bias if bias is not None else weight, r1 if r1 is not None else y, y, N, K,
            weight.stride(0), HAS_BIAS=bias is not None, HAS_RESIDUAL=r1 is not None,
            GATE_ACT=_GATE_CODES[gate_act], BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"],
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y.reshape(*x.shape[:-1], N)


_GATE_CODES = {"": 0, "silu": 1, "gelu_tanh": 2}


@triton.jit
def _gated_rows_kernel(x_ptr, out_ptr, K, stride_xr, GATE_ACT: tl.constexpr, BLOCK: tl.constexpr):
    """``out[r, k] = act(x[r, k]) * x[r, K + k]``: the gated activation of several rows, one launch."""
    r = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = k < K
    g = tl.load(x_ptr + r * stride_xr + k, mask=ok, other=0.0)
    u = tl.load(x_ptr + r * stride_xr + K + k, mask=ok, other=0.0)
    tl.store(out_ptr + r * K + k, _gated(g, u, out_ptr.dtype.element_ty, GATE_ACT), mask=ok)


def gated_activation(x: torch.Tensor, gate_act: str) -> torch.Tensor:
    """``act(gate) * up`` for ``x = [gate, up]``: one Triton launch for half precision on CUDA (as Inductor fused
    it before the activation moved into the op), torch's own ops elsewhere (float32 exactly as the module)."""
    K = x.shape[-1] // 2
    if not x.is_cuda or x.numel() == 0 or x.dtype not in (torch.bfloat16, torch.float16):
        return gated_input(x, gate_act)
    x2 = x.reshape(-1, 2 * K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], K, dtype=x.dtype, device=x.device)
    with torch.cuda.device(x.device):
        _gated_rows_kernel[(x2.shape[0], triton.cdiv(K, 1024))](x2, out, K, x2.stride(0),
                                                               GATE_ACT=_GATE_CODES[gate_act], BLOCK=1024)
    return out.reshape(*x.shape[:-1], K)


def _unfused(x, weight, bias, residual, gate_act):
    """Several rows, float32 or a shape not in the table: torch's own ops, the residual added by cuBLAS's
    epilogue where it can (``beta * C`` of ``addmm``: one rounding of the sum instead of two, half precision)."""
    if gate_act:
        x = gated_activation(x, gate_act)
    if residual is None:
        return F.linear(x, weight, bias)
    if (bias is None and x.dtype in (torch.bfloat16, torch.float16) and residual.dtype == x.dtype
            and residual.shape == (*x.shape[:-1], weight.shape[0])):
        x2 = x.reshape(-1, x.shape[-1])
        return torch.addmm(residual.reshape(x2.shape[0], -1), x2, weight.t()).reshape(residual.shape)
    return residual + F.linear(x, weight, bias)
