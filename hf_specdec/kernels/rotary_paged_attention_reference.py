"""A decode or verify step's attention of a Llama-family layer, from its queries and keys before the rotary.

The layer hands over ``query`` ``(T, heads, D)``, ``key`` / ``value`` ``(T, kv_heads, D)`` and the tokens' angles
``cos`` / ``sin`` ``(T, D)``. What the step computes is two kernels' work in order:

    q, k  = rotary(query, key)                              (rotary_write_kv_reference: transformers' formula)
    cache[slot_mapping[t]] = (k[t], value[t])               (a negative slot writes nothing)
    out   = paged_attention(q, caches, block_tables, ...)   (paged_attention_reference: causal, sliding window)

``rotary_paged_attention_triton.py`` does all of it in one launch: the new tokens' keys and values are attended
from the registers that store them, so no program reads a slot another program of the same launch writes. This
reference is that sequence of the two references, so the CPU path computes exactly what it did before the fusion.
"""
from __future__ import annotations

from typing import Optional

import torch

from .paged_attention_reference import paged_attention_reference
from .rotary_write_kv_reference import rotary_write_kv_reference


def rotary_paged_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    slot_mapping: torch.Tensor,
    max_query_len: int,
    scale: float,
    sliding_window: Optional[int] = None,
) -> torch.Tensor:
    """Rotate, write the new keys and values into ``slot_mapping`` (in place), attend; ``(T, heads, D)`` in the
    query's dtype. Token ``i`` of row ``b`` sits at position ``seq_lens[b] - qlen_b + i`` and ``slot_mapping`` holds
    that position's slot (``step_metadata``'s layout)."""
    q, _ = rotary_write_kv_reference(query, key, value, cos, sin, key_cache, value_cache, slot_mapping, False)
    return paged_attention_reference(q, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                                     max_query_len, scale, sliding_window, None)
