"""``enable(model)``: give one model's ``generate()`` a ``spec_config=`` keyword.

transformers does not forward ``assistant_model`` or ``streamer`` to a ``custom_generate``
callable, so the wrapper moves them under the callable's own parameter names
(``draft_model``, ``spec_streamer``) and lets transformers do all its usual preparation.
Without ``spec_config`` the call goes to the original ``generate`` untouched; with it, the call
runs with the model's GPU as the current CUDA device.

transformers also drops ``tokenizer`` on that path, which stop strings need, so the
wrapper turns stop strings into Hugging Face's own ``StopStringCriteria`` itself.

Hugging Face's prompt lookup (``prompt_lookup_num_tokens=``, ``max_matching_ngram_size=``)
runs only at batch size 1; on an enabled model it becomes
``SpecConfig(method="ngram")``, batched, with the same meaning.
"""
from __future__ import annotations

import contextlib
import functools
import warnings

import torch
from transformers import PreTrainedModel, StoppingCriteriaList, StopStringCriteria

from .call.arguments import as_spec_config, check_tokenizers
from .call.config import SpecConfig
from .generate import speculative_generate
from .kernels.triton_startup import start_triton_startup
from .runner.graphs import CAPTURE_LOCK


def enable(model: PreTrainedModel) -> PreTrainedModel:
    if getattr(model.generate, "_hf_specdec_enabled", False):
        return model
    original = model.generate

    @functools.wraps(original)
    def generate(*args, spec_config=None, **kwargs):
        if spec_config is None:
            spec_config = _prompt_lookup_config(model, kwargs)
        if spec_config is None:
            with _after_background_tracing():
                return original(*args, **kwargs)
        if kwargs.get("custom_generate") is not None:
            raise ValueError("spec_config and custom_generate cannot be combined: spec_config already uses it.")
        spec_config = as_spec_config(spec_config)
        check_tokenizers(kwargs.get("tokenizer"), kwargs.pop("assistant_tokenizer", None))
        _stop_strings_as_criteria(model, kwargs)
        kwargs["draft_model"] = kwargs.pop("assistant_model", None)
        streamer = kwargs.pop("streamer", None)
        if streamer is not None:
            kwargs["spec_streamer"] = streamer
        _no_hf_cache(model, kwargs)
        with _current_device(model):
            return original(*args, custom_generate=speculative_generate, spec_config=spec_config, **kwargs)

    generate._hf_specdec_enabled = True
    model.generate = generate
    start_triton_startup(model.device)  # beside the user's next steps (loading a draft), not in the first call
    return model


@contextlib.contextmanager
def _after_background_tracing():
    """A plain call runs holding ``CAPTURE_LOCK``, as hf_specdec's own work in another thread does: a background
    compilation traces and captures, and Hugging Face's compiled plain ``generate()`` compiling and replaying its own
    graphs meanwhile can break both (torch.fx's patches of ``nn.Module`` act in the compiling thread only,
    ``runner/thread_scoped_tracing.py``, but its tracing flag stays process-wide). The compilation may take the lock
    any time after a speculative call returned (its first phase runs in a separate process), so the lock is held for
    the whole call, not only checked at its start; plain calls of several threads therefore run one after another."""
    if not CAPTURE_LOCK.acquire(blocking=False):
        warnings.warn("hf_specdec: this generate() without spec_config waits for the compilation, CUDA graph capture "
                      "or plain generate() that another thread runs under hf_specdec's lock; SpecConfig(compile=True) "
                      "or hf_specdec.warmup() finishes compiling before the call returns.", RuntimeWarning,
                      stacklevel=4)
        CAPTURE_LOCK.acquire()
    try:
        yield
    finally:
        CAPTURE_LOCK.release()


def _current_device(model: PreTrainedModel):
    """The call runs with the model's (first) GPU as the current CUDA device: Triton kernels launch on the
    current device and CUDA graphs capture its stream, and a model may live on another GPU than device 0."""
    device = model.device
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _no_hf_cache(model: PreTrainedModel, kwargs: dict) -> None:
    """The call keeps its K/V in hf_specdec's paged caches: transformers need not build a DynamicCache of its own
    first (0.6 ms for a 32-layer model on a 2-core host, in every call's time to first token). Left to transformers
    when the call names a cache, ``use_cache`` or a cache implementation (it checks those against each other), or a
    ``generation_config`` (transformers deprecates passing one together with generation arguments)."""
    names = ("generation_config", "use_cache", "cache", "past_key_values", "cache_implementation")
    if all(kwargs.get(name) is None for name in names) and model.generation_config.cache_implementation is None:
        kwargs["use_cache"] = False


def _stop_strings_as_criteria(model: PreTrainedModel, kwargs: dict) -> None:
    config = kwargs.get("generation_config") or model.generation_config
    stop_strings = kwargs.pop("stop_strings", None) or getattr(config, "stop_strings", None)
    tokenizer = kwargs.pop("tokenizer", None)
    if not stop_strings:
        return
    if tokenizer is None:
        raise ValueError("stop_strings need the model's tokenizer: pass tokenizer=<tokenizer> to generate().")
    criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
    criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    kwargs["stopping_criteria"] = criteria
    kwargs["stop_strings"] = None  # also overrides stop strings set in the generation config


def _prompt_lookup_config(model: PreTrainedModel, kwargs: dict):
    """Hugging Face's prompt lookup arguments as an n-gram SpecConfig (None when not asked for)."""
    config = kwargs.get("generation_config") or model.generation_config
    num = kwargs.get("prompt_lookup_num_tokens", getattr(config, "prompt_lookup_num_tokens", None))
    if num is None or kwargs.get("assistant_model") is not None:
        return None
    max_n = kwargs.pop("max_matching_ngram_size", None) or getattr(config, "max_matching_ngram_size", None) or 2
    kwargs.pop("prompt_lookup_num_tokens", None)
    kwargs["prompt_lookup_num_tokens"] = None  # also overrides a value set in the generation config
    kwargs["max_matching_ngram_size"] = None
    return SpecConfig(num_speculative_tokens=num, method="ngram", prompt_lookup_min=1, prompt_lookup_max=max_n)
