"""The fixed-shape runner on CPU: bucket changes, plain decoding (k = 0), reuse across calls, fallbacks.

The runner's code is the same with or without CUDA graphs; on CPU it runs without them,
which is how CI covers the GPU fast path.
"""
import weakref

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

import hf_specdec
from hf_specdec.runner import runner_for
from models import left_padded_prompts, make_draft, make_model


@pytest.fixture(scope="module")
def target():
    return hf_specdec.enable(make_model("llama", seed=3))


def fast(**kw):
    return hf_specdec.SpecConfig(block_size=4, **kw)


def test_rows_finish_at_different_rounds_and_the_batch_changes_bucket(target):
    """Nine rows (bucket 16) with an EOS that some rows hit early: survivors move to smaller buckets."""
    ids, mask = left_padded_prompts(9, seed=41)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24, eos_token_id=None)
    eos = int(plain[0, ids.shape[1] + 2])  # row 0 stops at its 3rd token; others later or never
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24, eos_token_id=eos, pad_token_id=0)
    expected = target.generate(**kw)
    lengths = (expected[:, ids.shape[1]:] != 0).sum(1)
    assert len(set(lengths.tolist())) > 2  # rows really finish at different times
    draft = make_draft(target, "mix")
    out = target.generate(**kw, assistant_model=draft, spec_config=fast(num_speculative_tokens=3),
                          return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    runner = runner_for(target, draft)
    assert 16 in runner.slot.states and runner.state.size < 16  # started at bucket 16, ended in a smaller one


def test_the_policy_sees_each_rounds_verdicts_across_rows_leaving_and_smaller_buckets(target, monkeypatch):
    """The next round starts before the host's bookkeeping of the last one, in the same bucket (rows that
    finished are done on the device), and a move to a smaller bucket follows it on the device: the policy
    must still get every live row's verdict of every round exactly once, and no row's after it finished.
    Summed, they are the device's own counts; every count is the round's k."""
    from hf_specdec.round.policy.speculation_length import SpeculationLength

    ids, mask = left_padded_prompts(9, seed=41)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24, eos_token_id=None)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
              eos_token_id=int(plain[0, ids.shape[1] + 2]), pad_token_id=0)
    expected = target.generate(**kw)
    seen = []
    observe = SpeculationLength.observe
    monkeypatch.setattr(SpeculationLength, "_choose", lambda self, bucket, rows, remaining: 3)
    monkeypatch.setattr(SpeculationLength, "observe", lambda self, bucket, k, seconds, v: (
        seen.append((bucket, k, list(v))), observe(self, bucket, k, seconds, v)))
    draft = make_draft(target, "mix")
    out = target.generate(**kw, assistant_model=draft, spec_config=fast(num_speculative_tokens=3, adaptive=True),
                          return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    m = out.spec_metrics
    assert len(seen) == m.num_rounds and {b for b, _, _ in seen} > {16}  # every round; smaller buckets too
    assert all(k == 3 and count == 3 and 0 <= accepted <= 3 for _, k, v in seen for _, accepted, count in v)
    assert sum(a for _, _, v in seen for _, a, _ in v) == m.num_accepted_tokens
    assert sum(c for _, _, v in seen for _, _, c in v) == m.num_draft_tokens
    lengths = (expected[:, ids.shape[1]:] != 0).sum(1).tolist()
    last_round = {}
    for i, (_, _, v) in enumerate(seen):
        for row, _, _ in v:
            last_round[row] = i
    assert sorted(last_round) == list(range(9))
    longest = max(range(9), key=lambda r: lengths[r])
    assert last_round[longest] == len(seen) - 1 and min(last_round.values()) < len(seen) - 1  # rows left early


@pytest.mark.parametrize("batch", [1, 5])
def test_k0_is_plain_decoding_through_the_runner(target, batch):
    ids, mask = left_padded_prompts(batch, seed=batch)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=9)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=9,
                          spec_config=fast(num_speculative_tokens=0), return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert out.spec_metrics.num_rounds == 8 and out.spec_metrics.num_draft_tokens == 0
    plain = hf_specdec.SpecConfig(num_speculative_tokens=0)  # bucketed left to choose: k = 0 lives on the runner
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=9,
                          spec_config=plain, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected) and out.spec_metrics.fast_path == "bucketed"


def test_second_call_reuses_buckets(target):
    draft = make_draft(target, "full")
    ids, mask = left_padded_prompts(3, seed=7)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, assistant_model=draft,
              spec_config=fast(num_speculative_tokens=2))
    first = target.generate(**kw)
    runner = runner_for(target, draft)
    states = dict(runner.slot.states)
    second = target.generate(**kw)
    assert torch.equal(first, second)
    assert runner_for(target, draft) is runner
    assert all(runner.slot.states[b] is s for b, s in states.items())  # same buffers: graphs would replay


def test_alternating_configurations_each_keep_their_buckets(target):
    """k = 2, then k = 3, then k = 2 again: the third call finds the first call's buffers (graphs would
    replay, not capture again), and every call stays exact."""
    draft = make_draft(target, "mix")
    ids, mask = left_padded_prompts(3, seed=9)
    base = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10)
    expected = target.generate(**base)
    runner = runner_for(target, draft)
    kept = {}
    for k in (2, 3, 2):
        out = target.generate(**base, assistant_model=draft, spec_config=fast(num_speculative_tokens=k))
        assert torch.equal(out, expected)
        kept.setdefault(k, dict(runner.slot.states))
        assert all(runner.slot.states[b] is s for b, s in kept[k].items())
    assert runner.key.k == 2 and len(runner.slots) == 2
    assert all(s.stat_per_position.shape[0] == 2 for s in kept[2].values())  # the k = 2 buffers, not k = 3's


def test_sampling_with_warpers_runs_on_the_runner(target):
    draft = make_draft(target, "mix")
    ids, mask = left_padded_prompts(4, seed=8)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.7, top_k=20, top_p=0.9,
                          max_new_tokens=12, assistant_model=draft, return_dict_in_generate=True,
                          spec_config=fast(num_speculative_tokens=3, generator=torch.Generator().manual_seed(0)))
    assert out.spec_metrics.fast_path == "bucketed"
    assert out.sequences.shape[1] == ids.shape[1] + 12
    assert 0 < out.spec_metrics.acceptance_rate < 1


def test_a_new_generator_never_finds_the_graphs_of_a_dropped_one(target):
    """Graphs replay the generator they were captured with. A generator the user dropped must not lend its
    configuration to a new one that CPython allocates at the same address (the new seed would be ignored):
    the runner keeps each configuration's generator alive, so its address cannot come back while the
    configuration is kept, and every generator gets a configuration of its own."""
    draft = make_draft(target, "mix")
    ids, mask = left_padded_prompts(2, seed=3)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=6, assistant_model=draft)
    runner = runner_for(target, draft)
    dropped, slots = [], []
    for _ in range(4):
        gen = torch.Generator().manual_seed(0)
        target.generate(**kw, spec_config=fast(num_speculative_tokens=2, generator=gen))
        slots.append(runner.slots.slot(runner.key))
        dropped.append(weakref.ref(gen))
        del gen  # the user's last reference
    assert all(ref() is not None for ref in dropped)  # (the runner's own last spec held only the newest)
    assert len({id(s) for s in slots}) == 4


class ShiftLogits(LogitsProcessor):
    """A user's own processor: the runner cannot know it is graph-safe."""

    def __call__(self, input_ids, scores):
        return scores + (input_ids[:, -1:] % 3).float()


@pytest.mark.parametrize("batch,cache_tokens", [(2, None), (5, 48)])
def test_unknown_processor_runs_hugging_faces_object_and_says_why(target, batch, cache_tokens):
    """A processor with no graph-safe form runs as the user's own object (graphs off), with plain generate's
    input_ids at every position: rows of different lengths, bucket padding rows, rows in waves."""
    ids, mask = left_padded_prompts(batch, seed=9)
    procs = LogitsProcessorList([ShiftLogits()])
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8, logits_processor=procs,
              output_scores=True, return_dict_in_generate=True)
    expected = target.generate(**kw)
    out = target.generate(**kw, assistant_model=make_draft(target, "mix"),
                          spec_config=fast(num_speculative_tokens=2, cache_tokens=cache_tokens))
    assert torch.equal(out.sequences, expected.sequences)
    for ours, theirs in zip(out.scores, expected.scores):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert out.spec_metrics.fast_path.startswith("bucketed: ShiftLogits has no graph-safe")


@pytest.mark.parametrize("batch,k,cache_tokens", [(1, 3, None), (5, 2, None), (5, 3, 48)])
def test_output_scores_run_on_the_runner_and_match_plain_generate(target, batch, k, cache_tokens):
    """The verify's processed scores of every committed token, rows ending at different steps on an EOS (their
    later steps padded as plain generate pads them), rows in waves under a small cache budget."""
    ids, mask = left_padded_prompts(batch, seed=10)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, eos_token_id=None)
    eos = int(plain[0, ids.shape[1] + 4])
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, eos_token_id=eos, pad_token_id=0,
              output_scores=True, return_dict_in_generate=True, repetition_penalty=1.3)
    expected = target.generate(**kw)
    out = target.generate(**kw, assistant_model=make_draft(target, "mix"),
                          spec_config=fast(num_speculative_tokens=k, cache_tokens=cache_tokens))
    assert out.spec_metrics.fast_path == "bucketed"
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores)
    for step, (ours, theirs) in enumerate(zip(out.scores, expected.scores)):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4, msg=lambda m: f"step {step}: {m}")


@pytest.mark.parametrize("batch,k,cache_tokens", [(1, 2, None), (5, 3, 48)])
def test_output_logits_run_on_the_runner_and_match_plain_generate(target, batch, k, cache_tokens):
    """The verify's raw logits of every committed token (rows ending early padded as plain generate pads them)."""
    ids, mask = left_padded_prompts(batch, seed=10)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=9, eos_token_id=None)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=9, pad_token_id=0,
              eos_token_id=int(plain[0, ids.shape[1] + 3]), output_logits=True, return_dict_in_generate=True)
    expected = target.generate(**kw)
    out = target.generate(**kw, assistant_model=make_draft(target, "mix"),
                          spec_config=fast(num_speculative_tokens=k, cache_tokens=cache_tokens))
    assert out.spec_metrics.fast_path == "bucketed"
    assert torch.equal(out.sequences, expected.sequences) and out.scores is None
    assert len(out.logits) == len(expected.logits)
    for ours, theirs in zip(out.logits, expected.logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_cpu_runs_the_runner_without_graphs_and_graph_switches_refuse_cpu(target):
    ids, mask = left_padded_prompts(1, seed=11)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=4,
              assistant_model=make_draft(target, "mix"), return_dict_in_generate=True)
    out = target.generate(**kw, spec_config=hf_specdec.SpecConfig(num_speculative_tokens=2))
    assert out.spec_metrics.fast_path == "bucketed"
    with pytest.raises(ValueError, match=r"cuda_graphs=True\) needs CUDA"):
        target.generate(**kw, spec_config=hf_specdec.SpecConfig(cuda_graphs=True))
    with pytest.raises(ValueError, match="compile=True"):
        target.generate(**kw, spec_config=hf_specdec.SpecConfig(compile=True))
    with pytest.raises(ValueError, match="draft model"):
        target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, spec_config=fast())


def test_typical_acceptance_runs_on_the_runner(target):
    ids, mask = left_padded_prompts(3, seed=12)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, max_new_tokens=10,
                          assistant_model=make_draft(target, "full"), return_dict_in_generate=True,
                          spec_config=fast(num_speculative_tokens=3, acceptance="typical"))
    assert out.spec_metrics.fast_path == "bucketed"
    assert out.spec_metrics.acceptance_rate > 0.5  # a copy of the target is typical by construction
    assert out.sequences.shape == (3, ids.shape[1] + 10)


def test_exhausted_cache_budget_names_the_setting(target):
    ids, mask = left_padded_prompts(4, seed=13)
    with pytest.raises(hf_specdec.CacheBudgetError, match="cache_tokens"):
        target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=30,
                        assistant_model=make_draft(target, "mix"),
                        spec_config=fast(num_speculative_tokens=2, cache_tokens=40))


def test_copies_of_a_model_do_not_copy_its_runners(target):
    """Runners stay with their model: a deepcopy (how users often build a draft) starts with none."""
    import copy

    ids, mask = left_padded_prompts(2, seed=14)
    target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=4,
                    assistant_model=make_draft(target, "mix"), spec_config=fast(num_speculative_tokens=2))
    assert len(target.__dict__["_hf_specdec_runners"]) >= 1
    clone = copy.deepcopy(target)
    assert len(clone.__dict__["_hf_specdec_runners"]) == 0


def test_output_scores_with_a_stopping_criterion_that_cuts_inside_a_run(target):
    """A user criterion stops a row in the middle of an accepted run: its scores end where its tokens end."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StopAfterToken(StoppingCriteria):
        def __init__(self, token):
            self.token = token

        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == self.token

    ids, mask = left_padded_prompts(3, seed=9)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, eos_token_id=2, pad_token_id=0,
              output_scores=True, return_dict_in_generate=True)
    plain = target.generate(**kw)
    stop = StoppingCriteriaList([StopAfterToken(int(plain.sequences[1, ids.shape[1] + 3]))])
    expected = target.generate(**kw, stopping_criteria=stop)
    out = target.generate(**kw, stopping_criteria=stop, assistant_model=make_draft(target, "full"),
                          spec_config=fast(num_speculative_tokens=4))
    assert out.spec_metrics.fast_path == "bucketed"
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores)
    for ours, theirs in zip(out.scores, expected.scores):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_host_processors_reuse_one_runner_slot_and_respect_subclasses(target):
    """Calls with a processor that has no graph-safe form share the runner's buffers (one slot, not one per call);
    a subclass of a warper that reads input_ids gets plain generate's input_ids (not the history-free shortcut)."""
    from transformers import TemperatureLogitsWarper

    class ShiftedTemperature(TemperatureLogitsWarper):
        def __call__(self, input_ids, scores):
            return super().__call__(input_ids, scores + (input_ids[:, -1:] % 5).float())

    ids, mask = left_padded_prompts(3, seed=14)
    draft = make_draft(target, "mix")
    for processor in (ShiftLogits(), ShiftedTemperature(0.7), ShiftLogits()):
        kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=9, pad_token_id=0,
                  logits_processor=LogitsProcessorList([processor]))
        expected = target.generate(**kw)
        out = target.generate(**kw, assistant_model=draft, spec_config=fast(num_speculative_tokens=3))
        assert torch.equal(out, expected), type(processor).__name__
    assert len(runner_for(target, draft).slots) == 1


def test_requests_the_rounds_cannot_reproduce_are_refused_by_name(target):
    """Classifier-free guidance keeps state per generation step; a stopping criterion without an EOS token at
    batch > 1 lets plain generate() decode stopped rows on. Both are refused, naming the fix; batch 1 runs."""
    class StopAt(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == 7

    ids, mask = left_padded_prompts(2, seed=15)
    kw = dict(assistant_model=make_draft(target, "mix"), spec_config=fast(num_speculative_tokens=2), max_new_tokens=6)
    with pytest.raises(ValueError, match="guidance_scale"):
        target.generate(input_ids=ids, attention_mask=mask, guidance_scale=2.0, **kw)
    stop = StoppingCriteriaList([StopAt()])
    with pytest.raises(ValueError, match="StopAt.*without an EOS token.*eos_token_id"):
        target.generate(input_ids=ids, attention_mask=mask, eos_token_id=None, pad_token_id=0, stopping_criteria=stop,
                        **kw)
    one = dict(input_ids=ids[:1], attention_mask=mask[:1], eos_token_id=None, pad_token_id=0, stopping_criteria=stop,
               max_new_tokens=12)
    expected = target.generate(**one)
    assert torch.equal(target.generate(**one, assistant_model=kw["assistant_model"], spec_config=kw["spec_config"]),
                       expected)


def test_a_call_builds_no_cache_of_transformers_unless_asked(target, monkeypatch):
    """The paged caches hold the call's K/V: transformers' generate() is not left to build a DynamicCache first
    (time to first token), unless the call asks for a cache itself, which is then checked as before."""
    from transformers import DynamicCache, GenerationConfig

    built = []
    init = DynamicCache.__init__
    monkeypatch.setattr(DynamicCache, "__init__", lambda self, *a, **kw: (built.append(1), init(self, *a, **kw))[1])
    ids, mask = left_padded_prompts(2, seed=5)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    plain = target.generate(**kw)
    built.clear()
    assert torch.equal(target.generate(**kw, spec_config=fast(num_speculative_tokens=0)), plain)
    assert not built
    assert torch.equal(target.generate(**kw, use_cache=True, spec_config=fast(num_speculative_tokens=0)), plain)
    assert built  # asked for: transformers builds it, and the call runs on the paged caches all the same
    config = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    got = target.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                          spec_config=fast(num_speculative_tokens=0))
    assert torch.equal(got, plain)
