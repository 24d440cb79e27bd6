"""The paged attention function, registered with transformers' ``AttentionInterface``.

``paged_forward`` calls a model with ``use_cache=False``, its packed tokens as a batch
of one, per-token ``position_ids`` and a ``PagedBatch`` under the forward keyword
``PAGED_BATCH_KWARG``; transformers hands that keyword to every attention layer. For
the duration of that call only, the model's configs name ``ATTN_NAME`` as their
attention implementation. The function writes the layer's new, already rotated K/V
into their slots and attends each query to its own sequence's cached keys (causal,
sliding window, soft-capping and scaling as the layer passes them). transformers
builds no mask for a name it has no mask function for, so a paged forward costs no
mask construction (and no host synchronisation for packed-sequence detection).

The switch is per forward, not per ``paged_attention_enabled`` block, because an
ordinary forward under ``ATTN_NAME`` would get no attention mask at all: padding, a
DynamicCache's offset and sliding windows would be silently lost. So ordinary calls
made while generation runs (inside ``paged_attention_enabled``) use the user's own
implementation and masks, unchanged. A call that reaches the function without a
``PagedBatch`` is delegated to the original implementation.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from typing import Iterator, Optional

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..kernels import paged_attention, rotary_paged_attention, rotary_write_kv, write_kv_to_slots
from .devices import hidden_states_device, input_device, kwargs_left_in_place

ATTN_NAME = "hf_specdec_paged"
PAGED_BATCH_KWARG = "hf_specdec_batch"

# Keyword arguments a layer may pass that change the attention it asks for; refusing
# them beats silently computing something else.
_UNSUPPORTED_KWARGS = ("s_aux", "sinks", "attention_chunk_size", "cu_seq_lens_q")

_original_impl: dict[int, str] = {}  # id(config) -> implementation to delegate to

# Prompts of up to PROMPT_FLASH_MAX_TOKENS on a GPU attend by flash or memory-efficient kernels, not cuDNN's. torch
# 2.11 picks cuDNN's on Hopper, which builds a plan for every new sequence length (40-65 ms each on an H200) and, with
# an empty CUDA cache (a machine's first process), compiles its kernels at run time first (0.4-1.3 s a head size and
# tile); flash's serve any length (10-20 ms for a kernel's first use in a process, 0.3 ms for a new length).
# Longer prompts keep torch's choice: cuDNN's kernel is faster there (8B shapes: 214 against 240 ms for the
# prefill of 8192 tokens). benchmarks/sdpa_first_use.py; docs/first_call.md. The backend flags are global: the
# lock keeps two of our threads from restoring each other's.
CUDNN_PROMPT_ATTENTION_ENV = "HF_SPECDEC_CUDNN_PROMPT_ATTENTION"  # "1": torch's choice at every length
PROMPT_FLASH_MAX_TOKENS = 1024
_PROMPT_SDPA_LOCK = threading.Lock()


def _delegate(module):
    """The attention function of the module's original implementation (its own eager one for "eager")."""
    original = _original_impl.get(id(module.config), "sdpa")
    if original == "eager":
        eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        return eager if eager is not None else sdpa_attention_forward
    if original == ATTN_NAME or original not in ALL_ATTENTION_FUNCTIONS:
        return sdpa_attention_forward
    return ALL_ATTENTION_FUNCTIONS[original]


@torch.compiler.disable
def paged_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Outside every compiled region (a graph break): what it reads per layer (``module.layer_idx``, that layer's
    pools) would otherwise become a guard of the compiled layer, and each of a model's layers would compile its own
    copy; this way one compiled decoder layer serves them all (``runner/compiled_regions.py``). Its kernels are
    custom ops, so under CUDA graphs the break costs nothing at replay."""
    batch = kwargs.pop(PAGED_BATCH_KWARG, None)
    if batch is None:
        return _delegate(module)(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
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
    batch = batch.on(q.device)  # accelerate may place this layer on another device than the metadata
    with _launch_device(q):
        write_kv_to_slots(k, v, key_pool, value_pool, batch.slot_mapping)
        if _fresh_spans_fit(batch.fresh, kwargs.get("sliding_window"), kwargs.get("softcap")):
            return _prompt_attention(module, query, key, value, scaling, batch.fresh, batch.slot_mapping >= 0), None
        out = _paged(q.contiguous(), key_pool, value_pool, batch, scaling, kwargs.get("sliding_window"),
                     kwargs.get("softcap"))
    return out.unsqueeze(0), None


@torch.compiler.disable
def paged_rotary_attention(module, query, key, value, cos, sin, scaling, sliding_window, batch) -> torch.Tensor:
    """``paged_attention_forward`` for a layer that hands over its queries and keys before the rotary
    (``runner/rotary_attention.py``): ``query`` ``(T, heads, D)``, ``key``/``value`` ``(T, kv_heads, D)``,
    ``cos``/``sin`` ``(T, D)``. Prompts read from position 0: one launch rotates q and k and writes K/V
    (``kernels.rotary_write_kv``), then the model's own attention runs over the rotated keys it also returned.
    Other steps: ``kernels.rotary_paged_attention``, one launch that rotates, writes and attends over the paged
    caches for a decode, verify or catch-up step (up to 32 tokens a row; longer, the two kernels). Returns
    ``(T, heads, D)``."""
    key_pool, value_pool = batch.cache.layer_pools(module.layer_idx, key)
    batch = batch.on(query.device)
    with _launch_device(query):
        if _fresh_spans_fit(batch.fresh, sliding_window, None):
            q, k = rotary_write_kv(query, key, value, cos, sin, key_pool, value_pool, batch.slot_mapping, True)
            heads_first = (x.transpose(0, 1)[None] for x in (q, k, value))  # (1, heads, T, D), as transformers'
            return _prompt_attention(module, *heads_first, scaling, batch.fresh, batch.slot_mapping >= 0)[0]
        return rotary_paged_attention(query, key, value, cos, sin, key_pool, value_pool, batch.block_tables,
                                      batch.seq_lens, batch.query_start_loc, batch.slot_mapping, batch.max_query_len,
                                      _scale(scaling, query), sliding_window)


def _paged(q, key_pool, value_pool, batch, scaling, sliding_window, softcap) -> torch.Tensor:
    """The paged kernel over ``q`` ``(T, heads, D)`` (contiguous), after its K/V were written."""
    return paged_attention(q, key_pool, value_pool, batch.block_tables, batch.seq_lens, batch.query_start_loc,
                           batch.max_query_len, _scale(scaling, q), sliding_window, softcap)


def _scale(scaling, query) -> float:
    """The layer's attention scale, or head_dim^-0.5 where it passes none."""
    return scaling if scaling is not None else query.shape[-1] ** -0.5


def _fresh_spans_fit(spans, window, softcap) -> bool:
    """Prompts read from position 0 go through the model's own attention (a flash / cuDNN kernel on GPU, about 3x the
    paged kernel's speed on an 8k prompt), unless a soft-cap or a window shorter than a span needs the paged kernel."""
    return spans is not None and softcap is None and (window is None or all(e - s <= window for s, e in spans))


def _prompt_attention(module, query, key, value, scaling, spans, real: torch.Tensor) -> torch.Tensor:
    """Causal self-attention of each span of the packed tokens, by Hugging Face's sdpa function (what plain
    ``generate()`` computes for a prompt); tokens outside every span get zeros. ``(1, T, heads, dim)``.
    ``real`` (T,): False for padding tokens (a fixed-shape prefill's tail), whose K/V are zeroed: they follow the
    real ones, so no real token attends them, but garbage there (NaN) would leak through a masked softmax."""
    keep = real[None, None, :, None]
    key, value = torch.where(keep, key, 0), torch.where(keep, value, 0)
    with prompt_sdpa_backends(query.device, max(e - s for s, e in spans)):
        if spans == ((0, query.shape[2]),):  # one row, prompt then padding (a b = 1 prefill): no zeros, no copy
            return sdpa_attention_forward(module, query, key, value, None, scaling=scaling, dropout=0.0)[0]
        out = query.new_zeros(1, query.shape[2], query.shape[1], query.shape[3])
        for s, e in spans:
            part, _ = sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None,
                                             scaling=scaling, dropout=0.0)
            out[:, s:e] = part
    return out


@contextlib.contextmanager
def prompt_sdpa_backends(device: torch.device, tokens: int) -> Iterator[None]:
    """On CUDA, scaled-dot-product attention of up to ``PROMPT_FLASH_MAX_TOKENS`` query tokens without cuDNN's
    backend inside (see ``CUDNN_PROMPT_ATTENTION_ENV``); anything else as torch chooses."""
    if device.type != "cuda" or tokens > PROMPT_FLASH_MAX_TOKENS or os.environ.get(CUDNN_PROMPT_ATTENTION_ENV) == "1":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with _PROMPT_SDPA_LOCK, sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


def _launch_device(t: torch.Tensor):
    """Triton launches on the *current* CUDA device: a layer (or draft) on another GPU switches to its own.
    Never while compiling: compiled models run on one device (CUDA graphs need it)."""
    if t.is_cuda and not torch.compiler.is_compiling() and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


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


def _attn_configs(model: PreTrainedModel) -> list:
    """The distinct config objects whose ``_attn_implementation`` the model's modules read."""
    configs = _configs_of.get(model)
    if configs is None:
        seen: dict[int, object] = {id(model.config): model.config}
        for module in model.modules():
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "_attn_implementation_internal"):
                seen.setdefault(id(config), config)
        _configs_of[model] = configs = list(seen.values())
    return configs


_configs_of: "weakref.WeakKeyDictionary[PreTrainedModel, list]" = weakref.WeakKeyDictionary()


# Paged forwards in flight per config (id -> count), from any thread: the runner's background compilation
# (runner/background_compile.py) runs paged forwards of a model while the caller's thread runs its own, and the
# first to finish must not hand the other's remaining layers back to the user's implementation.
_in_flight: dict[int, int] = {}
_saved_impl: dict[int, str] = {}  # id(config) -> the implementation to restore when its last paged forward ends
_switch_lock = threading.Lock()


@contextlib.contextmanager
def _paged_implementation(model: PreTrainedModel) -> Iterator[None]:
    """Name ``ATTN_NAME`` as the model's attention implementation for one forward (plain attribute writes)."""
    configs = _attn_configs(model)
    with _switch_lock:
        for config in configs:
            key = id(config)
            if not _in_flight.get(key):
                original = _saved_impl[key] = config._attn_implementation_internal
                if original != ATTN_NAME:
                    _original_impl[key] = original
                config._attn_implementation_internal = ATTN_NAME
            _in_flight[key] = _in_flight.get(key, 0) + 1
    try:
        yield
    finally:
        with _switch_lock:
            for config in configs:
                key = id(config)
                _in_flight[key] -= 1
                if not _in_flight[key]:
                    del _in_flight[key]
                    config._attn_implementation_internal = _saved_impl.pop(key)
                    _original_impl.pop(key, None)


@contextlib.contextmanager
def paged_attention_enabled(*models: PreTrainedModel) -> Iterator[None]:
    """Check that ``models`` can run on the paged cache; ``paged_forward`` may then be called on them.

    Raises before anything changes if one of them cannot (see ``check_paged_support``).
    The user's attention implementation stays in force for every other call, and is what
    the models have after the block, also when it exits with an exception.
    """
    for model in models:
        check_paged_support(model)
    with _switch_lock:  # a paged forward of another thread in flight: the user's implementation is the one it saved
        saved = [(model, [(c, _saved_impl.get(id(c), c._attn_implementation_internal)) for c in _attn_configs(model)])
                 for model in models]
    try:
        yield
    finally:
        with _switch_lock:  # a paged forward of another thread still running restores its configs itself
            for _, configs in saved:
                for config, original in configs:
                    if id(config) not in _in_flight:
                        config._attn_implementation_internal = original


def paged_forward(model: PreTrainedModel, input_ids: torch.Tensor, batch, logits_rows: Optional[torch.Tensor],
                  call=None, hidden: bool = False, features: Optional[torch.Tensor] = None, float_logits: bool = True):
    """One packed forward over ``input_ids`` ``(T,)``; returns fp32 logits of the rows ``logits_rows`` (None: of
    every token, in order, with no gather: a decode step's and a verify's case).
    ``call``: what to invoke instead of ``model`` itself (its compiled version).
    ``hidden``: also return the last hidden state of every token ``(T, H)``, the features a draft head reads: the
    model's decoder runs, then its output layer on ``logits_rows`` (and its final soft-cap), as its own forward does.
    ``features`` ``(T, H)``: the model is a draft head (``draft_head.py``) reading them; returns its logits and its
    own hidden states. ``float_logits=False``: the logits in the model's dtype (no cast kernel)."""
    device = input_device(model)
    cast = (lambda x: x.float()) if float_logits else (lambda x: x)
    m = call if call is not None else model
    args = dict(input_ids=input_ids[None].to(device), position_ids=batch.positions[None].to(device),
                **{PAGED_BATCH_KWARG: batch})
    with _paged_implementation(model), kwargs_left_in_place(model, "logits_to_keep"):
        rows = None if logits_rows is None else logits_rows.to(hidden_states_device(model))  # indexes the last layer
        if features is not None:  # a head, compiled whole: its inputs detach()ed, the same memory but no view's base
            # (torch.compile guards on the sizes of a view's base: history rows, a (rows, tokens, width) features
            # buffer, the head's own last output; each layout would compile the head again)
            args.update(input_ids=args["input_ids"].detach(), position_ids=args["position_ids"].detach())
            out = m(features=features[None].detach(), logits_to_keep=None if rows is None else rows.detach(), **args)
            return cast(out.logits[0]), out.hidden[0]
        if hidden:
            states = m.get_decoder()(use_cache=False, **args).last_hidden_state
            kept = states if rows is None else states[:, rows]
            logits = m.get_output_embeddings()(kept)[0]  # (1, n, H) in: the shape its forward passes
            softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
            if softcap is not None:  # in the model's dtype, as its forward does
                logits = torch.tanh(logits / softcap) * softcap
            return cast(logits), states[0]
        out = m(use_cache=False, logits_to_keep=0 if rows is None else rows, **args)  # 0: every token
    return cast(out.logits[0]).to(input_ids.device)
