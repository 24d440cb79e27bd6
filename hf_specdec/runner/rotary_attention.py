"""Llama-family attention in the runner's copies of a model: rotary, K/V write and attention in one place.

transformers' attention modules rotate q and k (eagerly: about a dozen small kernels a layer; compiled: one
Inductor kernel for q, one for k) and hand them to the paged attention function, which writes K/V (one more
kernel) and attends. In the runner's copies of a model, the attention modules of the classes below run
``forward`` here instead: the projections (and Qwen3's q/k norms) as the model computes them, then
``cache.paged_rotary_attention`` with q and k not yet rotated, and the output projection. That rotates both,
writes K/V and attends in one launch for a decode or verify step (``kernels.rotary_paged_attention``); a prompt
read from position 0 gets the rotary and the write in one launch (``kernels.rotary_write_kv``) and the model's
own attention. Two copies use it: the one every uncompiled forward
runs (prefills, and every round where nothing is compiled: ``paged_model.paged_models``) and the compiled one
(``compiled_regions.py``). In the uncompiled copy of a model whose q/k/v weights share one tensor
(``fused_projections.py``, set up by the first call that compiles), ``fused_qkv`` makes the projections one matmul
(the compiled copy gets that from Inductor). What a layer computes is the model's own (``tests/test_runner_copies.py``: equal to
the model's paged logits bit for bit in fp32). The user's modules are not changed: the copies' attention modules
are shallow copies of another class, along a path of shallow copies.

Only these classes, by exact type (a subclass may compute something else), whose rotary is the ``rotate_half``
one over the whole head: Llama, Mistral, Qwen2, Qwen3. Anything else keeps its own forward; so does a module
with hooks (accelerate's device placement) or sharded weights (a tensor-parallel plan), and a call without the
runner's paged batch (the model's own forward runs).
"""
from __future__ import annotations

from typing import Callable, Optional

from torch import nn

from ..cache import PAGED_BATCH_KWARG, paged_rotary_attention
from .fused_projections import fused_linear
from .module_copies import plain, subclass


def _window_of_config(module) -> Optional[int]:
    return getattr(module.config, "sliding_window", None)


def _window_of_layer(module) -> Optional[int]:
    return module.sliding_window


def _supported() -> dict[type, tuple[Callable, bool]]:
    """attention class -> (its sliding window, whether it norms q and k per head before the rotary)."""
    from transformers.models.llama.modeling_llama import LlamaAttention
    from transformers.models.mistral.modeling_mistral import MistralAttention
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    return {LlamaAttention: (lambda module: None, False), MistralAttention: (_window_of_config, False),
            Qwen2Attention: (_window_of_layer, False), Qwen3Attention: (_window_of_layer, True)}


_SUPPORTED: Optional[dict] = None
_SUBCLASSES: dict[type, type] = {}


def rotary_class(module: nn.Module) -> Optional[type]:
    """The rotary class for a supported, plain attention module; else None."""
    global _SUPPORTED
    if _SUPPORTED is None:
        _SUPPORTED = _supported()
    spec = _SUPPORTED.get(type(module))
    if spec is None or not plain(module):
        return None
    window, qk_norm = spec
    return subclass(type(module), "Rotary", {"forward": _forward, "_paged_window": staticmethod(window),
                                             "_paged_qk_norm": qk_norm, "fused_qkv": None,
                                             "paged_applies": _paged_applies, "paged_attend": _paged_attend},
                    _SUBCLASSES)


def _forward(self, hidden_states, *args, **kwargs):
    batch = kwargs.get(PAGED_BATCH_KWARG)
    position_embeddings = kwargs.get("position_embeddings", args[0] if args else None)
    if not _paged_applies(self, batch, position_embeddings):
        return super(type(self), self).forward(hidden_states, *args, **kwargs)
    if self.fused_qkv is not None:  # the uncompiled copy of a model whose q/k/v share one tensor: one matmul
        weight, bias, sizes = self.fused_qkv
        q, k, v = fused_linear(hidden_states, weight, bias).split(sizes, dim=-1)
    else:
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
    return self.o_proj(_paged_attend(self, q, k, v, position_embeddings, batch)), None


def _paged_applies(self, batch, position_embeddings) -> bool:
    """The runner's paged forward (its batch given) with a rotary over the whole head: ``_paged_attend`` computes
    the module's attention."""
    return batch is not None and position_embeddings is not None and position_embeddings[0].shape[-1] == self.head_dim


def _paged_attend(self, q, k, v, position_embeddings, batch):
    """The attention before the output projection, ``(1, tokens, heads x head_dim)``, from the projections of a batch
    of one row of packed tokens (Qwen3's q/k norms, then the rotary, K/V write and attention in one op)."""
    tokens = q.shape[1]
    shape = (tokens, -1, self.head_dim)
    q, k, v = q.view(shape), k.view(shape), v.view(shape)
    if self._paged_qk_norm:
        q, k = self.q_norm(q), self.k_norm(k)
    cos, sin = position_embeddings
    out = paged_rotary_attention(self, q, k, v, cos[0], sin[0], self.scaling, self._paged_window(self), batch)
    return out.reshape(1, tokens, -1)
