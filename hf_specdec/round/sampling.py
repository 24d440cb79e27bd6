"""Token choice from processed logits: the draft's steps, k = 0 rounds and each row's first token.

Sampling uses the exponential race: ``argmax(p / E)`` with ``E ~ Exp(1)`` is a draw from
``p`` without normalisation, multinomial or host synchronisation.
"""
from __future__ import annotations

from typing import Optional

import torch


def choose_tokens(scores: torch.Tensor, do_sample: bool, generator: Optional[torch.Generator]):
    """Tokens ``(R,)`` and, when sampling, the distributions ``(R, V)`` they were drawn from."""
    if not do_sample:
        return scores.argmax(-1), None
    probs = torch.softmax(scores, dim=-1)
    noise = torch.empty_like(probs).exponential_(generator=generator).clamp_(min=1e-10)
    return (probs / noise).argmax(-1), probs


def cut_to_counts(emitted: torch.Tensor, accepted: torch.Tensor, counts: torch.Tensor, scores: torch.Tensor,
                  do_sample: bool, generator: Optional[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that proposed ``counts[b] < k`` real drafts (n-gram rows with a short or no match).

    Verification ran over k drafts per row; past a row's count they are filler. A run that
    got to the row's count stops there and the token at that position is the target's own
    choice, a fresh draw from ``p`` (the kernel's token there answered a filler draft, so its
    residual would be wrong). Runs that ended earlier are exact as they are.
    ``emitted`` ``(B, k+1)``, ``scores`` ``(B*(k+1), V)`` processed target logits.
    """
    B, k1 = emitted.shape
    over = accepted >= counts
    at = counts.clamp(max=k1 - 1)
    rows = torch.arange(B, device=emitted.device)
    fresh, _ = choose_tokens(scores.view(B, k1, -1)[rows, at], do_sample, generator)
    span = torch.arange(k1, device=emitted.device)
    cut = torch.where(span[None, :] < at[:, None], emitted, -1)
    cut = torch.where(span[None, :] == at[:, None], fresh[:, None], cut)
    return torch.where(over[:, None], cut, emitted), torch.minimum(accepted, counts)
