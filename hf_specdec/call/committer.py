"""What the host keeps of a call besides its tokens, and the commit of each row's first token.

A row's first token comes from its prefill, on the host's side of the call (``waves.py``); every
later token is committed on the device by the round (``round/fixed_round.py``), and the call loop
hands this object what the host must see at each round's sync: stopping criteria that need the host
(stop strings, max_time, the user's own), ``output_scores`` / ``output_logits``, a streamer.
"""
from __future__ import annotations

import contextlib
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
        # what output_scores / output_logits return, in chunks of tokens: (step of each, batch row of each, values)
        self.kept: dict[str, list[tuple[list[int], list[int], torch.Tensor]]] = {"scores": [], "logits": []}
        self.steps_kept: dict[int, int] = defaultdict(int)  # batch row -> steps kept so far

    @property
    def reads_tokens(self) -> bool:
        """Host work on each round's tokens before the next round may start (criteria cut rows, a streamer)."""
        return bool(self.criteria) or self.stream is not None

    @property
    def keeps_outputs(self) -> bool:
        return self.keep_scores or self.keep_logits

    def commit_first(self, batch: SequenceBatch, rows: list[int], first: list[int], scores: torch.Tensor,
                     raw: torch.Tensor) -> list[int]:
        """Commit each of ``rows``' first token (``scores``/``raw``: row ``i``'s); returns the rows that stopped."""
        batch.append_runs(rows, [[t] for t in first])
        stopped = [t in self.eos or batch.max_new_tokens <= 1 for t in first]
        if self.criteria:
            hits = stop_hits(self.criteria, batch.tokens, rows, [batch.end(b) + 1 for b in rows], scores)
            stopped = [s or h for s, h in zip(stopped, hits)]
        if self.keeps_outputs:  # copies: the prefill's buffers serve the next prefill too
            self.keep(rows, scores[: len(rows)].clone(), raw[: len(rows)].clone())
        for i, (b, t) in enumerate(zip(rows, first)):
            batch.gen_len[b] += 1
            batch.finished[b] = stopped[i]
            if self.stream is not None:
                self.stream.add(b, [t], stopped[i])
        if self.stream is not None:
            self.stream.flush()
        return [b for b, s in zip(rows, stopped) if s]

    def keep(self, rows: list[int], scores: Optional[torch.Tensor], raw: Optional[torch.Tensor]) -> None:
        """Token ``i`` of batch row ``rows[i]`` (each row's tokens in order): its processed scores and raw logits
        ``(len(rows), V)``, where the call returns them. Kept as they come; laid out once, at the end."""
        if not self.keeps_outputs or not rows:
            return
        steps = []
        for b in rows:
            steps.append(self.steps_kept[b])
            self.steps_kept[b] += 1
        for name, values, wanted in (("scores", scores, self.keep_scores), ("logits", raw, self.keep_logits)):
            if wanted:
                self.kept[name].append((steps, rows, values))

    def per_step(self, name: str, batch_size: int, vocab: int, device) -> tuple:
        """Hugging Face's layout: one ``(B, V)`` tensor per generated token (a row that finished early has its
        padding steps from ``padding_steps.py``), written in one indexed copy."""
        chunks = self.kept[name]
        if not chunks:
            return ()
        out = torch.zeros(max(t for c in chunks for t in c[0]) + 1, batch_size, vocab, device=device)
        while chunks:  # each chunk freed once written (any order: a (step, row) pair is kept once)
            steps, rows, values = chunks.pop()
            out[torch.tensor(steps, device=device), torch.tensor(rows, device=device)] = values.to(device, out.dtype)
        return tuple(out.unbind(0))

    def end(self) -> None:
        """Flush a streamer and end it, once."""
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.flush(end=True)
            stream.streamer.end()

    def end_after_failure(self) -> None:
        """A failed call still ends its streamer (a consumer iterating it would wait forever): what was committed
        is flushed first. A failure while doing so (the streamer's own) must not hide the call's, so it is dropped."""
        with contextlib.suppress(Exception):
            self.end()
