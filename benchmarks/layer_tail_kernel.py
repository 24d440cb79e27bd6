"""A probe (not used by the runner): a decoder layer after its attention at one token in one launch, its three GEMVs
joined by grid-wide barriers; ``benchmarks/layer_tail.py`` times it against the three launches the one-token
layers run (``runner/one_token_layers.py``). docs/real_sizes.md has the result: a grid barrier costs about what a
kernel boundary costs inside a CUDA graph, so the one launch did not pay and the runner does not use it.

    phase 0   h2  = h + attn W_o^T                                  rows of W_o               (H outputs)
    phase 1   act = silu(g) * u,  [g; u] = rms_norm(h2) W_gu^T       rows i and I + i of W_gu  (I outputs)
    phase 2   out = h2 + act W_d^T                                  rows of W_d               (H outputs)

Layout: a persistent grid, a few programs an SM (all resident at once: a program spins at a barrier only while every
other one runs; ``resident_programs`` checks registers and shared memory). Each phase's row blocks go round-robin over
the programs, each a GEMV tile loop along K rounding as ``decode_linear_triton``'s kernels do (its prologue and
epilogue helpers). The rows a phase reads were written by other programs before the barrier and never read by this
one before it, so no stale L1 line can hold them. A program done with phase p asks L2 for the first
``PREFETCH_COLS`` columns of its first row block of phase p + 1 (weights are no phase's output), then waits.
Barrier: ``counter`` holds two int32 (arrivals, exits), zero between launches; a program arriving at its n-th barrier
adds one (release) and polls (acquire) until n x programs have arrived, as CUDA's cooperative grid sync does; the
last program out sets both back to zero. ``FIRST``/``LAST`` run some phases only: the phases as three launches of
the same code, no barrier ("split").
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hf_specdec.kernels.decode_linear_triton import (_input_tile, _rms_scale, _store_outputs, decode_linear_triton,
                                                     tile_rows)

DEFAULT = dict(block_n=(8, 8, 8), block_k=(512, 512, 512), num_stages=(3, 3, 3), num_warps=4, prefetch_cols=512,
               programs_per_sm=1, phases="one")  # phases "split": three launches, no barrier


@triton.jit
def _gemv_phase(x_ptr, w_ptr, norm_ptr, res_ptr, y_ptr, N_OUT, K, stride_wn, eps, NORM: tl.constexpr,
                GATED: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                NUM_STAGES: tl.constexpr):
    """This program's row blocks of one GEMV (no bias): blocks pid, pid + P, ... of ``cdiv(N_OUT, BLOCK_N)``."""
    rk = tl.arange(0, BLOCK_K)
    scale = _rms_scale(x_ptr, K, eps, BLOCK_K) if NORM else 1.0
    for blk in range(tl.program_id(0), tl.cdiv(N_OUT, BLOCK_N), tl.num_programs(0)):
        n0 = blk * BLOCK_N
        n, rows = tile_rows(n0, N_OUT, GATED, BLOCK_N)
        in_range = n < N_OUT
        w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_wn + rk[None, :]
        acc = tl.zeros((rows.shape[0], BLOCK_K), tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            w = tl.load(w_rows + k0, mask=in_range[:, None] & (rk < K - k0)[None, :], other=0.0,
                        eviction_policy="evict_first")
            acc += w.to(tl.float32) * _input_tile(x_ptr, norm_ptr, k0, rk, K, scale, NORM)[None, :]
        _store_outputs(tl.sum(acc, axis=1), rows, in_range, x_ptr, res_ptr, y_ptr, n0, N_OUT, False, GATED,
                       RESIDUAL, BLOCK_N)


@triton.jit
def _prefetch_first_block(w_ptr, N_OUT, K, stride_wn, GATED: tl.constexpr, BLOCK_N: tl.constexpr,
                          COLS: tl.constexpr):
    """Ask L2 for the first ``COLS`` columns of this program's first row block (one request per 128-byte line of
    half-precision weights; nothing waits for them)."""
    n, rows = tile_rows(tl.program_id(0) * BLOCK_N, N_OUT, GATED, BLOCK_N)
    lines = tl.arange(0, COLS // 64) * 64
    ok = (n < N_OUT)[:, None] & (lines < K)[None, :]
    ptrs = w_ptr + tl.where(ok, rows[:, None].to(tl.int64) * stride_wn + lines[None, :], 0)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n mov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _grid_barrier(counter_ptr, expected):
    """Wait until ``expected`` arrivals in all (this program's included) have reached ``counter_ptr``; the stores
    of every arrived program are then visible to this one."""
    tl.debug_barrier()  # every thread of the program has issued its stores
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < expected:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _leave_counter_zero(counter_ptr, P):
    """Count this program out; the last of the ``P`` sets both words back to zero, as the launch found them."""
    gone = tl.atomic_add(counter_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if gone == P - 1:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(counter_ptr + 1, 0, sem="relaxed", scope="gpu")


@triton.jit(do_not_specialize=["H", "K_ATTN", "I"])
def _layer_tail_kernel(attn_ptr, h_ptr, wo_ptr, norm_ptr, wgu_ptr, wd_ptr, h2_ptr, act_ptr, out_ptr, counter_ptr,
                       H, K_ATTN, I, stride_wo, stride_wgu, stride_wd, eps, FIRST: tl.constexpr, LAST: tl.constexpr,
                       BN0: tl.constexpr, BK0: tl.constexpr, S0: tl.constexpr,
                       BN1: tl.constexpr, BK1: tl.constexpr, S1: tl.constexpr,
                       BN2: tl.constexpr, BK2: tl.constexpr, S2: tl.constexpr, PREFETCH_COLS: tl.constexpr):
    P = tl.num_programs(0)
    if FIRST == 0:
        _gemv_phase(attn_ptr, wo_ptr, attn_ptr, h_ptr, h2_ptr, H, K_ATTN, stride_wo, eps, False, False, True,
                    BN0, BK0, S0)
        if LAST >= 1:
            if PREFETCH_COLS > 0:
                _prefetch_first_block(wgu_ptr, I, H, stride_wgu, True, BN1, PREFETCH_COLS)
            _grid_barrier(counter_ptr, P)
    if FIRST <= 1 and LAST >= 1:
        _gemv_phase(h2_ptr, wgu_ptr, norm_ptr, h2_ptr, act_ptr, I, H, stride_wgu, eps, True, True, False,
                    BN1, BK1, S1)
        if LAST >= 2:
            if PREFETCH_COLS > 0:
                _prefetch_first_block(wd_ptr, H, I, stride_wd, False, BN2, PREFETCH_COLS)
            _grid_barrier(counter_ptr, (2 - FIRST) * P)
    if LAST >= 2:
        _gemv_phase(act_ptr, wd_ptr, act_ptr, h2_ptr, out_ptr, H, I, stride_wd, eps, False, False, True,
                    BN2, BK2, S2)
    if LAST > FIRST:
        _leave_counter_zero(counter_ptr, P)


def layer_tail_one(attn, h, wo, nw, eps, wgu, wd, counter, cfg: dict) -> torch.Tensor:
    """The layer tail of one bf16 row (no biases) by the probe kernel: one launch (``cfg["phases"] == "one"``,
    ``counter`` int32 ``(2,)`` zero and used by no concurrent launch) or three (``"split"``), over
    ``cfg["programs_per_sm"]`` programs an SM at most as many as fit at once (``resident_programs``)."""
    H, K_attn = wo.shape
    I = wgu.shape[0] // 2
    h2, act, out = (torch.empty(n, dtype=attn.dtype, device=attn.device) for n in (H, I, H))
    x = attn.reshape(K_attn)
    (bn0, bn1, bn2), (bk0, bk1, bk2), (s0, s1, s2) = cfg["block_n"], cfg["block_k"], cfg["num_stages"]
    args = (x, h.reshape(H), wo, nw, wgu, wd, h2, act, out, counter, H, K_attn, I, wo.stride(0), wgu.stride(0),
            wd.stride(0), float(eps))
    for first, last in ([(0, 2)] if cfg["phases"] == "one" else [(0, 0), (1, 1), (2, 2)]):
        flags = dict(FIRST=first, LAST=last, BN0=bn0, BK0=bk0, S0=s0, BN1=bn1, BK1=bk1, S1=s1, BN2=bn2, BK2=bk2,
                     S2=s2, PREFETCH_COLS=cfg["prefetch_cols"], num_warps=cfg["num_warps"])
        programs = resident_programs(_layer_tail_kernel, args, flags, attn.device, cfg.get("programs_per_sm", 1))
        _layer_tail_kernel[(programs,)](*args, **flags)
    return out.reshape(h.shape)


_RESIDENT: dict = {}


def resident_programs(kernel, args, flags, device, per_sm: int) -> int:
    """``per_sm`` programs an SM, fewer where the compiled kernel's registers or shared memory do not let that many
    run at once (a program spinning at a barrier waits for every other: all must be resident)."""
    key = (kernel, tuple(sorted(flags.items())), per_sm)
    if key not in _RESIDENT:
        compiled = kernel.warmup(*args, grid=(1,), **flags)
        compiled._init_handles()  # loads the binary: its register count
        props = torch.cuda.get_device_properties(device)
        warps = flags["num_warps"]
        regs_a_warp = -(-compiled.n_regs * 32 // 256) * 256
        by_regs = props.regs_per_multiprocessor // (regs_a_warp * warps)
        by_smem = props.shared_memory_per_multiprocessor // (compiled.metadata.shared + 1024)
        by_threads = props.max_threads_per_multi_processor // (32 * warps)
        _RESIDENT[key] = props.multi_processor_count * max(1, min(per_sm, by_regs, by_smem, by_threads, 32))
    return _RESIDENT[key]


def layer_tail_three(attn, h, wo, nw, eps, wgu, wd) -> torch.Tensor:
    """What the one-token layers run: three fused GEMV launches (the table's, ``decode_linear_triton``)."""
    h2 = decode_linear_triton(attn, wo, None, residual=h)
    act = decode_linear_triton(h2, wgu, None, nw, eps, gated=True)
    return decode_linear_triton(act, wd, None, residual=h2)


@triton.jit
def _barriers_kernel(counter_ptr, buf_ptr, ROUNDS: tl.constexpr):
    """``ROUNDS`` grid barriers and nothing else (each program stores a word before each): the cost of a barrier."""
    P = tl.num_programs(0)
    for r in tl.static_range(ROUNDS):
        tl.store(buf_ptr + tl.program_id(0), r)
        _grid_barrier(counter_ptr, (r + 1) * P)
    _leave_counter_zero(counter_ptr, P)


@triton.jit
def _store_kernel(buf_ptr, r):
    """One word a program: the cost of a launch boundary inside a graph."""
    tl.store(buf_ptr + tl.program_id(0), r)
