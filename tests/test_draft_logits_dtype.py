"""A greedy draft without logits processors chooses from its model's own dtype (no float32 cast kernel a draft
step); sampling and processors still read float32. In bfloat16 the drafts, and so the output, are those of the
float32 cast: the argmax of an exact cast is the same token."""
import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

import hf_specdec
from hf_specdec.round.fixed_round import RoundSpec
from hf_specdec.runner.paged_model import PagedModel
from models import left_padded_prompts, make_draft, make_model


def _draft_logits_dtypes(monkeypatch, target) -> list:
    """Spy: the dtype of the logits every forward of a model other than ``target`` returns."""
    seen, forward = [], PagedModel.forward

    def spy(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if self.model is not target:
            seen.append((out[0] if isinstance(out, tuple) else out).dtype)
        return out

    monkeypatch.setattr(PagedModel, "forward", spy)
    return seen


@pytest.mark.parametrize("assistant", ["draft", "head"])
def test_greedy_drafts_read_the_models_dtype_and_emit_what_float32_would(monkeypatch, assistant):
    target = hf_specdec.enable(make_model("llama", seed=0).to(torch.bfloat16))
    torch.manual_seed(1)
    helper = (make_draft(target, "mix") if assistant == "draft" else hf_specdec.DraftHead.for_target(target))
    ids, mask = left_padded_prompts(3, seed=2)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, assistant_model=helper,
              spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, adaptive=False))
    seen = _draft_logits_dtypes(monkeypatch, target)
    fast = target.generate(**kw)
    assert seen and set(seen) == {torch.bfloat16}, seen
    monkeypatch.setattr(RoundSpec, "draft_logits_in_float", property(lambda self: True))
    assert torch.equal(target.generate(**kw), fast)


def test_sampling_and_processors_keep_float32():
    def spec(do_sample, processors=False):
        from hf_specdec.round.logits.graph_logits import graph_safe_logits

        procs = [RepetitionPenaltyLogitsProcessor(1.3)] if processors else []
        return RoundSpec(k=3, do_sample=do_sample, acceptance="rejection" if do_sample else "greedy",
                         logits=graph_safe_logits(procs)[0])

    assert not spec(False).draft_logits_in_float
    assert spec(True).draft_logits_in_float
    assert spec(False, processors=True).draft_logits_in_float
    assert RoundSpec(k=3, do_sample=False, acceptance="greedy", logits=lambda s, *a, **k: s).draft_logits_in_float
