"""Triton: RMSNorm over the last dimension in one launch (``rms_norm_reference.py`` gives the formula).

One program per row: a first pass sums the squares in float32 over column tiles of 1024, a second scales
each tile, rounds it to the input's dtype (as transformers does before the weight), multiplies by the weight in
float32 and stores in the promoted dtype; the second pass reads the row again from L2. The tile is the same for
every width, so a target and its draft share one JIT compile inside a process's first call (a tile per width
cost one more, 0.3 s on an H200 host). The sum's order differs from PyTorch's reduction, so the variance may
differ in its last float32 bits (an output an ulp apart, rarely), as Inductor's compiled norm may too.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import pdl_launch
from .pdl_triton import wait_for_previous_then_release_next

_BLOCK = 1024  # columns per tile, whatever the width


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, H, stride_x, stride_o, eps, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    wait_for_previous_then_release_next(USE_PDL)  # before reading what earlier kernels wrote (kernels/pdl.py)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    squares = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, H, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < H, other=0.0).to(tl.float32)
        squares += x * x
    scale = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / H + eps)
    for start in range(0, H, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < H, other=0.0)
        y = (x.to(tl.float32) * scale).to(x.dtype).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, (w * y).to(out_ptr.dtype.element_ty), mask=cols < H)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """See ``rms_norm_reference``: ``x`` ``(..., H)`` normalised over ``H``, times ``weight``."""
    H = x.shape[-1]
    rows = x.reshape(-1, H)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if rows.shape[0] == 0:
        return out
    _rms_norm_kernel[(rows.shape[0],)](
        rows, weight, out, H, rows.stride(0), H, float(eps), BLOCK=_BLOCK, num_warps=4, **pdl_launch(x.device))
    return out
