"""A call interrupted anywhere (an exception or KeyboardInterrupt in prefill, a draft step, a verify, the model's own
forward) leaves the model usable: the next call's output equals an uninterrupted call's, the user's attention
implementation is back, and the paged caches hold no block of the dead call. CPU, runner without graphs."""
import pytest
import torch

import hf_specdec
import hf_specdec.round.fixed_round as fixed_round
import hf_specdec.round.proposers as proposers
import hf_specdec.runner.spec_runner as spec_runner
from hf_specdec.runner import runner_for
from models import RecordingStreamer, left_padded_prompts, make_draft, make_model

STAGES = {  # (module, function) the fault is injected into, on its n-th call
    "prefill": (spec_runner, "FixedPrefill.run"),
    "draft prefill": (spec_runner, "SpecRunner.prefill_draft"),  # after the rows' first tokens are committed
    "draft step": (proposers, "DraftModelProposer.propose"),
    "verify": (fixed_round, "verify_and_commit"),
}


def _call(target, draft, spec, batch=3, seed=0):
    ids, mask = left_padded_prompts(batch, seed=seed)
    return target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, max_new_tokens=12,
                           do_sample=False, eos_token_id=None, pad_token_id=0, spec_config=spec)


def _inject(monkeypatch, module, name, error, after: int):
    owner, _, attr = name.rpartition(".")
    holder = getattr(module, owner) if owner else module
    real = getattr(holder, attr)
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > after:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(holder, attr, failing)
    return calls


@pytest.mark.parametrize("error", [RuntimeError("injected"), KeyboardInterrupt()], ids=["exception", "interrupt"])
@pytest.mark.parametrize("stage", list(STAGES))
def test_the_runner_after_an_interrupted_call(stage, error):
    target = hf_specdec.enable(make_model("llama", seed=0))
    draft = make_draft(target, "mix")
    spec = hf_specdec.SpecConfig(num_speculative_tokens=3, adaptive=False)
    want = _call(target, draft, spec)
    free = _free_blocks(target, draft)
    implementation = target.config._attn_implementation
    module, name = STAGES[stage]
    with pytest.MonkeyPatch.context() as patch:
        calls = _inject(patch, module, name, error, after=0 if "prefill" in stage else 1)
        with pytest.raises(type(error)):
            _call(target, draft, spec, seed=0)
        assert calls["n"] > 0
    assert target.config._attn_implementation == implementation
    assert torch.equal(_call(target, draft, spec), want)
    assert _free_blocks(target, draft) == free, "the caches hold blocks of the interrupted call"
    fresh = hf_specdec.enable(make_model("llama", seed=0))
    assert torch.equal(_call(target, draft, spec, batch=5, seed=1),
                       _call(fresh, make_draft(fresh, "mix"), spec, batch=5, seed=1))


def _free_blocks(target, draft) -> dict:
    return {name: cache.allocator.num_free_blocks for name, cache in runner_for(target, draft).caches.items()}


@pytest.mark.parametrize("error", [RuntimeError("injected"), KeyboardInterrupt()], ids=["exception", "interrupt"])
def test_a_fault_inside_the_draft_models_forward(error, monkeypatch):
    target = hf_specdec.enable(make_model("llama", seed=0))
    draft = make_draft(target, "mix")
    spec = hf_specdec.SpecConfig(num_speculative_tokens=3, adaptive=False)  # every round drafts
    want = _call(target, draft, spec)
    free = _free_blocks(target, draft)
    implementation = target.config._attn_implementation
    real = draft.forward
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 2:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(draft, "forward", failing)
    with pytest.raises(type(error)):
        _call(target, draft, spec)
    monkeypatch.undo()
    assert target.config._attn_implementation == implementation
    assert torch.equal(_call(target, draft, spec), want)
    assert _free_blocks(target, draft) == free


@pytest.mark.parametrize("error", [RuntimeError("injected"), KeyboardInterrupt()], ids=["exception", "interrupt"])
def test_a_failed_call_still_ends_its_streamer(error, monkeypatch):
    """A consumer iterating a streamer (TextIteratorStreamer) waits for end(): a call failing mid-way still sends
    it, after what had been committed, once, and the call's own error is what the caller sees."""
    target = hf_specdec.enable(make_model("llama", seed=0))
    draft = make_draft(target, "mix")
    spec = hf_specdec.SpecConfig(num_speculative_tokens=3, adaptive=False)
    ids = torch.randint(3, 100, (1, 7), generator=torch.Generator().manual_seed(0))

    def call(streamer):
        return target.generate(input_ids=ids, assistant_model=draft, max_new_tokens=12, do_sample=False,
                               eos_token_id=None, pad_token_id=0, spec_config=spec, streamer=streamer)

    whole = RecordingStreamer()
    call(whole)
    assert whole.ended == 1 and len(whole.puts) > 2
    _inject(monkeypatch, fixed_round, "verify_and_commit", error, after=2)
    failed = RecordingStreamer()
    with pytest.raises(type(error)):
        call(failed)
    assert failed.ended == 1
    assert 1 < len(failed.puts) < len(whole.puts)  # the prompt, the first token and two rounds, then end()
    assert failed.puts == whole.puts[: len(failed.puts)]

    class Broken(RecordingStreamer):  # a streamer failing at end() does not hide the call's own error
        def end(self):
            raise ValueError("the streamer's own")

    with pytest.raises(type(error)):
        call(Broken())
