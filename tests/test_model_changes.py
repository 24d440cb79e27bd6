"""A model changed between calls (``model.double()``, ``load_state_dict(assign=True)``): the next call runs on what
the model is now, as a fresh process would. Graphs, prefill graphs and the paged caches hold the weights' addresses,
dtype and device of the call that made them; the runner keys them on the models' tensors. CPU, runner without
graphs (the caches are what carries over there)."""
import copy

import torch

import hf_specdec
from hf_specdec.runner import runner_for
from models import left_padded_prompts, make_draft, make_model


def _logits(target, draft):
    ids, mask = left_padded_prompts(3, seed=1)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, max_new_tokens=8,
                          do_sample=False, eos_token_id=None, pad_token_id=0, output_logits=True,
                          return_dict_in_generate=True,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, adaptive=False))
    return out.sequences, torch.stack(out.logits)


def test_a_new_dtype_runs_as_a_fresh_process_would():
    target = hf_specdec.enable(make_model("llama", seed=0))
    draft = make_draft(target, "mix")
    fresh_target, fresh_draft = copy.deepcopy(target).double(), copy.deepcopy(draft).double()
    _logits(target, draft)  # float32 caches
    target.double()
    draft.double()
    sequences, logits = _logits(target, draft)
    want_sequences, want_logits = _logits(fresh_target, fresh_draft)
    assert torch.equal(sequences, want_sequences)
    assert torch.equal(logits, want_logits), (logits - want_logits).abs().max()
    caches = runner_for(target, draft).caches.values()
    assert all(pool.dtype == torch.float64 for cache in caches for pool in cache.key_pools.values())


def test_new_weights_by_assignment_are_read():
    target = hf_specdec.enable(make_model("llama", seed=0))
    draft = make_draft(target, "mix")
    other = make_model("llama", seed=5)
    _logits(target, draft)
    target.load_state_dict(other.state_dict(), assign=True)  # new tensors, new addresses
    got = _logits(target, draft)
    fresh = hf_specdec.enable(copy.deepcopy(target))
    want = _logits(fresh, copy.deepcopy(draft))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
