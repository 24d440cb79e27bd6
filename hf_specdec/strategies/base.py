"""The interface a proposer implements (modelled on transformers' CandidateGenerator)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import torch

from ..batch_state import SequenceBatch


@dataclass
class DraftProposal:
    token_ids: torch.Tensor  # (Ba, k) int64, also written into the batch's token buffer
    probs: Optional[torch.Tensor]  # (Ba, k, V) draft distributions q, or None (q is one-hot)
    counts: Optional[torch.Tensor] = None  # (Ba,) real drafts per row when fewer than k (n-gram), else None


class Proposer(Protocol):
    def get_candidates(self, batch: SequenceBatch, rows: list[int], k: int) -> DraftProposal:
        """Propose (up to) k tokens after the committed tokens of each of ``rows``."""

    def update_candidate_strategy(self, batch: SequenceBatch, rows: list[int], num_accepted: list[int]) -> None:
        """Learn the verdict of the round (before the batch commits it): roll state back."""

    def release(self, rows: list[int]) -> None:
        """Rows that finished: free what they hold."""
