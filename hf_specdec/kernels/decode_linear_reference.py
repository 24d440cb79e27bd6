"""Reference of ``decode_linear_triton``: the linear layer, with what a decode step's layer fuses into its matmuls.

    y = linear(norm(x), W, b)                   norm: the model's RMSNorm (``norm_weight``), else none
    y = silu(y[:N/2]) * y[N/2:]                 ``gated``: a fused [gate; up] weight's activation
    y = residual + y                            ``residual``: the layer's residual add

each rounded to the row's dtype as the model's own operations are (what every device but CUDA runs, and the
unfused path everywhere).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .rms_norm_reference import rms_norm_reference
from .silu_mul_reference import silu_mul_reference


def decode_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                            norm_weight: Optional[torch.Tensor] = None, eps: float = 0.0, gated: bool = False,
                            residual: Optional[torch.Tensor] = None, *, rms_norm: Callable = rms_norm_reference,
                            silu_mul: Callable = silu_mul_reference) -> torch.Tensor:
    """``x W^T + b`` over the last dimension of ``x``, with the norm before it and SiLU·up and the residual after it
    where given. ``rms_norm`` / ``silu_mul``: what computes those two (the Triton launcher's unfused path passes
    its kernels)."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps)
    y = F.linear(x, weight, bias)
    if gated:
        y = silu_mul(*y.chunk(2, dim=-1))
    return y if residual is None else residual + y
