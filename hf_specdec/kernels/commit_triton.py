"""A round's commit in one launch: ``commit_reference`` (same signature and layout) as one Triton program.

The torch version is some forty small kernels (compare with each EOS id, find the first, cut, gather, scatter,
add the counters and the five statistics); inside a round's CUDA graph each costs a launch of a few
microseconds, as much as a decoder layer of a small draft. ``_commit_kernel`` is one program that walks the
bucket's rows in blocks of ``BLOCK_B``, ``(BLOCK_B, BLOCK_K)`` tiles of each row's run:

    limit = min(accepted + 1, max_new - gen);   eos[j] = emitted[j] in eos ids and j < limit
    keep  = first EOS column + 1, else limit (0 for a done row);   hist[pads + length + j] = emitted[j], j < keep
    gen += keep;  length += keep;  done |= live and (an EOS or gen >= max_new)

and sums the statistics over all blocks in registers (one program: no atomics, the same sums every time).
``B``, ``k`` and the number of EOS ids are runtime ints and ``BLOCK_K`` covers k + 1 <= 8 (16 beyond), so every
bucket and k runs one compiled kernel.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch
import triton
import triton.language as tl

from .commit_reference import commit_reference


@triton.jit(do_not_specialize=["B", "k", "E", "stride_e", "stride_h"])
def _commit_kernel(emitted_ptr, accepted_ptr, hist_ptr, pads_ptr, length_ptr, gen_ptr, done_ptr, max_new_ptr,
                   eos_ptr, counts_ptr, keep_ptr, accepted_out_ptr,
                   rows_ptr, drafted_ptr, draft_tokens_ptr, accepted_total_ptr, per_position_ptr,
                   B, k, E, stride_e, stride_h, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr):
    j = tl.arange(0, BLOCK_K)
    max_new = tl.load(max_new_ptr)
    total_rows = tl.zeros([], tl.int64)
    total_drafted = tl.zeros([], tl.int64)
    total_tokens = tl.zeros([], tl.int64)
    total_accepted = tl.zeros([], tl.int64)
    per_position = tl.zeros([BLOCK_K], tl.int64)
    for r0 in range(0, B, BLOCK_B):
        r = r0 + tl.arange(0, BLOCK_B)
        r_ok = r < B
        done = tl.load(done_ptr + r, mask=r_ok, other=1).to(tl.int1)
        live = r_ok & (done == 0)
        acc = tl.load(accepted_ptr + r, mask=r_ok, other=0)
        gen = tl.load(gen_ptr + r, mask=r_ok, other=0)
        length = tl.load(length_ptr + r, mask=r_ok, other=0)
        limit = tl.minimum(acc + 1, max_new - gen)
        col_ok = r_ok[:, None] & (j[None, :] <= k)
        emitted = tl.load(emitted_ptr + r[:, None].to(tl.int64) * stride_e + j[None, :], mask=col_ok, other=-1)
        is_eos = tl.zeros([BLOCK_B, BLOCK_K], tl.int1)
        for e in range(E):
            is_eos = is_eos | (emitted == tl.load(eos_ptr + e))
        is_eos = is_eos & col_ok & (j[None, :] < limit[:, None])
        first = tl.min(tl.where(is_eos, j[None, :], BLOCK_K), axis=1)
        hit = first < BLOCK_K
        keep = tl.where(live, tl.where(hit, first + 1, limit), 0)
        column = tl.load(pads_ptr + r, mask=r_ok, other=0) + length
        tl.store(hist_ptr + r[:, None].to(tl.int64) * stride_h + column[:, None] + j[None, :], emitted,
                 mask=col_ok & (j[None, :] < keep[:, None]))
        tl.store(keep_ptr + r, keep, mask=r_ok)
        tl.store(accepted_out_ptr + r, tl.where(live, acc, 0), mask=r_ok)
        gen += keep
        tl.store(gen_ptr + r, gen, mask=r_ok)
        tl.store(length_ptr + r, length + keep, mask=r_ok)
        tl.store(done_ptr + r, (done | (live & (hit | (gen >= max_new)))).to(done_ptr.dtype.element_ty), mask=r_ok)
        counts = tl.load(counts_ptr + r, mask=r_ok, other=0)
        total_rows += tl.sum(live.to(tl.int64), axis=0)
        total_drafted += tl.sum((live & (counts > 0)).to(tl.int64), axis=0)
        total_tokens += tl.sum(tl.where(live, counts, 0).to(tl.int64), axis=0)
        total_accepted += tl.sum(tl.where(live, acc, 0).to(tl.int64), axis=0)
        per_position += tl.sum(((acc[:, None] > j[None, :]) & live[:, None]).to(tl.int64), axis=0)
    if k > 0:
        tl.store(rows_ptr, tl.load(rows_ptr) + total_rows)
        tl.store(drafted_ptr, tl.load(drafted_ptr) + total_drafted)
        tl.store(draft_tokens_ptr, tl.load(draft_tokens_ptr) + total_tokens)
        tl.store(accepted_total_ptr, tl.load(accepted_total_ptr) + total_accepted)
        p_ok = j < k
        tl.store(per_position_ptr + j, tl.load(per_position_ptr + j, mask=p_ok, other=0) + per_position, mask=p_ok)


def commit_triton(emitted: torch.Tensor, accepted: torch.Tensor, hist: torch.Tensor, pads: torch.Tensor,
                  length: torch.Tensor, gen: torch.Tensor, done: torch.Tensor, max_new: torch.Tensor,
                  eos: torch.Tensor, counts: torch.Tensor, keep_out: torch.Tensor, accepted_out: torch.Tensor,
                  stats: Sequence[torch.Tensor], k: int) -> None:
    """Triton twin of ``commit_reference`` (the reference for layouts it does not read: strided state)."""
    state = (accepted, pads, length, gen, done, eos, counts, keep_out, accepted_out, *stats)
    if (k + 1 > 16 or emitted.stride(1) != 1 or hist.stride(1) != 1 or any(t.stride(-1) != 1 for t in state if t.dim())
            or emitted.dtype != hist.dtype):
        return commit_reference(emitted, accepted, hist, pads, length, gen, done, max_new, eos, counts, keep_out,
                                accepted_out, stats, k)
    B = hist.shape[0]
    with torch.cuda.device(hist.device) if hist.is_cuda else contextlib.nullcontext():
        _commit_kernel[(1,)](emitted, accepted, hist, pads, length, gen, done, max_new, eos, counts, keep_out,
                             accepted_out, *stats, B, k, eos.numel(), emitted.stride(0), hist.stride(0),
                             BLOCK_B=32, BLOCK_K=8 if k + 1 <= 8 else 16, num_warps=4)
