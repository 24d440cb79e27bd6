"""Llama-family RMSNorm in one launch on the runner's uncompiled path (``kernels.rms_norm``).

Uncompiled, transformers' RMSNorm issues seven operations, each a pass over the activations: at a decode step
about seven kernel launches per norm (two or three norms a layer), and over a 2048-token prompt of an 8B-shaped
model hundreds of megabytes a norm. The runner's uncompiled copy of a model (``paged_model.paged_models``: its
prefills, and its rounds before or without compile) runs the norms of the classes below through the one-launch
kernel instead, computing the model's own formula (bit for bit on the CPU, where the reference runs). The compiled
copy keeps transformers' norm: Inductor fuses it with the residual add before it, which an opaque op would stop.

Only these classes, by exact type and with plain weights and no hooks (``module_copies.plain``): Llama, Mistral,
Qwen2 and Qwen3's RMSNorm (the same ``forward`` in every transformers release supported; Qwen3 also norms q and k
per head with it).
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from ..kernels import rms_norm
from .module_copies import plain, subclass

_SUPPORTED: Optional[tuple] = None
_SUBCLASSES: dict[type, type] = {}


def _supported() -> tuple:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.mistral.modeling_mistral import MistralRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    return LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm


def norm_class(module: nn.Module) -> Optional[type]:
    """The one-launch class for a supported, plain RMSNorm module; else None."""
    global _SUPPORTED
    if _SUPPORTED is None:
        _SUPPORTED = _supported()
    if type(module) not in _SUPPORTED or not plain(module):
        return None
    return subclass(type(module), "Fused", {"forward": _forward}, _SUBCLASSES)


def _forward(self, hidden_states):
    return rms_norm(hidden_states, self.weight, self.variance_epsilon)
