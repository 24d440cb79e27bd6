"""Triton prompt lookup: ``ngram_lookup.ngram_drafts`` as one launch instead of about ten torch operations per n.

Same signature, layout and result as the torch version (its reference): one program per row scans the row's
committed tokens ``[pads, pads + length)`` for the latest earlier occurrence of its last ``n`` tokens, ``n`` from
``max_n`` down to ``min_n``; the first ``n`` with a match wins and the up to ``k`` tokens after it are the drafts.
Starts are scanned in blocks of ``BLOCK`` columns, from the block holding the row's first column to the one holding
its last candidate start; a start matches when all ``n`` of its tokens equal the suffix's (``MAX_N`` unrolled
comparisons, those past ``n`` masked). Drafts past a row's count are filler, as in torch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_STARTS = 1024  # the most start columns a program compares at once (tests lower it to cross blocks)


@triton.jit
def _ngram_drafts_kernel(tokens_ptr, pads_ptr, length_ptr, drafts_ptr, counts_ptr, W, stride_t, k, min_n, max_n,
                         BLOCK: tl.constexpr, MAX_N: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0)
    row = tokens_ptr + b.to(tl.int64) * stride_t
    pad = tl.load(pads_ptr + b).to(tl.int32)
    end = pad + tl.load(length_ptr + b).to(tl.int32)  # column after the last committed token
    best = pad * 0 - 1  # start column of the chosen match (int32 scalar)
    best_n = pad * 0
    for i in range(0, max_n - min_n + 1):
        n = max_n - i
        latest = pad * 0 - 1
        if (best < 0) & (n <= W - 1):
            # only the blocks holding the row's candidate starts, [pad, end - n): a row of a few hundred tokens in
            # a history thousands of columns wide scans its own columns, not the width
            for s0 in range(pad - pad % BLOCK, end - n, BLOCK):
                starts = s0 + tl.arange(0, BLOCK)
                # an earlier occurrence: inside the row, and ending before its last token (something follows it)
                match = (starts >= pad) & (starts + n < end)
                for j in tl.static_range(MAX_N):
                    in_gram = (starts * 0 + j) < n  # a tensor: j is a constant, n may be one too
                    tok = tl.load(row + starts + j, mask=match & in_gram, other=0)
                    suffix = tl.load(row + tl.minimum(tl.maximum(end - n + j, 0), W - 1))
                    match = match & ((tok == suffix) | ~in_gram)
                latest = tl.maximum(latest, tl.max(tl.where(match, starts, -1), axis=0))
        take = (best < 0) & (latest >= 0)
        best = tl.where(take, latest, best)
        best_n = tl.where(take, n, best_n)
    follow = best + best_n  # first column after the match
    count = tl.where(best >= 0, tl.minimum(tl.maximum(end - follow, 0), k), 0)
    j = tl.arange(0, BLOCK_K)
    drafts = tl.load(row + tl.minimum(tl.maximum(follow + j, 0), W - 1), mask=j < k, other=0)
    tl.store(drafts_ptr + b.to(tl.int64) * k + j, drafts, mask=j < k)
    tl.store(counts_ptr + b, count.to(tl.int64))


def ngram_drafts_triton(tokens: torch.Tensor, pads: torch.Tensor, length: torch.Tensor, k: int, min_n: int,
                        max_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts ``(B, k)`` (past a row's count: filler, never used) and draft counts ``(B,)``, int64."""
    B, W = tokens.shape
    drafts = torch.empty(B, k, dtype=tokens.dtype, device=tokens.device)
    counts = torch.empty(B, dtype=torch.int64, device=tokens.device)
    if B == 0 or k == 0:
        return drafts, counts.zero_()
    if tokens.stride(1) != 1:
        tokens = tokens.contiguous()
    _ngram_drafts_kernel[(B,)](
        tokens, pads, length, drafts, counts, W, tokens.stride(0), k, min_n, max_n,
        BLOCK=min(triton.next_power_of_2(max(W, 16)), BLOCK_STARTS), MAX_N=triton.next_power_of_2(max(max_n, 1)),
        BLOCK_K=triton.next_power_of_2(max(k, 1)), num_warps=4)
    return drafts, counts
