"""Reference of ``commit_triton``: a round's commit on the device, in torch's own ops.

Layout: ``emitted`` ``(B, k+1)`` tokens of each row's run (-1 after it), ``accepted`` ``(B,)`` drafts accepted;
the bucket's state: ``hist`` ``(B, W)`` tokens (a row's next token goes to column ``pads + length``), ``pads``,
``length``, ``gen`` (tokens generated), ``done`` (bool), ``max_new`` ``()``, ``eos`` ``(E,)`` (-1 unused),
``counts`` ``(B,)`` real drafts per row; written: ``keep`` and ``accepted_out`` ``(B,)`` (the round's tokens and
accepted drafts per row), the five statistics (``stats``: rows, rows that drafted, draft tokens, accepted drafts,
``(K,)`` accepted per position), summed over rounds.
"""
from __future__ import annotations

from typing import Sequence

import torch


def commit_reference(emitted: torch.Tensor, accepted: torch.Tensor, hist: torch.Tensor, pads: torch.Tensor,
                     length: torch.Tensor, gen: torch.Tensor, done: torch.Tensor, max_new: torch.Tensor,
                     eos: torch.Tensor, counts: torch.Tensor, keep_out: torch.Tensor, accepted_out: torch.Tensor,
                     stats: Sequence[torch.Tensor], k: int) -> None:
    """Append each live row's run up to its first EOS and its ``max_new`` tokens; advance lengths and done flags;
    add the round's acceptance statistics (``k`` > 0)."""
    span = torch.arange(k + 1, device=emitted.device)
    live = ~done
    limit = torch.minimum(accepted + 1, max_new - gen)
    is_eos = (emitted[:, :, None] == eos).any(-1) & (span < limit[:, None])
    hit_eos = is_eos.any(1)
    keep = torch.where(hit_eos, is_eos.int().argmax(1) + 1, limit)
    keep = torch.where(live, keep, 0)
    columns = (pads + length)[:, None] + span
    old = hist.gather(1, columns)
    hist.scatter_(1, columns, torch.where(span < keep[:, None], emitted, old))
    keep_out.copy_(keep)
    accepted_out.copy_(torch.where(live, accepted, 0))
    gen.add_(keep)
    length.add_(keep)
    done.logical_or_(live & (hit_eos | (gen >= max_new)))
    if k:
        rows, drafted_rows, draft_tokens, accepted_total, per_position = stats
        rows.add_(live.sum())
        drafted = live & (counts > 0)
        drafted_rows.add_(drafted.sum())
        draft_tokens.add_(torch.where(live, counts, 0).sum())
        accepted_total.add_(torch.where(live, accepted, 0).sum())
        per_position[:k].add_(((accepted[:, None] > span[:k]) & live[:, None]).sum(0))
