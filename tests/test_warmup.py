"""``hf_specdec.warmup`` (CPU: the runner without graphs, so nothing is compiled or captured): it visits the
largest batch and every smaller bucket with the caller's generate arguments, reports each step, leaves the
model's output unchanged, and refuses bad input naming the value."""
import pytest
import torch

import hf_specdec
from models import make_draft, make_model


def make_pair(family):
    target = make_model(family, 0)
    return target, make_draft(target, "mix")


def test_warmup_visits_every_bucket_and_leaves_output_unchanged(capsys):
    target, draft = make_pair("llama")
    hf_specdec.enable(target)
    ids = torch.randint(3, 97, (3, 9), generator=torch.Generator().manual_seed(1))
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    plain = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, **kwargs)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=2)
    steps = hf_specdec.warmup(target, draft, spec, batch_size=3, prompt_length=9, max_new_tokens=6, **kwargs)
    assert list(steps) == ["compile", "batch 3", "batch 2", "batch 1", "total"]
    assert all(s > 0 for s in steps.values())
    err = capsys.readouterr().err
    assert "hf_specdec.warmup: batch 3: graphs captured in" in err and "ready for batches up to 3" in err
    assert "nothing to compile: no CUDA graphs" in err  # the CPU runs the runner without graphs or compile
    out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, assistant_model=draft,
                          spec_config=spec, **kwargs)
    assert torch.equal(out, plain)


@pytest.mark.parametrize("field,value", [("batch_size", 0), ("prompt_length", -3), ("max_new_tokens", 2.5)])
def test_warmup_refuses_bad_sizes(field, value):
    target, draft = make_pair("llama")
    hf_specdec.enable(target)
    with pytest.raises(ValueError, match=f"{field} must be a positive int; got {value!r}"):
        hf_specdec.warmup(target, draft, **{field: value})


def test_warmup_needs_an_enabled_model():
    target, draft = make_pair("llama")
    with pytest.raises(ValueError, match="hf_specdec.enable"):
        hf_specdec.warmup(target, draft)


def test_capture_every_k_asks_the_runner_for_every_k_of_a_bucket(monkeypatch):
    """The adaptive policy's first round in a bucket captures k = 0 and the largest k (others when first picked);
    ``SpecConfig(capture_every_k=True)``, and so ``warmup``, asks for every k at once (CPU: the request is made,
    the runner without graphs has nothing to capture)."""
    import dataclasses

    from hf_specdec.runner import SpecRunner

    asked = []
    original = SpecRunner.capture

    def spy(self, ks):
        asked.append(tuple(ks))
        return original(self, ks)

    monkeypatch.setattr(SpecRunner, "capture", spy)
    target, draft = make_pair("llama")
    hf_specdec.enable(target)
    ids = torch.randint(3, 97, (3, 9), generator=torch.Generator().manual_seed(2))
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
                  eos_token_id=None, pad_token_id=0, assistant_model=draft)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=3, adaptive=True)
    plain = target.generate(spec_config=spec, **kwargs)
    assert asked and set(asked) == {(0, 3)}
    asked.clear()
    every = target.generate(spec_config=dataclasses.replace(spec, capture_every_k=True), **kwargs)
    assert asked and set(asked) == {(0, 1, 2, 3)}
    assert torch.equal(every, plain)
    asked.clear()
    hf_specdec.warmup(target, draft, spec, batch_size=2, prompt_length=9, max_new_tokens=4, verbose=False,
                      do_sample=False, eos_token_id=None, pad_token_id=0)
    assert asked and set(asked) == {(0, 1, 2, 3)}


def test_capture_every_k_must_be_a_bool():
    with pytest.raises(ValueError, match="capture_every_k must be True or False; got 1"):
        hf_specdec.SpecConfig(capture_every_k=1)
