"""Token choice from processed logits, shared by the draft and the target's first token.

Sampling uses the exponential race: ``argmax(p / E)`` with ``E ~ Exp(1)`` is a draw from
``p`` without normalisation, multinomial or host synchronisation.
"""
from __future__ import annotations

from typing import Optional

import torch


def align_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Cut or -inf-pad the last dim to ``vocab_size`` (draft and target vocabularies that differ by padding)."""
    V = logits.shape[-1]
    if V == vocab_size:
        return logits
    if V > vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - V), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def choose_tokens(scores: torch.Tensor, do_sample: bool, generator: Optional[torch.Generator]):
    """Tokens ``(R,)`` and, when sampling, the distributions ``(R, V)`` they were drawn from."""
    if not do_sample:
        return scores.argmax(-1), None
    probs = torch.softmax(scores, dim=-1)
    noise = torch.empty_like(probs).exponential_(generator=generator).clamp_(min=1e-10)
    return (probs / noise).argmax(-1), probs
