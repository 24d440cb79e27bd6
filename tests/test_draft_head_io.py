"""A draft head's sampled law, soft-cap, reduced vocabulary, refusals, save and load (test_draft_head.py: greedy
exactness and what the head reads)."""
import pytest
import torch

import hf_specdec
from models import VOCAB, left_padded_prompts, make_model
from reduced_models import make_gemma
from test_draft_head import MAX_NEW, head_for, spec
from test_sampling_exact import N, V, chi_square_pvalue, exact_joint_23, joint_23_counts, wrong_rejection_sample


@pytest.fixture(scope="module")
def targets():
    return {"llama": hf_specdec.enable(make_model("llama", seed=0)), "qwen2": hf_specdec.enable(make_model("qwen2", seed=1))}


# -- sampled output follows the target's law --------------------------------------------------------------------


def sample_with_head(target, prompt):
    spec = hf_specdec.SpecConfig(num_speculative_tokens=2, adaptive=False, generator=torch.Generator().manual_seed(0))
    out = target.generate(input_ids=prompt.expand(N, -1), assistant_model=head_for(target, seed=1), do_sample=True,
                          top_k=0, max_new_tokens=3, spec_config=spec, return_dict_in_generate=True)
    return joint_23_counts(out.sequences, prompt.shape[1], V), out.spec_metrics


def test_sampling_with_a_head_follows_the_target(small_target):
    """Tokens 2 and 3 (rejection at position 1, rejection or bonus at 2) against the exact joint law
    (test_sampling_exact.py's chi-square test)."""
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    counts, metrics = sample_with_head(small_target, prompt)
    assert 0.05 < metrics.acceptance_rate < 0.95  # both rejections and acceptances are exercised
    assert chi_square_pvalue(counts, exact_joint_23(small_target, prompt)) > 1e-3


def test_sampling_test_with_a_head_catches_a_wrong_residual(small_target, monkeypatch):
    from hf_specdec.round import fixed_round
    monkeypatch.setattr(fixed_round.kernels, "rejection_sample", wrong_rejection_sample)
    torch.manual_seed(0)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    counts, _ = sample_with_head(small_target, prompt)
    assert chi_square_pvalue(counts, exact_joint_23(small_target, prompt)) < 1e-3


# -- soft-cap, refusals, save and load --------------------------------------------------------------------------

def test_a_head_soft_caps_its_logits_as_its_target_does():
    """Gemma's final soft-cap (greedy drafts cannot tell, and rejection sampling stays exact with any draft law):
    the head's logits are the target's output layer over its g, then capped (a low cap, so that it shows)."""
    target = make_gemma(3, VOCAB, softcap=0.5)
    head = head_for(target).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (2, 5), generator=gen)
    features = torch.randn(2, 5, target.config.hidden_size, generator=gen)
    with torch.no_grad():
        out = head(ids, torch.arange(5).expand(2, -1), features)
        raw = target.get_output_embeddings()(out.hidden)
    cap = target.config.final_logit_softcapping
    torch.testing.assert_close(out.logits, torch.tanh(raw / cap) * cap)
    assert (out.logits - raw).abs().max() > 1e-2  # the cap changes these logits


# -- 7. refusals, save and load ---------------------------------------------------------------------------------

def test_a_head_bound_to_another_target_is_refused(targets):
    target = targets["llama"]
    head = head_for(make_model("llama", seed=9))
    ids, mask = left_padded_prompts(2, seed=1)
    with pytest.raises(ValueError, match=r"bound to another model.*load_draft_head\(path, target=model\)"):
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=head, do_sample=False,
                        max_new_tokens=4, spec_config=spec(3))


@pytest.mark.parametrize("assistant", ["draft model", "none"])
def test_method_head_without_a_head_is_refused(targets, assistant):
    target = targets["llama"]
    draft = make_model("llama", seed=9) if assistant == "draft model" else None
    ids, mask = left_padded_prompts(2, seed=1)
    with pytest.raises(ValueError, match=r"method='head'.*load_draft_head"):
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, do_sample=False, max_new_tokens=4,
                        spec_config=spec(3, method="head"))


def test_a_target_that_scales_its_logits_gets_no_head():
    model = make_model("llama", seed=9)
    model.config.logit_scale = 0.5
    with pytest.raises(ValueError, match="logit_scale=0.5"):
        hf_specdec.DraftHead.for_target(model)


def test_save_and_load_round_trip_and_refusals(targets, tmp_path):
    target = targets["llama"]
    head = head_for(target, seed=4).eval()
    hf_specdec.save_draft_head(head, tmp_path / "head")
    loaded = hf_specdec.load_draft_head(tmp_path / "head", target=target)
    assert loaded.get_input_embeddings() is target.get_input_embeddings()
    assert loaded.get_output_embeddings() is target.get_output_embeddings()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (2, 7), generator=gen)
    features = torch.randn(2, 7, target.config.hidden_size, generator=gen)
    positions = torch.arange(7).expand(2, -1)
    with torch.no_grad():
        a, b = head(ids, positions, features), loaded(ids, positions, features)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)
    prompts, mask = left_padded_prompts(3, seed=8)
    runs = [target.generate(input_ids=prompts, attention_mask=mask, assistant_model=h, do_sample=False,
                            max_new_tokens=MAX_NEW, spec_config=spec(3), return_dict_in_generate=True)
            for h in (head, loaded)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].spec_metrics.accepted_per_position == runs[1].spec_metrics.accepted_per_position
    with pytest.raises(ValueError, match="weights differ"):  # same class and sizes, other weights
        hf_specdec.load_draft_head(tmp_path / "head", target=make_model("llama", seed=9))
    with pytest.raises(ValueError, match="was trained for"):  # another class
        hf_specdec.load_draft_head(tmp_path / "head", target=targets["qwen2"])
    with pytest.raises(ValueError, match="holds no draft head"):
        hf_specdec.load_draft_head(tmp_path, target=target)


# -- a head with an output layer of its own over kept tokens (reduced vocabulary) -------------------------------

def test_reduced_vocab_head_is_exact_proposes_kept_tokens_and_round_trips(targets, tmp_path):
    """``kept_ids``: the head scores those tokens only (the rest at the fill value), greedy output is still the
    target's, and save / load keeps the kept set and the weights."""
    target = targets["llama"]
    kept = torch.arange(3, 60)
    head = head_for(target, seed=6, kept_ids=kept).eval()
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
    features = torch.randn(2, 7, target.config.hidden_size)
    with torch.no_grad():
        logits = head(ids, torch.arange(7).expand(2, -1), features).logits
    assert logits.shape[-1] == VOCAB and int(logits.argmax(-1).max()) < 60 and (logits[..., 60:] < -1e29).all()
    prompts, mask = left_padded_prompts(3, seed=8)
    expected = target.generate(input_ids=prompts, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    out = target.generate(input_ids=prompts, attention_mask=mask, assistant_model=head, do_sample=False,
                          max_new_tokens=MAX_NEW, spec_config=spec(3), return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    hf_specdec.save_draft_head(head, tmp_path / "kept")
    loaded = hf_specdec.load_draft_head(tmp_path / "kept", target=target)
    assert torch.equal(loaded.lm_head.token_ids, kept) and loaded.get_input_embeddings() is target.get_input_embeddings()
    with torch.no_grad():
        assert torch.equal(loaded(ids, torch.arange(7).expand(2, -1), features).logits, logits)
    with pytest.raises(ValueError, match="kept token ids must lie in"):
        hf_specdec.DraftHead.for_target(target, kept_ids=[1, VOCAB])
    with pytest.raises(ValueError, match="num_layers=0: a draft head has at least one decoder layer"):
        hf_specdec.DraftHead.for_target(target, num_layers=0)


def test_a_head_in_another_dtype_than_its_target():
    """A head cast to bf16 on an fp32 target (greedy output still the target's own), and a target cast to bf16
    after its head was built: the head computes in its own dtype, reads the target's modules in theirs."""
    ids, mask = left_padded_prompts(3, seed=4)
    target = hf_specdec.enable(make_model("llama", seed=0))
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    head = hf_specdec.DraftHead.for_target(target).to(torch.bfloat16)
    got = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                          assistant_model=head, spec_config=spec(3))
    assert torch.equal(got, expected)
    head = hf_specdec.DraftHead.for_target(target)
    target.to(torch.bfloat16)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                          assistant_model=head, spec_config=spec(3), return_dict_in_generate=True)
    assert out.sequences.shape == (3, ids.shape[1] + MAX_NEW) and out.spec_metrics.num_draft_tokens > 0


# -- host stopping criteria, the compile worker's skeleton, RoPE precision, logits a head cannot rebuild ---------

def test_a_row_cut_by_a_host_criterion_leaves_the_head_a_valid_first_read():
    """A stopping criterion cuts row 0 inside a fully accepted run of 7 (1-token prompts): the row stays in the
    bucket, done, and the head's next first read starts at length - keep - 1, which must not go negative
    (before the fix: an index error in the next round)."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    from test_draft_head import perfect_pair

    class StopRowZero(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return (input_ids[:, 0] == 7) & (input_ids.shape[1] >= 3)

    target, head = perfect_pair(seed=5)
    ids = torch.tensor([[7], [9], [11], [13]])
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=13, pad_token_id=0,
              eos_token_id=1, stopping_criteria=StoppingCriteriaList([StopRowZero()]))
    expected = target.generate(**kw)
    assert torch.equal(target.generate(**kw, assistant_model=head, spec_config=spec(6)), expected)


@pytest.mark.parametrize("kept", [None, 40])
def test_the_workers_skeleton_of_a_bf16_head_runs(kept):
    """The compile worker rebuilds a head from its class, config and dtypes; the stand-ins for the target's modules
    come in the head's own dtype (bf16 here), and its forward runs."""
    from hf_specdec.runner.compile_worker import _tensors, model_spec, skeleton

    target = make_model("llama", seed=3).to(torch.bfloat16)
    head = hf_specdec.DraftHead.for_target(target, kept_ids=None if kept is None else torch.arange(5, 5 + kept))
    small = skeleton(model_spec(head))
    assert {n: (t.shape, t.dtype) for n, t in _tensors(small)} == {n: (t.shape, t.dtype) for n, t in _tensors(head)}
    hidden = head.config.hidden_size
    out = small(torch.zeros(1, 3, dtype=torch.long), torch.arange(3)[None], torch.zeros(1, 3, hidden, dtype=torch.bfloat16))
    assert out.logits.shape == (1, 3, VOCAB)
    if kept:
        assert torch.equal(small.lm_head.token_ids, torch.arange(kept))


def test_a_bf16_heads_rotary_frequencies_stay_fp32(targets, tmp_path):
    target = make_model("llama", seed=3).to(torch.bfloat16)
    head = hf_specdec.DraftHead.for_target(target)
    hf_specdec.save_draft_head(head, tmp_path / "h")
    for h in (head, hf_specdec.load_draft_head(tmp_path / "h", target=target)):
        assert h.fc.weight.dtype == torch.bfloat16 and h.rotary_emb.inv_freq.dtype == torch.float32


def test_a_target_whose_forward_changes_its_logits_gets_no_head():
    """The verify that feeds a head rebuilds the logits as the output layer over the decoder's last hidden state;
    a class that does more (here: a multiplier its config does not name) is refused, not silently inexact."""
    from transformers import LlamaForCausalLM

    class Scaled(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 1.5
            return out

    base = make_model("llama", seed=3)
    model = Scaled(base.config).eval()
    model.load_state_dict(base.state_dict())
    with pytest.raises(ValueError, match="computes its logits otherwise"):
        hf_specdec.DraftHead.for_target(model)
