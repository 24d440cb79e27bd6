"""Reference of ``decode_linear_triton``: the linear layer itself (what every device but CUDA runs)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def decode_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x W^T + b`` over the last dimension of ``x``."""
    return F.linear(x, weight, bias)
