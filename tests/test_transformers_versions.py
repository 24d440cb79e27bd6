"""What differs between the transformers releases hf_specdec supports (5.17 to the newest 5.x).

transformers 5.24 renamed the KV cache keyword of a model's forward and of generate()
from ``past_key_values`` to ``cache`` (the old name warns, and goes in 5.40); 5.17 knows
only ``past_key_values``. These tests pass on both, without that deprecation warning
(pyproject.toml turns it into an error): our own HF-cache forwards take the keyword the
installed forward names, and a cache the user passes to generate() is refused on both.
"""
import os
import sys
import warnings

import pytest
import torch
import transformers

import hf_specdec
from hf_specdec.call.request import cache_keyword
from models import left_padded_prompts, make_draft, make_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "evals"))


@pytest.fixture(scope="module")
def target():
    return hf_specdec.enable(make_model("llama", seed=0))


def test_cache_keyword_is_the_one_forward_fills_without_warning(target):
    name = cache_keyword(target)
    cache = transformers.DynamicCache(config=target.config)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = target(input_ids=torch.tensor([[5, 6, 7, 8]]), use_cache=True, **{name: cache})
        assert getattr(out, name) is cache
        target(input_ids=torch.tensor([[9]]), use_cache=True, **{name: cache})
    assert cache.get_seq_length() == 5


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
@pytest.mark.parametrize("filled", [False, True], ids=["empty", "filled"])
def test_a_cache_passed_to_generate_is_refused(target, name, filled):
    """Plain generate() would extend the user's cache and return it; hf_specdec keeps its own, so it refuses."""
    ids, mask = left_padded_prompts(2, seed=0)
    cache = transformers.DynamicCache(config=target.config)
    if filled:
        target(input_ids=ids[:, :4], use_cache=True, **{cache_keyword(target): cache})
    held = cache.get_seq_length()
    with warnings.catch_warnings():
        # The user's own old keyword: on 5.24 generate() warns about it (ours is the error that follows).
        warnings.filterwarnings("ignore", message="`past_key_values` is deprecated", category=FutureWarning)
        with pytest.raises(ValueError) as info:
            target.generate(input_ids=ids, attention_mask=mask, assistant_model=make_draft(target, "full"),
                            max_new_tokens=4, spec_config=hf_specdec.SpecConfig(num_speculative_tokens=2),
                            **{name: cache})
    message = str(info.value)
    if name == "cache" and cache_keyword(target) == "past_key_values":
        assert "not used by the model: ['cache']" in message  # before the rename: transformers' own refusal
    else:
        for part in ("own paged KV cache", "DynamicCache passed to generate()", f"holding {held} tokens",
                     "Drop the `cache=` / `past_key_values=` argument"):
            assert part in message, message
    assert cache.get_seq_length() == held  # nothing ran


def _cache_lengths_seen(model, name):
    seen = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs[name].get_seq_length() if kwargs.get(name) else None),
        with_kwargs=True)
    return seen


@pytest.mark.parametrize("timer", ["distill_eval.eager_step_ms", "gemma_step_costs.forward_ms"])
def test_eval_step_timers_reuse_the_cache_without_warning(timer):
    """The evals' timed forwards on Hugging Face's cache: each step extends the previous step's cache."""
    import distill_eval
    import gemma_step_costs

    model = make_model("llama", seed=1)
    seen = _cache_lengths_seen(model, cache_keyword(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        if timer == "distill_eval.eager_step_ms":
            ms, step = distill_eval.eager_step_ms(model, batch=2, context=6, repeats=2), 1
        else:
            ms, step = gemma_step_costs.forward_ms(model, batch=2, context=6, tokens=3, repeats=2), 3
    assert ms > 0
    assert seen == [None] + [6 + i * step for i in range(5)]  # prefill, then 3 warm-up and 2 timed steps
