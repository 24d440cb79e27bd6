"""The target model on its paged cache: prompt prefill, and one ragged forward that scores all drafts.

Scoring packs ``[y_prev, x_1..x_k]`` of every sequence into one forward (vLLM's "MQA
scorer"): k+1 query tokens per sequence over its cached keys, never one sequence per
draft. The target cache always holds every committed token but the newest, so after
verification it keeps ``y_prev`` and the accepted drafts: a length change.
"""
from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..batch_state import SequenceBatch
from ..cache import PagedKVCache, paged_forward


class TargetScorer:
    def __init__(self, model: PreTrainedModel, cache: PagedKVCache, k: int):
        self.model = model
        self.cache = cache
        self.k = k

    def prefill(self, batch: SequenceBatch, rows: list[int]) -> torch.Tensor:
        """Run the prompts; return the logits ``(B, V)`` of each prompt's last position."""
        self.cache.add_sequences(len(rows))
        lens = [batch.real_len(b) for b in rows]
        self.cache.reserve(rows, lens)
        device = batch.device
        step = self.cache.batch(torch.tensor(rows, device=device), torch.zeros(len(rows), dtype=torch.long, device=device),
                                torch.tensor(lens, device=device), max(lens), sum(lens))
        input_ids = batch.gather(rows, [batch.pads[b] for b in rows], lens)
        logits = paged_forward(self.model, input_ids, step, step.query_start_loc[1:].long() - 1)
        self.cache.set_lengths(rows, lens)
        return logits

    def score(self, batch: SequenceBatch, rows: list[int], k: int) -> torch.Tensor:
        """Logits ``(Ba * (k+1), V)`` of the target at ``y_prev, x_1..x_k`` of every row (drafts are in the buffer)."""
        device = batch.device
        context = [batch.real_len(b) - 1 for b in rows]
        self.cache.reserve(rows, [c + k + 1 for c in context])
        step = self.cache.batch(torch.tensor(rows, device=device), torch.tensor(context, device=device),
                                torch.full((len(rows),), k + 1, device=device), k + 1, len(rows) * (k + 1))
        input_ids = batch.gather(rows, [batch.end(b) - 1 for b in rows], [k + 1] * len(rows))
        return paged_forward(self.model, input_ids, step, torch.arange(input_ids.shape[0], device=device))

    def update_after_verify(self, batch: SequenceBatch, rows: list[int], num_accepted: list[int]) -> None:
        self.cache.set_lengths(rows, [batch.real_len(b) + a for b, a in zip(rows, num_accepted)])

    def release(self, rows: list[int]) -> None:
        self.cache.free(rows)
