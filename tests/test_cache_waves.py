"""A batch larger than the cache budget runs in waves inside one generate() call.

Rows wait until the blocks their whole generation may need are free, start when finished rows
release theirs, and the output is what plain generate() gives; only a row that cannot fit even
alone is refused, before anything is decoded. On the runner (CPU, without graphs).

Sampled output under a budget follows the target's law (chi-square, as test_sampling_exact) but
is not the unlimited-budget run's output for the same seed: one generator serves the whole batch,
so a row's draws depend on which rows share its rounds (see docs/architecture.md, "Admission").
"""

import pytest
import torch

import hf_specdec
from hf_specdec.cache import blocks_for
from models import left_padded_prompts, make_draft, make_model
from test_sampling_exact import N, V, chi_square_pvalue, exact_joint_23, joint_23_counts, pair  # noqa: F401 (pair: fixture)

BLOCK = 4
K = 3
NEW = 16


@pytest.fixture(scope="module")
def target():
    return hf_specdec.enable(make_model("llama", seed=21))


def two_rows_budget(mask):
    """cache_tokens that hold any two rows of this batch at once and never three."""
    needs = sorted(blocks_for(int(n) + NEW + K + 1, BLOCK) for n in mask.sum(1))
    assert 3 * needs[0] > 2 * needs[-1]
    return 2 * needs[-1] * BLOCK


def test_batch_of_8_in_a_budget_of_2_rows_equals_plain_generate(target):
    ids, mask = left_padded_prompts(8, seed=31)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    eos = int(plain[3, ids.shape[1] + 4])  # some rows stop early, so rows start at many different rounds
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, eos_token_id=eos,
              pad_token_id=0)
    expected = target.generate(**kw)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=K, block_size=BLOCK, cache_tokens=two_rows_budget(mask),
                                 adaptive=False)  # a fixed k: every live row drafts each round
    out = target.generate(**kw, assistant_model=make_draft(target, "mix"), spec_config=spec,
                          return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    m = out.spec_metrics
    assert m.num_rounds < m.num_drafts <= 2 * m.num_rounds  # at most 2 rows a round, 2 in some


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_acceptance_statistics_in_waves_are_the_whole_batchs(target, method):
    """Greedy rounds of a fixed k depend only on each row's own text, so the call's acceptance statistics
    (summed on the device on the runner) are the unlimited budget's although rows start in waves and the
    bucket is rebuilt whenever they join."""
    ids, mask = left_padded_prompts(8, seed=35)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW,
              eos_token_id=int(plain[3, ids.shape[1] + 4]), pad_token_id=0, return_dict_in_generate=True,
              assistant_model=make_draft(target, "mix") if method == "draft" else None)
    metrics = []
    for budget in (None, two_rows_budget(mask)):
        spec = hf_specdec.SpecConfig(num_speculative_tokens=K, block_size=BLOCK, cache_tokens=budget, method=method,
                                     prompt_lookup_min=1, adaptive=False)
        metrics.append(target.generate(**kw, spec_config=spec).spec_metrics)
    unlimited, waves = metrics
    assert waves.num_rounds > unlimited.num_rounds  # it ran in waves
    totals = lambda m: (m.num_row_rounds, m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens,  # noqa: E731
                        m.accepted_per_position)
    assert totals(waves) == totals(unlimited)
    assert 0 < waves.num_accepted_tokens and waves.acceptance_rate <= 1 and waves.match_fraction <= 1


def test_sampled_waves_reproduce_with_a_fixed_generator(target):
    ids, mask = left_padded_prompts(8, seed=33)
    draft = make_draft(target, "mix")
    outs = []
    for _ in range(2):
        spec = hf_specdec.SpecConfig(num_speculative_tokens=K, block_size=BLOCK, cache_tokens=two_rows_budget(mask),
                                     generator=torch.Generator().manual_seed(7))
        outs.append(target.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, max_new_tokens=NEW,
                                    assistant_model=draft, spec_config=spec, pad_token_id=0, eos_token_id=None))
    assert torch.equal(outs[0], outs[1])
    assert outs[0].shape == (8, ids.shape[1] + NEW)


def test_row_larger_than_the_budget_fails_before_decoding(target):
    ids, mask = left_padded_prompts(3, seed=32)  # row 0: an 11-token prompt, needs 11 + 16 + 4 = 31 tokens
    forwards = []
    handle = target.register_forward_hook(lambda *_: forwards.append(1))
    try:
        with pytest.raises(hf_specdec.CacheBudgetError, match=r"row 0 .* needs 32 cache tokens.*cache_tokens \(now 24\)"
                                                              r".*at least 32 tokens"):
            target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW,
                            assistant_model=make_draft(target, "mix"),
                            spec_config=hf_specdec.SpecConfig(num_speculative_tokens=K, block_size=BLOCK,
                                                              cache_tokens=24))
    finally:
        handle.remove()
    assert not forwards


def test_sampling_under_a_budget_follows_the_target(pair):  # noqa: F811
    """N rows, a third of them at a time: tokens 2 and 3 still follow the target's joint law."""
    target, draft = pair
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    rows_at_once = N // 3
    spec = hf_specdec.SpecConfig(num_speculative_tokens=2, generator=torch.Generator().manual_seed(0),
                                 cache_tokens=rows_at_once * 16)  # one 16-token block a row
    out = target.generate(input_ids=prompt.expand(N, -1), assistant_model=draft, do_sample=True, top_k=0,
                          max_new_tokens=3, spec_config=spec, return_dict_in_generate=True)
    m = out.spec_metrics
    assert m.num_drafts <= rows_at_once * m.num_rounds and m.num_rounds >= 3  # it did run in waves
    counts = joint_23_counts(out.sequences, prompt.shape[1], V)
    assert chi_square_pvalue(counts, exact_joint_23(target, prompt)) > 1e-3


@pytest.mark.parametrize("deferred", [False, True], ids=["prefilled", "deferred"])
def test_rows_joining_after_rounds_of_zero_keep_the_survivors_draft_current(target, monkeypatch, deferred):
    """Rounds of k = 0 leave the draft model behind; a row that starts while the others are behind
    rebuilds the bucket, and the survivors' draft still reads those tokens before the next drafting
    round (a copy of the target then agrees on every draft). Deferred: after a call that ended at k = 0
    no row's prompt reaches the draft model until a round drafts; then every row's does."""
    from hf_specdec.round.proposers import DraftModelProposer
    from hf_specdec.round.policy.speculation_length import SpeculationLength

    zeros = [10 ** 9]  # rounds of k = 0 before the policy turns to k = 2 (counted in rounds launched: a decision
    # prepared ahead for a shape that then changes is made and dropped, so a script of decisions would slip)
    monkeypatch.setattr(SpeculationLength, "_choose",
                        lambda self, bucket, rows, remaining: 0 if sum(self.histogram.values()) < zeros[0] else 2)
    unread = []  # rounds of k = 0 the draft model had not read, at each catch-up window
    feed = DraftModelProposer.catch_up
    monkeypatch.setattr(DraftModelProposer, "catch_up",
                        staticmethod(lambda s, *a, **kw: (unread.append(int(s.behind)), feed(s, *a, **kw))))
    ids, mask = left_padded_prompts(3, seed=31)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, eos_token_id=None)
    eos = int(plain[0, ids.shape[1] + 2])  # row 0 stops after 3 tokens, while the draft model is behind
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, eos_token_id=eos,
              pad_token_id=0)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=2, block_size=BLOCK, cache_tokens=two_rows_budget(mask),
                                 adaptive=True)
    draft = make_draft(target, "full")
    if deferred:  # a call that ends at k = 0
        target.generate(**kw, assistant_model=draft, spec_config=spec)
        assert unread == []
    zeros[0] = 6
    out = target.generate(**kw, assistant_model=draft, spec_config=spec, return_dict_in_generate=True)
    assert torch.equal(out.sequences, target.generate(**kw))
    assert out.spec_metrics.k_histogram[0] == 6 and out.spec_metrics.acceptance_rate == 1.0
    if deferred:  # the longest row in the bucket, from position 0
        assert unread[0] > 6
    else:
        assert unread[0] == 6  # all of them, those before row 2 joined too
