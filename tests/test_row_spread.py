"""How much a batch's rows differ (strategies/row_spread.py) and what the speculation-length policy makes of
it: rows whose own rate is unknown yet count as the slowest of rows that differ that much."""
import numpy as np
import pytest

from hf_specdec.round.policy import speculation_length as sl
from hf_specdec.round.policy.row_spread import between_rows_variance, slowest_quantile
from hf_specdec.round.policy.speculation_length import SpeculationLength


def rows_observed(rates, rounds=60, k=1, seed=0):
    """A policy that saw ``rounds`` rounds of k drafts of rows accepting each draft with their ``rates``."""
    rng = np.random.default_rng(seed)
    policy = SpeculationLength(k, True, "draft", hold_rounds=2)
    for _ in range(rounds):
        accepted = [int(np.argmin(np.append(rng.random(k) < a, False))) for a in rates]  # drafts before a miss
        policy.observe(32, k, None, [(r, n, k) for r, n in enumerate(accepted)])
    return policy


def test_between_rows_variance_recovers_the_spread_of_rates():
    rng = np.random.default_rng(1)
    estimates = []
    for _ in range(40):
        rates = np.clip(0.7 + 0.15 * rng.standard_normal(32), 0.02, 0.98)
        n = np.full(32, 80.0)
        accepted = rng.binomial(80, rates).astype(float)
        estimates.append(between_rows_variance(accepted, n, n, 8.0, 4))
    assert abs(np.mean(estimates) / np.var(np.clip(0.7 + 0.15 * rng.standard_normal(10 ** 6), 0.02, 0.98)) - 1) < 0.15
    alike = [between_rows_variance(rng.binomial(80, 0.7, 32).astype(float), n, n, 8.0, 4) for _ in range(40)]
    assert np.mean(alike) < 0.002  # sampling noise alone is not read as rows that differ
    assert between_rows_variance(np.array([5.0, 6.0, 7.0]), np.full(3, 9.0), np.full(3, 9.0), 8.0, 4) is None


@pytest.mark.parametrize("rates, low, high", [([0.7] * 32, 0.0, 0.001), ([0.9] * 16 + [0.4] * 16, 0.05, 0.075),
                                               ([0.8] * 16 + [0.7] * 16, 0.0018, 0.0035)])
def test_the_policy_reads_the_spread_through_its_decayed_counts(rates, low, high):
    """The long memory decays its counts; their sampling variance is taken from the squared weights, so rows
    alike read as alike, and half-and-half batches of 0.9 and 0.4, or 0.8 and 0.7, as variances of about
    0.0625 and 0.0025 (counting each decayed draft as a whole one read the latter as 0.0004)."""
    spreads = [rows_observed(rates, seed=s).row_spread() for s in range(6)]
    assert low <= np.mean(spreads) <= high


def test_slowest_quantile():
    assert slowest_quantile(1) == 0.0
    assert 1.8 < slowest_quantile(32) < 1.9
    assert slowest_quantile(4) < slowest_quantile(8) < slowest_quantile(32)


def choice_at_a_calls_start(rows, spread):
    memory = {"acceptance": 0.85, "row_spread": spread}
    policy = SpeculationLength(8, True, "draft", memory, hold_rounds=2)
    for bucket in (1, 32):
        for k in range(9):
            policy.record_cost(bucket, k, 1.0 + 0.17 * k)  # an H200 pair's bucket-32 costs, relative to k = 0
    return policy.choose(32 if rows > 1 else 1, list(range(rows)), [127] * rows)


def test_a_calls_start_is_decided_for_the_slowest_of_rows_that_differ():
    """An H200 pair at batch 32, bf16: each call began with k = 7, right for a row at the batch's acceptance,
    while the slowest of 32 rows that differed (its best k 2-3) set the pace. Rows seen by nobody yet count as
    the slowest of 32 rows spread as the last call's were; one row alone, or rows alike, are taken at the prior."""
    alone = choice_at_a_calls_start(1, 0.006)  # that pair's calls ended with a spread of about 0.006 (sd 0.075)
    assert alone == 5
    assert choice_at_a_calls_start(32, 0.0) == alone
    assert choice_at_a_calls_start(32, 0.006) == 3
    assert choice_at_a_calls_start(32, 0.03) < 3


def test_rows_with_their_own_rate_are_taken_at_it(monkeypatch):
    """Once rows have drafted, their own estimates stand: the spread no longer moves them."""
    policy = rows_observed([0.9] * 16 + [0.4] * 16, rounds=30, k=2)
    rows = list(range(32))
    with_spread = policy.bottleneck_rounds(rows, [100] * 32)
    monkeypatch.setattr(sl, "_ROW_SPREAD", 0)
    policy._spread = None
    np.testing.assert_allclose(policy.bottleneck_rounds(rows, [100] * 32), with_spread)


def test_a_calls_end_leaves_its_spread_to_the_next_call():
    """Decisions read the spread only while rows have no rate of their own (a call's start), so the call's end
    computes it once for the next call's start."""
    policy = rows_observed([0.9] * 16 + [0.4] * 16, rounds=60, k=1)
    assert "row_spread" not in policy.memory  # nothing decided: never read
    policy.end_call()
    assert 0.04 <= policy.memory["row_spread"] <= 0.09
    again = SpeculationLength(1, True, "draft", policy.memory, hold_rounds=2)
    assert again.row_spread() == policy.memory["row_spread"]  # a call with no rows of its own yet: the last call's
