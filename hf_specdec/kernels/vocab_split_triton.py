"""Small batches, large vocabularies: the rejection sampler with each sequence's vocabulary split over programs.

Grid ``(B, S)``. Program ``(b, s)`` sweeps slice ``s`` of the vocabulary (``SPLIT_BLOCK_V``-sized
chunks) of sequence ``b``'s rows and stores a partial ``(max, first argmax)`` (greedy: of every
row ``0..k_b``, which the walk needs in order; random: of the race on row ``r``, after redoing
the cheap accept walk, plus the residual's max) in a small scratch buffer, then takes an
atomic ticket (acquire-release). The last of the ``S`` programs of the sequence to arrive
combines the partials (max, then smallest id: slices are ordered, so ties still go to the
first token), walks, and writes the outputs. The same function as ``_rejection_sample_kernel``
(``rejection_sampler_triton.py``, which launches both); the slice helpers also serve typical
acceptance's split kernel.
"""
import triton
import triton.language as tl

from .acceptance_common_triton import _combined_argmax, _sequence_rows, _store_sequence_outputs


@triton.jit
def _slice_argmax(row_ptr, lo, hi, BLOCK_V: tl.constexpr):
    """(max, first argmax) of ``row[lo:hi]``."""
    best = tl.full([BLOCK_V], -float("inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_V], tl.int32)
    for start in range(lo, hi, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        vals = tl.load(row_ptr + offs, mask=offs < hi, other=-float("inf")).to(tl.float32)
        better = vals > best
        best = tl.where(better, vals, best)
        best_idx = tl.where(better, offs, best_idx)
    top = tl.max(best, axis=0)
    return top, tl.min(tl.where(best == top, best_idx, 2147483647), axis=0)


@triton.jit
def _slice_race(p_row, q_row, e_row, lo, hi, use_residual, onehot_token, HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr):
    """Exponential race of ``max(p - q, 0) / E`` over ``[lo, hi)`` (``q = 0`` unless ``use_residual``):
    (best weight, its first index, max residual)."""
    best = tl.full([BLOCK_V], -1.0, tl.float32)
    best_idx = tl.zeros([BLOCK_V], tl.int32)
    res_max = tl.zeros([BLOCK_V], tl.float32)
    q_hi = tl.where(use_residual, hi, lo)  # q is only read for a rejected run
    onehot = tl.where(use_residual, onehot_token, -1)
    for start in range(lo, hi, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < hi
        p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float32)
        e = tl.load(e_row + offs, mask=m, other=1.0)
        if HAS_Q:
            q = tl.load(q_row + offs, mask=offs < q_hi, other=0.0).to(tl.float32)
        else:
            q = tl.where(offs == onehot, 1.0, 0.0)
        res = tl.maximum(p - q, 0.0)
        res_max = tl.maximum(res_max, res)
        w = tl.where(m, tl.math.div_rn(res, e), -1.0)
        better = w > best
        best = tl.where(better, w, best)
        best_idx = tl.where(better, offs, best_idx)
    top = tl.max(best, axis=0)
    return top, tl.min(tl.where(best == top, best_idx, 2147483647), axis=0), tl.max(res_max, axis=0)


@triton.jit(do_not_specialize=["max_spec_len", "stride_out", "num_splits"])
def _rejection_sample_split_kernel(
    out_ptr, num_accepted_ptr, cu_num_draft_ptr, draft_ids_ptr, draft_probs_ptr, target_probs_ptr,
    is_greedy_ptr, uniform_ptr, exp_ptr,
    part_val_ptr, part_idx_ptr, part_res_ptr, ticket_ptr,  # (B, S, K+1), (B, S, K+1), (B, S), (B,) zeros
    vocab_size, max_spec_len, slice_len,
    stride_out, stride_q, stride_p, stride_e,
    num_splits,  # a runtime int (S), as are max_spec_len and stride_out: one compiled kernel for every B and k
    HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr,  # >= num_splits, lanes past it masked
):
    """Small batches: program (b, s) sweeps vocabulary slice s of sequence b's rows and leaves
    a partial (max, argmax) in scratch; the last of the sequence's programs to arrive (an
    atomic ticket) combines the partials and writes the outputs. Still one launch."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    start, count, target_start = _sequence_rows(cu_num_draft_ptr, b, b >= 0)
    greedy = tl.load(is_greedy_ptr + b) != 0
    lo = s * slice_len
    hi = tl.minimum(lo + slice_len, vocab_size)
    part = (b * num_splits + s).to(tl.int64) * (max_spec_len + 1)

    num_acc = b * 0  # scalar tensors (not literals): they change inside data-dependent branches
    rejected = b < 0
    if greedy:  # partial argmax of every row (the walk needs them in order)
        for j in range(0, count + 1):
            top, idx = _slice_argmax(target_probs_ptr + (target_start + j) * stride_p, lo, hi, BLOCK_V)
            tl.store(part_val_ptr + part + j, top)
            tl.store(part_idx_ptr + part + j, idx)
    else:  # the accept walk is a few scalar loads: every slice redoes it
        still = b >= 0
        for j in range(0, count):
            if still:
                d = tl.load(draft_ids_ptr + start + j).to(tl.int64)
                p_d = tl.load(target_probs_ptr + (target_start + j) * stride_p + d).to(tl.float32)
                if HAS_Q:
                    q_d = tl.load(draft_probs_ptr + (start + j) * stride_q + d).to(tl.float32).to(tl.float64)
                else:
                    q_d = 1.0
                u = tl.load(uniform_ptr + start + j)
                if u * q_d < p_d.to(tl.float64):
                    num_acc += 1
                else:
                    still = b < 0
        rejected = num_acc < count
        r_draft = tl.load(draft_ids_ptr + start + num_acc, mask=rejected, other=-1).to(tl.int64)
        top, idx, res_max = _slice_race(
            target_probs_ptr + (target_start + num_acc) * stride_p, draft_probs_ptr + (start + num_acc) * stride_q,
            exp_ptr + b.to(tl.int64) * stride_e, lo, hi, rejected, r_draft, HAS_Q, BLOCK_V)
        tl.store(part_val_ptr + part, top)
        tl.store(part_idx_ptr + part, idx)
        tl.store(part_res_ptr + b * num_splits + s, res_max)

    ticket = tl.atomic_add(ticket_ptr + b, 1, sem="acq_rel")  # releases the partials above
    if ticket == num_splits - 1:  # last arrival: combine
        out_row = out_ptr + b.to(tl.int64) * stride_out
        sl = tl.arange(0, BLOCK_S)
        s_ok = sl < num_splits
        parts = (b * num_splits + sl).to(tl.int64) * (max_spec_len + 1)
        emitted = b * 0
        if greedy:
            still = b >= 0
            for j in range(0, count + 1):
                if still:
                    am = _combined_argmax(part_val_ptr, part_idx_ptr, parts, j, s_ok)
                    d = tl.load(draft_ids_ptr + start + j, mask=j < count, other=-1)
                    if d == am:
                        tl.store(out_row + j, d.to(tl.int64))
                        num_acc += 1
                    else:
                        emitted = am
                        still = b < 0
        else:
            for i in range(0, num_acc):
                tl.store(out_row + i, tl.load(draft_ids_ptr + start + i).to(tl.int64))
            vals = tl.load(part_val_ptr + parts, mask=s_ok, other=-2.0, cache_modifier=".cg")
            idxs = tl.load(part_idx_ptr + parts, mask=s_ok, other=2147483647, cache_modifier=".cg")
            emitted = tl.min(tl.where(vals == tl.max(vals, axis=0), idxs, 2147483647), axis=0)
            res_max = tl.max(tl.load(part_res_ptr + b * num_splits + sl, mask=s_ok, other=0.0,
                                     cache_modifier=".cg"), axis=0)
            if rejected & (res_max <= 0.0):  # all-zero residual (rounding): draw from p over the whole row
                top, idx, res_max = _slice_race(
                    target_probs_ptr + (target_start + num_acc) * stride_p, draft_probs_ptr,
                    exp_ptr + b.to(tl.int64) * stride_e, 0, vocab_size, b < 0, b * 0 - 1, False, BLOCK_V)
                emitted = idx
        _store_sequence_outputs(out_row, num_accepted_ptr, b, emitted, num_acc, max_spec_len, BLOCK_K)
