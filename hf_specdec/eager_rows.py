"""The rows of the eager path's rounds: waiting rows start as the cache budget frees blocks.

A row starts with a prefill: its prompt goes into the target cache, its first token is chosen
and committed as plain generate would (Hugging Face's processors and stopping criteria), and it
gets a draft cache row. A row that finishes frees its blocks in both caches at once, and the
waiting rows that then fit start before the next round (``admission.py``).
"""
from __future__ import annotations

from typing import Optional

import torch

from .admission import Admission
from .batch_state import SequenceBatch
from .commit import Committer
from .logits import LogitsPipeline
from .metrics import StageTimer
from .sampling import choose_tokens


class EagerRows:
    def __init__(self, admission: Admission, batch: SequenceBatch, scorer, proposer, logits: LogitsPipeline,
                 committer: Committer, timer: StageTimer, vocab_size: int, do_sample: bool,
                 generator: Optional[torch.Generator]):
        self.admission, self.batch, self.scorer, self.proposer = admission, batch, scorer, proposer
        self.logits, self.committer, self.timer = logits, committer, timer
        self.vocab_size, self.do_sample, self.generator = vocab_size, do_sample, generator

    def next(self) -> list[int]:
        """Rows of the next round (batch order): the running ones and every waiting row that fits now."""
        while new := self.admission.admit():
            self._start(new)
        return list(self.admission.running)

    def release(self, rows: list[int]) -> None:
        """Rows that finished: their blocks go back to both caches and to the admission count."""
        if rows:
            self.scorer.release(rows)
            self.proposer.release(rows)
            self.admission.release(rows)

    def _start(self, rows: list[int]) -> None:
        batch = self.batch
        with self.timer("prefill_seconds"):
            raw = self.scorer.prefill(batch, rows)[:, : self.vocab_size]
            scores = self.logits(raw, batch.tokens, *batch.history_lens(rows, 1))
            first, _ = choose_tokens(scores, self.do_sample, self.generator)
        self.proposer.add_rows(rows)
        self.release(self.committer.commit(batch, rows, [[t] for t in first.tolist()], scores, raw, 1))
