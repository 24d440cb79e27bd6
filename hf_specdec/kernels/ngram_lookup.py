"""Prompt lookup (n-gram) drafts for a whole batch at once, as fixed-shape tensor code.

For every row, the last ``n`` committed tokens are searched for in the row's own earlier
tokens (prompt and output), ``n`` from ``max_n`` down to ``min_n``; the most recent earlier
occurrence of the longest matching ``n`` wins and the (up to ``k``) tokens that followed it
are the row's drafts. A row without a match proposes nothing (count 0). An n-gram draft is
a point mass, so verification treats ``q`` as one-hot (``draft_probs=None``).

Layout: ``tokens`` ``(B, W)`` holds row b's committed tokens at columns
``[pads[b], pads[b] + length[b])`` (plain generate's left-padded ``input_ids``); anything
after them is ignored. No host synchronisation, no value-dependent shape: the same code
runs eagerly and inside a CUDA graph. Work is ``O(B * W * n)`` comparisons per ``n``.
"""
from __future__ import annotations

import torch


def ngram_drafts(tokens: torch.Tensor, pads: torch.Tensor, length: torch.Tensor, k: int, min_n: int,
                 max_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts ``(B, k)`` (past a row's count: filler, never used) and draft counts ``(B,)``."""
    B, W = tokens.shape
    device = tokens.device
    end = pads + length  # column after the last committed token
    best = torch.full((B,), -1, dtype=torch.long, device=device)  # start column of the chosen match
    best_n = torch.zeros(B, dtype=torch.long, device=device)
    for n in range(max_n, min_n - 1, -1):
        if n > W - 1:
            continue
        suffix = tokens.gather(1, ((end - n)[:, None] + torch.arange(n, device=device)).clamp(0, W - 1))
        windows = tokens.unfold(1, n, 1)  # (B, W-n+1, n), a view
        starts = torch.arange(W - n + 1, device=device)
        # an earlier occurrence: inside the row, and ending before its last token (so something follows it)
        valid = (starts[None, :] >= pads[:, None]) & (starts[None, :] + n < end[:, None])
        found = (windows == suffix[:, None, :]).all(-1) & valid
        latest = torch.where(found, starts[None, :], -1).amax(1)
        take = (best < 0) & (latest >= 0)
        best = torch.where(take, latest, best)
        best_n = torch.where(take, torch.full_like(best_n, n), best_n)
    follow = best + best_n  # first column after the match
    counts = torch.where(best >= 0, (end - follow).clamp(min=0, max=k), 0)
    columns = (follow[:, None] + torch.arange(k, device=device)).clamp(0, W - 1)
    drafts = tokens.gather(1, columns)
    return drafts, counts


def ngram_drafts_reference(tokens: torch.Tensor, pads: torch.Tensor, length: torch.Tensor, k: int, min_n: int,
                           max_n: int) -> tuple[list[list[int]], list[int]]:
    """The same search as plain Python loops, row by row (the tests' oracle): drafts and counts."""
    drafts, counts = [], []
    for row, p, L in zip(tokens.tolist(), pads.tolist(), length.tolist()):
        seq = row[p : p + L]
        found = []
        for n in range(max_n, min_n - 1, -1):
            if n >= len(seq):
                continue
            tail = seq[-n:]
            starts = [i for i in range(len(seq) - n) if seq[i : i + n] == tail]
            if starts:
                found = seq[starts[-1] + n : starts[-1] + n + k]
                break
        drafts.append(found)
        counts.append(len(found))
    return drafts, counts
