"""Reference of ``step_metadata_triton``: the paged metadata of a fixed-shape forward, in torch's own ops.

A forward of ``q`` tokens per row over ``B`` rows (token ``t`` belongs to row ``t // q``) needs each token's cache
slot, the query offsets and the rows whose logits a decode step reads; all follow from the block tables
``(B, W)`` int32 and the tokens' positions ``(B*q,)``, so the runner computes them on the device every forward.
"""
from __future__ import annotations

import torch


def step_metadata_reference(tables: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor, q: int,
                            block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(slots (B*q,) int64, query_start_loc (B+1,) int32, seq_lens (B,) int32, last token of each row (B,)
    int64)``; ``slot = tables[t // q, pos // block_size] * block_size + pos % block_size``."""
    B, device = tables.shape[0], tables.device
    slots = slots_of(tables, torch.arange(B, device=device)[:, None].expand(B, q).reshape(-1), positions, block_size)
    starts = torch.arange(B + 1, device=device, dtype=torch.int32) * q
    last = torch.arange(B, device=device) * q + (q - 1)
    return slots, starts, seq_lens.to(torch.int32, copy=True), last  # a custom op returns no alias of an input


def slots_of(tables: torch.Tensor, token_rows: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """The flat pool slot of each token: row ``token_rows[t]`` of ``tables`` at position ``positions[t]`` (the one
    slot formula: the paged cache's batches, the fixed-shape prefill and ``step_metadata`` use it)."""
    return tables.long()[token_rows, positions // block_size] * block_size + positions % block_size
