"""Bad requests fail with errors that name the problem and the fix; nothing partial is returned."""
import pytest
import torch

import hf_specdec
from models import left_padded_prompts, make_draft, make_model


@pytest.fixture(scope="module")
def target():
    return hf_specdec.enable(make_model("llama", seed=0))


def run(target, draft, **kw):
    ids, mask = left_padded_prompts(2, seed=0)
    kw.setdefault("spec_config", hf_specdec.SpecConfig(num_speculative_tokens=3))
    return target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, max_new_tokens=8, **kw)


@pytest.mark.parametrize("field,value", [
    ("num_speculative_tokens", -1), ("num_speculative_tokens", 2.5), ("acceptance", "maybe"),
    ("block_size", 0), ("cache_tokens", -4), ("cache_memory_fraction", 1.5), ("posterior_alpha", 2.0),
    ("draft_tp", 0), ("draft_tp", True),
])
def test_invalid_spec_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"SpecConfig.{field}"):
        hf_specdec.SpecConfig(**{field: value})


def test_draft_tp_checked_against_the_loaded_draft(target):
    draft = make_draft(target, "mix")
    with pytest.raises(ValueError, match=r"SpecConfig\(draft_tp=2\) but the draft is split over 1 rank\(s\)"):
        run(target, draft, spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, draft_tp=2))
    out = run(target, draft, spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, draft_tp=1))
    assert out.shape[0] == 2


def test_incompatible_vocabulary(target):
    with pytest.raises(ValueError, match="vocabularies differ"):
        run(target, make_model("llama", seed=1, vocab=1000))


def test_vocab_padding_only_is_accepted(target):
    ids, mask = left_padded_prompts(2, seed=0)
    padded = make_model("llama", seed=0, vocab=target.config.vocab_size + 31)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=padded, do_sample=False, max_new_tokens=8,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3))
    assert torch.equal(out, expected)


def test_beam_search_refused(target):
    with pytest.raises(ValueError, match="num_beams"):
        run(target, make_draft(target, "full"), num_beams=2)


@pytest.mark.parametrize("settings,names", [
    (dict(penalty_alpha=0.6, top_k=4), r"penalty_alpha=0\.6, top_k=4 asks transformers for contrastive_search"),
    (dict(dola_layers="low"), r"dola_layers='low' asks transformers for dola_generation"),
    (dict(force_words_ids=[[5]]), r"force_words_ids=\[\[5\]\].*constrained_beam_search"),
])
def test_other_decoding_modes_refused_by_the_setting_that_asks_for_them(target, settings, names):
    """Plain generate() would run (or fetch from the hub) another decoding for these; greedy output is not it."""
    with pytest.raises(ValueError, match=names):
        run(target, make_draft(target, "full"), do_sample=False, **settings)


@pytest.mark.parametrize("name", ["output_attentions", "output_hidden_states"])
def test_per_step_attentions_and_hidden_states_refused_not_dropped(target, name):
    with pytest.raises(ValueError, match=f"{name}=True"):
        run(target, make_draft(target, "full"), return_dict_in_generate=True, **{name: True})
    out = run(target, make_draft(target, "full"), **{name: True})  # not returned by plain generate() either
    assert out.shape[0] == 2


def test_per_step_hidden_states_from_the_models_own_config_warn_and_the_call_runs():
    """``from_pretrained(..., output_hidden_states=True)`` puts them in the model's generation_config: not the call's
    request, so it runs (a warning says they are left out) and returns the plain greedy tokens."""
    model = make_model("llama", seed=0)
    model.generation_config.output_hidden_states = model.generation_config.return_dict_in_generate = True
    ids, mask = left_padded_prompts(2, seed=0)
    want = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8).sequences
    hf_specdec.enable(model)
    with pytest.warns(UserWarning, match="generation_config asks for them"):
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8,
                             assistant_model=make_draft(model, "mix"),
                             spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3))
    assert torch.equal(out.sequences, want)


def test_sampling_with_top_k_and_a_penalty_alpha_is_sampling(target):
    """penalty_alpha selects contrastive search only for greedy decoding; sampled, transformers samples."""
    out = run(target, make_draft(target, "mix"), do_sample=True, top_k=5, penalty_alpha=0.6)
    assert out.shape[0] == 2


def test_missing_draft(target):
    with pytest.raises(ValueError, match="assistant_model"):
        run(target, None)


def test_exhausted_cache_budget(target):
    with pytest.raises(hf_specdec.CacheBudgetError, match="cache_tokens"):
        run(target, make_draft(target, "full"), spec_config=hf_specdec.SpecConfig(cache_tokens=16, block_size=4))


def test_prompt_beyond_max_positions(target):
    ids = torch.randint(3, 90, (1, 250))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        target.generate(input_ids=ids, assistant_model=make_draft(target, "full"), max_new_tokens=20,
                        spec_config=hf_specdec.SpecConfig())


def test_right_padding_refused(target):
    ids = torch.randint(3, 90, (2, 6))
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    with pytest.raises(ValueError, match="left"):
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=make_draft(target, "full"),
                        max_new_tokens=4, spec_config=hf_specdec.SpecConfig())


def test_attention_restored_after_error(target):
    before = target.config._attn_implementation
    with pytest.raises(hf_specdec.CacheBudgetError):
        run(target, make_draft(target, "full"), spec_config=hf_specdec.SpecConfig(cache_tokens=16, block_size=4))
    assert target.config._attn_implementation == before


def test_spec_config_as_a_dict(target):
    ids, mask = left_padded_prompts(2, seed=0)
    draft = make_draft(target, "mix")
    kw = dict(input_ids=ids, attention_mask=mask, assistant_model=draft, do_sample=False, max_new_tokens=8,
              return_dict_in_generate=True)
    out = target.generate(**kw, spec_config={"num_speculative_tokens": 2})
    assert torch.equal(out.sequences, target.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                                      max_new_tokens=8))
    assert out.spec_metrics.num_speculative_tokens == 2
    with pytest.raises(ValueError, match=r"unknown keys \['k'\].*num_speculative_tokens"):
        target.generate(**kw, spec_config={"k": 2})
    with pytest.raises(TypeError, match="SpecConfig or a dict"):
        target.generate(**kw, spec_config=4)


def test_assistant_model_given_as_a_path(target):
    with pytest.raises(TypeError, match=r"loaded model, not the path or name 'path/to/draft'.*from_pretrained"):
        run(target, "path/to/draft")


def test_draft_vocabulary_smaller_than_the_target_ids(target):
    small = make_model("llama", seed=1, vocab=target.config.vocab_size - 7)  # within padding distance, but short
    with pytest.raises(ValueError, match=r"embeds token ids 0\.\.89 only.*emit ids up to 96"):
        run(target, small)


def test_spec_config_without_enable_names_the_keyword():
    """What a model never passed to hf_specdec.enable() says (transformers' own check; README's first example)."""
    plain = make_model("llama", seed=0)
    with pytest.raises(ValueError, match=r"model_kwargs.*not used.*spec_config"):
        run(plain, make_draft(plain, "full"))


def _tokenizer(words):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, "<unk>")))


def test_tokenizer_pairs_must_share_one_vocabulary(target):
    words = ["<unk>", "def", "return", "x"]
    with pytest.raises(ValueError, match=r"different vocabularies \(4 vs 4 tokens; 2 differ, e\.g\. 'return': 2 vs None"):
        run(target, make_draft(target, "full"), tokenizer=_tokenizer(words),
            assistant_tokenizer=_tokenizer(words[:2] + ["yield", "x"]))
    with pytest.raises(ValueError, match="without tokenizer="):
        run(target, make_draft(target, "full"), assistant_tokenizer=_tokenizer(words))
    ids, mask = left_padded_prompts(2, seed=0)
    same = run(target, make_draft(target, "full"), tokenizer=_tokenizer(words), assistant_tokenizer=_tokenizer(words),
               do_sample=False)
    assert torch.equal(same, target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8))


@pytest.mark.parametrize("k", [3, 0])
def test_an_empty_batch_is_refused_by_name(target, k):
    draft = make_draft(target, "mix") if k else None
    ids = torch.zeros(0, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"at least one sequence.*shape \(0, 5\)"):
        target.generate(input_ids=ids, assistant_model=draft, max_new_tokens=4,
                        spec_config=hf_specdec.SpecConfig(num_speculative_tokens=k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
def test_input_ids_that_are_not_integers_are_refused_by_name(target, dtype):
    ids, mask = left_padded_prompts(2, seed=0)
    with pytest.raises(ValueError, match=f"integer token ids; got dtype {dtype}"):
        target.generate(input_ids=ids.to(dtype), attention_mask=mask, assistant_model=make_draft(target, "mix"),
                        max_new_tokens=4, spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3))
