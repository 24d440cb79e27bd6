"""Adaptive speculation length: the policy's choices from costs and acceptance, and generate() staying
exact while k changes between rounds, reaches 0 (a plain step: the draft model falls behind and
catches up) and comes back."""
import itertools

import numpy as np
import pytest
import torch

import hf_specdec
from hf_specdec.round.policy.speculation_length import SpeculationLength
from models import left_padded_prompts, make_draft, make_model
from test_sampling_exact import chi_square_pvalue, exact_joint_23, joint_23_counts, pair  # noqa: F401 (fixture)

MAX_NEW = 19


def measured(policy, bucket, costs):
    for k, c in costs.items():
        policy.record_cost(bucket, k, c)


def test_explores_both_ends_first():
    policy = SpeculationLength(4, True, "draft", hold_rounds=2)
    assert policy.choose(8, [0], [100]) == 4
    policy.observe(8, 4, 1.0, [(0, 2, 4)])
    assert policy.choose(8, [0], [100]) == 0


def test_without_graphs_the_first_round_of_each_length_is_warm_up():
    """The eager path (``hold_rounds == 1``) does not time the first round of a (bucket, k) in a call: it
    carried one-time work (13.4 ms against 7.3 later in a fresh CPU process). On graphs every clean round
    counts (the runner already drops rounds that captured)."""
    policy = SpeculationLength(3, True, "ngram")
    assert policy.choose(1, [0], [100]) == 3
    policy.observe(1, 3, 13.4, [(0, 3, 3)])
    assert policy.choose(1, [0], [100]) == 3  # not measured yet: both ends are tried until they are
    policy.observe(1, 3, 7.3, [(0, 3, 3)])
    for seconds in (20.0, 5.0):
        assert policy.choose(1, [0], [100]) == 0
        policy.observe(1, 0, seconds, [(0, 0, 0)])
    assert policy.cost(1, 3) == 7.3 and policy.cost(1, 0) == 5.0
    graphs = SpeculationLength(3, True, "ngram", hold_rounds=2)
    graphs.observe(1, 3, 13.4, [(0, 3, 3)])
    assert graphs.cost(1, 3) == 13.4


def test_a_round_in_which_no_row_drafted_does_not_price_its_length():
    """n-gram rows without a match propose nothing: such a round stands in for the length's cost only until
    a round that drafted is measured, and is not mixed with those after."""
    policy = SpeculationLength(4, True, "ngram", hold_rounds=2)
    policy.observe(1, 4, 9.0, [(0, 0, 0), (1, 0, 0)])
    assert policy.cost(1, 4) == 9.0  # nothing better known
    policy.observe(1, 4, 2.0, [(0, 1, 4), (1, 0, 0)])
    policy.observe(1, 4, 30.0, [(0, 0, 0), (1, 0, 0)])
    assert policy.cost(1, 4) == 2.0


def test_an_eager_call_whose_first_round_found_no_match_still_drafts():
    """tests/test_ngram.py's flaky case: a fresh process's first round (k_max) found no n-gram match in any
    row and took twice a later round's time; the call then priced drafting out for all its 16 rounds."""
    policy = SpeculationLength(3, True, "ngram")
    rows, ks = [0, 1, 2], []
    for i in range(16):
        k = policy.choose(1, rows, [16 - i] * 3)
        ks.append(k)
        matches = i > 0 and k > 0
        seconds = 13.4 if i == 0 else (7.3 if k else 5.0)
        policy.observe(1, k, seconds, [(r, k if matches else 0, k if matches else 0) for r in rows])
    assert sum(k > 0 for k in ks[4:]) >= 8, ks


def test_useless_draft_goes_to_zero_and_probes_ever_less_often():
    policy = SpeculationLength(4, True, "draft")
    measured(policy, 1, {0: 1.0, 4: 2.2})
    for _ in range(3):
        policy.observe(1, 4, None, [(0, 0, 4), (1, 0, 4)])
    chosen = []
    for _ in range(60):
        k = policy.choose(1, [0, 1], [100, 100])
        chosen.append(k)
        if k:
            policy.observe(1, k, None, [(0, 0, k), (1, 0, k)])
    probes = [i for i, k in enumerate(chosen) if k]
    assert chosen[0] == 0 and len(probes) == 2 and probes[1] - probes[0] > 16
    assert policy.histogram[0] == 58


def test_good_draft_takes_the_longest_round():
    policy = SpeculationLength(6, True, "draft")
    measured(policy, 1, {0: 1.0, 6: 1.6})
    for _ in range(10):
        policy.observe(1, 6, None, [(0, 6, 6)])
    assert policy.choose(1, [0], [100]) == 6


def test_expensive_verify_picks_a_middle_length():
    policy = SpeculationLength(8, True, "draft")
    measured(policy, 32, {0: 1.0, 1: 1.5, 8: 5.0})  # large batch: every drafted token costs
    for _ in range(10):
        policy.observe(32, 8, None, [(r, 2, 8) for r in range(32)])  # acceptance about 0.67
    assert 1 <= policy.choose(32, list(range(32)), [100] * 32) < 8


def test_fixed_and_zero():
    assert SpeculationLength(3, False, "draft").choose(1, [0], [9]) == 3
    assert SpeculationLength(0, True, "draft").choose(1, [0], [9]) == 0


def test_the_slowest_row_sets_the_length():
    """Many rows that accept everything and one that accepts little: long rounds would serve the many,
    but the call lasts as long as the slow row, for which short rounds are cheaper per token."""
    policy = SpeculationLength(8, True, "draft")
    measured(policy, 32, {0: 1.0, 1: 1.3, 8: 3.4})
    for _ in range(40):  # one dip is not enough: a row's long memory must learn that its draft fails
        policy.observe(32, 8, None, [(r, 8, 8) for r in range(31)] + [(31, 0, 8)])
    assert policy.choose(32, list(range(32)), [100] * 32) <= 1
    assert policy.choose(32, list(range(31)), [100] * 31) == 8  # without the slow row: the longest round


def test_ngram_rows_without_matches_count_as_plain_steps():
    policy = SpeculationLength(4, True, "ngram")
    for _ in range(20):
        policy.observe(1, 4, None, [(0, 0, 0), (1, 4, 4)])
    assert policy.match_rate(0) < 0.15 and policy.match_rate(1) > 0.85 and policy.acceptance(1) > 0.9


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


def test_a_dip_is_retried_but_a_useless_draft_is_not():
    def zero_rounds_until_drafting(policy):
        for i in range(15):  # fewer than the first probe's 16: only the drift toward the prior can end it
            if policy.choose(1, [0], [100]):
                return i
            policy.observe(1, 0, None, [(0, 0, 0)])
        return None

    costs = {0: 1.0, 1: 1.9, 2: 2.1, 3: 2.3, 4: 2.4}
    good = SpeculationLength(4, True, "draft")
    measured(good, 1, costs)
    for _ in range(20):
        good.observe(1, 4, None, [(0, 4, 4), (1, 4, 4)])  # this call's drafts mostly accepted
    for _ in range(30):
        good.observe(1, 4, None, [(0, 0, 4)])  # hard text: row 0's drafts fail for a while
    assert good.choose(1, [0], [100]) == 0
    assert zero_rounds_until_drafting(good) is not None
    useless = SpeculationLength(4, True, "draft")
    measured(useless, 1, costs)
    for _ in range(6):
        useless.observe(1, 4, None, [(0, 0, 4)])
    assert zero_rounds_until_drafting(useless) is None


def test_one_stalled_round_does_not_price_a_length_out():
    """Costs are the median of recent clean rounds: one round that met a host stall (a collector pause,
    a lazy load) leaves the choice as it was."""
    policy = SpeculationLength(4, True, "draft")
    for _ in range(3):
        measured(policy, 1, {0: 1.0, 1: 1.2, 2: 1.4, 3: 1.6, 4: 1.8})
    for _ in range(10):
        policy.observe(1, 4, None, [(0, 3, 4)])
    k = policy.choose(1, [0], [100])
    assert k > 0
    policy.observe(1, k, 1.5, [])  # the call's first round of k: warm-up, not timed
    policy.observe(1, k, 500.0, [])  # the stalled round's cost alone (its verdicts would move the estimate)
    assert policy.choose(1, [0], [100]) == k
    assert policy.cost(1, k) < 2.0


def test_round_costs_are_kept_per_execution():
    """Rounds on the models' uncompiled graphs (while the compiled code is being made) cost about twice what
    compiled rounds cost. A call that switches to the compiled code prices its rounds afresh: with one table,
    k = 0 (re-measured every round) got cheap while k > 0 kept its old prices, and speculation stopped."""
    memory = {}
    graphs = SpeculationLength(4, True, "draft", memory, hold_rounds=2, execution=(True, False))
    for _ in range(3):
        measured(graphs, 32, {0: 2.0, 4: 4.0})
    for _ in range(10):
        graphs.observe(32, 4, None, [(r, 3, 4) for r in range(32)])
    graphs.end_call()
    compiled = SpeculationLength(4, True, "draft", memory, hold_rounds=2, execution=(True, True))
    assert not compiled.has_costs(32)  # the loop times k = 0 and k_max on this execution first
    for _ in range(3):
        measured(compiled, 32, {0: 1.0, 4: 1.8})
    for _ in range(10):
        compiled.observe(32, 4, None, [(r, 3, 4) for r in range(32)])
    assert compiled.cost(32, 4) == 1.8 and graphs.cost(32, 4) == 4.0
    assert compiled.choose(32, list(range(32)), [100] * 32) > 0
    again = SpeculationLength(4, True, "draft", memory, hold_rounds=2, execution=(True, False))
    assert again.has_costs(32) and again.cost(32, 0) == 2.0  # each execution keeps its own table


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


def test_the_row_spread_shortens_rounds_but_does_not_stop_drafting(monkeypatch):
    """At a call's start no row has drafted: they count as the slowest of rows that spread (row_spread.py).
    That may shorten the rounds, but a k = 0 it chose would bring no verdicts and leave the rows as unknown and as
    pessimistic until the next probe (an H200 pair's traces at b = 32: k = 0 in 65 of 207 rounds, 0.96x the best
    fixed k)."""
    from hf_specdec.round.policy import speculation_length as sl

    def first_choice():
        policy = SpeculationLength(4, True, "draft", {"acceptance": 0.6, "row_spread": 0.04}, hold_rounds=2)
        for _ in range(3):
            measured(policy, 32, {0: 1.0, 1: 1.31, 2: 1.5, 3: 1.7, 4: 1.86})
        rows = list(range(32))
        spread, plain = policy.bottleneck_rounds(rows, [100] * 32), policy.bottleneck_rounds(rows, [100] * 32, False)
        return policy.choose(32, rows, [100] * 32), spread, plain

    k, spread, plain = first_choice()
    costs = np.array([1.0, 1.31, 1.5, 1.7, 1.86])
    assert np.argmax(1 / (costs * spread)) == 0 and np.argmax(1 / (costs * plain)) > 0  # the case in question
    assert k == 1 + np.argmax(1 / (costs * spread)[1:])  # the spread still sets the length
    monkeypatch.setattr(sl, "_SPREAD_STOPS_DRAFTING", True)
    assert first_choice()[0] == 0  # as before


def test_rows_seen_first_in_choose_start_from_the_prior():
    policy = SpeculationLength(3, True, "draft", {"acceptance": 0.9})
    measured(policy, 8, {0: 1.0, 3: 1.2})
    assert policy.choose(8, [5, 6], [50, 50]) == 3  # rows never observed: prior 0.9, long rounds pay
    assert abs(policy.acceptance(6) - 0.9) < 1e-9


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
    probes still come after the same rounds of 0, and a probe stands one round."""
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
    useless = SpeculationLength(4, True, "draft", hold_rounds=4)
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
    assert chosen[first_probe + 1] == 0  # a probe stands one round
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


def test_without_position_data_the_rounds_are_geometric():
    """No run-position data (a fresh memory): E(k) = 1 + a + ... + a^k, the model the policy had before."""
    policy = SpeculationLength(8, True, "draft")
    a = np.array([0.3, 0.7, 0.95])
    geometric = np.cumsum(a[:, None] ** np.arange(9), axis=1)
    assert np.allclose(policy.runs.tokens_per_round(a), geometric)


def test_run_positions_not_reached_lean_on_the_one_before():
    """Rounds of k = 3 that start runs: positions 1..3 measured (the 2nd hard), 4 and later not. Position 4 is
    taken as good as the 3rd (a longer round gets tried); after a hard position none is extrapolated."""
    runs = SpeculationLength(8, True, "draft").runs
    rng = np.random.default_rng(0)
    for _ in range(300):
        accepted = rng.choice([0, 1, 3], p=[0.1, 0.4, 0.5], size=4)
        runs.observe(np.full(4, 0.6), accepted, np.full(4, 3), np.ones(4, dtype=np.int64))
    d = np.log(runs.odds_factors())
    assert d[1] < d[0] - 1 and d[2] > d[1] + 1  # the 2nd position is the hard one
    assert abs(d[3] - d[2]) < 0.05 and d[3] > 0 and d[-1] >= 0
    hard = SpeculationLength(8, True, "draft").runs
    for _ in range(300):  # the 2nd position always fails: later ones are never reached
        hard.observe(np.full(4, 0.6), np.ones(4, dtype=np.int64), np.full(4, 3), np.ones(4, dtype=np.int64))
    d = np.log(hard.odds_factors())
    assert d[1] < -1 and abs(d[2]) < 0.05
