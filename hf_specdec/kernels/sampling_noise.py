"""Random draws for acceptance, made outside the kernels so that kernel and reference agree bit for bit.

With per-sequence ``torch.Generator``s (a seeded request reproduces whatever its batch
mates are) each sequence draws its own rows; without them one batched draw serves all.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

_TINY = 1e-10  # Exp(1) can round to 0; dividing by it would make that token certain.


def draw_acceptance_noise(
    cu_num_draft_tokens: torch.Tensor,
    num_draft_tokens: int,
    vocab_size: int,
    device: torch.device,
    generators: Optional[Sequence[Optional[torch.Generator]]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniforms ``(N,)`` float64 for the accept tests and Exp(1) noise ``(B, V)`` for recovered/bonus draws."""
    B = cu_num_draft_tokens.shape[0]
    N = num_draft_tokens
    uniform = torch.empty(N, dtype=torch.float64, device=device)
    exponential = torch.empty(B, vocab_size, dtype=torch.float32, device=device)
    if generators is None or all(g is None for g in generators):
        uniform.uniform_()
        exponential.exponential_()
    else:
        if len(generators) != B:
            raise ValueError(f"generators has {len(generators)} entries; expected one per sequence ({B}).")
        cu = cu_num_draft_tokens.tolist()
        start = 0
        for b, gen in enumerate(generators):
            uniform[start:cu[b]].uniform_(generator=gen)
            exponential[b].exponential_(generator=gen)
            start = cu[b]
    return uniform, exponential.clamp_(min=_TINY)
