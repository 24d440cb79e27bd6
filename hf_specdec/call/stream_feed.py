"""A streamer fed as plain ``generate()`` feeds it, from rounds that commit several tokens at once.

Plain generate puts the prompt, then each step's token of every row: a ``(B,)`` tensor, with the pad
token for rows that have finished. Rows of a speculative call advance at their own pace, so step ``t``
goes out once every row has committed its token ``t`` or finished. At batch 1 each round's run goes
out at once, as one 1-D tensor (what Hugging Face's ``TextStreamer`` reads as consecutive tokens).
"""
from __future__ import annotations

import torch


class StreamFeed:
    def __init__(self, streamer, batch_size: int, pad_token_id: int):
        self.streamer, self.pad = streamer, pad_token_id
        self.tokens: list[list[int]] = [[] for _ in range(batch_size)]
        self.finished = [False] * batch_size
        self.sent = 0  # steps put so far

    def add(self, row: int, tokens: list[int], finished: bool) -> None:
        """Row ``row`` committed ``tokens`` (and stopped, when ``finished``)."""
        self.tokens[row] += tokens
        self.finished[row] = self.finished[row] or finished

    def flush(self, end: bool = False) -> None:
        """Put every step that all rows have reached (all of them at the ``end`` of the call)."""
        lengths = [len(t) for t in self.tokens]
        ready = max(lengths) if end else min(n if not done else max(lengths) for n, done in
                                                 zip(lengths, self.finished))
        if ready <= self.sent:
            return
        if len(self.tokens) == 1:
            self.streamer.put(torch.tensor(self.tokens[0][self.sent: ready]))
        else:
            for t in range(self.sent, ready):
                self.streamer.put(torch.tensor([row[t] if t < len(row) else self.pad for row in self.tokens]))
        self.sent = ready
