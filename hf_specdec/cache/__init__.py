"""Paged KV cache for the target and the draft model (see docs/architecture.md, "Paged KV cache")."""
from .attention import (ATTN_NAME, PAGED_BATCH_KWARG, check_paged_support, paged_attention_enabled, paged_forward,
                        paged_rotary_attention)
from .block_allocator import BlockAllocator, CacheBudgetError, blocks_for
from .devices import hidden_states_device, input_device, model_devices, same_device
from .paged_cache import PagedBatch, PagedKVCache

__all__ = [
    "ATTN_NAME", "PAGED_BATCH_KWARG", "BlockAllocator", "CacheBudgetError", "PagedBatch", "PagedKVCache",
    "blocks_for", "check_paged_support", "hidden_states_device", "input_device", "model_devices", "same_device",
    "paged_attention_enabled", "paged_forward", "paged_rotary_attention",
]
