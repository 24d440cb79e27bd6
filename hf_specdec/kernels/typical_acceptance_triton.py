"""Triton typical acceptance: the twin of ``typical_accept_reference`` (same signature and outputs).

Math (see the reference): accept ``x_j`` while
``p_j(x_j) > min(posterior_threshold, posterior_alpha * exp(-H(p_j)))``; at the first
rejection emit ``argmax p_r``; after ``k`` acceptances emit ``argmax p_{k+1} / E``.

Kernel: one program per ``BLOCK_B`` sequences (``BLOCK_B = 1`` for real vocabularies),
grid ``(cdiv(B, BLOCK_B),)``. The program walks drafts ``j = 0..k_b-1``; each visited row
gets one vocabulary sweep in chunks of ``BLOCK_V`` (``_rows_entropy_argmax``: entropy as
``ln 2 * sum p log2 p`` and argmax, lane-wise, reduced once per row). A sequence stops at
its first rejection; one that accepted everything then takes one exponential-race
sweep over its bonus row and noise row (``_rows_exponential_race``, shared with the rejection
sampler in ``acceptance_common_triton.py``). So it reads ``r_b + 1`` target rows (the last one is the rejected or the bonus row) and
at most one noise row.
Stores: accepted drafts, the emitted token, ``-1`` padding and the accepted counts; no
host synchronisation.

Small batches with large vocabularies take ``_typical_accept_split_kernel`` instead, grid
``(B, S)``: program ``(b, s)`` sweeps vocabulary slice ``s`` of every row of sequence ``b``
(partial ``sum p log2 p`` and argmax of the draft rows, partial race of the bonus row),
then takes an atomic ticket; the last of the ``S`` programs combines the partials and
walks, as in the rejection sampler's split path.

The entropy is a float32 sum in lane-then-tree order (and log2 rather than ln), so it can differ from torch's in the last
bits; a draft whose probability sits within that rounding of its threshold could be
decided differently by kernel and reference (no test input comes close).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .acceptance_common_triton import (
    _combined_argmax,
    _first_argmax,
    _new_outputs,
    _num_programs_target,
    _rows_exponential_race,
    _sampler_launch,
    _sequence_rows,
    _store_outputs,
    _store_sequence_outputs,
    aligned,
)
from .vocab_split_triton import _slice_race


@triton.jit
def _rows_entropy_argmax(p_ptrs, live, vocab_size, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """Per live row: (entropy in nats, argmax p). Lane-wise running sums and argmaxes,
    reduced across lanes after the loop."""
    plogp = tl.zeros([BLOCK_B, BLOCK_V], tl.float32)
    best = tl.full([BLOCK_B, BLOCK_V], -float("inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_B, BLOCK_V], tl.int32)
    for start in range(0, vocab_size, BLOCK_V):
        offs = (start + tl.arange(0, BLOCK_V))[None, :]
        m = live[:, None] & (offs < vocab_size)
        p = tl.load(p_ptrs[:, None] + offs, mask=m, other=0.0).to(tl.float32)
        plogp += tl.where(p > 0.0, p * tl.log2(tl.where(p > 0.0, p, 1.0)), 0.0)
        vals = tl.where(m, p, -float("inf"))
        better = vals > best
        best = tl.where(better, vals, best)
        best_idx = tl.where(better, offs, best_idx)
    return -0.6931471805599453 * tl.sum(plogp, axis=1), _first_argmax(best, best_idx)


@triton.jit(do_not_specialize=["batch_size", "max_spec_len", "stride_out"])
def _typical_accept_kernel(
    out_ptr, num_accepted_ptr, cu_num_draft_ptr, draft_ids_ptr, target_probs_ptr, exp_ptr,
    batch_size, vocab_size, max_spec_len,
    posterior_threshold, posterior_alpha,
    stride_out, stride_p, stride_e,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    posterior_threshold = tl.cast(posterior_threshold, tl.float32)  # typed scalars: never an fp64 compare
    posterior_alpha = tl.cast(posterior_alpha, tl.float32)
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    in_batch = b < batch_size
    start, count, target_start = _sequence_rows(cu_num_draft_ptr, b, in_batch)
    out_rows = out_ptr + b.to(tl.int64) * stride_out

    # 1. Walk the drafts: one entropy + argmax sweep per visited row.
    alive = in_batch
    num_acc = tl.zeros([BLOCK_B], tl.int64)
    emitted = tl.zeros([BLOCK_B], tl.int32)
    for j in range(0, max_spec_len):
        live = alive & (j < count)
        if tl.max(live.to(tl.int32), axis=0) > 0:
            row = target_probs_ptr + (target_start + j) * stride_p
            entropy, am = _rows_entropy_argmax(row, live, vocab_size, BLOCK_B, BLOCK_V)
            d = tl.load(draft_ids_ptr + start + j, mask=live, other=0).to(tl.int64)
            p_d = tl.load(row + d, mask=live, other=0.0).to(tl.float32)
            threshold = tl.minimum(posterior_alpha * tl.exp(-entropy), posterior_threshold)
            accept = live & (p_d > threshold)
            tl.store(out_rows + j, d, mask=accept)
            num_acc += accept.to(tl.int64)
            emitted = tl.where(live & ~accept, am, emitted)  # first rejection: the target's argmax
            alive = alive & (accept | ~live)

    # 2. All drafts accepted: the bonus token, drawn from p_{k+1} by the exponential race.
    bonus = in_batch & (num_acc == count)
    if tl.max(bonus.to(tl.int32), axis=0) > 0:
        sampled = _rows_exponential_race(
            target_probs_ptr + (target_start + count) * stride_p, target_probs_ptr,
            exp_ptr + b.to(tl.int64) * stride_e, bonus, bonus & False, tl.full([BLOCK_B], -1, tl.int64),
            vocab_size, False, BLOCK_B, BLOCK_V)
        emitted = tl.where(bonus, sampled, emitted)

    _store_outputs(out_rows, num_accepted_ptr, b, in_batch, emitted, num_acc, max_spec_len, BLOCK_B, BLOCK_K)


@triton.jit
def _slice_entropy_argmax(row_ptr, lo, hi, BLOCK_V: tl.constexpr):
    """Over ``row[lo:hi]``: (sum p log2 p, max, first argmax)."""
    plogp = tl.zeros([BLOCK_V], tl.float32)
    best = tl.full([BLOCK_V], -float("inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_V], tl.int32)
    for start in range(lo, hi, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < hi
        p = tl.load(row_ptr + offs, mask=m, other=0.0).to(tl.float32)
        plogp += tl.where(p > 0.0, p * tl.log2(tl.where(p > 0.0, p, 1.0)), 0.0)
        vals = tl.where(m, p, -float("inf"))
        better = vals > best
        best = tl.where(better, vals, best)
        best_idx = tl.where(better, offs, best_idx)
    top = tl.max(best, axis=0)
    return tl.sum(plogp, axis=0), top, tl.min(tl.where(best == top, best_idx, 2147483647), axis=0)


@triton.jit(do_not_specialize=["max_spec_len", "stride_out", "num_splits"])
def _typical_accept_split_kernel(
    out_ptr, num_accepted_ptr, cu_num_draft_ptr, draft_ids_ptr, target_probs_ptr, exp_ptr,
    part_val_ptr, part_idx_ptr, part_ent_ptr, ticket_ptr,  # (B, S, K+1) x3, (B,) zeros
    vocab_size, max_spec_len, slice_len, posterior_threshold, posterior_alpha,
    stride_out, stride_p, stride_e,
    num_splits,  # a runtime int (S), as are max_spec_len and stride_out: one compiled kernel for every B and k
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,  # BLOCK_S >= num_splits, masked
):
    """Small batches: program (b, s) sweeps vocabulary slice s of all of sequence b's rows
    (partial entropy and argmax of the draft rows, partial race of the bonus row); the
    last program of the sequence to take the atomic ticket combines them and walks."""
    posterior_threshold = tl.cast(posterior_threshold, tl.float32)
    posterior_alpha = tl.cast(posterior_alpha, tl.float32)
    b = tl.program_id(0)
    s = tl.program_id(1)
    start, count, target_start = _sequence_rows(cu_num_draft_ptr, b, b >= 0)
    lo = s * slice_len
    hi = tl.minimum(lo + slice_len, vocab_size)
    part = (b * num_splits + s).to(tl.int64) * (max_spec_len + 1)
    for j in range(0, count):
        ent, top, idx = _slice_entropy_argmax(target_probs_ptr + (target_start + j) * stride_p, lo, hi, BLOCK_V)
        tl.store(part_ent_ptr + part + j, ent)
        tl.store(part_val_ptr + part + j, top)
        tl.store(part_idx_ptr + part + j, idx)
    top, idx, _ = _slice_race(target_probs_ptr + (target_start + count) * stride_p, target_probs_ptr,
                              exp_ptr + b.to(tl.int64) * stride_e, lo, hi, b < 0, b * 0 - 1, False, BLOCK_V)
    tl.store(part_val_ptr + part + count, top)
    tl.store(part_idx_ptr + part + count, idx)

    ticket = tl.atomic_add(ticket_ptr + b, 1, sem="acq_rel")  # releases the partials above
    if ticket == num_splits - 1:  # last arrival: combine and walk
        out_row = out_ptr + b.to(tl.int64) * stride_out
        sl = tl.arange(0, BLOCK_S)
        s_ok = sl < num_splits
        parts = (b * num_splits + sl).to(tl.int64) * (max_spec_len + 1)
        num_acc = b * 0
        still = b >= 0
        emitted = b * 0
        for j in range(0, count + 1):
            if still:
                am = _combined_argmax(part_val_ptr, part_idx_ptr, parts, j, s_ok)
                if j < count:
                    ent = tl.load(part_ent_ptr + parts + j, mask=s_ok, other=0.0, cache_modifier=".cg")
                    entropy = -0.6931471805599453 * tl.sum(ent, axis=0)
                    d = tl.load(draft_ids_ptr + start + j).to(tl.int64)
                    p_d = tl.load(target_probs_ptr + (target_start + j) * stride_p + d).to(tl.float32)
                    threshold = tl.minimum(posterior_alpha * tl.exp(-entropy), posterior_threshold)
                    if p_d > threshold:
                        tl.store(out_row + j, d)
                        num_acc += 1
                    else:
                        emitted = am  # the target's argmax
                        still = b < 0
                else:
                    emitted = am  # bonus: the race winner
        _store_sequence_outputs(out_row, num_accepted_ptr, b, emitted, num_acc, max_spec_len, BLOCK_K)


def typical_accept_triton(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    max_spec_len: int,
    posterior_threshold: float,
    posterior_alpha: float,
    exponential_samples: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of ``typical_accept_reference`` (same arguments, same outputs)."""
    B = cu_num_draft_tokens.shape[0]
    V = target_probs.shape[-1]
    K = int(max_spec_len)
    device = target_probs.device
    out, num_accepted = _new_outputs(B, K, device)
    if B == 0:
        return out, num_accepted
    target_probs, cu_num_draft_tokens = aligned(target_probs), aligned(cu_num_draft_tokens)
    exponential_samples = aligned(exponential_samples.to(torch.float32))
    draft_token_ids = aligned(draft_token_ids)
    if draft_token_ids.numel() == 0:  # keep the pointer valid; never read
        draft_token_ids = torch.zeros(1, dtype=torch.int64, device=device)
    splits, slice_len, constexprs = _typical_launch(B, V, K, _num_programs_target(device))
    if splits > 1:
        part_val = torch.empty(B, splits, K + 1, dtype=torch.float32, device=device)
        part_idx = torch.empty(B, splits, K + 1, dtype=torch.int32, device=device)
        part_ent = torch.empty(B, splits, K + 1, dtype=torch.float32, device=device)
        tickets = torch.zeros(B, dtype=torch.int32, device=device)
        _typical_accept_split_kernel[(B, splits)](
            out, num_accepted, cu_num_draft_tokens, draft_token_ids, target_probs, exponential_samples,
            part_val, part_idx, part_ent, tickets,
            V, K, slice_len, float(posterior_threshold), float(posterior_alpha),
            out.stride(0), target_probs.stride(0), exponential_samples.stride(0),
            splits, **constexprs,
        )
        return out, num_accepted
    _typical_accept_kernel[(triton.cdiv(B, constexprs["BLOCK_B"]),)](
        out, num_accepted, cu_num_draft_tokens, draft_token_ids, target_probs, exponential_samples,
        B, V, K, float(posterior_threshold), float(posterior_alpha),
        out.stride(0), target_probs.stride(0), exponential_samples.stride(0),
        **constexprs,
    )
    return out, num_accepted


def _typical_launch(batch: int, vocab_size: int, max_spec_len: int, programs_target: int):
    """(splits, slice length, constexpr kwargs) of a typical-acceptance launch: ``_sampler_launch`` with
    chunks of at most 2048 tokens in the per-sequence kernel (a log2 per element)."""
    return _sampler_launch(batch, vocab_size, max_spec_len, programs_target, max_block_v=2048)
