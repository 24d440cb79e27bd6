"""Small constant tensors a round reads every time (an all-greedy mask, each row's draft offsets, the noise
stand-ins of a greedy verify), made once per key and device: made afresh, each is a fill kernel in every replay of
a round's CUDA graph. Readers never write them."""
from __future__ import annotations

from typing import Callable, Hashable

import torch

_MADE: dict = {}


def device_constant(key: Hashable, device: torch.device, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()`` the first time ``(key, device)`` is asked for, the same tensor after. One made while a CUDA
    graph is being captured holds its values only in that graph's replays, so it is not kept (nor one traced by
    torch.compile)."""
    if torch.compiler.is_compiling():  # traced: the graph makes its own
        return make()
    t = _MADE.get((key, device))
    if t is None:
        t = make()
        if not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
            _MADE[(key, device)] = t
    return t
