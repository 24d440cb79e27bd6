"""Multi-step drafting with a small model on its own paged cache.

Step 1 feeds every sequence the committed tokens its cache lacks: normally one (the
newest token), two after a round that accepted all k drafts (the last draft, which the
draft model produced but never consumed, plus the bonus token), the whole prompt in
the first round. That is vLLM's bonus-token batch expansion done as one ragged query.
Steps 2..k feed one token each. After verification the cache keeps what the target
accepted: a length change, never a copy.
"""
from __future__ import annotations

from typing import Optional

import torch
from transformers import PreTrainedModel

from ..batch_state import SequenceBatch
from ..cache import PagedKVCache, paged_forward
from ..logits import LogitsPipeline
from ..sampling import align_vocab, choose_tokens
from .base import DraftProposal


class DraftModelProposer:
    def __init__(self, model: PreTrainedModel, cache: PagedKVCache, logits: LogitsPipeline, k: int,
                 vocab_size: int, do_sample: bool, generator: Optional[torch.Generator]):
        self.model = model
        self.cache = cache
        self.logits = logits
        self.k = k
        self.vocab_size = vocab_size
        self.do_sample = do_sample
        self.generator = generator
        self.cached = {}  # row -> tokens in the draft cache

    def add_rows(self, rows: list[int]) -> None:
        self.cache.add_sequences(len(rows))
        self.cached.update({b: 0 for b in rows})

    def get_candidates(self, batch: SequenceBatch, rows: list[int], k: int) -> DraftProposal:
        """Rounds may propose fewer than the configured k (adaptive length), or none at all: a row's
        pending tokens then simply grow, and step 1 feeds them all."""
        device = batch.device
        self.k_round = k
        cached = [self.cached[b] for b in rows]
        pending = [batch.real_len(b) - c for b, c in zip(rows, cached)]
        self.cache.reserve(rows, [batch.real_len(b) + k - 1 for b in rows])
        rows_t = torch.tensor(rows, device=device)
        ends = torch.tensor([batch.end(b) for b in rows], device=device)
        context = torch.tensor(cached, device=device)
        queries = torch.tensor(pending, device=device)

        input_ids = batch.gather(rows, [batch.end(b) - p for b, p in zip(rows, pending)], pending)
        flat_rows, history = batch.history_lens(rows, 1)
        drafts, probs = [], []
        for j in range(k):
            step = self.cache.batch(rows_t, context, queries, max(pending) if j == 0 else 1, input_ids.shape[0])
            last = step.query_start_loc[1:].long() - 1
            logits = align_vocab(paged_forward(self.model, input_ids, step, last), self.vocab_size)
            lens = [n + j for n in history]
            tokens, q = choose_tokens(self.logits(logits, batch.tokens, flat_rows, lens), self.do_sample, self.generator)
            batch.write(rows_t, ends + j, tokens)
            drafts.append(tokens)
            probs.append(q)
            context = context + queries
            queries = torch.ones_like(queries)
            input_ids = tokens
        token_ids = torch.stack(drafts, dim=1)
        return DraftProposal(token_ids, torch.stack(probs, dim=1) if self.do_sample else None)

    def update_candidate_strategy(self, batch: SequenceBatch, rows: list[int], num_accepted: list[int]) -> None:
        # The cache holds the committed tokens plus drafts x1..x_{k-1}; of those, the accepted ones stay.
        lengths = [batch.real_len(b) + min(a, self.k_round - 1) for b, a in zip(rows, num_accepted)]
        self.cache.set_lengths(rows, lengths)
        self.cached.update(zip(rows, lengths))

    def release(self, rows: list[int]) -> None:
        self.cache.free(rows)
        for b in rows:
            self.cached.pop(b, None)
