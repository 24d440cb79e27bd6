"""RMSNorm of the Llama family, as transformers computes it: the oracle of ``rms_norm_triton.py``.

    y = weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype),     x^2, the mean and the scaling in float32

over the last dimension. The product with the weight runs in the promoted dtype of the two (bfloat16 for a
bfloat16 model: upcast, multiplied, rounded once, as PyTorch's elementwise kernels do). Uncompiled, transformers
issues seven operations for it (a cast, the square, the mean, the add, rsqrt, the scaling, the cast back and the
weight's product), each a pass over the activations; the Triton kernel is one.
"""
from __future__ import annotations

import torch


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x`` ``(..., H)``, ``weight`` ``(H,)``: transformers' ``LlamaRMSNorm.forward``, operation for operation."""
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)
