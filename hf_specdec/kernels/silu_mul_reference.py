"""A gated MLP's activation, ``silu(gate) * up``, as transformers computes it: the oracle of ``silu_mul_triton.py``.

Llama-family MLPs compute ``down(silu(gate(x)) * up(x))``; uncompiled, the activation and the product are two
passes over the MLP's widest activations (``(tokens, intermediate)``: 58 MB for a 2048-token prompt of an
8B-shaped model, in bfloat16), the Triton kernel one. Roundings as transformers': the activation rounded to the
input dtype, then the product rounded.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gate``/``up`` ``(..., N)``: ``F.silu(gate) * up``."""
    return F.silu(gate) * up
