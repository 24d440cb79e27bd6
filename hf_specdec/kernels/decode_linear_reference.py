"""References of ``decode_linear_triton``: the linear layer itself (what every device but CUDA runs), and the
same with a gated activation before it and a residual added after it (a gated MLP's down projection)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

# Gated activations ``act(gate) * up`` the fused op computes before its matmul, by name (the op's ``gate_act``).
GATE_ACTS = {
    "silu": F.silu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
}


def gated_input(x: torch.Tensor, gate_act: str) -> torch.Tensor:
    """``act(gate) * up`` for ``x = [gate, up]`` along its last dimension, in ``x``'s dtype as the modules
    compute it."""
    gate, up = x.chunk(2, dim=-1)
    return GATE_ACTS[gate_act](gate) * up


def decode_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x W^T + b`` over the last dimension of ``x``."""
    return F.linear(x, weight, bias)


def decode_linear_fused_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                                  residual: Optional[torch.Tensor], gate_act: str) -> torch.Tensor:
    """``residual + linear(act(gate) * up, W, b)`` where ``x = [gate, up]`` along its last dimension (``gate_act``
    names ``act``; "" takes ``x`` as it is). The activation rounds to ``x``'s dtype as the unfused modules do; in
    half precision without a bias, ``residual + x W^T`` rounds once (as ``torch.addmm(residual, x, W^T)`` does on a
    GPU), else the linear layer's output rounds before the add."""
    if gate_act:
        x = gated_input(x, gate_act)
    if residual is not None and bias is None and x.dtype in (torch.bfloat16, torch.float16):
        return (residual.float() + F.linear(x.float(), weight.float())).to(x.dtype)
    y = F.linear(x, weight, bias)
    return y if residual is None else residual + y
