"""Adaptive speculation length, the policy alone: the k it chooses from measured round costs and the rows'
acceptance (exploring both ends, warm-up and stalled rounds, cost tables per execution, the slowest row and the
row spread, probes of a useless draft) and its model of how many tokens a round of k yields."""
import numpy as np

from hf_specdec.round.policy import speculation_length as sl
from hf_specdec.round.policy.speculation_length import SpeculationLength


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
    probes = [i for i, k in enumerate(chosen) if k and not (i and chosen[i - 1])]  # each probe: 4 rounds
    assert chosen[0] == 0 and len(probes) == 2 and probes[1] - probes[0] > 16 + 4
    assert policy.histogram[0] == 60 - 2 * 4


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


H200_PAIR_B1 = {0: 0.651e-3, 1: 1.121e-3, 2: 1.171e-3, 3: 1.21e-3, 4: 1.269e-3}  # one-token layers: k_max ~ 2 steps


def _call(acceptance: float, costs: dict, memory=None, rounds: int = 300, seed: int = 0) -> SpeculationLength:
    """One adaptive call on graphs at b = 1 whose round costs are ``costs``, a draft accepting each token with
    probability ``acceptance``, in the loop's order: a round is observed after the next one was chosen, and the
    decision after that is prepared meanwhile."""
    rng = np.random.default_rng(seed)
    policy = SpeculationLength(4, True, "draft", dict(memory or {}), hold_rounds=2)
    measured(policy, 1, costs)
    last = None
    for _ in range(rounds):
        k = policy.choose(1, [0], [1000])
        if last is not None:
            policy.observe(1, *last)
        accepted = int(np.argmin(np.append(rng.random(k) < acceptance, False)))  # the leading agreements
        last = (k, None, [(0, accepted, k)] if k else [(0, 0, 0)])
        policy.prepare(1, [0], [1000])
    policy.end_call()
    return policy


def test_a_first_call_judges_the_draft_before_it_stops_drafting():
    """Where rounds that draft cost a little over twice a plain step, the prior 0.5 alone chooses k = 0, and rounds
    of k = 0 bring no verdicts: a call with no earlier call's acceptance drafts until it has seen a few."""
    policy = SpeculationLength(4, True, "draft", {}, hold_rounds=2)
    measured(policy, 1, {k: c * (1.05 if k else 1.0) for k, c in H200_PAIR_B1.items()})
    assert np.argmax(1 / (policy.cost_table(1) * policy.bottleneck_rounds([0], [1000]))) == 0  # the prior's choice
    ks = []
    for _ in range(sl._JUDGED_VERDICTS):  # a useless draft: a rejection a round
        ks.append(policy.choose(1, [0], [1000]))
        policy.observe(1, ks[-1], None, [(0, 0, ks[-1])])
    assert all(ks) and policy.judged and policy.choose(1, [0], [1000]) == 0
    assert policy.choose(1, [0], [1]) == 0  # nor before, where no row has a second token left
    assert SpeculationLength(4, True, "draft", {"acceptance": 0.5}, hold_rounds=2).judged  # an earlier call's
    ngram = SpeculationLength(4, True, "ngram", {}, hold_rounds=2)
    for _ in range(sl._JUDGED_ROUNDS):  # rounds of k > 0 in which no row found a match: no verdicts
        assert not ngram.judged
        ngram.observe(1, 4, None, [(0, 0, 0)])
    assert ngram.judged


def test_probes_lift_an_estimate_that_dipped_below_the_break_even():
    """An earlier call left the acceptance at 0.35 (a hard stretch), below the break-even of the pair's b = 1 costs
    on an H200 (about 0.5), and the draft agrees 0.75 again: probes of four rounds bring enough verdicts to resume
    drafting (probes of one round, at most every 1024, left an H200 b = 1 benchmark at k = 0 for 1015 of its 1016
    rounds). Medians over seeds (one call's luck decides when it resumes)."""
    zeros = lambda a: np.median([_call(a, H200_PAIR_B1, {"acceptance": 0.35}, seed=s).histogram[0]  # noqa: E731
                                 for s in range(9)])
    assert zeros(0.75) < 64
    assert zeros(0.02) > 250  # a useless draft still runs plain steps


def test_a_probe_cut_short_by_rows_joining_is_made_again():
    """Rows that join drop the decision that stands: a probe dropped so must not count as made (the schedule has
    moved on), or rows joining at every sync would leave a call without probes."""
    policy = SpeculationLength(4, True, "draft", {"acceptance": 0.02}, hold_rounds=2)
    measured(policy, 1, H200_PAIR_B1)
    ks = []
    for _ in range(200):
        ks.append(policy.choose(1, [0], [1000]))
        policy.observe(1, ks[-1], None, [(0, 0, ks[-1])] if ks[-1] else [(0, 0, 0)])
        policy.prepare(1, [0], [1000])
        if ks[-1] or policy._pending and policy._pending.k:
            policy.rows_joined()  # at every probe round, and whenever a probe is prepared
    assert sum(k > 0 for k in ks) >= 4
