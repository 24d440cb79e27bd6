"""The paged metadata of a fixed-shape forward in one launch: ``step_metadata_reference``'s outputs.

Five to ten small kernels in torch (row of each token, block index, gather, multiply, remainder, the offsets)
become one launch: program ``p`` writes tokens ``p * BLOCK ...`` and the rows of the same indices. Positions
divide as torch's do (floor division; a negative block index counts from the table's end), so every slot is the
reference's.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .step_metadata_reference import step_metadata_reference


@triton.jit(do_not_specialize=["B", "q", "block_size", "width", "stride_t"])
def _step_metadata_kernel(tables_ptr, positions_ptr, seq_lens_ptr, slots_ptr, starts_ptr, seq_lens_out_ptr,
                          last_ptr, B, q, block_size, width, stride_t, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # tokens i, and rows i
    ok = i < B * q
    pos = tl.load(positions_ptr + i, mask=ok, other=0).to(tl.int64)
    offset = pos % block_size
    offset = tl.where(offset < 0, offset + block_size, offset)  # floor semantics, whatever `%` does here
    index = (pos - offset) // block_size
    index = tl.where(index < 0, index + width, index)
    block = tl.load(tables_ptr + (i // q).to(tl.int64) * stride_t + index, mask=ok, other=0).to(tl.int64)
    tl.store(slots_ptr + i, block * block_size + offset, mask=ok)
    tl.store(starts_ptr + i, (i * q).to(tl.int32), mask=i <= B)
    tl.store(seq_lens_out_ptr + i, tl.load(seq_lens_ptr + i, mask=i < B, other=0).to(tl.int32), mask=i < B)
    tl.store(last_ptr + i, i.to(tl.int64) * q + q - 1, mask=i < B)


def step_metadata_triton(tables: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor, q: int,
                         block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton twin of ``step_metadata_reference`` (the reference where a layout is strided)."""
    B, device = tables.shape[0], tables.device
    if tables.stride(1) != 1 or positions.stride(0) != 1 or seq_lens.stride(0) != 1 or B == 0:
        return step_metadata_reference(tables, positions, seq_lens, q, block_size)
    slots = torch.empty(B * q, dtype=torch.long, device=device)
    starts = torch.empty(B + 1, dtype=torch.int32, device=device)
    seq_lens_out = torch.empty(B, dtype=torch.int32, device=device)
    last = torch.empty(B, dtype=torch.long, device=device)
    with torch.cuda.device(device) if tables.is_cuda else contextlib.nullcontext():
        _step_metadata_kernel[(triton.cdiv(max(B * q, B + 1), 256),)](
            tables, positions, seq_lens, slots, starts, seq_lens_out, last, B, q, block_size, tables.shape[1],
            tables.stride(0), BLOCK=256, num_warps=4)
    return slots, starts, seq_lens_out, last
