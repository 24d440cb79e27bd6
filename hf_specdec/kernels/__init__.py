"""Kernels of a speculative round, each a Triton kernel beside a torch reference of the same signature.

``rejection_sample``, ``typical_accept``, ``write_kv_to_slots``, ``rotary_write_kv``, ``rotary_paged_attention``,
``rms_norm``, ``silu_mul``, ``paged_attention``, ``decode_linear``, ``commit_round``, ``step_metadata`` and
``ngram_drafts`` call the custom ops of ``ops.py`` (``torch.ops.hf_specdec.*``): Triton on CUDA tensors, the reference
elsewhere, one opaque node each under ``torch.compile``. The samplers' random numbers are drawn
here, outside the ops (custom ops cannot take generators). Nothing here reads tensor values:
no host synchronisation, allocations by shape only (the wrappers run inside CUDA graphs).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import ops
from .commit_reference import commit_reference
from .decode_linear_reference import decode_linear_reference
from .device_constants import device_constant
from .ngram_lookup import ngram_drafts as ngram_drafts_torch
from .ngram_lookup import ngram_drafts_reference
from .paged_attention_reference import paged_attention_reference, write_kv_to_slots_reference
from .rejection_sampler_reference import PLACEHOLDER_TOKEN_ID, rejection_sample_reference
from .rms_norm_reference import rms_norm_reference
from .rotary_paged_attention_reference import rotary_paged_attention_reference
from .rotary_write_kv_reference import rotary_write_kv_reference
from .silu_mul_reference import silu_mul_reference
from .sampling_noise import draw_acceptance_noise, greedy_noise_placeholders
from .step_metadata_reference import slots_of, step_metadata_reference
from .typical_acceptance_reference import typical_accept_reference


def all_true(n: int, device: torch.device) -> torch.Tensor:
    """A ``(n,)`` bool mask of True (read-only, made once per size and device: an all-greedy verify's)."""
    return device_constant(("all true", n), device, lambda: torch.ones(n, dtype=torch.bool, device=device))


def _int(x):
    """A Python (or symbolic) int for an ``int`` schema argument; ``int()`` on a SymInt would specialise it."""
    return x if isinstance(x, (int, torch.SymInt)) else int(x)


def _float(x):
    """A Python (or symbolic) float: an int ``scale`` must not reach a Triton kernel as an integer."""
    return x if isinstance(x, (float, torch.SymFloat)) else float(x)


def rejection_sample(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    target_probs: torch.Tensor,
    is_greedy: torch.Tensor,
    max_spec_len: int,
    generators: Optional[Sequence[Optional[torch.Generator]]] = None,
    *,
    all_greedy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify flattened ragged drafts; returns ``(B, max_spec_len+1)`` ids (-1 padded) and accepted counts.

    ``all_greedy=True`` says every row is greedy (the caller knows; ``is_greedy.all()`` would
    synchronise): every row is then verified greedily, whatever ``is_greedy`` holds, and no
    random numbers are drawn (the generators and the global RNG do not advance).
    """
    if all_greedy:
        is_greedy = all_true(is_greedy.shape[0], is_greedy.device)  # no row can read the placeholders
        uniform, exponential = greedy_noise_placeholders(target_probs.device)
    else:
        uniform, exponential = draw_acceptance_noise(
            cu_num_draft_tokens, draft_token_ids.shape[0], target_probs.shape[-1], target_probs.device, generators
        )
    return ops.rejection_sample_op(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, is_greedy,
                                   _int(max_spec_len), uniform, exponential)


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
    _, exponential = draw_acceptance_noise(cu_num_draft_tokens, draft_token_ids.shape[0], target_probs.shape[-1],
                                           target_probs.device, generators, with_uniform=False)
    return ops.typical_accept_op(draft_token_ids, cu_num_draft_tokens, target_probs, _int(max_spec_len),
                                 _float(posterior_threshold), _float(posterior_alpha), exponential)


def write_kv_to_slots(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Write ``key``/``value`` ``(T, kv_heads, head_dim)`` into the caches' flat slots ``slot_mapping`` (in place)."""
    ops.write_kv_to_slots_op(key, value, key_cache, value_cache, slot_mapping)


def rotary_write_kv(query, key, value, cos, sin, key_cache, value_cache, slot_mapping,
                    return_key: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` ``(T, heads, D)`` and ``key`` ``(T, kv_heads, D)`` by ``cos``/``sin`` ``(T, D)``
    (transformers' ``rotate_half`` layout), write the rotated keys and ``value`` into the flat slots
    ``slot_mapping`` (in place); returns the rotated queries and, with ``return_key``, the rotated keys (else an
    empty tensor). One launch on CUDA (``rotary_write_kv_triton.py``)."""
    return ops.rotary_write_kv_op(query, key, value, cos, sin, key_cache, value_cache, slot_mapping, bool(return_key))


def rotary_paged_attention(query, key, value, cos, sin, key_cache, value_cache, block_tables, seq_lens,
                           query_start_loc, slot_mapping, max_query_len, scale, sliding_window=None) -> torch.Tensor:
    """A decode or verify step's attention from its queries and keys before the rotary: rotate, write the new keys
    and values into ``slot_mapping`` (in place), attend over the paged caches; ``(T, heads, D)``. One launch on CUDA
    where ``rotary_write_kv`` then ``paged_attention`` are two (``rotary_paged_attention_triton.py``), plus the
    split-KV combine where the keys are split."""
    return ops.rotary_paged_attention_op(
        query, key, value, cos, sin, key_cache, value_cache, block_tables, seq_lens, query_start_loc, slot_mapping,
        _int(max_query_len), _float(scale), None if sliding_window is None else _int(sliding_window))


def rms_norm(x, weight, eps) -> torch.Tensor:
    """transformers' Llama-family RMSNorm of ``x`` ``(..., H)`` with ``weight`` ``(H,)``: one launch on CUDA
    (``rms_norm_triton.py``) where eagerly it is seven."""
    return ops.rms_norm_op(x, weight, _float(eps))


def silu_mul(gate, up) -> torch.Tensor:
    """``F.silu(gate) * up`` (a gated MLP's activation): one launch on CUDA (``silu_mul_triton.py``)."""
    return ops.silu_mul_op(gate, up)


def paged_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                    max_query_len, scale, sliding_window=None, softcap=None) -> torch.Tensor:
    """Causal attention of packed ragged queries over the paged caches; ``(T, heads, head_dim)``."""
    return ops.paged_attention_op(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, _int(max_query_len), _float(scale),
        None if sliding_window is None else _int(sliding_window), None if softcap is None else _float(softcap),
    )


def commit_round(emitted, accepted, hist, pads, length, gen, done, max_new, eos, counts, keep_out, accepted_out,
                 stats, k: int) -> None:
    """Append each live row's run (``emitted`` ``(B, k+1)``, ``accepted`` ``(B,)``) to ``hist`` up to its first EOS
    and ``max_new``; advance ``length``, ``gen``, ``done``; write ``keep_out`` / ``accepted_out``; add the round's
    five statistics (``stats``). One launch on CUDA (``commit_triton.py``); layout in ``commit_reference.py``."""
    ops.commit_round_op(emitted, accepted, hist, pads, length, gen, done, max_new, eos, counts, keep_out,
                        accepted_out, *stats, _int(k))


def step_metadata(tables, positions, seq_lens, q: int, block_size: int):
    """A fixed-shape forward's paged metadata, ``q`` tokens a row: ``(slots, query_start_loc, seq_lens as int32,
    each row's last token)``; one launch on CUDA (``step_metadata_triton.py``)."""
    return ops.step_metadata_op(tables, positions, seq_lens, _int(q), _int(block_size))


def ngram_drafts(tokens, pads, length, k: int, min_n: int, max_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt lookup for every row (``ngram_lookup.py``): drafts ``(B, k)`` and counts ``(B,)``; one launch on CUDA
    (``ngram_lookup_triton.py``), the torch version elsewhere."""
    return ops.ngram_drafts_op(tokens, pads, length, _int(k), _int(min_n), _int(max_n))


def decode_linear(x, weight, bias=None, *, norm_weight=None, eps: float = 0.0, gated: bool = False,
                  residual=None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, after the model's RMSNorm (``norm_weight``, ``eps``), followed by SiLU·up
    (``gated``: a [gate; up] weight) and the residual add (``residual``) where given (``decode_linear_reference``).
    One half-precision row on a Hopper GPU runs ``decode_linear_triton``'s GEMV in one launch with all of them (the
    plain matmul only where it beats cuBLAS)."""
    if norm_weight is None and not gated and residual is None:
        return ops.decode_linear_op(x, weight, bias)
    return ops.decode_linear_fused_op(x, weight, bias, norm_weight, _float(eps), bool(gated), residual)


def decode_fusions_run(weight: torch.Tensor) -> bool:
    """Whether ``decode_linear``'s fusions suit a model with weights like ``weight``: on a Hopper GPU in half
    precision each is one GEMV launch; on the CPU the references compute the model's own operations. Elsewhere
    (another GPU, float32) they would run one by one: slower than Inductor, which fuses the residual add with the
    norm after it."""
    if not weight.is_cuda:
        return True
    if not ops.HAS_TRITON or weight.dtype not in (torch.bfloat16, torch.float16):
        return False
    from .decode_linear_triton import measured_gpu

    return measured_gpu(weight.device) is not None


__all__ = [
    "all_true",
    "commit_round",
    "commit_reference",
    "decode_fusions_run",
    "decode_linear",
    "decode_linear_reference",
    "device_constant",
    "PLACEHOLDER_TOKEN_ID",
    "draw_acceptance_noise",
    "greedy_noise_placeholders",
    "ngram_drafts",
    "ngram_drafts_reference",
    "ngram_drafts_torch",
    "paged_attention",
    "paged_attention_reference",
    "rejection_sample",
    "rejection_sample_reference",
    "rms_norm",
    "rms_norm_reference",
    "rotary_paged_attention",
    "rotary_paged_attention_reference",
    "rotary_write_kv",
    "rotary_write_kv_reference",
    "silu_mul",
    "silu_mul_reference",
    "slots_of",
    "step_metadata",
    "step_metadata_reference",
    "typical_accept",
    "typical_accept_reference",
    "write_kv_to_slots",
    "write_kv_to_slots_reference",
]
