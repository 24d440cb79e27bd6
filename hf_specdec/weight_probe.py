"""A few rows of a weight matrix, kept in a saved file to recognise the model it was saved against.

A file that reuses another model's tensors (a reduced draft's input embedding, a draft head's target) stores
these rows instead of the tensor; the loader compares them with the model it is handed, so a file cannot
silently run on another model's weights.
"""
from __future__ import annotations

import torch

PROBE_ROWS = 16


def probe(weight: torch.Tensor) -> torch.Tensor:
    """``PROBE_ROWS`` rows spread over the weight's first dimension, fp32 on the CPU."""
    rows = torch.linspace(0, weight.shape[0] - 1, PROBE_ROWS).round().long().unique()
    return weight.detach().index_select(0, rows.to(weight.device)).float().cpu()


def matches_probe(weight: torch.Tensor, saved: torch.Tensor) -> bool:
    """The probe rows equal up to a cast to bf16 (the model may be loaded in another dtype than at save time)."""
    scale = float(saved.abs().max().clamp(min=1e-6))
    return bool(torch.allclose(probe(weight), saved, rtol=1e-2, atol=1e-2 * scale))
