"""Triton: ``silu(gate) * up`` in one launch (``silu_mul_reference.py`` gives the formula and roundings).

Grid (rows, column tiles of 1024): each program loads its tile of both inputs, computes ``g / (1 + exp(-g))`` in
float32, rounds it to the input dtype (as ``F.silu`` does), multiplies by ``up`` in float32 and stores in the
promoted dtype. Triton's ``exp`` may differ from CUDA's in its last float32 bit (a bfloat16 output an ulp apart,
rarely), as Inductor's compiled activation may too.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import pdl_launch
from .pdl_triton import wait_for_previous_then_release_next

_BLOCK = 1024


@triton.jit
def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, N, stride_g, stride_u, stride_o, BLOCK: tl.constexpr,
                     USE_PDL: tl.constexpr):
    wait_for_previous_then_release_next(USE_PDL)  # before reading what earlier kernels wrote (kernels/pdl.py)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    g = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0)
    u = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (s * u).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """See ``silu_mul_reference``: ``gate``/``up`` ``(..., N)`` of one shape."""
    N = gate.shape[-1]
    g, u = gate.reshape(-1, N), up.reshape(-1, N)
    g, u = (x if x.stride(-1) == 1 else x.contiguous() for x in (g, u))
    out = torch.empty(gate.shape, dtype=torch.promote_types(gate.dtype, up.dtype), device=gate.device)
    if g.shape[0] == 0 or N == 0:
        return out
    _silu_mul_kernel[(g.shape[0], triton.cdiv(N, _BLOCK))](
        g, u, out, N, g.stride(0), u.stride(0), N, BLOCK=_BLOCK, num_warps=4, **pdl_launch(gate.device))
    return out
