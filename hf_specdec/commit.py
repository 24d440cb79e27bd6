"""Commit: append each row's emitted run, cut at EOS / max_new_tokens / stopping criteria inside it.

What a row emits in a round (a run of accepted drafts plus one token) is committed token by
token as plain generate would have: a stop anywhere in the run discards the rest. EOS
and the length limit are handled here; every other stopping criterion from Hugging
Face's list (stop strings, max_time, the user's own) is called with the exact
``input_ids`` plain generate would pass at that token.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

import torch
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

from .batch_state import SequenceBatch
from .history_groups import stop_hits


class Committer:
    def __init__(self, eos_token_ids: list[int], stopping_criteria: Optional[StoppingCriteriaList],
                 streamer=None, keep_scores: bool = False, keep_logits: bool = False):
        self.eos = set(eos_token_ids)
        self.criteria = StoppingCriteriaList(
            [c for c in (stopping_criteria or []) if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
        )
        self.streamer = streamer
        self.keep_scores = keep_scores
        self.keep_logits = keep_logits
        self.scores: dict[int, list[torch.Tensor]] = defaultdict(list)
        self.logits: dict[int, list[torch.Tensor]] = defaultdict(list)

    def commit(self, batch: SequenceBatch, rows: list[int], runs: list[list[int]],
               scores: torch.Tensor, raw_logits: Optional[torch.Tensor], positions: int) -> list[int]:
        """Commit ``runs[i]`` to row ``rows[i]``; ``scores``/``raw_logits`` hold ``positions`` rows per
        batch row (row ``i*positions + j`` scored token ``j`` of run ``i``). Returns rows that finished."""
        # Write every run in full (drafts are already there; the last token is not), then cut.
        batch.append_runs(rows, runs)

        keep = []
        for b, run in zip(rows, runs):
            n = min(len(run), batch.max_new_tokens - batch.gen_len[b])
            eos_at = next((j for j, t in enumerate(run[:n]) if t in self.eos), None)
            keep.append(n if eos_at is None else eos_at + 1)
        stopped = [batch.gen_len[b] + n >= batch.max_new_tokens or (n > 0 and run[n - 1] in self.eos)
                   for b, run, n in zip(rows, runs, keep)]
        if self.criteria:
            self._apply_criteria(batch, rows, keep, stopped, scores, positions)

        kept_index = [i * positions + j for i, n in enumerate(keep) for j in range(n)]
        if self.keep_scores or self.keep_logits:
            self._keep(rows, keep, kept_index, scores, raw_logits)
        for b, n in zip(rows, keep):
            batch.gen_len[b] += n
        if self.streamer is not None and keep[0]:
            self.streamer.put(torch.tensor(runs[0][: keep[0]]))
        done = [b for b, s in zip(rows, stopped) if s]
        for b in done:
            batch.finished[b] = True
        return done

    def _apply_criteria(self, batch, rows, keep, stopped, scores, positions) -> None:
        for j in range(max(keep, default=0)):
            live = [i for i, n in enumerate(keep) if j < n]
            index = torch.tensor([i * positions + j for i in live], dtype=torch.long, device=scores.device)
            hits = stop_hits(self.criteria, batch.tokens, [rows[i] for i in live],
                             [batch.end(rows[i]) + j + 1 for i in live], scores[index])
            for i, h in zip(live, hits):
                if h:
                    keep[i] = j + 1
                    stopped[i] = True

    def _keep(self, rows, keep, kept_index, scores, raw_logits) -> None:
        index = torch.tensor(kept_index, device=scores.device)
        picked_scores = scores[index] if self.keep_scores else None
        picked_logits = raw_logits[index] if self.keep_logits else None
        at = 0
        for b, n in zip(rows, keep):
            for _ in range(n):
                if self.keep_scores:
                    self.scores[b].append(picked_scores[at])
                if self.keep_logits:
                    self.logits[b].append(picked_logits[at])
                at += 1

    def per_step(self, kept: dict[int, list[torch.Tensor]], batch_size: int, vocab: int, device) -> tuple:
        """Hugging Face's layout: one ``(B, V)`` tensor per generated token (a row that finished early has its
        padding steps from ``padding_steps.py``; without them those entries are 0)."""
        steps = max((len(v) for v in kept.values()), default=0)
        out = []
        for t in range(steps):
            step = torch.zeros(batch_size, vocab, device=device)
            for b, rows in kept.items():
                if t < len(rows):
                    step[b] = rows[t]
            out.append(step)
        return tuple(out)

    def end(self) -> None:
        if self.streamer is not None:
            self.streamer.end()
