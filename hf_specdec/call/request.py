"""Checks of a speculative generate() request and sizing of the two paged caches.

Every refusal names the problem and the fix; nothing is generated for a request that
cannot be served exactly.
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
from transformers import GenerationConfig, PreTrainedModel

from ..cache import blocks_for, check_paged_support
from ..cache.devices import is_split
from .arguments import check_draft_model
from .batch_state import SequenceBatch
from .config import SpecConfig
from .tensor_parallel import tp_size

# Vocabularies padded for efficiency differ by at most this many (unused) rows.
_MAX_VOCAB_PADDING = 256
_UNSUPPORTED_MODEL_KWARGS = ("inputs_embeds", "encoder_outputs", "pixel_values")
# Where generate() keeps its KV cache in model_kwargs: `cache` in transformers 5.24, `past_key_values` in 5.17.
_CACHE_KWARGS = ("cache", "past_key_values")


def cache_keyword(model) -> str:
    """The keyword under which this transformers' ``model.forward`` takes a KV cache: ``cache`` (5.24 warns on
    ``past_key_values``, 5.40 removes it) or, on releases before the rename, ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "past_key_values" if "past_key_values" in params and "cache" not in params else "cache"


def _check_no_user_cache(model_kwargs: dict) -> None:
    """generate() puts a fresh cache of its own in model_kwargs; one the user passed would be left unfilled
    and unreturned (plain generate() extends it), so it is refused rather than ignored."""
    for name in _CACHE_KWARGS:
        cache = model_kwargs.get(name)
        if cache is None:
            continue
        held = cache.get_seq_length() if hasattr(cache, "get_seq_length") else 0
        if getattr(cache, "_is_user_defined", False) or held:
            raise ValueError(
                f"hf_specdec keeps its own paged KV cache and cannot use the {type(cache).__name__} passed to "
                f"generate() (as `{name}`, holding {held} tokens). Drop the `cache=` / `past_key_values=` "
                "argument: the whole sequence goes in input_ids and its prompt is prefilled."
            )


@dataclass
class Request:
    do_sample: bool
    max_new_tokens: int
    vocab_size: int
    eos_token_ids: list
    pad_token_id: int


def _as_list(x) -> list:
    if x is None:
        return []
    if isinstance(x, torch.Tensor):
        return x.flatten().tolist()
    return list(x) if isinstance(x, (list, tuple)) else [x]


def check_vocabularies(target: PreTrainedModel, draft: PreTrainedModel) -> int:
    t_cfg, d_cfg = target.config.get_text_config(), draft.config.get_text_config()
    vt, vd = t_cfg.vocab_size, d_cfg.vocab_size
    if abs(vt - vd) > _MAX_VOCAB_PADDING:
        raise ValueError(
            f"draft and target vocabularies differ: target {type(target).__name__} has {vt} tokens, draft "
            f"{type(draft).__name__} has {vd}. Speculative decoding needs a draft with the target's tokenizer "
            "(vocabularies may differ only by padding rows)."
        )
    _check_draft_embeds_target_ids(target, draft, vt)
    for name in ("bos_token_id", "eos_token_id"):
        a, b = _as_list(getattr(t_cfg, name, None)), _as_list(getattr(d_cfg, name, None))
        if a and b and not set(a) & set(b):
            raise ValueError(
                f"draft and target disagree on {name} ({b} vs {a}): they were not trained with the same tokenizer. "
                "Use a draft that shares the target's tokenizer."
            )
    return vt


def _check_draft_embeds_target_ids(target: PreTrainedModel, draft: PreTrainedModel, vocab: int) -> None:
    """Every token the target can emit is fed to the draft next round: its embedding must have that row."""
    head = target.get_output_embeddings()
    emitted = min(vocab, head.weight.shape[0]) if head is not None and hasattr(head, "weight") else vocab
    embedding = draft.get_input_embeddings()
    embedded = getattr(embedding, "num_embeddings", None) or embedding.weight.shape[0]
    if embedded < emitted:
        raise ValueError(
            f"the draft {type(draft).__name__} embeds token ids 0..{embedded - 1} only, but the target "
            f"{type(target).__name__} can emit ids up to {emitted - 1}: the draft would fail on the first such token. "
            "Use a draft with an embedding row for every id the target emits (a larger, padded vocabulary is fine)."
        )


def check_input_ids(input_ids: torch.Tensor) -> None:
    """Token ids, at least one sequence: what plain ``generate()`` fails on deep inside a model, refused by name."""
    if input_ids.dim() != 2 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids must hold at least one sequence, as a (batch, length) tensor; got shape "
                         f"{tuple(input_ids.shape)}. Call generate() only with a non-empty batch.")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must be integer token ids; got dtype {input_ids.dtype}. Pass the tokenizer's "
                         "ids (a LongTensor), e.g. input_ids.long() if they were converted by mistake.")


def check_request(model, draft_model, input_ids, generation_config: GenerationConfig, spec_config: SpecConfig,
                  model_kwargs: dict) -> Request:
    check_input_ids(input_ids)
    check_draft_model(draft_model)
    if spec_config.method == "ngram" and draft_model is not None:
        raise ValueError("SpecConfig(method='ngram') proposes from the prompt and output, not from a draft model; "
                         "drop assistant_model= or use method='draft'.")
    if getattr(draft_model, "reads_target_hidden", False):
        _check_head(model, draft_model)
    if draft_model is None and spec_config.num_speculative_tokens > 0 and spec_config.method == "draft":
        raise ValueError("speculative decoding needs a draft model: pass assistant_model=<draft> to generate() "
                         "(or SpecConfig(method='ngram') for prompt lookup without one).")
    if generation_config.num_beams is not None and generation_config.num_beams > 1:
        raise ValueError(f"hf_specdec does not do beam search (num_beams={generation_config.num_beams}); "
                         "use num_beams=1 or drop spec_config.")
    _check_decoding_mode(generation_config, getattr(model, "generation_config", None))
    for name in _UNSUPPORTED_MODEL_KWARGS:
        if model_kwargs.get(name) is not None:
            raise ValueError(f"hf_specdec does not accept `{name}`; pass input_ids (and attention_mask).")
    _check_no_user_cache(model_kwargs)
    check_paged_support(model)
    if draft_model is not None:
        check_paged_support(draft_model)
    if draft_model is not None:
        vocab = check_vocabularies(model, draft_model)
    else:
        vocab = model.config.get_text_config().vocab_size

    max_new = generation_config.max_length - input_ids.shape[1]
    if max_new < 1:
        raise ValueError(f"max_length ({generation_config.max_length}) leaves no room after the {input_ids.shape[1]}-token "
                         "prompt; set max_new_tokens.")
    mask = model_kwargs.get("attention_mask")
    longest = int(mask.sum(-1).max()) if mask is not None else input_ids.shape[1]
    for m in (model, draft_model) if draft_model is not None else (model,):
        limit = getattr(m.config.get_text_config(), "max_position_embeddings", None)
        if limit is not None and longest + max_new > limit:
            raise ValueError(
                f"a prompt of {longest} tokens plus max_new_tokens={max_new} exceeds {type(m).__name__}'s "
                f"max_position_embeddings ({limit}); shorten the prompt or lower max_new_tokens."
            )

    eos = _as_list(getattr(generation_config, "_eos_token_tensor", None)) or _as_list(generation_config.eos_token_id)
    pad = _as_list(getattr(generation_config, "_pad_token_tensor", None)) or _as_list(generation_config.pad_token_id)
    pad_id = pad[0] if pad else (eos[0] if eos else 0)
    return Request(bool(generation_config.do_sample), max_new, vocab, eos, pad_id)


# Each decoding mode that is neither greedy nor sampling (transformers' get_generation_mode): the settings that select
# it, and those shown beside them.
_MODE_SETTINGS = {"contrastive_search": (("penalty_alpha",), ("top_k",)), "dola_generation": (("dola_layers",), ()),
                  "constrained_beam_search": (("force_words_ids", "constraints"), ())}
_PER_STEP = ("output_attentions", "output_hidden_states")


def _check_decoding_mode(generation_config: GenerationConfig, model_default: Optional[GenerationConfig]) -> None:
    """Greedy decoding or sampling, as a speculative round reproduces; any other mode transformers would choose from
    these settings (contrastive search, DoLa, constrained search) is refused by name rather than run as greedy; so are
    per-step attentions and hidden states asked for in the call, which the rounds do not keep (asked for by the
    model's own generation_config, e.g. from ``from_pretrained(..., output_hidden_states=True)``: a warning)."""
    mode = str(getattr(generation_config.get_generation_mode(), "value", ""))
    if mode in _MODE_SETTINGS:
        selectors, shown = _MODE_SETTINGS[mode]
        names = [name for name in selectors if getattr(generation_config, name, None) is not None]
        settings = ", ".join(f"{name}={getattr(generation_config, name, None)!r}" for name in names + list(shown))
        raise ValueError(f"hf_specdec decodes greedily or by sampling; {settings} asks transformers for {mode}. "
                         f"Unset {' and '.join(names)}, or drop spec_config for {mode}.")
    if not generation_config.return_dict_in_generate:
        return
    for name in _PER_STEP:
        if not getattr(generation_config, name, False):
            continue
        what = name.split("_", 1)[1].replace("_", " ")
        if model_default is not None and getattr(model_default, name, False):
            warnings.warn(f"hf_specdec does not return per-step {what}; the model's generation_config asks for them "
                          f"({name}=True, e.g. from its config): the output leaves them out. Pass {name}=False to "
                          "generate() to say so.", UserWarning, stacklevel=6)
            continue
        raise ValueError(f"hf_specdec does not return per-step {what} ({name}=True); drop {name}, or drop "
                         "spec_config for them (output_scores and output_logits are returned).")


def _check_head(target: PreTrainedModel, head) -> None:
    """A draft head reads through its target's own embedding and output layer: it must be bound to this target,
    on one device with it."""
    if not head.bound_to(target):
        raise ValueError(f"this draft head is bound to another model than the target {type(target).__name__}: load "
                         "it for this one, load_draft_head(path, target=model).")
    if is_split(target) or tp_size(target) > 1:
        raise ValueError(f"{type(target).__name__} is split over devices (device_map or tensor parallelism); draft "
                         "heads read the target's hidden states on one device. Use a draft model there.")


def _bytes_per_token(model: PreTrainedModel) -> int:
    cfg = model.config.get_text_config()
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    kv_heads = max(1, kv_heads // tp_size(model))  # a tensor-parallel rank caches its own heads only
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * model.dtype.itemsize


def cache_budget(target: PreTrainedModel, draft, batch: SequenceBatch, spec: SpecConfig,
                 held_bytes: int = 0) -> tuple[Optional[int], str]:
    """Blocks per model's cache from SpecConfig (None: exactly what the call needs) and the hint an
    exhausted budget names. ``held_bytes``: pool memory this pair already holds (a runner reusing its
    pools), counted as free so that the budget does not shrink call after call."""
    bs = spec.block_size
    if spec.cache_tokens is not None:
        return blocks_for(spec.cache_tokens, bs), f"Raise SpecConfig.cache_tokens (now {spec.cache_tokens})."
    if spec.cache_memory_fraction is not None and batch.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(batch.device)
        per_block = bs * sum(_bytes_per_token(m) for m in (target, draft) if m is not None)
        blocks = int((free + held_bytes) * spec.cache_memory_fraction) // per_block
        return blocks, f"Raise SpecConfig.cache_memory_fraction (now {spec.cache_memory_fraction})."
    return None, "Set SpecConfig.cache_tokens to a larger budget."


def check_host_stops(criteria, eos_token_ids: list, batch_size: int) -> None:
    """Without an EOS token plain generate() keeps decoding a row that a stopping criterion stopped, until every row
    has stopped (it pads finished rows only when an EOS criterion exists); the rounds end each row at its own stop.
    That batch > 1 case is refused rather than answered differently."""
    if criteria and not eos_token_ids and batch_size > 1:
        names = ", ".join(sorted({type(c).__name__ for c in criteria}))
        raise ValueError(f"a stopping criterion ({names}) at batch {batch_size} without an EOS token: plain generate() "
                         "then keeps decoding a stopped row until every row stops, which speculative rounds do not "
                         "reproduce. Set eos_token_id (the tokenizer's EOS), or call generate() per row.")
