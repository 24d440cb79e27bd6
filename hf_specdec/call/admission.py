"""Admission of a call's rows into the cache budget: rows wait until the blocks they may need are free.

With ``SpecConfig(cache_tokens=...)`` (or ``cache_memory_fraction``) smaller than the whole batch
needs, the rows of one generate() call run in waves, as vLLM's scheduler and transformers'
continuous batching do: a waiting row starts (is prefilled) once the blocks its whole generation
may hold are free, and a finished row gives its blocks back within the same call. A row is
admitted against its worst case (prompt + max_new_tokens + k + 1 tokens), so an admitted row never
runs out mid-way and nothing is preempted; rows start in batch order (first come, first served).
Only a row that cannot fit an empty cache is an error, raised before anything runs.
"""
from __future__ import annotations

from collections import deque
from typing import Optional

from ..cache import CacheBudgetError, blocks_for
from .batch_state import SequenceBatch


class Admission:
    def __init__(self, batch: SequenceBatch, block_size: int, num_blocks: Optional[int], hint: str):
        """``num_blocks``: the budget of each model's cache in blocks (None: room for every row at once)."""
        self.need = [blocks_for(batch.budget_tokens(b), block_size) for b in range(batch.size)]
        self.num_blocks = sum(self.need) if num_blocks is None else num_blocks
        for b, need in enumerate(self.need):
            if need > self.num_blocks:
                raise CacheBudgetError(
                    f"row {b} of the batch needs {need * block_size} cache tokens ({need} blocks of {block_size}: "
                    f"a {batch.prompt_len(b)}-token prompt + max_new_tokens={batch.max_new_tokens} + "
                    f"{batch.k + 1} for a round's lookahead), more than the whole budget of "
                    f"{self.num_blocks * block_size} tokens ({self.num_blocks} blocks): it cannot run even alone, "
                    f"and nothing was generated. {hint} A budget of at least {need * block_size} tokens runs it "
                    "(rows that do not fit together wait for free blocks); or lower max_new_tokens."
                )
        self.free = self.num_blocks
        self.waiting = deque(range(batch.size))
        self.running: list[int] = []

    def admit(self) -> list[int]:
        """Rows that start now: from the head of the queue, while their worst case fits the free blocks."""
        rows = []
        while self.waiting and self.need[self.waiting[0]] <= self.free:
            b = self.waiting.popleft()
            self.free -= self.need[b]
            rows.append(b)
        self.running += rows
        return rows

    def release(self, rows: list[int]) -> None:
        """Finished rows: their blocks count as free again."""
        for b in rows:
            self.running.remove(b)
            self.free += self.need[b]
