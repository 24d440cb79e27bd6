"""Random draws for acceptance, made outside the kernels so that kernel and reference agree bit for bit.

Without generators, or with one generator shared by every sequence (``SpecConfig(generator=g)``),
one batched draw serves all rows: no host synchronisation. Distinct per-sequence
``torch.Generator``s (a seeded request reproduces whatever its batch mates are) draw their own
rows, which needs the draft counts on the host.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .device_constants import device_constant

_TINY = 1e-10  # Exp(1) can round to 0; dividing by it would make that token certain.


def draw_acceptance_noise(
    cu_num_draft_tokens: torch.Tensor,
    num_draft_tokens: int,
    vocab_size: int,
    device: torch.device,
    generators: Optional[Sequence[Optional[torch.Generator]]] = None,
    *,
    with_uniform: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniforms ``(N,)`` float64 for the accept tests and Exp(1) noise ``(B, V)`` for recovered/bonus draws.

    ``with_uniform=False`` (typical acceptance needs no uniforms) returns an empty ``(0,)`` uniform
    and draws none: a draw whose result is unused would be dropped by ``torch.compile`` and then
    eager and compiled runs would no longer share one random stream."""
    B = cu_num_draft_tokens.shape[0]
    N = num_draft_tokens if with_uniform else 0
    uniform = torch.empty(N, dtype=torch.float64, device=device)
    exponential = torch.empty(B, vocab_size, dtype=torch.float32, device=device)
    if generators is not None and len(generators) != B:
        raise ValueError(f"generators has {len(generators)} entries; expected one per sequence ({B}).")
    if generators is None or all(g is generators[0] for g in generators):  # one source for every row
        gen = generators[0] if generators else None
        if with_uniform:
            uniform.uniform_(generator=gen)
        exponential.exponential_(generator=gen)
    else:
        cu = cu_num_draft_tokens.tolist()
        start = 0
        for b, gen in enumerate(generators):
            if with_uniform:
                uniform[start:cu[b]].uniform_(generator=gen)
            exponential[b].exponential_(generator=gen)
            start = cu[b]
    return uniform, exponential.clamp_(min=_TINY)


def greedy_noise_placeholders(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-ins for the noise of an all-greedy verify: a ``(1,)`` uniform and a ``(1, 1)`` Exp(1)
    row. Greedy rows never read noise (the kernels mask those loads, the reference broadcasts
    them into values it then discards), so greedy verification draws no random numbers."""
    return (device_constant("uniform placeholder", device, lambda: torch.zeros(1, dtype=torch.float64, device=device)),
            device_constant("exponential placeholder", device,
                            lambda: torch.ones(1, 1, dtype=torch.float32, device=device)))
