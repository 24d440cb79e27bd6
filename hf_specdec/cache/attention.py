"""The paged attention function, registered with transformers' ``AttentionInterface``.

A model switched to ``ATTN_NAME`` is called with ``use_cache=False``, its packed tokens
as a batch of one, per-token ``position_ids`` and a ``PagedBatch`` under the forward
keyword ``PAGED_BATCH_KWARG``; transformers hands that keyword to every attention layer.
The function writes the layer's new, already rotated K/V into their slots and attends
each query to its own sequence's cached keys (causal, sliding window, soft-capping and
scaling as the layer passes them). transformers builds no mask for a name it has no
mask function for, so a paged forward costs no mask construction.

A call without a ``PagedBatch`` (an ordinary forward while the switch is on) goes to
the model's original implementation. ``paged_attention_enabled`` restores the user's
setting on exit.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..kernels import paged_attention, write_kv_to_slots

ATTN_NAME = "hf_specdec_paged"
PAGED_BATCH_KWARG = "hf_specdec_batch"

# Keyword arguments a layer may pass that change the attention it asks for; refusing
# them beats silently computing something else.
_UNSUPPORTED_KWARGS = ("s_aux", "sinks", "attention_chunk_size", "cu_seq_lens_q")

_original_impl: dict[int, str] = {}  # id(config) -> implementation to delegate to


def paged_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    batch = kwargs.pop(PAGED_BATCH_KWARG, None)
    if batch is None:
        original = _original_impl.get(id(module.config), "sdpa")
        fn = sdpa_attention_forward if original == "eager" else ALL_ATTENTION_FUNCTIONS[original]
        return fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            raise NotImplementedError(
                f"{type(module).__name__} passes `{name}` to its attention, which hf_specdec's paged attention "
                "does not implement; this model cannot run on the paged cache."
            )
    # (1, heads, T, head_dim) -> (T, heads, head_dim)
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    key_pool, value_pool = batch.cache.layer_pools(module.layer_idx, k)
    write_kv_to_slots(k, v, key_pool, value_pool, batch.slot_mapping.to(k.device))
    dev = q.device  # accelerate may place this layer on another device than the metadata
    out = paged_attention(
        q.contiguous(), key_pool, value_pool, batch.block_tables.to(dev), batch.seq_lens.to(dev),
        batch.query_start_loc.to(dev),
        batch.max_query_len, scaling if scaling is not None else q.shape[-1] ** -0.5,
        kwargs.get("sliding_window"), kwargs.get("softcap"),
    )
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_NAME, paged_attention_forward)


def check_paged_support(model: PreTrainedModel) -> None:
    """Raise a clear error for a model whose attention does not go through the AttentionInterface."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"{type(model).__name__} is an encoder-decoder model; hf_specdec serves decoder-only models.")
    if not getattr(model, "_supports_attention_backend", False):
        raise ValueError(
            f"{type(model).__name__} does not route its attention through transformers' AttentionInterface "
            "(its class does not set `_supports_attention_backend`), so hf_specdec's paged KV cache cannot serve "
            "it. Use a model family that does (Llama, Mistral, Qwen2/3, Gemma, Phi3, GPT-2, OPT, ...)."
        )


@contextlib.contextmanager
def paged_attention_enabled(*models: PreTrainedModel) -> Iterator[None]:
    """Switch ``models`` to the paged attention function; restore their own setting on exit."""
    saved = []
    try:
        for model in models:
            check_paged_support(model)
            original = model.config._attn_implementation
            _original_impl[id(model.config)] = original
            saved.append((model, original))
            if original != ATTN_NAME:
                model.set_attn_implementation(ATTN_NAME)
        yield
    finally:
        for model, original in reversed(saved):
            if original != ATTN_NAME:
                model.set_attn_implementation(original)
            _original_impl.pop(id(model.config), None)


def paged_forward(model: PreTrainedModel, input_ids: torch.Tensor, batch, logits_rows: torch.Tensor) -> torch.Tensor:
    """One packed forward over ``input_ids`` ``(T,)``; returns fp32 logits of the rows ``logits_rows``."""
    device = model.get_input_embeddings().weight.device
    out = model(
        input_ids=input_ids[None].to(device),
        position_ids=batch.positions[None].to(device),
        use_cache=False,
        logits_to_keep=logits_rows.to(device),
        **{PAGED_BATCH_KWARG: batch},
    )
    return out.logits[0].float().to(input_ids.device)
