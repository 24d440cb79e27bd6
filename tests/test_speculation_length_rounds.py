"""Adaptive speculation length over a call's rounds: decisions that stand for several rounds, prepared ahead
or made afresh when rows join, and generate() staying exact while k changes between rounds, reaches 0 (a plain
step: the draft model falls behind and catches up) and comes back, keeping and reporting the round costs it
used."""
import itertools

import pytest
import torch

import hf_specdec
from hf_specdec.round.policy import speculation_length as sl
from hf_specdec.round.policy.speculation_length import SpeculationLength
from models import left_padded_prompts, make_draft, make_model
from test_sampling_exact import chi_square_pvalue, exact_joint_23, joint_23_counts, pair  # noqa: F401 (fixture)
from test_speculation_length_choice import measured

MAX_NEW = 19


SCHEDULE = [3, 0, 0, 2, 0, 3, 1, 0, 0, 0, 3]


@pytest.fixture
def scripted(monkeypatch):
    """Rounds take k from SCHEDULE in turn (the real policy otherwise follows timings)."""
    turn = itertools.count()
    monkeypatch.setattr(SpeculationLength, "_choose",
                        lambda self, bucket, rows, remaining: min(SCHEDULE[next(turn) % len(SCHEDULE)], self.k_max))


@pytest.mark.parametrize("method,kind,batch", [("draft", "full", 1), ("draft", "full", 4), ("draft", "mix", 3),
                                               ("ngram", None, 3)])
def test_changing_k_stays_greedy_exact(scripted, method, kind, batch):
    target = hf_specdec.enable(make_model("llama", seed=3))
    ids, mask = left_padded_prompts(batch, seed=batch)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    draft = make_draft(target, kind) if method == "draft" else None
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                          assistant_model=draft, return_dict_in_generate=True,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, method=method, block_size=4,
                                                            adaptive=True))
    assert torch.equal(out.sequences, expected)
    m = out.spec_metrics
    assert m.k_histogram[0] >= 2 and len(m.k_histogram) >= 3
    if kind == "full":  # after rounds of k = 0 the draft caught up: a copy of the target still agrees
        assert m.acceptance_rate == 1.0


def test_changing_k_keeps_the_sampling_law(scripted, pair):  # noqa: F811
    target, draft = pair
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    spec = hf_specdec.SpecConfig(num_speculative_tokens=2, generator=torch.Generator().manual_seed(0),
                                 adaptive=True)
    n = 6000
    out = target.generate(input_ids=prompt.expand(n, -1), assistant_model=draft, do_sample=True, top_k=0,
                          max_new_tokens=3, spec_config=spec, return_dict_in_generate=True)
    counts = joint_23_counts(out.sequences, prompt.shape[1], target.config.vocab_size)
    assert out.spec_metrics.k_histogram.get(0, 0) >= 1
    assert chi_square_pvalue(counts, exact_joint_23(target, prompt)) > 1e-3


def test_long_runs_of_zero_catch_up_in_chunks(monkeypatch):
    """More rounds of k = 0 than the runner's catch-up window, then drafting again: the draft model reads
    the missed tokens only then, window by window, oldest first (a copy of the target still agrees on
    every draft) and the output is the target's own. A call that ends at k = 0 feeds the draft nothing."""
    from hf_specdec.round.proposers import DraftModelProposer

    unread = []  # tokens the draft model had still to read, at each catch-up window
    feed = DraftModelProposer.catch_up
    monkeypatch.setattr(DraftModelProposer, "catch_up",
                        staticmethod(lambda s, *a, **kw: (unread.append(int(s.behind)), feed(s, *a, **kw))))
    schedule = iter([2] + [0] * 37 + [2] * 40)
    monkeypatch.setattr(SpeculationLength, "_choose", lambda self, bucket, rows, remaining: next(schedule))
    target = hf_specdec.enable(make_model("llama", seed=5))
    ids, mask = left_padded_prompts(3, seed=2)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=60)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=2, adaptive=True)
    draft = make_draft(target, "full")
    out = target.generate(**kw, assistant_model=draft, return_dict_in_generate=True, spec_config=spec)
    assert torch.equal(out.sequences, target.generate(**kw))
    assert out.spec_metrics.k_histogram[0] == 37 and out.spec_metrics.acceptance_rate == 1.0
    assert unread == [37, 29, 21, 13, 5]  # windows of CATCH_UP = 8, the oldest first
    unread.clear()
    schedule = iter([2] + [0] * 80)
    out = target.generate(**kw, assistant_model=draft, return_dict_in_generate=True, spec_config=spec)
    assert torch.equal(out.sequences, target.generate(**kw)) and unread == []


def test_generate_keeps_round_costs_under_the_call_s_execution():
    from hf_specdec.runner import runner_for
    target = hf_specdec.enable(make_model("llama", seed=5))
    draft = make_draft(target, "full")
    ids, mask = left_padded_prompts(2, seed=1)
    target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8, assistant_model=draft,
                    spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, adaptive=True))
    runner = runner_for(target, draft)
    assert runner.execution == (False, False)  # CPU: no graphs, no compiled code
    tables = runner.policy_memory["costs_by_execution"]
    assert list(tables) == [(False, False)] and tables[(False, False)]["costs"]
    assert "costs" not in runner.policy_memory


def test_the_costs_used_are_reported():
    target = hf_specdec.enable(make_model("llama", seed=5))
    ids, mask = left_padded_prompts(2, seed=1)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
                          assistant_model=make_draft(target, "full"), return_dict_in_generate=True,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, adaptive=True))
    costs = out.spec_metrics.round_costs_ms
    assert list(costs) == [2] and sorted(costs[2]) == [0, 1, 2, 3] and all(c > 0 for c in costs[2].values())


def good_draft_with_decisions_recorded(monkeypatch, hold_rounds: int):
    """A policy at bucket 8 whose five rows accepted every draft of 20 rounds of k = 4, and the list of
    buckets its ``_choose`` was called with (one entry per fresh decision)."""
    decisions = []
    policy = SpeculationLength(4, True, "draft", hold_rounds=hold_rounds)
    original = policy._choose
    monkeypatch.setattr(policy, "_choose", lambda *a: decisions.append(a[0]) or original(*a))
    measured(policy, 8, {0: 1.0, 4: 1.1})
    for _ in range(20):
        policy.observe(8, 4, None, [(r, 4, 4) for r in range(5)])
    return policy, decisions


def test_a_held_decision_stands_for_its_rounds_of_the_same_shape(monkeypatch):
    """On CUDA graphs a decision stands for a few rounds (the policy's host work delays the next round),
    one of k = 0 longer; rows that finish keep it (in a smaller bucket too), a larger bucket or rows that join
    decide afresh,
    probes still come after the same rounds of 0, and a probe stands its four rounds."""
    policy, decisions = good_draft_with_decisions_recorded(monkeypatch, hold_rounds=4)
    ks = [policy.choose(8, list(range(5)), [100] * 5) for _ in range(7)]
    assert ks == [4] * 7 and len(decisions) == 2
    policy.choose(8, list(range(4)), [100] * 4)  # a row finished: the decision stands its last round
    assert len(decisions) == 2
    policy.choose(8, list(range(4)), [100] * 4)
    policy.choose(8, list(range(6)), [100] * 6)  # rows joined: decided again
    assert len(decisions) == 4
    for _ in range(3):
        policy.choose(4, list(range(3)), [100] * 3)  # a smaller bucket: the decision stands its rounds there
    assert len(decisions) == 4
    policy.choose(4, list(range(3)), [100] * 3)  # then the next one is the smaller bucket's
    assert decisions[-1] == 4 and len(decisions) == 5
    policy.choose(8, list(range(3)), [100] * 3)  # a larger bucket (rows joined): decided again
    assert decisions[-1] == 8 and len(decisions) == 6
    useless = SpeculationLength(4, True, "draft", hold_rounds=2)  # not _PROBE_ROUNDS: a probe stands its own
    measured(useless, 1, {0: 1.0, 4: 2.2})
    for _ in range(6):
        useless.observe(1, 4, None, [(0, 0, 4)])
    decisions.clear()
    monkeypatch.setattr(useless, "_choose", lambda *a, f=useless._choose: decisions.append(a[0]) or f(*a))
    chosen, expect_none = [], []
    for _ in range(40):
        chosen.append(useless.choose(1, [0], [100]))
        expect_none.append(useless.expects_no_drafts)
    first_probe = next(i for i, k in enumerate(chosen) if k)
    assert chosen[:first_probe] == [0] * first_probe and 12 <= first_probe <= 20
    probe = sl._PROBE_ROUNDS
    assert probe > 1 and chosen[first_probe:first_probe + probe + 1] == [chosen[first_probe]] * probe + [0]
    assert all(expect_none)  # a probe does not make the next call run the draft's prefill
    assert len(decisions) <= 6  # decisions of 0 stand 16 rounds (until the next probe at most)


def test_a_decision_prepared_while_the_device_works_is_taken_by_the_next_choice(monkeypatch):
    """``prepare`` decides ahead (the fast path calls it while a round runs); the next ``choose`` of that
    shape takes the decision without deciding again (also when rows finished since), a held decision is not
    pre-empted, and a decision for rows that joined since is dropped."""
    policy, decisions = good_draft_with_decisions_recorded(monkeypatch, hold_rounds=2)
    rows = list(range(5))
    assert policy.choose(8, rows, [100] * 5) == 4 and len(decisions) == 1
    policy.prepare(8, rows, [100] * 5)  # the decision stands one more round: nothing to decide yet
    assert len(decisions) == 1 and policy.choose(8, rows, [100] * 5) == 4
    policy.prepare(8, rows, [100] * 5)
    assert len(decisions) == 2
    assert policy.choose(8, rows, [100] * 5) == 4 and len(decisions) == 2  # taken, not decided again
    assert policy.choose(8, rows, [100] * 5) == 4 and len(decisions) == 2  # and it stands its rounds
    policy.prepare(8, rows, [100] * 5)
    assert policy.choose(8, rows[:4], [100] * 4) == 4 and len(decisions) == 3  # a row left: the one prepared
    policy.choose(8, rows[:4], [100] * 4)
    policy.prepare(8, rows[:4], [100] * 4)
    assert policy.choose(8, rows + [5], [100] * 6) == 4 and len(decisions) == 5  # a row joined: afresh


def test_rows_that_join_while_others_leave_are_decided_for(monkeypatch):
    """Two rows finish and one joins at the same sync: the live count fell, but a new row came, so the
    decision that stood is not reused."""
    policy, decisions = good_draft_with_decisions_recorded(monkeypatch, hold_rounds=4)
    policy.choose(8, list(range(5)), [100] * 5)
    assert len(decisions) == 1
    policy.rows_joined()  # what run_fast calls when waiting rows start
    policy.choose(8, [0, 1, 2, 9], [100] * 4)
    assert len(decisions) == 2


def test_a_draft_left_at_zero_is_not_run_until_a_round_drafts(monkeypatch):
    """After a call whose last choice was k = 0 the next call starts without the draft model's prefill: a
    call that stays at k = 0 never runs the draft; one that drafts again first has it read every row from
    position 0, in windows (rows of different lengths), and stays exact with every draft accepted."""
    from hf_specdec.round.proposers import DraftModelProposer

    unread = []
    feed = DraftModelProposer.catch_up
    monkeypatch.setattr(DraftModelProposer, "catch_up",
                        staticmethod(lambda s, *a, **kw: (unread.append(int(s.behind)), feed(s, *a, **kw))))
    schedule = iter([0] * 30)
    monkeypatch.setattr(SpeculationLength, "_choose", lambda self, bucket, rows, remaining: next(schedule))
    target = hf_specdec.enable(make_model("llama", seed=5))
    draft = make_draft(target, "full")
    ids, mask = left_padded_prompts(3, seed=4, min_len=3, max_len=40)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=2, adaptive=True)
    calls = []
    draft_forward = draft.forward
    monkeypatch.setattr(draft, "forward", lambda *a, **k: (calls.append(1), draft_forward(*a, **k))[1])
    expected = target.generate(**kw)
    for schedule in (iter([0] * 21), iter([0] * 21)):  # the first call runs the draft's prefill, the second not
        calls.clear()
        out = target.generate(**kw, assistant_model=draft, spec_config=spec, return_dict_in_generate=True)
        assert torch.equal(out.sequences, expected)
    assert calls == [] and unread == []
    schedule = iter([0] * 4 + [2] * 20)
    out = target.generate(**kw, assistant_model=draft, spec_config=spec, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert out.spec_metrics.acceptance_rate == 1.0, out.spec_metrics.k_histogram
    longest = int(mask.sum(1).max())
    assert unread[0] == longest + 1 - 2 + 4  # the longest row's length - 2 after 4 rounds of k = 0
    assert len(unread) == -(-unread[0] // 8)  # windows of CATCH_UP = 8
