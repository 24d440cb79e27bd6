"""Paged KV cache of one model: per-layer block pools plus per-sequence block tables and lengths.

Pools are ``(num_blocks, block_size, kv_heads, head_dim)`` for K and for V. Each layer's
pool is created at its first write, from the K/V the layer actually produced, so it has
the layer's own device (accelerate may spread layers over GPUs), dtype, kv-head count
(GQA/MQA) and head_dim without guessing from the config.

Sequences are addressed by *slot rows*: row ``r`` of ``block_tables`` is the table of the
sequence added as the r-th one. Lengths are mirrored on the host (the round loop
learns them from the accepted counts it reads once per round) and on the device.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ..kernels import slots_of
from .block_allocator import BlockAllocator, blocks_for


@dataclass
class PagedBatch:
    """Everything the attention function needs for one packed forward (all device tensors but one int)."""

    cache: "PagedKVCache"
    block_tables: torch.Tensor  # (B, max_blocks) int32
    seq_lens: torch.Tensor  # (B,) int32, length after this forward
    query_start_loc: torch.Tensor  # (B+1,) int32
    slot_mapping: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64, absolute position of every packed token
    max_query_len: int
    # host (start, end) token spans of rows with nothing cached before this forward (a prompt read from position 0):
    # their attention is a causal self-attention, which the model's own implementation computes (flash / cuDNN)
    fresh: Optional[tuple] = None
    _copies: dict = field(default_factory=dict, repr=False, compare=False)

    def on(self, device: torch.device) -> "PagedBatch":
        """This metadata on ``device``, copied once per device and forward: the layers a ``device_map``
        put on another GPU share one copy instead of each copying it again."""
        if device == self.slot_mapping.device:
            return self
        moved = self._copies.get(device)
        if moved is None:
            moved = self._copies[device] = PagedBatch(
                self.cache, self.block_tables.to(device), self.seq_lens.to(device), self.query_start_loc.to(device),
                self.slot_mapping.to(device), self.positions.to(device), self.max_query_len, self.fresh)
        return moved


class PagedKVCache:
    def __init__(self, num_blocks: int, block_size: int, max_seqs: int, max_seq_len: int,
                 device: torch.device, budget_hint: str = ""):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        self.key_pools: dict[int, torch.Tensor] = {}
        self.value_pools: dict[int, torch.Tensor] = {}
        self.reset(max_seqs, max_seq_len, budget_hint)

    def resize(self, num_blocks: int) -> None:
        """A new pool size: the pools are re-created at the next write (same cache object, so a compiled
        model that reads pools through it keeps its code)."""
        self.num_blocks = num_blocks
        for pools in (self.key_pools, self.value_pools):
            pools.clear()

    def reset(self, max_seqs: int, max_seq_len: int, budget_hint: str = "") -> None:
        """Forget every sequence but keep the pools: a runner reuses one cache (and the pool
        addresses its CUDA graphs captured) across generate() calls."""
        self.max_blocks_per_seq = blocks_for(max_seq_len, self.block_size)
        self.allocator = BlockAllocator(self.num_blocks, self.block_size, budget_hint)
        self.block_tables = torch.zeros(max_seqs, self.max_blocks_per_seq, dtype=torch.int32, device=self.device)
        self._next_row = 0

    # -- pools ---------------------------------------------------------------------
    def layer_pools(self, layer_idx: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V pools of ``layer_idx``, created from ``like`` ``(T, kv_heads, head_dim)`` on first use."""
        pool = self.key_pools.get(layer_idx)
        if pool is None:
            shape = (self.num_blocks, self.block_size, like.shape[-2], like.shape[-1])
            # zeros, not empty: masked-out garbage (NaN) would still poison probs @ V
            self.key_pools[layer_idx] = pool = torch.zeros(shape, dtype=like.dtype, device=like.device)
            self.value_pools[layer_idx] = torch.zeros(shape, dtype=like.dtype, device=like.device)
        return pool, self.value_pools[layer_idx]

    # -- sequences -----------------------------------------------------------------
    def add_sequences(self, count: int) -> list[int]:
        rows = list(range(self._next_row, self._next_row + count))
        if rows and rows[-1] >= self.block_tables.shape[0]:
            raise ValueError(f"cache was built for {self.block_tables.shape[0]} sequences; {rows[-1] + 1} requested.")
        for r in rows:
            self.allocator.add(r)
        self._next_row += count
        return rows

    def reserve(self, rows: list[int], num_tokens: list[int]) -> None:
        """Give each row blocks for ``num_tokens`` tokens (a step's lookahead) and publish its table."""
        for n in num_tokens:
            if blocks_for(n, self.block_size) > self.max_blocks_per_seq:
                raise ValueError(
                    f"a sequence needs {n} cached tokens but the cache was sized for at most "
                    f"{self.max_blocks_per_seq * self.block_size} per sequence."
                )
        grown = self.allocator.reserve(dict(zip(rows, num_tokens)))
        self._publish(grown)

    def set_lengths(self, rows: list[int], lengths: list[int]) -> None:
        """Commit (or roll back to) each row's valid length; trailing blocks return to the pool."""
        for r, n in zip(rows, lengths):
            self.allocator.set_length(r, n)

    def free(self, rows: list[int]) -> None:
        for r in rows:
            self.allocator.free(r)

    def length(self, row: int) -> int:
        return self.allocator.length(row)

    def _publish(self, rows: list[int]) -> None:
        if not rows:
            return
        table = torch.zeros(len(rows), self.max_blocks_per_seq, dtype=torch.int32)
        for i, r in enumerate(rows):
            blocks = self.allocator.blocks(r)
            table[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        index = torch.tensor(rows, device=self.device)
        self.block_tables.index_copy_(0, index, table.to(self.device, non_blocking=True))

    # -- forward metadata ----------------------------------------------------------
    def batch(self, rows: torch.Tensor, context_lens: torch.Tensor, query_lens: torch.Tensor,
              max_query_len: int, num_tokens: Optional[int] = None) -> PagedBatch:
        """Metadata of a packed forward: sequence ``rows[b]`` brings ``query_lens[b]`` new tokens after
        ``context_lens[b]`` cached ones. Pure device arithmetic, no host synchronisation.
        ``num_tokens`` (= query_lens.sum()) should be passed when known to avoid a sync."""
        device = self.device
        rows = rows.to(device)
        query_lens = query_lens.to(device=device, dtype=torch.int32)
        seq_lens = context_lens.to(device=device, dtype=torch.int32) + query_lens
        query_start_loc = torch.zeros(rows.shape[0] + 1, dtype=torch.int32, device=device)
        torch.cumsum(query_lens, 0, out=query_start_loc[1:])
        T = int(query_lens.sum()) if num_tokens is None else num_tokens
        token_seq = torch.repeat_interleave(
            torch.arange(rows.shape[0], device=device), query_lens.long(), output_size=T
        )
        token_idx = torch.arange(T, device=device) - query_start_loc[:-1].long()[token_seq]
        positions = (context_lens.to(device).long()[token_seq] + token_idx)
        tables = self.block_tables[rows]
        slots = self.slot_mapping(tables, token_seq, positions)
        return PagedBatch(self, tables, seq_lens, query_start_loc, slots, positions, max_query_len)

    def slot_mapping(self, tables: torch.Tensor, token_rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The flat pool slot of each token: row ``token_rows[t]`` of ``tables`` at position ``positions[t]``, the
        layout the attention kernels read (``tables[row, pos // block_size] * block_size + pos % block_size``).
        Device arithmetic only, so graphs capture it."""
        return slots_of(tables, token_rows, positions, self.block_size)
