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

from .vocab_split_triton import _rejection_sample_split_kernel

PLACEHOLDER_TOKEN_ID = -1


@triton.jit
def _first_argmax(best_val, best_idx):
    """Finish a lane-wise running argmax ``(BLOCK_B, BLOCK_V)``: the smallest token id holding the row max."""
    row_max = tl.max(best_val, axis=1)
    return tl.min(tl.where(best_val == row_max[:, None], best_idx, 2147483647), axis=1)


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


@triton.jit
def _rows_exponential_race(p_ptrs, q_ptrs, e_ptrs, live, use_residual, onehot_token, vocab_size,
                           HAS_Q: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """Per live row: argmax of ``max(p - q, 0) / E`` where ``use_residual`` (``p / E`` if that
    residual is all zero), else argmax of ``p / E``. Without ``HAS_Q``, ``q`` is one-hot at
    ``onehot_token``.

    One race serves both cases: ``q`` is only read (and the one-hot only placed) on rows
    that use the residual, elsewhere ``q = 0`` and ``max(p - 0, 0) = p`` exactly. The
    all-zero residual (rounding) is detected from a running max and redone on ``p`` in a
    second sweep that only such rows take. Lane-wise running argmaxes as in ``_rows_argmax``."""
    best = tl.full([BLOCK_B, BLOCK_V], -1.0, tl.float32)
    best_idx = tl.zeros([BLOCK_B, BLOCK_V], tl.int32)
    res_max = tl.zeros([BLOCK_B, BLOCK_V], tl.float32)
    q_live = live & use_residual
    onehot = tl.where(q_live, onehot_token, -1)
    for start in range(0, vocab_size, BLOCK_V):
        offs = (start + tl.arange(0, BLOCK_V))[None, :]
        in_vocab = offs < vocab_size
        m = live[:, None] & in_vocab
        p = tl.load(p_ptrs[:, None] + offs, mask=m, other=0.0).to(tl.float32)
        e = tl.load(e_ptrs[:, None] + offs, mask=m, other=1.0)
        if HAS_Q:
            q = tl.load(q_ptrs[:, None] + offs, mask=q_live[:, None] & in_vocab, other=0.0).to(tl.float32)
        else:
            q = tl.where(offs == onehot[:, None], 1.0, 0.0)
        res = tl.maximum(p - q, 0.0)
        res_max = tl.maximum(res_max, res)
        w = tl.math.div_rn(res, e)  # out-of-vocab lanes give 0 at an index above every real token
        better = w > best
        best = tl.where(better, w, best)
        best_idx = tl.where(better, offs, best_idx)
    token = _first_argmax(best, best_idx)
    redo = q_live & (tl.max(res_max, axis=1) <= 0.0)
    if tl.max(redo.to(tl.int32), axis=0) > 0:  # all-zero residual: draw from p instead
        best = tl.full([BLOCK_B, BLOCK_V], -1.0, tl.float32)
        best_idx = tl.zeros([BLOCK_B, BLOCK_V], tl.int32)
        for start in range(0, vocab_size, BLOCK_V):
            offs = (start + tl.arange(0, BLOCK_V))[None, :]
            m = redo[:, None] & (offs < vocab_size)
            p = tl.load(p_ptrs[:, None] + offs, mask=m, other=0.0).to(tl.float32)
            e = tl.load(e_ptrs[:, None] + offs, mask=m, other=1.0)
            w = tl.math.div_rn(p, e)
            better = w > best
            best = tl.where(better, w, best)
            best_idx = tl.where(better, offs, best_idx)
        token = tl.where(redo, _first_argmax(best, best_idx), token)
    return token


@triton.jit
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
    end = tl.load(cu_num_draft_ptr + b, mask=in_batch, other=0).to(tl.int64)
    start = tl.load(cu_num_draft_ptr + b - 1, mask=in_batch & (b > 0), other=0).to(tl.int64)
    count = end - start
    target_start = start + b  # first target row of each sequence
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
    tl.store(out_rows + num_acc, emitted.to(tl.int64), mask=in_batch)
    k = tl.arange(0, BLOCK_K)
    pad = in_batch[:, None] & (k[None, :] > num_acc[:, None]) & (k[None, :] <= max_spec_len)
    tl.store(out_rows[:, None] + k[None, :], tl.full([BLOCK_B, BLOCK_K], -1, tl.int64), mask=pad)
    tl.store(num_accepted_ptr + b, num_acc, mask=in_batch)


def _num_programs_target(device: torch.device) -> int:
    """Programs worth launching to fill the device: two per SM (a fixed 8 off-GPU)."""
    if device.type != "cuda":
        return 8
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


SPLIT_BLOCK_V = 2048


# Tuning knobs for benchmarks/kernels.py's sweep: {"block_v": int, "num_warps": int}.
LAUNCH_OVERRIDE: dict = {}


def _launch_config(vocab_size: int, max_block_v: int = 8192) -> tuple[int, int, int]:
    """(BLOCK_B, BLOCK_V, num_warps). Large vocabularies: one sequence per program, chunks of
    ``max_block_v`` with 16 warps (measured best on an H200 at B=256, k=8, V=128k: more bytes
    in flight per program); tiny vocabularies: several whole rows per program."""
    block_v = min(triton.next_power_of_2(max(vocab_size, 16)), LAUNCH_OVERRIDE.get("block_v", max_block_v))
    block_b = max(1, min(64, 1024 // block_v))
    num_warps = LAUNCH_OVERRIDE.get("num_warps", 16 if block_v >= 2048 else 4)
    return block_b, block_v, num_warps


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
    out = torch.empty(B, K + 1, dtype=torch.int64, device=device)
    num_accepted = torch.empty(B, dtype=torch.int64, device=device)
    if B == 0:
        return out, num_accepted
    target_probs = target_probs.contiguous()
    exponential_samples = exponential_samples.to(torch.float32).contiguous()
    uniform_samples = uniform_samples.to(torch.float64).contiguous()
    draft_token_ids = draft_token_ids.contiguous()
    if draft_token_ids.numel() == 0:  # keep the pointers valid; never read
        draft_token_ids = torch.zeros(1, dtype=torch.int64, device=device)
        uniform_samples = torch.zeros(1, dtype=torch.float64, device=device)
    has_q = draft_probs is not None and draft_probs.numel() > 0
    q = draft_probs.contiguous() if has_q else target_probs
    block_b, block_v, num_warps = _launch_config(V)
    # Small batch, large vocabulary: split each sequence's vocabulary over several programs.
    n_chunks = triton.cdiv(V, SPLIT_BLOCK_V)
    splits = min(n_chunks, _num_programs_target(device) // B) if block_b == 1 else 1
    if splits > 1 and not LAUNCH_OVERRIDE.get("no_split", False):
        per_slice = triton.cdiv(n_chunks, splits)
        splits = triton.cdiv(n_chunks, per_slice)  # no empty slice
        part_val = torch.empty(B, splits, K + 1, dtype=torch.float32, device=device)
        part_idx = torch.empty(B, splits, K + 1, dtype=torch.int32, device=device)
        part_res = torch.empty(B, splits, dtype=torch.float32, device=device)
        tickets = torch.zeros(B, dtype=torch.int32, device=device)
        _rejection_sample_split_kernel[(B, splits)](
            out, num_accepted, cu_num_draft_tokens.contiguous(), draft_token_ids, q, target_probs,
            is_greedy.contiguous(), uniform_samples, exponential_samples,
            part_val, part_idx, part_res, tickets,
            V, K, per_slice * SPLIT_BLOCK_V,
            out.stride(0), q.stride(0), target_probs.stride(0), exponential_samples.stride(0),
            NUM_SPLITS=splits, HAS_Q=has_q, BLOCK_V=SPLIT_BLOCK_V, BLOCK_K=triton.next_power_of_2(K + 1),
            BLOCK_S=triton.next_power_of_2(splits), num_warps=4,
        )
        return out, num_accepted
    _rejection_sample_kernel[(triton.cdiv(B, block_b),)](
        out, num_accepted, cu_num_draft_tokens.contiguous(), draft_token_ids, q, target_probs,
        is_greedy.contiguous(), uniform_samples, exponential_samples,
        B, V, K, out.stride(0), q.stride(0), target_probs.stride(0), exponential_samples.stride(0),
        HAS_Q=has_q, BLOCK_B=block_b, BLOCK_V=block_v, BLOCK_K=triton.next_power_of_2(K + 1),
        num_warps=num_warps,
    )
    return out, num_accepted
