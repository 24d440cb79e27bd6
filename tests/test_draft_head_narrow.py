"""A narrow draft head (``DraftHead.for_target(target, hidden_size=h)``, h below the target's width): its layer runs
at width h, an output layer of its own reads it, and ``up`` returns the next step's feature at the target's width.
Exact output (greedy and the sampled law), its start as the target's own output layer, save / load, the compile
worker's skeleton, and the refusal of a width that is no multiple of the head_dim."""
import pytest
import torch

import hf_specdec
from models import VOCAB, left_padded_prompts, make_model
from reduced_models import make_gemma
from test_draft_head import MAX_NEW, spec
from test_sampling_exact import N, V, chi_square_pvalue, exact_joint_23, joint_23_counts

NARROW = 16  # the test targets are 32 wide with head_dim 8


@pytest.fixture(scope="module")
def targets():
    models = {"llama": make_model("llama", seed=0), "qwen2": make_model("qwen2", seed=1),
              "gemma3": make_gemma(3, VOCAB, softcap=30.0)}
    return {family: hf_specdec.enable(m) for family, m in models.items()}


def narrow_head(target, seed=0, **kw):
    torch.manual_seed(seed)
    return hf_specdec.DraftHead.for_target(target, hidden_size=kw.pop("hidden_size", NARROW), **kw)


def _inputs(target, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, 7), generator=gen)
    return ids, torch.arange(7).expand(2, -1), torch.randn(2, 7, target.config.hidden_size, generator=gen)


def test_a_narrow_head_runs_at_its_width_and_returns_the_targets():
    target = make_model("llama", seed=0)
    head = narrow_head(target)
    H = target.config.hidden_size
    assert head.config.hidden_size == NARROW and head.feature_size == H
    assert head.fc.weight.shape == (NARROW, 2 * H) and head.up.weight.shape == (H, NARROW)
    assert head.config.num_attention_heads == NARROW // 8 and head.config.head_dim == 8
    assert head.lm_head.weight.shape == (VOCAB, NARROW)  # an output layer of its own, over every token by default
    with torch.no_grad():
        out = head(*_inputs(target))
    assert out.logits.shape == (2, 7, VOCAB) and out.hidden.shape == (2, 7, H)
    wide = hf_specdec.DraftHead.for_target(target)
    assert wide.up is None and wide.lm_head is None and wide.feature_size == H


def test_a_narrow_head_starts_as_the_targets_output_layer_over_up():
    """Its own output rows start as the target's through ``up``: logits(g) = W_target up(g), bias and all."""
    target = make_model("llama", seed=0)
    head = narrow_head(target, kept_ids=torch.arange(5, 50))
    g = torch.randn(3, NARROW)
    with torch.no_grad():
        own = head.lm_head.kept_logits(g)
        theirs = target.get_output_embeddings()(head.up(g))[:, 5:50]
    torch.testing.assert_close(own, theirs, atol=1e-5, rtol=1e-5)


CASES = [("llama", 1, 1), ("llama", 3, 3), ("llama", 8, 6), ("qwen2", 3, 6), ("gemma3", 8, 3)]


@pytest.mark.parametrize("family,batch,k", CASES)
def test_greedy_with_a_narrow_head_equals_target_greedy(targets, family, batch, k):
    target = targets[family]
    ids, mask = left_padded_prompts(batch, seed=batch * 10 + k)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=narrow_head(target), do_sample=False,
                          max_new_tokens=MAX_NEW, spec_config=spec(k), return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    m = out.spec_metrics
    assert m.k_histogram == {k: m.num_rounds} and m.num_draft_tokens == m.num_drafts * k > 0


def test_greedy_with_a_narrow_head_over_kept_tokens_and_the_adaptive_policy(targets):
    target = targets["llama"]
    ids, mask = left_padded_prompts(3, seed=5)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    head = narrow_head(target, kept_ids=torch.arange(3, 60), num_layers=2)
    got = target.generate(input_ids=ids, attention_mask=mask, assistant_model=head, do_sample=False,
                          max_new_tokens=MAX_NEW, spec_config=spec(4, adaptive=None))
    assert torch.equal(got, expected)


def test_sampling_with_a_narrow_head_follows_the_target(small_target):
    """Tokens 2 and 3 against the exact joint law (test_sampling_exact.py's chi-square test)."""
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    spec_ = hf_specdec.SpecConfig(num_speculative_tokens=2, adaptive=False, generator=torch.Generator().manual_seed(0))
    out = small_target.generate(input_ids=prompt.expand(N, -1), assistant_model=narrow_head(small_target, seed=1),
                                do_sample=True, top_k=0, max_new_tokens=3, spec_config=spec_,
                                return_dict_in_generate=True)
    assert 0.05 < out.spec_metrics.acceptance_rate < 0.95
    counts = joint_23_counts(out.sequences, prompt.shape[1], V)
    assert chi_square_pvalue(counts, exact_joint_23(small_target, prompt)) > 1e-3


def test_save_and_load_a_narrow_head(targets, tmp_path):
    target = targets["qwen2"]
    head = narrow_head(target, seed=4, kept_ids=torch.arange(3, 70)).eval()
    hf_specdec.save_draft_head(head, tmp_path / "narrow")
    loaded = hf_specdec.load_draft_head(tmp_path / "narrow", target=target)
    assert loaded.config.hidden_size == NARROW and loaded.feature_size == target.config.hidden_size
    with torch.no_grad():
        a, b = head(*_inputs(target)), loaded(*_inputs(target))
    assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)
    ids, mask = left_padded_prompts(3, seed=8)
    runs = [target.generate(input_ids=ids, attention_mask=mask, assistant_model=h, do_sample=False,
                            max_new_tokens=MAX_NEW, spec_config=spec(3)) for h in (head, loaded)]
    assert torch.equal(runs[0], runs[1])


def test_the_workers_skeleton_of_a_narrow_bf16_head_runs():
    """The compile worker rebuilds the head from its config: stand-ins of the target's modules at the target's
    width, the head's own modules at its width."""
    from hf_specdec.runner.compile_worker import _tensors, model_spec, skeleton

    target = make_model("llama", seed=3).to(torch.bfloat16)
    head = narrow_head(target)
    small = skeleton(model_spec(head))
    assert {n: (t.shape, t.dtype) for n, t in _tensors(small)} == {n: (t.shape, t.dtype) for n, t in _tensors(head)}
    H = target.config.hidden_size
    out = small(torch.zeros(1, 3, dtype=torch.long), torch.arange(3)[None], torch.zeros(1, 3, H, dtype=torch.bfloat16))
    assert out.logits.shape == (1, 3, VOCAB) and out.hidden.shape == (1, 3, H)


@pytest.mark.parametrize("width", [12, 0, -8])
def test_a_width_that_is_no_multiple_of_the_head_dim_is_refused(width):
    with pytest.raises(ValueError, match=rf"hidden_size={width}: .*multiple of the target's head_dim \(8\)"):
        hf_specdec.DraftHead.for_target(make_model("llama", seed=0), hidden_size=width)


def test_folding_the_output_layer_needs_a_narrow_head():
    target = make_model("llama", seed=0)
    with pytest.raises(ValueError, match="narrow head"):
        hf_specdec.DraftHead.for_target(target).fold_output_layer(None)
