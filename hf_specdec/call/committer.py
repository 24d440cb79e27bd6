"""What the host keeps of a call besides its tokens, and the commit of each row's first token.

A row's first token comes from its prefill, on the host's side of the call (``waves.py``); every
later token is committed on the device by the round (``round/fixed_round.py``), and the call loop
hands this object what the host must see at each round's sync: stopping criteria that need the host
(stop strings, max_time, the user's own), ``output_scores`` / ``output_logits``, a streamer.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

import torch
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

from ..round.logits.history_groups import stop_hits
from .batch_state import SequenceBatch
from .stream_feed import StreamFeed


class Committer:
    def __init__(self, eos_token_ids: list[int], stopping_criteria: Optional[StoppingCriteriaList],
                 stream: Optional[StreamFeed] = None, keep_scores: bool = False, keep_logits: bool = False):
        self.eos = set(eos_token_ids)
        # EOS and max_new_tokens are the round's own (on the device); the rest needs the host
        self.criteria = StoppingCriteriaList(
            [c for c in (stopping_criteria or []) if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
        )
        self.stream, self.keep_scores, self.keep_logits = stream, keep_scores, keep_logits
        self.scores: dict[int, list[torch.Tensor]] = defaultdict(list)
        self.logits: dict[int, list[torch.Tensor]] = defaultdict(list)

    @property
    def reads_each_round(self) -> bool:
        """Host work on every round's tokens: no round may start before it is done."""
        return bool(self.criteria) or self.keep_scores or self.keep_logits or self.stream is not None

    def commit_first(self, batch: SequenceBatch, rows: list[int], first: list[int], scores: torch.Tensor,
                     raw: torch.Tensor) -> list[int]:
        """Commit each of ``rows``' first token (``scores``/``raw``: row ``i``'s); returns the rows that stopped."""
        batch.append_runs(rows, [[t] for t in first])
        stopped = [t in self.eos or batch.max_new_tokens <= 1 for t in first]
        if self.criteria:
            hits = stop_hits(self.criteria, batch.tokens, rows, [batch.end(b) + 1 for b in rows], scores)
            stopped = [s or h for s, h in zip(stopped, hits)]
        for i, (b, t) in enumerate(zip(rows, first)):
            batch.gen_len[b] += 1
            batch.finished[b] = stopped[i]
            self.keep(b, scores[i].clone(), raw[i].clone())  # the prefill's buffers serve the next prefill too
            if self.stream is not None:
                self.stream.add(b, [t], stopped[i])
        if self.stream is not None:
            self.stream.flush()
        return [b for b, s in zip(rows, stopped) if s]

    def keep(self, row: int, scores: Optional[torch.Tensor], raw: torch.Tensor) -> None:
        """One step's processed scores / raw logits of ``row``, where the call returns them."""
        if self.keep_scores:
            self.scores[row].append(scores)
        if self.keep_logits:
            self.logits[row].append(raw)

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
        if self.stream is not None:
            self.stream.flush(end=True)
            self.stream.streamer.end()
