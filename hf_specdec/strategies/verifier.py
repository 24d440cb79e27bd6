"""Verification: turns draft tokens and the target's scores into accepted tokens (kernels in ``kernels/``)."""
from __future__ import annotations

from typing import Optional

import torch

from .. import kernels
from ..sampling import cut_to_counts
from .base import DraftProposal


class Verifier:
    def __init__(self, method: str, do_sample: bool, k: int, generator: Optional[torch.Generator],
                 posterior_threshold: float, posterior_alpha: float):
        self.method = "greedy" if not do_sample else method
        self.do_sample = do_sample
        self.k = k
        self.generator = generator
        self.posterior_threshold = posterior_threshold
        self.posterior_alpha = posterior_alpha

    def __call__(self, proposal: DraftProposal, target_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``target_scores`` ``(Ba*(k+1), V)`` processed target logits. Returns token ids ``(Ba, k+1)``
        (-1 after the emitted run) and accepted draft counts ``(Ba,)``."""
        emitted, accepted = self._verify(proposal, target_scores)
        if proposal.counts is None:
            return emitted, accepted
        return cut_to_counts(emitted, accepted, proposal.counts, target_scores, self.do_sample, self.generator)

    def _verify(self, proposal: DraftProposal, target_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        Ba, k = proposal.token_ids.shape
        device = target_scores.device
        drafts = proposal.token_ids.reshape(-1)
        cu = torch.arange(1, Ba + 1, device=device, dtype=torch.int32) * k
        generators = [self.generator] * Ba if self.generator is not None else None
        if self.method == "greedy":
            # argmax of the processed logits is exactly plain greedy generate's choice.
            greedy = torch.ones(Ba, dtype=torch.bool, device=device)
            return kernels.rejection_sample(drafts, cu, None, target_scores, greedy, k, generators, all_greedy=True)
        target_probs = torch.softmax(target_scores, dim=-1)
        if self.method == "typical":
            return kernels.typical_accept(drafts, cu, target_probs, k, self.posterior_threshold,
                                          self.posterior_alpha, generators)
        draft_probs = None if proposal.probs is None else proposal.probs.reshape(Ba * k, -1)
        random = torch.zeros(Ba, dtype=torch.bool, device=device)
        return kernels.rejection_sample(drafts, cu, draft_probs, target_probs, random, k, generators)
