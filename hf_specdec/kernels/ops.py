"""The kernels as torch custom ops (namespace ``hf_specdec``), so that ``torch.compile`` calls them opaquely.

Traced by dynamo, the Python launch wrappers would guard on every cache's strides and on
module globals (``MAX_KV_SPLITS``, ``LAUNCH_OVERRIDE``) once per layer, break the graph at
``torch.cuda.get_device_properties``, and hand Python floats to the Triton kernels as fp64
tensors (``scale`` once reached paged attention as fp64: "m_i ... fp32 re-assigned fp64").
As custom ops they are one node each: a fake implementation gives dynamo and AOTAutograd
the output shapes and dtypes, scalars arrive as typed ``int`` / ``float`` (``Optional``
where ``None`` means "off"), and ``write_kv_to_slots`` declares the caches it mutates.

Dispatch: CUDA tensors run the Triton kernel (the reference when Triton is not installed),
every other device runs the torch reference. Random numbers are never drawn here: custom
ops cannot take ``torch.Generator`` lists, so the wrappers in ``__init__.py`` draw the
noise and pass it in.

No ``from __future__ import annotations`` here: the op schemas are inferred from the
annotations, which must be real types on every supported torch.
"""
import importlib
import importlib.util
from typing import Callable, Optional

import torch
from torch import Tensor

from .commit_reference import commit_reference
from .decode_linear_reference import decode_linear_reference
from .ngram_lookup import ngram_drafts
from .paged_attention_reference import paged_attention_reference, write_kv_to_slots_reference
from .rejection_sampler_reference import rejection_sample_reference
from .rms_norm_reference import rms_norm_reference
from .rotary_paged_attention_reference import rotary_paged_attention_reference
from .rotary_write_kv_reference import rotary_write_kv_reference
from .silu_mul_reference import silu_mul_reference
from .step_metadata_reference import step_metadata_reference
from .typical_acceptance_reference import typical_accept_reference


HAS_TRITON = importlib.util.find_spec("triton") is not None


def _impl(tensor: Tensor, module: str, name: str, reference: Callable) -> Callable:
    """``module.name`` (a Triton launcher) for a CUDA ``tensor`` when Triton is installed, else ``reference``.
    Only a missing Triton falls back: a broken kernel module must fail loudly, not run the slow reference."""
    if tensor.is_cuda and HAS_TRITON:
        return getattr(importlib.import_module(f"{__package__}.{module}"), name)
    return reference


def _sampler_outputs(cu_num_draft_tokens: Tensor, like: Tensor, max_spec_len: int) -> tuple[Tensor, Tensor]:
    """Fake outputs of the samplers: ids ``(B, max_spec_len+1)`` and accepted counts ``(B,)``, int64."""
    B = cu_num_draft_tokens.shape[0]
    return (like.new_empty((B, max_spec_len + 1), dtype=torch.int64),
            like.new_empty((B,), dtype=torch.int64))


@torch.library.custom_op("hf_specdec::rejection_sample", mutates_args=())
def rejection_sample_op(
    draft_token_ids: Tensor,
    cu_num_draft_tokens: Tensor,
    draft_probs: Optional[Tensor],
    target_probs: Tensor,
    is_greedy: Tensor,
    max_spec_len: int,
    uniform_samples: Tensor,
    exponential_samples: Tensor,
) -> tuple[Tensor, Tensor]:
    fn = _impl(target_probs, "rejection_sampler_triton", "rejection_sample_triton", rejection_sample_reference)
    return fn(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, is_greedy, max_spec_len,
              uniform_samples, exponential_samples)


@rejection_sample_op.register_fake
def _(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, is_greedy, max_spec_len,
      uniform_samples, exponential_samples):
    return _sampler_outputs(cu_num_draft_tokens, target_probs, max_spec_len)


@torch.library.custom_op("hf_specdec::typical_accept", mutates_args=())
def typical_accept_op(
    draft_token_ids: Tensor,
    cu_num_draft_tokens: Tensor,
    target_probs: Tensor,
    max_spec_len: int,
    posterior_threshold: float,
    posterior_alpha: float,
    exponential_samples: Tensor,
) -> tuple[Tensor, Tensor]:
    fn = _impl(target_probs, "typical_acceptance_triton", "typical_accept_triton", typical_accept_reference)
    return fn(draft_token_ids, cu_num_draft_tokens, target_probs, max_spec_len, posterior_threshold,
              posterior_alpha, exponential_samples)


@typical_accept_op.register_fake
def _(draft_token_ids, cu_num_draft_tokens, target_probs, max_spec_len, posterior_threshold, posterior_alpha,
      exponential_samples):
    return _sampler_outputs(cu_num_draft_tokens, target_probs, max_spec_len)


@torch.library.custom_op("hf_specdec::write_kv_to_slots", mutates_args=("key_cache", "value_cache"))
def write_kv_to_slots_op(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                         slot_mapping: Tensor) -> None:
    fn = _impl(key, "paged_attention_triton", "write_kv_to_slots_triton", write_kv_to_slots_reference)
    fn(key, value, key_cache, value_cache, slot_mapping)


@write_kv_to_slots_op.register_fake
def _(key, value, key_cache, value_cache, slot_mapping):
    return None


@torch.library.custom_op("hf_specdec::rotary_write_kv", mutates_args=("key_cache", "value_cache"))
def rotary_write_kv_op(query: Tensor, key: Tensor, value: Tensor, cos: Tensor, sin: Tensor, key_cache: Tensor,
                       value_cache: Tensor, slot_mapping: Tensor, return_key: bool) -> tuple[Tensor, Tensor]:
    fn = _impl(query, "rotary_write_kv_triton", "rotary_write_kv_triton", rotary_write_kv_reference)
    return fn(query, key, value, cos, sin, key_cache, value_cache, slot_mapping, return_key)


@rotary_write_kv_op.register_fake
def _(query, key, value, cos, sin, key_cache, value_cache, slot_mapping, return_key):
    # both implementations return contiguous tensors
    return query.new_empty(query.shape), key.new_empty(key.shape if return_key else (0,))


@torch.library.custom_op("hf_specdec::rotary_paged_attention", mutates_args=("key_cache", "value_cache"))
def rotary_paged_attention_op(query: Tensor, key: Tensor, value: Tensor, cos: Tensor, sin: Tensor, key_cache: Tensor,
                              value_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, query_start_loc: Tensor,
                              slot_mapping: Tensor, max_query_len: int, scale: float,
                              sliding_window: Optional[int]) -> Tensor:
    fn = _impl(query, "rotary_paged_attention_triton", "rotary_paged_attention_triton",
               rotary_paged_attention_reference)
    return fn(query, key, value, cos, sin, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
              slot_mapping, max_query_len, scale, sliding_window)


@rotary_paged_attention_op.register_fake
def _(query, key, value, cos, sin, key_cache, value_cache, block_tables, seq_lens, query_start_loc, slot_mapping,
      max_query_len, scale, sliding_window):
    return query.new_empty(query.shape)  # both implementations return a contiguous tensor


@torch.library.custom_op("hf_specdec::rms_norm", mutates_args=())
def rms_norm_op(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return _impl(x, "rms_norm_triton", "rms_norm_triton", rms_norm_reference)(x, weight, eps)


@rms_norm_op.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype))


@torch.library.custom_op("hf_specdec::silu_mul", mutates_args=())
def silu_mul_op(gate: Tensor, up: Tensor) -> Tensor:
    return _impl(gate, "silu_mul_triton", "silu_mul_triton", silu_mul_reference)(gate, up)


@silu_mul_op.register_fake
def _(gate, up):
    return gate.new_empty(gate.shape, dtype=torch.promote_types(gate.dtype, up.dtype))


@torch.library.custom_op("hf_specdec::paged_attention", mutates_args=())
def paged_attention_op(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    max_query_len: int,
    scale: float,
    sliding_window: Optional[int],
    softcap: Optional[float],
) -> Tensor:
    fn = _impl(query, "paged_attention_triton", "paged_attention_triton", paged_attention_reference)
    return fn(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, max_query_len, scale,
              sliding_window, softcap)


@paged_attention_op.register_fake
def _(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, max_query_len, scale,
      sliding_window, softcap):
    return query.new_empty(query.shape)  # both implementations return a contiguous tensor


@torch.library.custom_op("hf_specdec::decode_linear", mutates_args=())
def decode_linear_op(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    fn = _impl(x, "decode_linear_triton", "decode_linear_triton", decode_linear_reference)
    return fn(x, weight, bias)


@decode_linear_op.register_fake
def _(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("hf_specdec::decode_linear_fused", mutates_args=())
def decode_linear_fused_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], norm_weight: Optional[Tensor],
                           eps: float, gated: bool, residual: Optional[Tensor]) -> Tensor:
    fn = _impl(x, "decode_linear_triton", "decode_linear_triton", decode_linear_reference)
    return fn(x, weight, bias, norm_weight, eps, gated, residual)


@decode_linear_fused_op.register_fake
def _(x, weight, bias, norm_weight, eps, gated, residual):
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2 if gated else weight.shape[0]))


@torch.library.custom_op("hf_specdec::commit_round", mutates_args=(
    "hist", "length", "gen", "done", "keep_out", "accepted_out", "stat_rows", "stat_drafted", "stat_draft_tokens",
    "stat_accepted", "stat_per_position"))
def commit_round_op(emitted: Tensor, accepted: Tensor, hist: Tensor, pads: Tensor, length: Tensor, gen: Tensor,
                    done: Tensor, max_new: Tensor, eos: Tensor, counts: Tensor, keep_out: Tensor, accepted_out: Tensor,
                    stat_rows: Tensor, stat_drafted: Tensor, stat_draft_tokens: Tensor, stat_accepted: Tensor,
                    stat_per_position: Tensor, k: int) -> None:
    fn = _impl(hist, "commit_triton", "commit_triton", commit_reference)
    fn(emitted, accepted, hist, pads, length, gen, done, max_new, eos, counts, keep_out, accepted_out,
       (stat_rows, stat_drafted, stat_draft_tokens, stat_accepted, stat_per_position), k)


@commit_round_op.register_fake
def _(emitted, accepted, hist, pads, length, gen, done, max_new, eos, counts, keep_out, accepted_out, stat_rows,
      stat_drafted, stat_draft_tokens, stat_accepted, stat_per_position, k):
    return None


@torch.library.custom_op("hf_specdec::step_metadata", mutates_args=())
def step_metadata_op(tables: Tensor, positions: Tensor, seq_lens: Tensor, q: int,
                     block_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    fn = _impl(tables, "step_metadata_triton", "step_metadata_triton", step_metadata_reference)
    return fn(tables, positions, seq_lens, q, block_size)


@step_metadata_op.register_fake
def _(tables, positions, seq_lens, q, block_size):
    B = tables.shape[0]
    return (positions.new_empty(B * q, dtype=torch.long), tables.new_empty(B + 1, dtype=torch.int32),
            tables.new_empty(B, dtype=torch.int32), positions.new_empty(B, dtype=torch.long))


@torch.library.custom_op("hf_specdec::ngram_drafts", mutates_args=())
def ngram_drafts_op(tokens: Tensor, pads: Tensor, length: Tensor, k: int, min_n: int,
                    max_n: int) -> tuple[Tensor, Tensor]:
    fn = _impl(tokens, "ngram_lookup_triton", "ngram_drafts_triton", ngram_drafts)
    return fn(tokens, pads, length, k, min_n, max_n)


@ngram_drafts_op.register_fake
def _(tokens, pads, length, k, min_n, max_n):
    return tokens.new_empty((tokens.shape[0], k)), tokens.new_empty(tokens.shape[0], dtype=torch.long)
