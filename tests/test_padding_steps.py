"""output_scores / output_logits of rows that finished early hold their padding steps, as in plain generate().

Plain generate keeps feeding a finished row pad tokens until the batch stops and returns the
logits and processed scores of those steps; hf_specdec computes them at the end (padding_steps.py).
"""
import pytest
import torch

import hf_specdec
from models import left_padded_prompts, make_draft, make_model


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("cache_tokens", [None, 64], ids=["one-wave", "waves"])
def test_padding_steps_match_plain_generate(family, cache_tokens):
    target = hf_specdec.enable(make_model(family, seed=3))
    ids, mask = left_padded_prompts(3, seed=41)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, eos_token_id=None,
                            repetition_penalty=1.3)
    eos = int(plain[0, ids.shape[1] + 2])  # row 0 stops at its 3rd token, the others later
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, eos_token_id=eos, pad_token_id=0,
              repetition_penalty=1.3, output_scores=True, output_logits=True, return_dict_in_generate=True)
    expected = target.generate(**kw)
    out = target.generate(**kw, assistant_model=make_draft(target, "mix"),
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, block_size=4,
                                                            cache_tokens=cache_tokens))
    assert torch.equal(out.sequences, expected.sequences)
    lengths = (out.sequences[:, ids.shape[1]:] != 0).sum(1)
    assert lengths.min() < len(expected.scores)  # some row has padding steps
    assert len(out.scores) == len(out.logits) == len(expected.scores)
    for ours, theirs in zip(out.scores + out.logits, expected.scores + expected.logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
