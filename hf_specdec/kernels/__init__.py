"""Kernels of a speculative round, each a Triton kernel beside a torch reference of the same signature.

``rejection_sample``, ``typical_accept``, ``write_kv_to_slots`` and ``paged_attention`` dispatch: on CUDA
tensors to the Triton kernel where one exists, elsewhere (CPU) to the reference.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .paged_attention_reference import paged_attention_reference, write_kv_to_slots_reference
from .rejection_sampler_reference import PLACEHOLDER_TOKEN_ID, rejection_sample_reference
from .sampling_noise import draw_acceptance_noise
from .typical_acceptance_reference import typical_accept_reference


def _triton_module(name: str, tensor: torch.Tensor):
    """The Triton implementation module ``name`` when ``tensor`` lives on a CUDA device, else None."""
    if not tensor.is_cuda:
        return None
    try:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    except ImportError:
        return None


def rejection_sample(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    target_probs: torch.Tensor,
    is_greedy: torch.Tensor,
    max_spec_len: int,
    generators: Optional[Sequence[Optional[torch.Generator]]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify flattened ragged drafts; returns ``(B, max_spec_len+1)`` ids (-1 padded) and accepted counts."""
    uniform, exponential = draw_acceptance_noise(
        cu_num_draft_tokens, draft_token_ids.shape[0], target_probs.shape[-1], target_probs.device, generators
    )
    impl = _triton_module("rejection_sampler_triton", target_probs)
    fn = impl.rejection_sample_triton if impl is not None else rejection_sample_reference
    return fn(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, is_greedy,
              max_spec_len, uniform, exponential)


def typical_accept(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    max_spec_len: int,
    posterior_threshold: float,
    posterior_alpha: float,
    generators: Optional[Sequence[Optional[torch.Generator]]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Typical acceptance of flattened ragged drafts; returns ``(B, max_spec_len+1)`` ids (-1 padded) and accepted counts."""
    _, exponential = draw_acceptance_noise(
        cu_num_draft_tokens, draft_token_ids.shape[0], target_probs.shape[-1], target_probs.device, generators
    )
    impl = _triton_module("typical_acceptance_triton", target_probs)
    fn = impl.typical_accept_triton if impl is not None else typical_accept_reference
    return fn(draft_token_ids, cu_num_draft_tokens, target_probs, max_spec_len,
              posterior_threshold, posterior_alpha, exponential)


def write_kv_to_slots(key, value, key_cache, value_cache, slot_mapping) -> None:
    impl = _triton_module("paged_attention_triton", key)
    fn = impl.write_kv_to_slots_triton if impl is not None else write_kv_to_slots_reference
    fn(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                    max_query_len, scale, sliding_window=None, softcap=None) -> torch.Tensor:
    impl = _triton_module("paged_attention_triton", query)
    fn = impl.paged_attention_triton if impl is not None else paged_attention_reference
    return fn(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
              max_query_len, scale, sliding_window, softcap)


__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "draw_acceptance_noise",
    "paged_attention",
    "paged_attention_reference",
    "rejection_sample",
    "rejection_sample_reference",
    "typical_accept",
    "typical_accept_reference",
    "write_kv_to_slots",
    "write_kv_to_slots_reference",
]
