"""Which models the paged cache serves, and that switching to it never changes a user's model.

* A class that does not route attention through transformers' AttentionInterface (no
  ``_supports_attention_backend``) is refused with an error naming the class, before
  anything about the model changes (which real families those are: tests/test_families.py).
* After ``paged_attention_enabled`` (also when it exits with an exception, or a paged
  forward raises) the model's own attention implementation is back and an ordinary
  forward gives the logits it gave before.
* Ordinary forwards inside the block (padding mask, DynamicCache, sliding window) are
  unaffected by the paged forwards around them.
"""
import pytest
import torch
import transformers

import hf_specdec
import hf_specdec.cache.attention as paged_attn_module
from cache_models import VOCAB, PagedRunner, build_model, shuffled_cache
from hf_specdec.cache import ATTN_NAME, check_paged_support, paged_attention_enabled
from hf_specdec.call.request import cache_keyword


def _without_attention_interface(model):
    """``model`` recast as a subclass that does not claim the AttentionInterface: what any such family is to
    hf_specdec. Which real families lack it changes with each transformers release (tests/test_families.py)."""
    cls = type(f"NoInterface{type(model).__name__}", (type(model),), {"_supports_attention_backend": False})
    model.__class__ = cls
    return model


def _padded_inputs():
    ids = torch.tensor([[5, 9, 3, 7, 1, 2, 8, 4, 6, 11, 12, 13], [0, 0, 0, 0, 7, 7, 3, 2, 9, 1, 4, 5]])
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    return ids, mask


@torch.no_grad()
def _ordinary_logits(model):
    """Logits of ordinary HF calls: a left-padded batch, then 3 more tokens on its DynamicCache."""
    ids, mask = _padded_inputs()
    cache = {cache_keyword(model): transformers.DynamicCache(config=model.config)}
    first = model(input_ids=ids, attention_mask=mask, use_cache=True, **cache).logits
    more = torch.tensor([[3, 4, 5], [6, 7, 8]])
    mask2 = torch.cat([mask, torch.ones_like(more)], dim=1)
    second = model(input_ids=more, attention_mask=mask2, use_cache=True, **cache).logits
    return torch.cat([first[0], first[1, 4:], second.flatten(0, 1)])


def _impls(model):
    return {id(c): c._attn_implementation for c in paged_attn_module._attn_configs(model)}


@pytest.mark.parametrize("family", ["llama_gqa", "gpt2"])
def test_class_without_attention_interface_refused_with_class_name(family):
    model = _without_attention_interface(build_model(family, attn_implementation="sdpa"))
    cls_name = type(model).__name__
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        before = model(input_ids=ids).logits

    with pytest.raises(ValueError, match=cls_name) as info:
        check_paged_support(model)
    assert "AttentionInterface" in str(info.value) and "_supports_attention_backend" in str(info.value)
    with pytest.raises(ValueError, match=cls_name):
        with paged_attention_enabled(model):
            pytest.fail("the block ran for an unsupported model")

    # A supported model passed alongside is left untouched as well.
    llama = build_model("llama_gqa", attn_implementation="sdpa")
    with pytest.raises(ValueError, match=cls_name):
        with paged_attention_enabled(llama, model):
            pytest.fail("the block ran for an unsupported model")
    assert llama.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == "sdpa"

    # Through generate(), as target and as draft.
    for target, draft in ((model, llama), (llama, model)):
        with pytest.raises(ValueError, match=cls_name):
            hf_specdec.enable(target).generate(input_ids=ids, assistant_model=draft, max_new_tokens=3,
                                               spec_config=hf_specdec.SpecConfig(num_speculative_tokens=2))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)


def test_encoder_decoder_refused():
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
    model = transformers.T5ForConditionalGeneration(config)
    with pytest.raises(ValueError, match="T5ForConditionalGeneration.*encoder-decoder"):
        check_paged_support(model)


def _paged_prefill(model):
    runner = PagedRunner(model, shuffled_cache())
    return runner, runner.step(runner.add(2), [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [4, 5]])


@pytest.mark.parametrize("family,impl", [("llama_gqa", "sdpa"), ("mistral_sliding8", "eager"),
                                         ("gemma2_softcap_sliding", "eager"), ("gpt2", "sdpa")])
def test_user_implementation_restored_and_ordinary_forward_unchanged(family, impl, monkeypatch):
    model = build_model(family, attn_implementation=impl)
    impls = _impls(model)
    assert set(impls.values()) == {impl}
    before = _ordinary_logits(model)

    # Ordinary calls between paged forwards inside the block see the user's implementation.
    with paged_attention_enabled(model):
        runner, _ = _paged_prefill(model)
        assert _impls(model) == impls
        inside = _ordinary_logits(model)
        runner.step(runner.rows, [[3], [4, 5, 6]])
    torch.testing.assert_close(inside, before, atol=1e-5, rtol=0)
    assert _impls(model) == impls
    torch.testing.assert_close(_ordinary_logits(model), before, atol=0, rtol=0)

    # An exception raised in the block's body.
    with pytest.raises(KeyError):
        with paged_attention_enabled(model):
            _paged_prefill(model)
            raise KeyError("boom")
    assert _impls(model) == impls

    # An exception raised inside a paged forward, in the attention function itself.
    seen = []

    def failing(*args, **kwargs):
        seen.append(model.config._attn_implementation)
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(paged_attn_module, "paged_attention", failing)
    with pytest.raises(RuntimeError, match="kernel failed"):
        with paged_attention_enabled(model):
            _paged_prefill(model)
    assert seen == [ATTN_NAME], "the paged forward did not run under the paged implementation"
    assert _impls(model) == impls
    torch.testing.assert_close(_ordinary_logits(model), before, atol=0, rtol=0)


def test_nested_and_repeated_enable_restore():
    """The same model twice (target == draft) and nested blocks leave the user's setting intact."""
    model = build_model("qwen2_sliding", attn_implementation="sdpa")
    before = _ordinary_logits(model)
    with paged_attention_enabled(model, model):
        with paged_attention_enabled(model):
            _paged_prefill(model)
            torch.testing.assert_close(_ordinary_logits(model), before, atol=1e-5, rtol=0)
        _paged_prefill(model)
        torch.testing.assert_close(_ordinary_logits(model), before, atol=1e-5, rtol=0)
    assert model.config._attn_implementation == "sdpa"
    assert not paged_attn_module._original_impl


def test_delegation_without_paged_batch_uses_original_implementation():
    """A call that reaches the paged function without a PagedBatch goes to the user's implementation."""
    model = build_model("gemma2_softcap_sliding", attn_implementation="eager")
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        # Inside a paged forward's switch, one layer called without the batch keyword: soft-capping
        # is only in Gemma2's own eager function, so an SDPA fallback would not match it.
        layer = model.model.layers[0].self_attn
        q = torch.randn(1, 4, 6, 8)
        k = torch.randn(1, 2, 6, 8)
        v = torch.randn(1, 2, 6, 8)
        mask = torch.zeros(1, 1, 6, 6)
        with paged_attn_module._paged_implementation(model):
            got, _ = paged_attn_module.paged_attention_forward(layer, q, k, v, mask, scaling=0.3, softcap=2.0)
        eager = transformers.models.gemma2.modeling_gemma2.eager_attention_forward
        ref, _ = eager(layer, q, k, v, mask, scaling=0.3, softcap=2.0)
        torch.testing.assert_close(got, ref)
        assert model.config._attn_implementation == "eager"
        assert torch.equal(model(input_ids=ids).logits, want)


def test_the_history_width_of_graphed_calls_starts_wide_enough_that_prompt_lengths_rarely_change_it():
    """A new width is a new runner key, whose graphs are all captured again: with graphs, calls of 444 and 518
    columns (prompts of 183 and 257 tokens, 256 new ones) share one width; it grows in powers of two, never shrinks,
    and stays tight without graphs."""
    from hf_specdec.runner.runner_slots import MIN_GRAPH_WIDTH, history_width

    assert history_width(444, True) == history_width(518, True) == MIN_GRAPH_WIDTH == 1024
    assert history_width(1100, True) == 2048 and history_width(444, True, previous=2048) == 2048
    assert history_width(444, False) == 512 and history_width(518, False) == 1024 and history_width(30, False) == 64
