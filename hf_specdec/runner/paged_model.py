"""One model on its paged cache, called with fixed-shape metadata: every row feeds ``q`` tokens.

With a fixed ``q`` per row, the ragged layout needs no host information at all: query
offsets are ``arange * q``, the slot of each token comes from the row's block table and
position, and the longest query is ``q`` (``kernels.step_metadata``: one launch). So a forward
is a pure function of device buffers, which is what a CUDA graph captures.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from transformers import PreTrainedModel

from .. import kernels
from ..cache import PagedBatch, PagedKVCache, paged_forward
from .eager_fusions import fused_class
from .fused_projections import GROUPS, SharedProjections
from .module_copies import copy_with
from .one_token_layers import mark_one_token_layers, one_token_class
from .rotary_attention import rotary_class


class PagedModel:
    def __init__(self, model: PreTrainedModel, cache: PagedKVCache, vocab_size: int,
                 call: Optional[Callable] = None, plain: Optional[PreTrainedModel] = None):
        self.model = model
        self.cache = cache
        self.vocab_size = vocab_size
        self.call = call  # a compiled model, or None for the model itself
        # what runs where nothing compiled does (prefills, eager one-offs, every forward without compile): the
        # model with fewer launches in its Llama-family layers (uncompiled_copy)
        self.plain = plain if plain is not None else model

    @property
    def reads_hidden(self) -> bool:
        """A draft head (``draft_head.py``): each forward reads features along with the tokens."""
        return getattr(self.model, "reads_target_hidden", False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, tables: torch.Tensor,
                seq_lens: torch.Tensor, q: int, last_only: bool, eager: bool = False, hidden: bool = False,
                features: Optional[torch.Tensor] = None, rows: Optional[torch.Tensor] = None,
                float_logits: bool = True):
        """``input_ids``/``positions`` ``(B*q,)``, row b's tokens at ``[b*q, (b+1)*q)``; ``seq_lens`` ``(B,)``
        lengths after the step. Returns fp32 logits ``(B, V)`` of each row's last token, or ``(B*q, V)``.
        ``eager``: the model uncompiled even when compiled (an odd one-off shape would recompile it).
        ``hidden`` (a target) or ``features`` ``(B*q, H)`` (a draft head): returns ``(logits, hidden states of every
        token (B*q, H))`` (``cache.paged_forward``). ``rows``: the token indices whose logits to compute instead.
        ``float_logits=False``: logits in the model's dtype, as a greedy draft without processors reads them."""
        block_size = self.cache.block_size
        slots, query_start_loc, lens, last = kernels.step_metadata(tables, positions, seq_lens, q, block_size)
        batch = PagedBatch(self.cache, tables, lens, query_start_loc, slots, positions, q)
        if rows is None and last_only and q > 1:
            rows = last  # else every token's logits are read: no gather (one token a row: the last is every one)
        call = self.plain if eager or self.call is None else self.call
        out = paged_forward(self.model, input_ids, batch, rows, call, hidden, features, float_logits)
        if isinstance(out, tuple):
            return align_vocab(out[0], self.vocab_size), out[1]
        return align_vocab(out, self.vocab_size)


def paged_models(models: dict, caches: dict, vocab_size: int, compiled: dict, plain_copies: dict,
                 signature: int, shared: dict) -> dict[str, PagedModel]:
    """A ``PagedModel`` per name of ``models``; ``compiled``: name -> compiled callable (where the call compiles);
    ``shared``: name -> the model's ``SharedProjections``.
    ``plain_copies`` (kept by the caller across calls): name -> (``signature``, the model's ``uncompiled_copy``,
    the model), made again when the models' signature (their modules and tensors) changed or the model's own
    ``forward`` was replaced on the instance (a wrapper or a spy set after the copy was made: the copy calls it)."""
    out = {}
    for name, model in models.items():
        kept = plain_copies.get(name)
        if kept is None or kept[0] != signature or kept[2] is not model or \
                kept[1].__dict__.get("forward") is not model.__dict__.get("forward"):
            kept = plain_copies[name] = (signature, uncompiled_copy(model, shared.get(name)), model)
        out[name] = PagedModel(model, caches[name], vocab_size, compiled.get(name), kept[1])
    return out


def uncompiled_copy(model: PreTrainedModel, shared: Optional[SharedProjections] = None,
                    one_token: bool = False) -> PreTrainedModel:
    """The copy of ``model`` that its uncompiled paged forwards run: Llama-family attention rotating and writing
    K/V in one launch (``rotary_attention.py``), RMSNorm and the MLP's activation in one each (``eager_fusions.py``);
    where ``shared`` fused a module's q/k/v or gate/up storage, that module's projections are one matmul. The
    one-token layers (``one_token_layers.py``) only with ``one_token``: the runner's rounds run this copy while the
    compiled one is being made, inside a process's first call, where each of their GEMV launches (four a model)
    would be one more Triton JIT compile; the compiled copy has them."""
    copy = copy_with(model, lambda module: (rotary_class(module) or fused_class(module)
                                            or (one_token_class(module) if one_token else None)))
    if one_token:
        mark_one_token_layers(copy, model)
    if shared is None or not shared.groups or copy is model:
        return copy
    originals = dict(model.named_modules())
    for name, module in copy.named_modules():
        for attribute, names in zip(("fused_qkv", "fused_gate_up"), GROUPS):
            if hasattr(type(module), attribute) and module is not originals[name]:  # a swapped copy: its own dict
                setattr(module, attribute, shared.fused(originals[name], names))
    return copy


def feature_layout(target: PreTrainedModel) -> tuple[int, torch.dtype]:
    """The target's hidden size and dtype: the features a draft head reads (its last hidden states)."""
    return target.config.get_text_config().hidden_size, target.get_output_embeddings().weight.dtype


def align_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Cut or -inf-pad the last dim to ``vocab_size`` (draft and target vocabularies that differ by padding)."""
    V = logits.shape[-1]
    if V == vocab_size:
        return logits
    if V > vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - V), float("-inf"))
    return torch.cat([logits, pad], dim=-1)
