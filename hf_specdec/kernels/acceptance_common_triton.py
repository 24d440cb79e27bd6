"""What the rejection and typical-acceptance kernels share: the ragged layout, argmax and race sweeps,
the output store, and the launch choice (one program per sequence, or its vocabulary split).

Layout (``docs/kernels.md``): sequence ``b`` owns drafts ``cu[b-1]:cu[b]`` and target rows
``cu[b-1]+b : cu[b]+b+1``; the output row holds the accepted drafts, the emitted token at the
accepted count, then ``-1``. Argmaxes are lane-wise running (max, index) pairs reduced once after
the loop; ties go to the smallest token id, as ``torch.argmax``.

Compiled variants: the kernels take the batch size, ``max_spec_len``, the output stride (k + 1)
and the split count as runtime ints (``do_not_specialize``: Triton would otherwise compile apart
values equal to 1 or divisible by 16), and ``_sampler_launch`` picks constexprs from the
vocabulary alone, so every batch bucket and k = 0..7 run one compiled kernel per launch path.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLIT_BLOCK_V = 2048

# Tuning knobs for benchmarks/kernel_bench.py's sweep: {"block_v": int, "num_warps": int, "no_split": bool}.
LAUNCH_OVERRIDE: dict = {}


@triton.jit
def _sequence_rows(cu_num_draft_ptr, b, in_batch):
    """Sequence ``b``'s (first draft index, draft count, first target row), int64."""
    end = tl.load(cu_num_draft_ptr + b, mask=in_batch, other=0).to(tl.int64)
    start = tl.load(cu_num_draft_ptr + b - 1, mask=in_batch & (b > 0), other=0).to(tl.int64)
    return start, end - start, start + b


@triton.jit
def _first_argmax(best_val, best_idx):
    """Finish a lane-wise running argmax ``(BLOCK_B, BLOCK_V)``: the smallest token id holding the row max."""
    row_max = tl.max(best_val, axis=1)
    return tl.min(tl.where(best_val == row_max[:, None], best_idx, 2147483647), axis=1)


@triton.jit
def _rows_exponential_race(p_ptrs, q_ptrs, e_ptrs, live, use_residual, onehot_token, vocab_size,
                           HAS_Q: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """Per live row: argmax of ``max(p - q, 0) / E`` where ``use_residual`` (``p / E`` if that
    residual is all zero), else argmax of ``p / E``. Without ``HAS_Q``, ``q`` is one-hot at
    ``onehot_token``.

    One race serves both cases: ``q`` is only read (and the one-hot only placed) on rows
    that use the residual, elsewhere ``q = 0`` and ``max(p - 0, 0) = p`` exactly. The
    all-zero residual (rounding) is detected from a running max and redone on ``p`` in a
    second sweep that only such rows take."""
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
def _store_outputs(out_rows, num_accepted_ptr, b, in_batch, emitted, num_acc, max_spec_len,
                   BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr):
    """Rows of ``BLOCK_B`` sequences: the emitted token at the accepted count, ``-1`` after it, the count.
    (Accepted drafts are stored by the walk.)"""
    tl.store(out_rows + num_acc, emitted.to(tl.int64), mask=in_batch)
    k = tl.arange(0, BLOCK_K)
    pad = in_batch[:, None] & (k[None, :] > num_acc[:, None]) & (k[None, :] <= max_spec_len)
    tl.store(out_rows[:, None] + k[None, :], tl.full([BLOCK_B, BLOCK_K], -1, tl.int64), mask=pad)
    tl.store(num_accepted_ptr + b, num_acc, mask=in_batch)


@triton.jit
def _store_sequence_outputs(out_row, num_accepted_ptr, b, emitted, num_acc, max_spec_len, BLOCK_K: tl.constexpr):
    """``_store_outputs`` for one sequence (the split kernels' combining program)."""
    tl.store(out_row + num_acc, emitted.to(tl.int64))
    k = tl.arange(0, BLOCK_K)
    tl.store(out_row + k, tl.full([BLOCK_K], -1, tl.int64), mask=(k > num_acc) & (k <= max_spec_len))
    tl.store(num_accepted_ptr + b, num_acc.to(tl.int64))


@triton.jit
def _combined_argmax(part_val_ptr, part_idx_ptr, parts, j, s_ok):
    """Argmax of row ``j`` from the slices' partial (max, first argmax): max, then smallest id
    (slices are ordered, so ties still go to the first token). Loads bypass L1 (``.cg``): other
    programs wrote the partials."""
    vals = tl.load(part_val_ptr + parts + j, mask=s_ok, other=-float("inf"), cache_modifier=".cg")
    idxs = tl.load(part_idx_ptr + parts + j, mask=s_ok, other=2147483647, cache_modifier=".cg")
    return tl.min(tl.where(vals == tl.max(vals, axis=0), idxs, 2147483647), axis=0)


def _num_programs_target(device: torch.device) -> int:
    """Programs worth launching to fill the device: two per SM (a fixed 8 off-GPU)."""
    if device.type != "cuda":
        return 8
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def _launch_config(vocab_size: int, max_block_v: int = 8192) -> tuple[int, int, int]:
    """(BLOCK_B, BLOCK_V, num_warps). Large vocabularies: one sequence per program, chunks of
    ``max_block_v`` with 16 warps (measured best on an H200 at B=256, k=8, V=128k: more bytes
    in flight per program); tiny vocabularies: several whole rows per program."""
    block_v = min(triton.next_power_of_2(max(vocab_size, 16)), LAUNCH_OVERRIDE.get("block_v", max_block_v))
    block_b = max(1, min(64, 1024 // block_v))
    num_warps = LAUNCH_OVERRIDE.get("num_warps", 16 if block_v >= 2048 else 4)
    return block_b, block_v, num_warps


def _vocab_splits(batch: int, vocab_size: int, block_b: int, programs_target: int) -> tuple[int, int]:
    """(programs per sequence, chunks of ``SPLIT_BLOCK_V`` per program) for the split kernels; (1, 0)
    when one program per sequence fills the device (``programs_target``, or several sequences share one)."""
    n_chunks = triton.cdiv(vocab_size, SPLIT_BLOCK_V)
    splits = min(n_chunks, programs_target // batch) if block_b == 1 else 1
    if splits <= 1 or LAUNCH_OVERRIDE.get("no_split", False):
        return 1, 0
    per_slice = triton.cdiv(n_chunks, splits)
    return triton.cdiv(n_chunks, per_slice), per_slice  # no empty slice


# Output columns a program tiles (k + 1, masked by the real k): k = 0..7 share one compiled kernel.
MIN_BLOCK_K = 8


def _sampler_launch(batch: int, vocab_size: int, max_spec_len: int, programs_target: int,
                    max_block_v: int = 8192) -> tuple[int, int, dict]:
    """A sampler's launch from host-side shapes: (splits, slice length, constexpr kwargs with num_warps).
    ``splits > 1``: the split kernel, grid ``(B, splits)``, slices of ``slice length`` tokens; else the
    per-sequence kernel, grid ``cdiv(B, BLOCK_B)``. Each distinct kwargs dict is a JIT compile: they
    depend on the vocabulary (and on k past 7), never on the batch size or split count (runtime ints;
    ``BLOCK_S`` covers the most splits a vocabulary can get: one per chunk)."""
    block_b, block_v, num_warps = _launch_config(vocab_size, max_block_v)
    block_k = max(MIN_BLOCK_K, triton.next_power_of_2(max_spec_len + 1))
    splits, per_slice = _vocab_splits(batch, vocab_size, block_b, programs_target)
    if splits > 1:
        block_s = triton.next_power_of_2(triton.cdiv(vocab_size, SPLIT_BLOCK_V))
        return splits, per_slice * SPLIT_BLOCK_V, dict(BLOCK_V=SPLIT_BLOCK_V, BLOCK_K=block_k, BLOCK_S=block_s,
                                                       num_warps=4)
    return 1, 0, dict(BLOCK_B=block_b, BLOCK_V=block_v, BLOCK_K=block_k, num_warps=num_warps)


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous and 16-byte aligned (copied where it is not). Triton keys a compiled kernel on each pointer's
    alignment: a round's drafts at one row are a view one token into the verify's ids, and a b = 32 call that ended
    on one row compiled the sampler again in its middle (0.67 s on an H200)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _new_outputs(batch: int, max_spec_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The samplers' outputs, uninitialised: every element is written by the kernel."""
    return (torch.empty(batch, max_spec_len + 1, dtype=torch.int64, device=device),
            torch.empty(batch, dtype=torch.int64, device=device))
