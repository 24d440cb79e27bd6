"""The models the runner compiles: one compiled decoder layer serves every layer (regional compilation).

Compiling the whole model unrolls every layer into one graph: an 8B-shaped Llama took about a minute per
shape family on an H200, in every new process. accelerate's ``compile_regions`` compiles each repeated block
with ``torch.compile`` instead; since the layers share their code and their weights are graph inputs, Dynamo
traces one layer and Inductor compiles it once for all of them. The paged attention sits outside the compiled
regions (``cache/attention.py``: it reads the layer's index, which would otherwise make each layer a guard of
its own), so a layer is a few compiled pieces around an opaque attention call; under CUDA graphs the breaks
cost nothing at replay. Shapes are dynamic: one compiled layer serves every batch bucket and every k (token
counts of 1 apart, which torch specialises).

What is compiled is ``fused_projections.shared_projections(model).module_copy(model)``: q/k/v and gate/up
run as one matmul each, over weights the user's parameters are views of; in it, Llama-family attention modules
hand their keys over before the rotary (``rotary_attention.py``: rotary and K/V write in one launch), and their
layers at one token run their norms, SiLU·up and residual adds inside the matmuls (``one_token_layers.py``). A
draft head of one layer is compiled whole instead (``compiled_whole``). The user's modules are not changed
(``compile_regions`` and the copies are shallow copies that share modules and weights).
"""
from __future__ import annotations

import torch
from accelerate.utils import compile_regions
from transformers import PreTrainedModel

from .fused_projections import shared_projections
from .inductor_passes import inductor_options
from .module_copies import copy_with
from .one_token_layers import mark_one_token_layers, one_token_class
from .rotary_attention import rotary_class

# compiled variants per code object: (target, draft) x (1 token, any count) x (full, sliding-window layers) ...
_CACHE_SIZE_LIMIT = 64


def compile_model(model: PreTrainedModel, backend="inductor"):
    """A callable like ``model`` whose repeated decoder layers (and other children) are compiled; a draft head of
    one layer is compiled whole (``compiled_whole``)."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, _CACHE_SIZE_LIMIT)
    fused = compiled_copy(model)
    options = {"options": inductor_options()} if backend == "inductor" else {}
    if compiled_whole(model):
        return torch.compile(fused, dynamic=True, backend=backend, **options)
    return compile_regions(fused, dynamic=True, backend=backend, **options)


def compiled_copy(model: PreTrainedModel):
    """What ``compile_model`` compiles: the fused projections' copy (``fused_projections.py``) with the runner's
    attention (``rotary_attention.py``) and one-token layers (``one_token_layers.py``); the user's model unchanged."""
    copy = copy_with(shared_projections(model).module_copy(model), lambda m: rotary_class(m) or one_token_class(m))
    mark_one_token_layers(copy, model)
    return copy


def compiled_whole(model: PreTrainedModel) -> bool:
    """A draft head (``draft_head.py``) of one layer: there is no layer to share, and compiled whole, its embedding
    lookup and the concatenation fc reads are one kernel, where regions ran them eagerly, two launches a draft step
    (the layer's own frame still splits around the paged attention, so its last add stays apart from the final
    norm)."""
    return getattr(model, "reads_target_hidden", False) and len(getattr(model, "layers", ())) == 1
