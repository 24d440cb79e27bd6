"""The rows of the fast path: waiting rows start as the cache budget frees blocks (``admission.py``).

A row starts with the target's prefill (fixed shapes: ``runner/prefill.py``) and its first token, chosen and
committed as plain generate would (Hugging Face's processors and stopping criteria); then, if it runs on, the
draft model reads its prompt. A row that
finishes frees its blocks at once; the waiting rows that then fit start at the same sync and the
bucket is rebuilt with the survivors and them (``runner/row_blocks.py``).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..round.fixed_round import RoundSpec
from ..round.sampling import choose_tokens
from ..runner import RowAtSync, SpecRunner
from ..runner.row_blocks import free_rows, rejoin, reserve_rows
from .admission import Admission
from .batch_state import SequenceBatch
from .committer import Committer
from .metrics import StageTimer


class FastRows:
    def __init__(self, runner: SpecRunner, batch: SequenceBatch, admission: Admission, spec: RoundSpec,
                 committer: Committer, timer: StageTimer):
        self.runner, self.batch, self.admission, self.spec = runner, batch, admission, spec
        self.committer, self.timer = committer, timer

    def start(self) -> list[int]:
        """Start every waiting row that fits; the batch rows still live after their first token."""
        live = []
        while new := self.admission.admit():
            live += self._start(new)
        return live

    def finish(self, rows: list[int]) -> None:
        """Rows that finished: their blocks go back to both caches and to the admission count."""
        if rows:
            free_rows(self.runner, rows)
            self.admission.release(rows)

    def join(self, rows: list, live: list[int], sync: list[RowAtSync], eos_ids: list[int]) -> Optional[list[int]]:
        """After a sync (``rows``: the batch row of each bucket row, ``live``: bucket rows still running,
        ``sync``: each bucket row as the round left it): start the waiting rows that fit now and rebuild the
        bucket with the survivors and them. Returns the new batch row of each bucket row, or None when
        no row started."""
        new = self.start()
        if not new:
            return None
        live_rows = [rows[i] for i in live]
        rejoin(self.runner, live, live_rows, [sync[i].generated for i in live], new, eos_ids)
        return live_rows + new

    def _start(self, rows: list[int]) -> list[int]:
        batch, spec = self.batch, self.spec
        reserve_rows(self.runner, rows)
        warm = self.runner.warmup_seconds
        with self.timer("prefill_seconds"):
            raw = self.runner.prefill(rows)
            index = torch.tensor(rows, device=batch.device)
            ends = torch.tensor([batch.end(b) for b in rows], device=batch.device)
            scores = spec.logits(raw, batch.tokens, index, ends, batch_rows=index)
            first, _ = choose_tokens(scores, spec.do_sample, spec.generator)
            first = first.tolist()
        self.finish(self.committer.commit_first(batch, rows, first, scores, raw))
        live = [b for b in rows if not batch.finished[b]]
        with self.timer("prefill_seconds"):
            self.runner.prefill_draft(live)  # after the first tokens: a streamer has them before the draft reads
        self.timer.metrics.prefill_seconds -= self.runner.warmup_seconds - warm  # a new shape's capture: warm-up
        return live
