"""Llama-family decoder layers of the runner's compiled copy at one token: the layer's pointwise work inside its
matmuls.

A decode step at b = 1 runs eleven launches a layer as Inductor compiles it: RMSNorm, q/k/v, the attention and its
split combine, o_proj, the residual add with the next RMSNorm, gate/up, SiLU·up, down_proj and cuBLAS's split-K
reduce, the last residual add. The small ones cost 1-2 us each on an H200 plus the gap before the next
(docs/kernels.md). At one token (a step of one row: a decode at b = 1, the draft's steps after its first) a layer
of the compiled copy (``compiled_regions.compiled_copy``) runs six: the norms in the prologues of the q/k/v and
gate/up GEMVs, SiLU·up in gate/up's epilogue, the residual adds in o_proj's and down_proj's
(``kernels.decode_linear``):

    qkv = linear(norm1(h), W_qkv)                 ->  attention (q/k norms, rotary, K/V write: rotary_attention.py)
    h   = h + linear(attention, W_o)
    h   = h + linear(silu(gate) * up of linear(norm2(h), W_gate_up), W_down)

Other token counts run the model's own forward (compiled, Inductor fuses each residual add with the norm after
it); so do layers whose q/k/v or gate/up do not share one tensor (``fused_projections.py``: the runs that compile)
and models where the fusions would run one by one (``kernels.decode_fusions_run``). Exact classes only: the
Llama, Mistral, Qwen2 and Qwen3 decoder layers whose attention ``rotary_attention.py`` swaps and whose norms and
MLP ``eager_fusions.py`` knows (transformers' RMSNorm, a SiLU MLP), with plain output projections, no hooks
(``mark_one_token_layers``; a hook added to one of them later makes its layer run the model's forward).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..cache import PAGED_BATCH_KWARG
from ..kernels import decode_fusions_run, decode_linear
from .eager_fusions import fused_class
from .fused_projections import GROUPS, DecodeLinear, fused_group
from .module_copies import hooked, plain, subclass
from .rotary_attention import rotary_class

_LAYERS: Optional[tuple] = None
_SUBCLASSES: dict[type, type] = {}


def _supported() -> tuple:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.mistral.modeling_mistral import MistralDecoderLayer
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    return LlamaDecoderLayer, MistralDecoderLayer, Qwen2DecoderLayer, Qwen3DecoderLayer


def one_token_class(module: nn.Module) -> Optional[type]:
    """The one-token class for a supported decoder layer, whether or not it may fuse (a hooked one runs the model's
    forward, its hooks with it): one class for all of a model's layers keeps them repeated blocks for regional
    compilation (``compiled_regions.py``); ``mark_one_token_layers`` says which fuse. Else None."""
    global _LAYERS
    if _LAYERS is None:
        _LAYERS = _supported()
    if type(module) not in _LAYERS:
        return None
    return subclass(type(module), "OneToken", {"forward": _forward, "fuses_one_token": False}, _SUBCLASSES)


def mark_one_token_layers(copy: nn.Module, model: nn.Module) -> None:
    """Let each one-token layer of ``copy`` (a runner copy of ``model``) fuse where ``model``'s layer of the same
    name is fit: the attention ``rotary_attention.py`` swaps, transformers' RMSNorms and SiLU MLP
    (``eager_fusions.fused_class``), plain output projections, no hooks or per-instance ``forward`` on them or it,
    weights where the fusions run (``kernels.decode_fusions_run``)."""
    originals = dict(model.named_modules())
    for name, layer in copy.named_modules():
        if type(layer) in _SUBCLASSES.values() and originals.get(name) is not None and layer is not originals[name]:
            layer.fuses_one_token = _fit(originals[name])


def _fit(layer: nn.Module) -> bool:
    attn, mlp, norms = layer.self_attn, layer.mlp, (layer.input_layernorm, layer.post_attention_layernorm)
    linears = (getattr(attn, "o_proj", None), getattr(mlp, "down_proj", None))
    return (plain(layer) and rotary_class(attn) is not None and fused_class(mlp) is not None
            and all(fused_class(norm) is not None for norm in norms)
            and all(type(linear) in (nn.Linear, DecodeLinear) and plain(linear) for linear in linears)
            and not any("forward" in vars(m) for m in (attn, mlp, *norms, *linears))  # hooks: plain()
            and decode_fusions_run(attn.o_proj.weight))


def _forward(self, hidden_states, *args, **kwargs):
    if not self.fuses_one_token or hidden_states.shape[0] != 1 or hidden_states.shape[1] != 1:
        return super(type(self), self).forward(hidden_states, *args, **kwargs)
    attn, mlp = self.self_attn, self.mlp
    norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
    batch, position_embeddings = kwargs.get(PAGED_BATCH_KWARG), kwargs.get("position_embeddings")
    qkv, gate_up = fused_group(attn, GROUPS[0]), fused_group(mlp, GROUPS[1])
    if (qkv is None or gate_up is None or not hasattr(attn, "paged_attend")
            or not attn.paged_applies(batch, position_embeddings)
            or any(map(hooked, (attn, mlp, norm1, norm2, attn.o_proj, mlp.down_proj)))  # hooks added later
            or torch.is_grad_enabled() or torch.is_autocast_enabled(hidden_states.device.type)):  # no autograd
        return super(type(self), self).forward(hidden_states, *args, **kwargs)
    q, k, v = decode_linear(hidden_states, qkv[0], qkv[1], norm_weight=norm1.weight,
                            eps=norm1.variance_epsilon).split(qkv[2], dim=-1)
    out = attn.paged_attend(q, k, v, position_embeddings, batch)
    h = decode_linear(out, attn.o_proj.weight, attn.o_proj.bias, residual=hidden_states)
    act = decode_linear(h, gate_up[0], gate_up[1], norm_weight=norm2.weight, eps=norm2.variance_epsilon, gated=True)
    return decode_linear(act, mlp.down_proj.weight, mlp.down_proj.bias, residual=h)
