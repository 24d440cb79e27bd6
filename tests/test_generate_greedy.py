"""Greedy speculative output must equal the target's own greedy generate(), token for token."""
import itertools

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

import hf_specdec
from models import RecordingStreamer, left_padded_prompts, make_draft, make_model

MAX_NEW = 13  # not a multiple of k+1 for any k tested


@pytest.fixture(scope="module")
def targets():
    return {family: hf_specdec.enable(make_model(family, seed=i)) for i, family in enumerate(["llama", "qwen2", "gpt2"])}


def spec_generate(target, draft, ids, mask, k, **kw):
    """The fixed-shape runner (the GPU fast path, here without graphs)."""
    return target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, do_sample=False,
                           spec_config=hf_specdec.SpecConfig(num_speculative_tokens=k, block_size=4,
                                                             adaptive=False),
                           return_dict_in_generate=True, **kw)


CASES = [
    (family, kind, batch, k)
    for family, kind, batch, k in itertools.product(["llama", "qwen2", "gpt2"], ["full", "mix", "none"], [1, 3, 8], [1, 3, 6])
    if family == "llama" or (batch, k) in {(1, 3), (3, 6), (8, 1), (8, 3)}
]


@pytest.mark.parametrize("family,kind,batch,k", CASES)
def test_greedy_equals_target_greedy(targets, family, kind, batch, k):
    target = targets[family]
    draft = make_draft(target, kind)
    ids, mask = left_padded_prompts(batch, seed=batch * 10 + k)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    out = spec_generate(target, draft, ids, mask, k, max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, expected)
    assert out.spec_metrics.fast_path == "bucketed"
    m = out.spec_metrics
    assert m.num_accepted_tokens <= m.num_draft_tokens == m.num_drafts * k
    if kind == "full":
        assert m.acceptance_rate == 1.0  # a copy of the target accepts every draft, round after round
        assert m.mean_acceptance_length == k + 1
    if kind == "none":
        assert m.acceptance_per_position[0] < 1.0  # some round rejected its very first draft


def test_eos_inside_accepted_run(targets):
    target = targets["llama"]
    ids, mask = left_padded_prompts(3, seed=5)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                            eos_token_id=None)
    eos = int(plain[0, ids.shape[1] + 4])  # row 0's 5th generated token becomes EOS
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                               eos_token_id=eos, pad_token_id=0)
    out = spec_generate(target, make_draft(target, "full"), ids, mask, 6, max_new_tokens=MAX_NEW,
                        eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out.sequences, expected)
    assert (out.sequences[0, ids.shape[1] + 5:] == 0).all()  # padded after EOS, as Hugging Face pads


def test_history_dependent_processor_and_custom_stopping(targets):
    """repetition_penalty reads input_ids; a user stopping criterion must cut inside the accepted run."""

    class StopAfterToken(StoppingCriteria):
        def __init__(self, token):
            self.token = token

        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == self.token

    target = targets["qwen2"]
    ids, mask = left_padded_prompts(3, seed=9)
    # With an EOS id Hugging Face pads a row that a criterion stopped (without one it keeps generating it).
    kw = dict(do_sample=False, max_new_tokens=MAX_NEW, repetition_penalty=1.7, eos_token_id=2)
    plain = target.generate(input_ids=ids, attention_mask=mask, **kw)
    stop = StoppingCriteriaList([StopAfterToken(int(plain[1, ids.shape[1] + 3]))])
    assert 2 in plain[:, ids.shape[1]:]  # EOS also ends a row of this batch
    expected = target.generate(input_ids=ids, attention_mask=mask, stopping_criteria=stop, pad_token_id=0, **kw)
    out = spec_generate(target, make_draft(target, "mix"), ids, mask, 3, stopping_criteria=stop,
                        pad_token_id=0, **{k: v for k, v in kw.items() if k != "do_sample"})
    assert torch.equal(out.sequences, expected)
    assert (out.sequences[1, ids.shape[1] + 4:] == 0).all()


def test_scores_and_logits_match_plain_generate(targets):
    target = targets["llama"]
    ids, mask = left_padded_prompts(2, seed=3)
    kw = dict(do_sample=False, max_new_tokens=7, eos_token_id=None, output_scores=True, output_logits=True,
              return_dict_in_generate=True)
    expected = target.generate(input_ids=ids, attention_mask=mask, **kw)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=make_draft(target, "mix"),
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3), **kw)
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores) == 7
    for ours, theirs in zip(out.scores + out.logits, expected.scores + expected.logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_streamer_receives_committed_tokens(targets):
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    target = targets["gpt2"]
    ids, mask = left_padded_prompts(1, seed=4)
    streamer = Collect()
    out = spec_generate(target, make_draft(target, "mix"), ids, mask, 3, max_new_tokens=MAX_NEW, streamer=streamer)
    assert streamer.ended
    assert streamer.chunks[0] == ids[0].tolist()
    assert sum(streamer.chunks[1:], []) == out.sequences[0, ids.shape[1]:].tolist()


def test_without_spec_config_generate_is_untouched(targets):
    target = targets["llama"]
    ids, mask = left_padded_prompts(2, seed=1)
    a = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=5)
    assert target.config._attn_implementation != "hf_specdec_paged"
    b = type(target).generate(target, input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=5)
    assert torch.equal(a, b)


def test_num_return_sequences_expands_batch(targets):
    target = targets["llama"]
    ids, mask = left_padded_prompts(2, seed=2)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=make_draft(target, "mix"),
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=2), do_sample=True,
                          num_return_sequences=3, max_new_tokens=6, top_k=0)
    assert out.shape[0] == 6
    assert torch.equal(out[:, : ids.shape[1]], ids.repeat_interleave(3, dim=0))


def test_stop_strings_cut_inside_accepted_run():
    """transformers drops `tokenizer` on the custom_generate path; enable() rebuilds the stop-string criterion."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    raw = ByteLevelBPETokenizer()
    raw.train_from_iterator(["def add(a, b):\n    return a + b\n" * 50], vocab_size=300, min_frequency=1)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw._tokenizer, pad_token="!", eos_token='"')
    target = hf_specdec.enable(make_model("llama", seed=5, vocab=len(tok)))
    ids, mask = left_padded_prompts(3, seed=21, vocab=len(tok))
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, tokenizer=tok)
    generated = plain[2, ids.shape[1]:].tolist()
    stop = next(t for t in (tok.decode([g]) for g in generated[2:]) if t.strip().isalnum())
    kw = dict(do_sample=False, max_new_tokens=MAX_NEW, stop_strings=[stop], tokenizer=tok)
    expected = target.generate(input_ids=ids, attention_mask=mask, **kw)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=make_draft(target, "full"),
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=6), **kw)
    assert torch.equal(out, expected)
    assert expected.shape != plain.shape or (expected != plain).any()  # the stop string really cut
    with pytest.raises(ValueError, match="tokenizer"):
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=make_draft(target, "full"),
                        spec_config=hf_specdec.SpecConfig(), do_sample=False, max_new_tokens=4, stop_strings=[stop])


def test_streamer_at_batch_3_gets_plain_generates_steps(targets):
    """At batch > 1 a streamer sees what plain generate gives it: the prompts, then one (B,) tensor per step, the pad
    token for rows that have finished; rows here end at different steps on an EOS and advance at their own pace."""
    target = targets["llama"]
    ids, mask = left_padded_prompts(3, seed=6)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                            eos_token_id=None)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0,
              eos_token_id=int(plain[1, ids.shape[1] + 2]))
    theirs, ours = RecordingStreamer(), RecordingStreamer()
    expected = target.generate(**kw, streamer=theirs)
    out = target.generate(**kw, streamer=ours, assistant_model=make_draft(target, "mix"),
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, block_size=4, adaptive=False))
    assert torch.equal(out, expected)
    assert ours.puts == theirs.puts and ours.ended == theirs.ended == 1


def test_more_than_eight_eos_ids(targets):
    target = targets["llama"]
    ids, mask = left_padded_prompts(3, seed=8)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                            eos_token_id=None)
    eos = sorted({int(t) for t in plain[:, ids.shape[1] + 5:].flatten()} | set(range(100, 110)))[:12]
    kw = dict(max_new_tokens=MAX_NEW, pad_token_id=0, eos_token_id=eos)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, **kw)
    out = spec_generate(target, make_draft(target, "mix"), ids, mask, 3, **kw)
    assert torch.equal(out.sequences, expected) and out.spec_metrics.fast_path == "bucketed"
    assert len(eos) > 8 and (expected[:, -1] == 0).any()  # some row ended on one of them
