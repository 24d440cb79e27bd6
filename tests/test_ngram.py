"""The batched n-gram (prompt lookup) proposer: the device search against a row-by-row oracle, greedy
output equal to the target's own greedy generate(), the sampling law, and Hugging Face's
``prompt_lookup_num_tokens=`` routed to it at batch size > 1."""
import os
import random

import pytest
import torch

import hf_specdec
from hf_specdec.kernels import ngram_drafts, ngram_drafts_reference, ngram_drafts_torch
from models import VOCAB, left_padded_prompts, make_model
from test_sampling_exact import V, chi_square_pvalue, exact_joint_23, joint_23_counts, wrong_rejection_sample

MAX_NEW = 17


def random_search(rng: random.Random, max_width: int, max_n: int):
    """Rows with many matches (2-5 token values) or few (50), ragged pads and lengths, k and an n range."""
    B, W = rng.randint(1, 5), rng.randint(3, max_width)
    tokens = torch.randint(0, rng.choice([2, 3, 5, 50]), (B, W))
    pads = torch.tensor([rng.randint(0, W - 1) for _ in range(B)])
    length = torch.tensor([rng.randint(1, W - p) for p in pads.tolist()])
    k, lo = rng.randint(1, 6), rng.randint(1, 3)
    return tokens, pads, length, k, lo, rng.randint(lo, max_n)


def test_device_search_matches_oracle():
    rng = random.Random(0)
    for _ in range(300):
        tokens, pads, length, k, lo, hi = random_search(rng, 40, 4)
        drafts, counts = ngram_drafts(tokens, pads, length, k, lo, hi)
        want, want_counts = ngram_drafts_reference(tokens, pads, length, k, lo, hi)
        assert counts.tolist() == want_counts
        assert [d[:c] for d, c in zip(drafts.tolist(), want_counts)] == want


@pytest.mark.parametrize("block", [16, 1024])
def test_triton_search_matches_torch(monkeypatch, block):
    """The Triton prompt lookup (one launch) against the torch version it stands in for on CUDA: counts and the
    counted drafts, over rows with many matches and few, ragged pads, n ranges and k; ``block`` 16 makes a row's
    starts span several blocks."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the Triton kernel on the CPU: TRITON_INTERPRET=1")
    nt = pytest.importorskip("hf_specdec.kernels.ngram_lookup_triton")
    monkeypatch.setattr(nt, "BLOCK_STARTS", block)
    rng = random.Random(block)
    for _ in range(40):
        tokens, pads, length, k, lo, hi = random_search(rng, 90, 5)
        want, want_counts = ngram_drafts_torch(tokens, pads, length, k, lo, hi)
        got, counts = nt.ngram_drafts_triton(tokens, pads, length, k, lo, hi)
        assert counts.dtype == torch.int64 and counts.tolist() == want_counts.tolist()
        assert all(g[:c] == w[:c] for g, w, c in zip(got.tolist(), want.tolist(), counts.tolist()))


def test_search_cases():
    # row 0: "7 8" recurs, most recent earlier occurrence wins; row 1: no match; row 2: the match ends
    # right before the last token (a match at the very end: one token follows); row 3: padding ignored
    tokens = torch.tensor([[5, 7, 8, 1, 7, 8, 2, 9, 7, 8],
                           [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
                           [0, 0, 0, 0, 0, 0, 4, 6, 6, 6],
                           [7, 8, 3, 3, 3, 3, 3, 1, 7, 8]])
    pads = torch.tensor([0, 0, 6, 7])
    length = torch.tensor([10, 10, 4, 3])
    drafts, counts = ngram_drafts(tokens, pads, length, 3, 1, 2)
    assert counts.tolist() == [3, 0, 1, 0]
    assert drafts[0].tolist() == [2, 9, 7] and drafts[2, :1].tolist() == [6]


def repeated_prompts(batch: int, seed: int):
    """Rows of repeated text (matches everywhere), random rows (few matches), and a row whose
    prompt ends with an n-gram seen once before, left padded."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for b in range(batch):
        if b % 3 == 0:
            unit = torch.randint(3, VOCAB, (4,), generator=gen).tolist()
            rows.append(unit * 3 + unit[:2])
        elif b % 3 == 1:
            rows.append(torch.randint(3, VOCAB, (int(torch.randint(2, 12, (1,), generator=gen)),), generator=gen).tolist())
        else:
            a = torch.randint(3, VOCAB, (6,), generator=gen).tolist()
            rows.append(a + a[:3])
    width = max(map(len, rows))
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r):] = torch.tensor(r)
        mask[b, width - len(r):] = 1
    return ids, mask


@pytest.fixture(scope="module")
def targets():
    return {f: hf_specdec.enable(make_model(f, seed=i)) for i, f in enumerate(["llama", "gpt2"])}


@pytest.mark.parametrize("family,batch,k,adaptive", [
    ("llama", 1, 3, False), ("llama", 3, 1, False), ("llama", 8, 4, False), ("llama", 3, 5, True),
    ("gpt2", 3, 3, False), ("gpt2", 8, 2, True)])
def test_ngram_greedy_equals_target_greedy(targets, family, batch, k, adaptive):
    target = targets[family]
    ids, mask = repeated_prompts(batch, seed=batch + k)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=k, method="ngram", block_size=4,
                                                            adaptive=adaptive),
                          return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    m = out.spec_metrics
    assert m.num_accepted_tokens <= m.num_draft_tokens and 0 <= m.match_fraction <= 1
    if not adaptive:
        assert m.k_histogram == {k: m.num_rounds}
        if family == "llama":  # this random llama continues repeated text: proposals get accepted
            assert m.num_accepted_tokens > 0


def test_ngram_random_prompts_without_matches(targets):
    target = targets["llama"]
    ids, mask = left_padded_prompts(3, seed=4)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                          spec_config=hf_specdec.SpecConfig(method="ngram", prompt_lookup_min=3,
                                                            prompt_lookup_max=4, adaptive=False),
                          return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)


def test_hf_prompt_lookup_routes_to_batched_proposer(targets):
    target = targets["llama"]
    ids, mask = repeated_prompts(3, seed=7)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW,
                          prompt_lookup_num_tokens=3, max_matching_ngram_size=2, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected)
    assert out.spec_metrics.num_speculative_tokens == 3 and out.spec_metrics.num_drafts > 0


def test_ngram_refuses_a_draft_model(targets):
    target = targets["llama"]
    ids, mask = left_padded_prompts(1, seed=1)
    with pytest.raises(ValueError, match="method='ngram'"):
        target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, assistant_model=make_model("llama", 9),
                        spec_config=hf_specdec.SpecConfig(method="ngram"))


def ngram_joint_23(target, prompt, n=6000):
    spec = hf_specdec.SpecConfig(num_speculative_tokens=2, method="ngram", prompt_lookup_max=2,
                                 generator=torch.Generator().manual_seed(0))
    out = target.generate(input_ids=prompt.expand(n, -1), do_sample=True, top_k=0, max_new_tokens=3,
                          spec_config=spec, return_dict_in_generate=True)
    return joint_23_counts(out.sequences, prompt.shape[1], V), out.spec_metrics


def test_ngram_sampling_follows_target_distribution(small_target):
    prompt = torch.tensor([[3, 1, 4, 1, 5, 3, 1]])  # matches of different lengths after each first token
    counts, m = ngram_joint_23(small_target, prompt)
    assert 0.05 < m.acceptance_rate < 0.95 and 0 < m.match_fraction < 1
    assert chi_square_pvalue(counts, exact_joint_23(small_target, prompt)) > 1e-3


def test_ngram_law_test_catches_wrong_residual(small_target, monkeypatch):
    from hf_specdec.round import fixed_round
    monkeypatch.setattr(fixed_round.kernels, "rejection_sample", wrong_rejection_sample)
    torch.manual_seed(0)
    prompt = torch.tensor([[3, 1, 4, 1, 5, 3, 1]])
    counts, _ = ngram_joint_23(small_target, prompt)
    assert chi_square_pvalue(counts, exact_joint_23(small_target, prompt)) < 1e-3
