"""Triton rejection sampler: greedy and random sequences verified in one launch.

Same signature and bit-for-bit the same function as ``rejection_sample_reference``
(see that file for the layout and the math, summarised here).

Math, for sequence ``b`` with ``k_b`` drafts ``x_1..x_k`` (draft distributions ``q_j``,
target distributions ``p_1..p_{k+1}``):

* random: accept ``x_j`` while ``u_j * q_j(x_j) < p_j(x_j)`` (float64 compare, ``u`` float64);
  at the first rejection ``r`` emit ``argmax_v max(p_r(v) - q_r(v), 0) / E_b(v)``, after
  ``k`` acceptances emit ``argmax_v p_{k+1}(v) / E_b(v)``. With ``E ~ Exp(1)`` the argmax is a
  draw from the normalised weights (exponential race), so no normalisation or
  multinomial is needed. If rounding leaves the residual all zero, ``p_r`` is used.
  ``draft_probs=None`` means ``q`` is one-hot on the draft token (n-gram proposer).
* greedy: accept while ``x_j == argmax p_j``; emit ``argmax`` of the first mismatching
  row (or of the bonus row). Ties go to the lowest token id, as ``torch.argmax``.

Kernel: one program per ``BLOCK_B`` sequences (grid ``(cdiv(B, BLOCK_B),)``), both modes
in the same launch. ``BLOCK_B = 1`` for real vocabularies (one program streams its rows
with all its warps); for tiny vocabularies several sequences share a program, each a
row of a ``(BLOCK_B, BLOCK_V)`` tile. Every step below is vectorised over those rows.

1. Acceptance walk. Random: ``k_b`` scalar gathers ``p_j(x_j)``, ``q_j(x_j)``, ``u_j``;
   greedy: one vocabulary sweep per visited row (``_rows_argmax``) until the first mismatch.
2. One vocabulary sweep over row ``r`` (``_rows_exponential_race``): ``p_r``, ``q_r`` (only read
   when the run was rejected; elsewhere ``q = 0`` makes the residual ``p`` itself, so one
   race serves recovered and bonus tokens) and ``E_b`` in chunks of ``BLOCK_V``, carrying
   lane-wise running max/argmax of ``residual / E`` and the residual's max, reduced
   across lanes once after the loop (the smallest token id among the maxima, as
   ``torch.argmax``). Large vocabularies (128k) are just more chunks. A rejected row
   whose residual rounded to all zeros takes a second sweep on ``p``.
3. Stores: accepted drafts, the emitted token at position ``r``, ``-1`` after it, and
   the accepted count. No host synchronisation; the output is ``torch.empty``.

Small batches with large vocabularies (``B`` below two programs per SM) launch
``_rejection_sample_split_kernel`` instead (``vocab_split_triton.py``): the same function with
each sequence's vocabulary split over programs that combine through an atomic ticket. One
launch plus a ``(B,)`` memset of tickets.

So a random sequence reads at most three vocabulary rows (``p_r``, ``q_r``, ``E_b``) and
a greedy one ``r_b + 1`` rows: the bytes a verify step cannot avoid.
Division uses ``div_rn`` (IEEE round-to-nearest) so that ties and values agree with torch.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .acceptance_common_triton import (  # noqa: F401 (LAUNCH_OVERRIDE, SPLIT_BLOCK_V: kernel_bench, tests)
    LAUNCH_OVERRIDE,
    SPLIT_BLOCK_V,
    aligned,
    _first_argmax,
    _new_outputs,
    _num_programs_target,
    _rows_exponential_race,
    _sampler_launch,
    _sequence_rows,
    _store_outputs,
)
from .vocab_split_triton import _rejection_sample_split_kernel

PLACEHOLDER_TOKEN_ID = -1


@triton.jit
def _rows_argmax(row_ptrs, live, vocab_size, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """argmax over the vocabulary of each live row (``row_ptrs`` (BLOCK_B,)); first index on ties.

    Each lane keeps its own running (max, index) across chunks (strict ``>``: the earlier
    chunk wins a tie) and the lanes are reduced once at the end, so the loop body is
    loads and selects only."""
    best_val = tl.full([BLOCK_B, BLOCK_V], -float("inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_B, BLOCK_V], tl.int32)
    for start in range(0, vocab_size, BLOCK_V):
        offs = (start + tl.arange(0, BLOCK_V))[None, :]
        m = live[:, None] & (offs < vocab_size)
        vals = tl.load(row_ptrs[:, None] + offs, mask=m, other=-float("inf")).to(tl.float32)
        better = vals > best_val
        best_val = tl.where(better, vals, best_val)
        best_idx = tl.where(better, offs, best_idx)
    return _first_argmax(best_val, best_idx)


@triton.jit(do_not_specialize=["batch_size", "max_spec_len", "stride_out"])
def _rejection_sample_kernel(
    out_ptr,  # (B, K+1) int64
    num_accepted_ptr,  # (B,) int64
    cu_num_draft_ptr,  # (B,) inclusive cumsum
    draft_ids_ptr,  # (N,)
    draft_probs_ptr,  # (N, V); target_probs when HAS_Q is False (never read)
    target_probs_ptr,  # (N+B, V)
    is_greedy_ptr,  # (B,) bool
    uniform_ptr,  # (N,) float64
    exp_ptr,  # (B, V) float32
    batch_size,
    vocab_size,
    max_spec_len,
    stride_out, stride_q, stride_p, stride_e,
    HAS_Q: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    in_batch = b < batch_size
    start, count, target_start = _sequence_rows(cu_num_draft_ptr, b, in_batch)
    greedy = tl.load(is_greedy_ptr + b, mask=in_batch, other=0) != 0
    out_rows = out_ptr + b.to(tl.int64) * stride_out

    # 1. Acceptance walk: lane stays `alive` while its drafts are accepted.
    alive = in_batch
    num_acc = tl.zeros([BLOCK_B], tl.int64)
    emitted = tl.zeros([BLOCK_B], tl.int32)
    for j in range(0, max_spec_len + 1):
        live = alive & (j <= count)
        has_draft = live & (j < count)
        d = tl.load(draft_ids_ptr + start + j, mask=has_draft, other=-1).to(tl.int64)
        # random lanes: accept with probability min(1, p(d) / q(d))
        rnd = has_draft & ~greedy
        p_d = tl.load(target_probs_ptr + (target_start + j) * stride_p + d, mask=rnd, other=0.0).to(tl.float32)
        if HAS_Q:
            q_d = tl.load(draft_probs_ptr + (start + j) * stride_q + d, mask=rnd, other=0.0).to(tl.float32)
        else:
            q_d = tl.full([BLOCK_B], 1.0, tl.float32)
        u = tl.load(uniform_ptr + start + j, mask=rnd, other=1.0)
        accept = rnd & (u * q_d.to(tl.float64) < p_d.to(tl.float64))
        # greedy lanes: accept while the draft is the target's argmax
        g_live = live & greedy
        if tl.max(g_live.to(tl.int32), axis=0) > 0:
            am = _rows_argmax(target_probs_ptr + (target_start + j) * stride_p, g_live, vocab_size, BLOCK_B, BLOCK_V)
        else:
            am = tl.full([BLOCK_B], -1, tl.int32)
        g_accept = has_draft & greedy & (d == am.to(tl.int64))
        accept = accept | g_accept
        tl.store(out_rows + j, d, mask=accept)
        num_acc += accept.to(tl.int64)
        emitted = tl.where(g_live & ~g_accept, am, emitted)
        alive = accept

    # 2. Random lanes: recovered token (rejection) or bonus token (all accepted) from row r.
    rnd = in_batch & ~greedy
    if tl.max(rnd.to(tl.int32), axis=0) > 0:
        rejected = num_acc < count
        r_draft = tl.load(draft_ids_ptr + start + num_acc, mask=rnd & rejected, other=-1).to(tl.int64)
        sampled = _rows_exponential_race(
            target_probs_ptr + (target_start + num_acc) * stride_p,
            draft_probs_ptr + (start + num_acc) * stride_q,
            exp_ptr + b.to(tl.int64) * stride_e,
            rnd, rejected, r_draft, vocab_size, HAS_Q, BLOCK_B, BLOCK_V,
        )
        emitted = tl.where(rnd, sampled, emitted)

    # 3. Emitted token at position r, -1 after it, accepted count.
    _store_outputs(out_rows, num_accepted_ptr, b, in_batch, emitted, num_acc, max_spec_len, BLOCK_B, BLOCK_K)


def rejection_sample_triton(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    target_probs: torch.Tensor,
    is_greedy: torch.Tensor,
    max_spec_len: int,
    uniform_samples: torch.Tensor,
    exponential_samples: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of ``rejection_sample_reference`` (same arguments, same outputs)."""
    B = cu_num_draft_tokens.shape[0]
    V = target_probs.shape[-1]
    K = int(max_spec_len)
    device = target_probs.device
    out, num_accepted = _new_outputs(B, K, device)
    if B == 0:
        return out, num_accepted
    target_probs, is_greedy = aligned(target_probs), aligned(is_greedy)
    cu_num_draft_tokens = aligned(cu_num_draft_tokens)
    exponential_samples = aligned(exponential_samples.to(torch.float32))
    uniform_samples = aligned(uniform_samples.to(torch.float64))
    draft_token_ids = aligned(draft_token_ids)
    if draft_token_ids.numel() == 0:  # keep the pointers valid; never read
        draft_token_ids = torch.zeros(1, dtype=torch.int64, device=device)
        uniform_samples = torch.zeros(1, dtype=torch.float64, device=device)
    has_q = draft_probs is not None  # as the reference: None is a one-hot q (also when k = 0: one variant)
    q = aligned(draft_probs) if has_q and draft_probs.numel() > 0 else target_probs  # no drafts: never read
    splits, slice_len, constexprs = _rejection_launch(B, V, K, has_q, _num_programs_target(device))
    if splits > 1:  # small batch, large vocabulary: each sequence's vocabulary over several programs
        part_val = torch.empty(B, splits, K + 1, dtype=torch.float32, device=device)
        part_idx = torch.empty(B, splits, K + 1, dtype=torch.int32, device=device)
        part_res = torch.empty(B, splits, dtype=torch.float32, device=device)
        tickets = torch.zeros(B, dtype=torch.int32, device=device)
        _rejection_sample_split_kernel[(B, splits)](
            out, num_accepted, cu_num_draft_tokens, draft_token_ids, q, target_probs,
            is_greedy, uniform_samples, exponential_samples,
            part_val, part_idx, part_res, tickets,
            V, K, slice_len,
            out.stride(0), q.stride(0), target_probs.stride(0), exponential_samples.stride(0),
            splits, **constexprs,
        )
        return out, num_accepted
    _rejection_sample_kernel[(triton.cdiv(B, constexprs["BLOCK_B"]),)](
        out, num_accepted, cu_num_draft_tokens, draft_token_ids, q, target_probs,
        is_greedy, uniform_samples, exponential_samples,
        B, V, K, out.stride(0), q.stride(0), target_probs.stride(0), exponential_samples.stride(0),
        **constexprs,
    )
    return out, num_accepted


def _rejection_launch(batch: int, vocab_size: int, max_spec_len: int, has_q: bool, programs_target: int):
    """(splits, slice length, constexpr kwargs) of a rejection-sampler launch (``_sampler_launch`` plus ``HAS_Q``)."""
    splits, slice_len, constexprs = _sampler_launch(batch, vocab_size, max_spec_len, programs_target)
    return splits, slice_len, dict(HAS_Q=has_q, **constexprs)
