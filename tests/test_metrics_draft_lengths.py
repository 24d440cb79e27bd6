"""spec_metrics' draft lengths (read at each round's sync) agree with the device's counts, and the acceptance per
drafted position is the per-position acceptance of the drafts that reached each position."""
import os
import sys

import pytest

import hf_specdec
from models import left_padded_prompts, make_draft, make_model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from benchmarks.common import aggregate_metrics  # noqa: E402


@pytest.fixture(scope="module")
def target():
    return hf_specdec.enable(make_model("llama", seed=0))


def _metrics(target, draft, batch, **spec):
    ids, mask = left_padded_prompts(batch, seed=batch)
    out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, do_sample=False,
                          max_new_tokens=21, return_dict_in_generate=True,
                          spec_config=hf_specdec.SpecConfig(block_size=4, **spec))
    return out.spec_metrics


def _check_counts(m):
    assert sum(m.draft_lengths.values()) == m.num_drafts > 0
    assert sum(d * n for d, n in m.draft_lengths.items()) == m.num_draft_tokens
    drafted = m.drafted_per_position
    assert drafted[0] == m.num_drafts and all(a >= b for a, b in zip(drafted, drafted[1:]))
    assert all(a <= n for a, n in zip(m.accepted_per_position, drafted))
    assert all(d >= p for d, p in zip(m.acceptance_per_drafted_position, m.acceptance_per_position))
    d = m.to_dict()
    assert d["acceptance_per_drafted_position"] == m.acceptance_per_drafted_position


@pytest.mark.parametrize("batch,kind", [(1, "mix"), (3, "mix"), (8, "none")])
def test_fixed_k_lengths_equal_k(target, batch, kind):
    m = _metrics(target, make_draft(target, kind), batch, num_speculative_tokens=3, adaptive=False)
    _check_counts(m)
    assert m.draft_lengths == {3: m.num_drafts}
    assert m.acceptance_per_drafted_position == pytest.approx(m.acceptance_per_position)


def test_rounds_of_k_zero_count_nothing(target):
    """The policy's rounds of k = 0 propose nothing (a row's count of its last drafts is stale then)."""
    m = _metrics(target, make_draft(target, "mix"), 3, num_speculative_tokens=4, adaptive=True)
    assert m.k_histogram.get(0)  # the case: rounds of k = 0 among drafting ones
    _check_counts(m)
    assert set(m.draft_lengths) <= {k for k in m.k_histogram if k}


def test_ngram_rows_propose_fewer(target):
    """Prompt lookup: a row whose match runs short proposes fewer than k tokens (or none)."""
    m = _metrics(target, None, 8, method="ngram", num_speculative_tokens=5)
    _check_counts(m)
    assert min(m.draft_lengths) < 5 < m.num_draft_tokens  # the case: drafts shorter than k


def test_benchmarks_aggregate_calls(target):
    """Benchmarks sum calls' metrics as their JSON holds them (string keys): the same figures as one call's."""
    m = _metrics(target, None, 8, method="ngram", num_speculative_tokens=5)
    d = m.to_dict()
    half = dict(d, draft_lengths={str(n): c for n, c in d["draft_lengths"].items()})
    agg = aggregate_metrics([half, half])
    assert agg["acceptance_per_drafted_position"] == pytest.approx(m.acceptance_per_drafted_position)
    assert agg["acceptance_per_position"] == pytest.approx(m.acceptance_per_position)
