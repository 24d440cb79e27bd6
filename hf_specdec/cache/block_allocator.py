"""Host-side block bookkeeping of the paged KV cache: a free list and one block list per sequence.

A sequence of ``n`` tokens owns exactly ``ceil(n / block_size)`` blocks. Growing a
sequence takes blocks from the free list; rolling it back to a shorter length returns
its trailing blocks (a length change, never a copy of KV); freeing it returns all.
Nothing is ever handed to two sequences, and running out raises ``CacheBudgetError``
before any state changes, so no KV is silently overwritten.
"""
from __future__ import annotations


class CacheBudgetError(RuntimeError):
    """The paged cache has too few free blocks to serve a step."""


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int, budget_hint: str = ""):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must both be >= 1.")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.budget_hint = budget_hint
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._blocks: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}

    # -- queries -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def sequences(self) -> list[int]:
        return list(self._blocks)

    def blocks(self, seq_id: int) -> list[int]:
        return self._blocks[seq_id]

    def length(self, seq_id: int) -> int:
        return self._lengths[seq_id]

    # -- updates -------------------------------------------------------------------
    def add(self, seq_id: int) -> None:
        if seq_id in self._blocks:
            raise ValueError(f"sequence {seq_id} already has blocks in this cache.")
        self._blocks[seq_id] = []
        self._lengths[seq_id] = 0

    def reserve(self, demands: dict[int, int]) -> list[int]:
        """Make every ``seq_id`` own enough blocks for ``num_tokens`` (its length is unchanged).

        All-or-nothing: if the free list cannot cover the whole demand, nothing is
        allocated and ``CacheBudgetError`` names the budget. Returns the ids of the
        sequences whose block list grew.
        """
        missing = {
            s: blocks_for(n, self.block_size) - len(self._blocks[s]) for s, n in demands.items()
        }
        need = sum(m for m in missing.values() if m > 0)
        if need > len(self._free):
            held = sum(len(b) for b in self._blocks.values())
            raise CacheBudgetError(
                f"paged KV cache exhausted: this step needs {need} more blocks of {self.block_size} tokens, "
                f"{len(self._free)} are free ({held} held by {len(self._blocks)} sequences, "
                f"{self.num_blocks} in all = {self.num_blocks * self.block_size} tokens). "
                f"{self.budget_hint or 'Raise the cache budget.'}"
            )
        grown = []
        for s, m in missing.items():
            if m > 0:
                self._blocks[s].extend(self._free.pop() for _ in range(m))
                grown.append(s)
        return grown

    def set_length(self, seq_id: int, num_tokens: int) -> bool:
        """Record the sequence's valid length; trailing blocks past it return to the free list.

        Returns True when blocks were released. The length may not exceed the reserved
        capacity (reserve first).
        """
        blocks = self._blocks[seq_id]
        if num_tokens < 0 or num_tokens > len(blocks) * self.block_size:
            raise ValueError(
                f"length {num_tokens} for sequence {seq_id} is outside its reserved capacity "
                f"{len(blocks) * self.block_size}; reserve blocks before extending."
            )
        self._lengths[seq_id] = num_tokens
        keep = blocks_for(num_tokens, self.block_size)
        if keep < len(blocks):
            self._free.extend(reversed(blocks[keep:]))
            del blocks[keep:]
            return True
        return False

    def free(self, seq_id: int) -> None:
        self._free.extend(reversed(self._blocks.pop(seq_id)))
        del self._lengths[seq_id]
