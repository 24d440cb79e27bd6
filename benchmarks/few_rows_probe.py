"""Whether a layer's fusions pay for a few rows too: a probe for the steps the one-token layers leave to Inductor.

The one-token layers (``runner/one_token_layers.py``) run a layer's norms, SiLU·up and residual adds inside four
GEMVs, but only at one row: a verify of k + 1 tokens at b = 1, the draft's first step (2 tokens), and every step at
b = 8-32 still run the model's layers (RMSNorm with the add before it, cuBLAS, SiLU·up, the last add: about 11
launches a layer). This probe times, for ``--rows`` rows and the 8B / 1B matmuls of a layer, inside one CUDA graph of
``--calls`` launches over weights rotated out of L2:

    unfused   kernels.rms_norm, F.linear (cuBLAS), kernels.silu_mul, a torch add: the launches a layer runs now
    fused     ``_few_rows_kernel``: the weight's tiles by TMA (BLOCK_N rows x BLOCK_K), the rows' tile
              (BLOCK_M >= 16, rows past M masked) normed in the prologue, ``tl.dot(w, x^T)`` on the tensor cores
              (the weight as the wide operand: swap-AB), SiLU·up and the residual add in the epilogue

    registers ``_few_rows_kernel(REGISTERS=True)`` (up to 8 rows): the same fusions with the weight's tiles by TMA but the
              products on the CUDA cores, every row against each weight tile once (``x[:, None, :] * w``, summed
              along K): a one-row GEMV's layout with the rows as a third dimension, no padding to 16 rows,
              reduced every tile
    accumulate ``_accumulate_kernel`` (up to 8 rows): the one-row GEMV's own loop (plain loads, the next tile in
              flight, float32 sums per lane) with the rows as a third dimension, one reduction at the end

and prints the unfused launches and the fastest fused one (its config names its kernel), their ratio and the fused
launch's error against the unfused one (max abs). Nothing here is used by the runner: a ratio well above 1 at the
runner's row counts is the case for few-row layers. On an H200 (2026-11-29, docs/real_sizes.md) only the output
projections' add paid, 1.06-1.29x (and the 1B gate/up at 2 rows), no registers launch was ever the fastest, and
``accumulate`` lost at 5 rows (0.3-0.64x), so the layers do not run these.

    python benchmarks/few_rows_probe.py --rows 2,5,8,16,32 --out $OUT/few_rows.json     # CUDA (Hopper); minutes
    python benchmarks/few_rows_probe.py --rows 2,5 --kernels accumulate \\
        --shapes pair.qkv,pair.o,pair.gate_up,pair.down,8b.qkv,8b.gate_up --out $OUT/few_rows_acc.json
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

from benchmarks.decode_linear_fused import LayerMatmul, unfused  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

SWEEP = {"block_n": (32, 64, 128), "block_k": (64, 128, 256), "num_stages": (3, 4)}
SWEEP_REGISTERS = {"block_n": (4, 8, 16), "block_k": (64, 128, 256), "num_stages": (3, 4)}
SWEEP_ACCUMULATE = {"block_n": (1, 2, 4, 8), "block_k": (64, 128, 256, 512), "num_warps": (2, 4, 8)}


@triton.jit
def _row_scales(x_ptr, rm, m_in, K, eps, NORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Each row's ``1 / sqrt(mean(x^2) + eps)`` with NORM (else ones), in float32."""
    scale = tl.full((BLOCK_M,), 1.0, tl.float32)
    if NORM:
        rk = tl.arange(0, BLOCK_K)
        squares = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + rm[:, None] * K + k0 + rk[None, :], mask=m_in[:, None] & (rk < K - k0)[None, :],
                        other=0.0).to(tl.float32)
            squares += x * x
        scale = 1.0 / tl.sqrt(tl.sum(squares, axis=1) / K + eps)
    return scale


@triton.jit
def _rows_tile(x_ptr, norm_ptr, rm, m_in, rk, k0, K, scale, NORM: tl.constexpr):
    """The rows' columns ``k0 + rk`` in their dtype; with NORM the RMSNorm's output there, rounded as the model's."""
    x = tl.load(x_ptr + rm[:, None] * K + k0 + rk[None, :], mask=m_in[:, None] & (rk < K - k0)[None, :], other=0.0)
    if NORM:
        nw = tl.load(norm_ptr + k0 + rk, mask=rk < K - k0, other=0.0).to(tl.float32)
        x = ((x.to(tl.float32) * scale[:, None]).to(x.dtype).to(tl.float32) * nw[None, :]).to(x.dtype)
    return x


@triton.jit
def _store_rows(acc, acc_up, rm, m_in, n0, res_ptr, y_ptr, N_OUT, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """``acc`` (BLOCK_M, BLOCK_N) float32 sums (``acc_up`` the up rows' with GATED): SiLU·up, the residual add, each
    rounded where the model's operations round; stores outputs ``n0 .. n0 + BLOCK_N`` of every row."""
    dtype = y_ptr.dtype.element_ty
    y = acc.to(dtype).to(tl.float32)
    if GATED:
        y = (y / (1.0 + tl.exp(-y))).to(dtype).to(tl.float32) * acc_up.to(dtype).to(tl.float32)
    rn = n0 + tl.arange(0, BLOCK_N)
    mask = m_in[:, None] & (rn < N_OUT)[None, :]
    if RESIDUAL:
        y = y.to(dtype).to(tl.float32) + tl.load(res_ptr + rm[:, None] * N_OUT + rn[None, :], mask=mask,
                                                 other=0.0).to(tl.float32)
    tl.store(y_ptr + rm[:, None] * N_OUT + rn[None, :], y.to(dtype), mask=mask)


@triton.jit
def _few_rows_kernel(x_ptr, w_desc, norm_ptr, res_ptr, y_ptr, M, N_OUT, K, eps, NORM: tl.constexpr,
                     GATED: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, REGISTERS: tl.constexpr):
    """``tl.dot(w, x^T)`` on the tensor cores, or with REGISTERS every row against the weight tile on the CUDA
    cores (``x[:, None, :] * w`` summed along K)."""
    n0 = tl.program_id(0) * BLOCK_N
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    m_in = rm < M
    scale = _row_scales(x_ptr, rm, m_in, K, eps, NORM, BLOCK_M, BLOCK_K)
    if REGISTERS:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        x = _rows_tile(x_ptr, norm_ptr, rm, m_in, rk, k0, K, scale, NORM)
        if REGISTERS:
            x3 = x.to(tl.float32)[:, None, :]
            acc += tl.sum(x3 * w_desc.load([n0, k0]).to(tl.float32)[None, :, :], axis=2)
            if GATED:
                acc_up += tl.sum(x3 * w_desc.load([N_OUT + n0, k0]).to(tl.float32)[None, :, :], axis=2)
        else:
            xt = tl.trans(x)
            acc = tl.dot(w_desc.load([n0, k0]), xt, acc)
            if GATED:
                acc_up = tl.dot(w_desc.load([N_OUT + n0, k0]), xt, acc_up)
    if not REGISTERS:  # (BLOCK_M, BLOCK_N)
        acc = tl.trans(acc)
        acc_up = tl.trans(acc_up)
    _store_rows(acc, acc_up, rm, m_in, n0, res_ptr, y_ptr, N_OUT, GATED, RESIDUAL, BLOCK_N)


@triton.jit(do_not_specialize=["M", "N_OUT", "K"])
def _accumulate_kernel(x_ptr, w_ptr, norm_ptr, res_ptr, y_ptr, M, N_OUT, K, eps, NORM: tl.constexpr,
                       GATED: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """The one-row GEMV's loop (``kernels/decode_linear_triton._gemv_kernel``) with the rows as a third dimension:
    ``acc[m, n, j] += w[n, k0 + j] * x[m, k0 + j]``, the next weight tile in flight while one is summed, one
    reduction along j at the end (REGISTERS reduces every tile). GATED: the up rows' tiles beside the gate rows'."""
    n0 = tl.program_id(0) * BLOCK_N
    rm = tl.arange(0, BLOCK_M)
    rn = n0 + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_in = rm < M
    n_in = rn < N_OUT
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
    up = N_OUT.to(tl.int64) * K  # the up rows follow the gate rows
    w = tl.load(w_ptrs, mask=n_in[:, None] & (rk < K)[None, :], other=0.0, eviction_policy="evict_first")
    w_up = w
    if GATED:
        w_up = tl.load(w_ptrs + up, mask=n_in[:, None] & (rk < K)[None, :], other=0.0, eviction_policy="evict_first")
    scale = _row_scales(x_ptr, rm, m_in, K, eps, NORM, BLOCK_M, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = _rows_tile(x_ptr, norm_ptr, rm, m_in, rk, k0, K, scale, NORM).to(tl.float32)[:, None, :]
        acc += x * w.to(tl.float32)[None, :, :]
        if GATED:
            acc_up += x * w_up.to(tl.float32)[None, :, :]
        w_ptrs += BLOCK_K  # the next tiles, in flight while these are summed (none past the last)
        next_in = n_in[:, None] & (rk < K - k0 - BLOCK_K)[None, :]
        w = tl.load(w_ptrs, mask=next_in, other=0.0, eviction_policy="evict_first")
        if GATED:
            w_up = tl.load(w_ptrs + up, mask=next_in, other=0.0, eviction_policy="evict_first")
    _store_rows(tl.sum(acc, axis=2), tl.sum(acc_up, axis=2), rm, m_in, n0, res_ptr, y_ptr, N_OUT, GATED, RESIDUAL,
                BLOCK_N)


def few_rows_fused(x, w, norm_weight, eps, gated, residual, cfg):
    """``decode_linear_reference(x, w, None, norm_weight, eps, gated, residual)`` for a few contiguous rows of x."""
    m, k = x.shape
    n_out = w.shape[0] // 2 if gated else w.shape[0]
    y = torch.empty(m, n_out, dtype=x.dtype, device=x.device)
    kernel = cfg.get("kernel", "dot")
    block_m = triton.next_power_of_2(m) if kernel != "dot" else max(16, triton.next_power_of_2(m))
    args = (norm_weight if norm_weight is not None else x, residual if residual is not None else x, y, m, n_out, k,
            float(eps))
    flags = dict(NORM=norm_weight is not None, GATED=gated, RESIDUAL=residual is not None, BLOCK_M=block_m,
                 BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"])
    grid = (triton.cdiv(n_out, cfg["block_n"]),)
    if kernel == "accumulate":
        _accumulate_kernel[grid](x, w, *args, **flags, num_warps=cfg["num_warps"])
        return y
    desc = TensorDescriptor(w, list(w.shape), [w.stride(0), 1], [cfg["block_n"], cfg["block_k"]])
    _few_rows_kernel[grid](x, desc, *args, **flags, NUM_STAGES=cfg["num_stages"], REGISTERS=kernel == "registers",
                           num_warps=4)
    return y


def launches(rows: int, kernels: str, gated: bool):
    """The sweep's launches: ``SWEEP`` for the tensor-core kernel; ``SWEEP_REGISTERS`` (at most 128 products a thread
    in flight) and ``SWEEP_ACCUMULATE`` (at most 64 float32 sums a thread) for the CUDA-core ones, at most 8 rows."""
    out = [dict(zip(SWEEP, values), kernel="dot") for values in itertools.product(*SWEEP.values())] \
        if "dot" in kernels else []
    block_m = triton.next_power_of_2(rows)
    if "registers" in kernels and rows <= 8:
        for values in itertools.product(*SWEEP_REGISTERS.values()):
            cfg = dict(zip(SWEEP_REGISTERS, values), kernel="registers")
            if block_m * cfg["block_n"] * cfg["block_k"] <= 128 * 128:
                out.append(cfg)
    if "accumulate" in kernels and rows <= 8:
        for values in itertools.product(*SWEEP_ACCUMULATE.values()):
            cfg = dict(zip(SWEEP_ACCUMULATE, values), kernel="accumulate")
            if block_m * (2 if gated else 1) * cfg["block_n"] * cfg["block_k"] <= 64 * 32 * cfg["num_warps"]:
                out.append(cfg)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="8b.qkv,8b.o,8b.gate_up,8b.down,1b.qkv,1b.o,1b.gate_up,1b.down")
    parser.add_argument("--rows", default="2,5,8,16,32")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--kernels", default="dot,registers,accumulate",
                        help="dot (tensor cores), registers and accumulate (CUDA cores, <= 8 rows)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    print(result["gpu"], result["torch"])
    for name in args.shapes.split(","):
        for m in map(int, args.rows.split(",")):
            mm = LayerMatmul(name, m)
            nw, res, gated = mm.norm_weight, mm.residual, mm.gated
            base = mm.time_us(lambda a, w: unfused(a, w, nw, res, gated), args.calls)  # F.linear past 1 row
            want = unfused(mm.x, mm.weights[0], nw, res, gated).float()
            run = lambda a, w, cfg: few_rows_fused(a, w, nw, 1e-5, gated, res, cfg)  # noqa: E731
            best = mm.fastest(launches(m, args.kernels, gated), run, args.calls, want)
            mm.record(result, name, base, best, args.out, rows=m)
            del mm
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
