"""What the runner's uncompiled copy of a Llama-family model fuses: RMSNorm, and the MLP's SiLU and product.

Uncompiled, transformers' RMSNorm issues seven operations and a gated MLP's activation two (``silu``, then the
product with ``up``), each a pass over the activations: at a decode step a kernel launch apiece, and over a
2048-token prompt of an 8B-shaped model hundreds of megabytes a layer. The runner's uncompiled copy of a model
(``paged_model.paged_models``: its prefills, and its rounds before or without compile) runs them through one
launch each (``kernels.rms_norm``, ``kernels.silu_mul``), computing the model's own formula (bit for bit on the
CPU, where the references run). The compiled copy keeps transformers' modules: Inductor fuses them, the norm with
the residual add before it, which an opaque op would stop.

Only these classes, by exact type and with plain weights and no hooks (``module_copies.plain``): Llama, Mistral,
Qwen2 and Qwen3's RMSNorm (the same ``forward`` in every transformers release supported; Qwen3 also norms q and k
per head with it) and MLP (with the SiLU activation its config names). Where gate and up share one tensor
(``fused_projections.py``), ``fused_gate_up`` makes them one matmul.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..kernels import rms_norm, silu_mul
from .fused_projections import fused_linear
from .module_copies import plain, subclass

_NORMS: Optional[tuple] = None
_MLPS: Optional[tuple] = None
_SUBCLASSES: dict[type, type] = {}


def _supported() -> None:
    global _NORMS, _MLPS
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
    from transformers.models.mistral.modeling_mistral import MistralMLP, MistralRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

    _NORMS = LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm
    _MLPS = LlamaMLP, MistralMLP, Qwen2MLP, Qwen3MLP


def fused_class(module: nn.Module) -> Optional[type]:
    """The one-launch class for a supported, plain RMSNorm or SiLU MLP module; else None."""
    if _NORMS is None:
        _supported()
    if type(module) in _NORMS and plain(module):
        return subclass(type(module), "Fused", {"forward": _norm_forward}, _SUBCLASSES)
    if type(module) in _MLPS and _silu(module.act_fn) and plain(module):
        return subclass(type(module), "Fused", {"forward": _mlp_forward, "fused_gate_up": None}, _SUBCLASSES)
    return None


def _silu(act: nn.Module) -> bool:
    from transformers.activations import SiLUActivation

    return type(act) in (SiLUActivation, nn.SiLU) and not getattr(act, "inplace", False)


def _norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    if self.fused_gate_up is not None:  # gate and up share one tensor (fused_projections.py): one matmul
        weight, bias, (n, _) = self.fused_gate_up
        both = fused_linear(x, weight, bias)
        return self.down_proj(silu_mul(both[..., :n], both[..., n:]))
    return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))
