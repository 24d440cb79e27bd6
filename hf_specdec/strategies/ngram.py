"""Prompt lookup proposals for the eager path: the batched device search of
``kernels/ngram_lookup.py`` over the call's token buffer, no draft model, no per-row loop
on the device side. Rows without a match propose nothing (count 0) and take one plain
decoding step in that round."""
from __future__ import annotations

import torch

from .. import kernels
from ..batch_state import SequenceBatch
from .base import DraftProposal


class NgramProposer:
    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def add_rows(self, rows: list[int]) -> None:
        pass

    def get_candidates(self, batch: SequenceBatch, rows: list[int], k: int) -> DraftProposal:
        device = batch.device
        rows_t = torch.tensor(rows, device=device)
        pads = torch.tensor([batch.pads[b] for b in rows], device=device)
        length = torch.tensor([batch.real_len(b) for b in rows], device=device)
        drafts, counts = kernels.ngram_drafts(batch.tokens.index_select(0, rows_t), pads, length, k,
                                              self.min_n, self.max_n)
        ends = torch.tensor([batch.end(b) for b in rows], device=device)
        batch.write(rows_t[:, None], ends[:, None] + torch.arange(k, device=device), drafts)
        return DraftProposal(drafts, None, counts)

    def update_candidate_strategy(self, batch: SequenceBatch, rows: list[int], num_accepted: list[int]) -> None:
        pass

    def release(self, rows: list[int]) -> None:
        pass
