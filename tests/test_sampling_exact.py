"""Sampled speculative output follows the target's distribution exactly.

Over one large batch of identical prompts, the joint distribution of generated tokens 2
and 3 (both produced by verification: rejection at position 1, rejection or bonus at
position 2) is compared with the target's exact distribution by a chi-square test. The
same test must reject a sampler whose recovered token is drawn from p instead of
norm(max(0, p - q)).
"""
import itertools

import pytest
import torch
from scipy.stats import chisquare

import hf_specdec
from hf_specdec.kernels import rejection_sample_reference
from models import make_model

V = 6
N = 6000


@pytest.fixture(scope="module")
def pair():
    target = hf_specdec.enable(make_model("llama", seed=11, vocab=V, sharpen=2.0))
    draft = make_model("llama", seed=12, vocab=V, sharpen=2.0)
    for m in (target, draft):
        m.config.eos_token_id = m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    return target, draft


def exact_joint_23(target, prompt):
    """P(t2, t3) = sum_t1 p(t1) p(t2|t1) p(t3|t1,t2) from plain target forwards (any small vocabulary)."""
    V = target.config.vocab_size
    prefixes = torch.tensor(list(itertools.product(range(V), repeat=2)))
    ids = torch.cat([prompt.expand(len(prefixes), -1), prefixes], dim=1)
    with torch.no_grad():
        logits = target(ids).logits.double()
    p = torch.softmax(logits, -1)
    L = prompt.shape[1]
    p1 = p[0, L - 1]  # p(t1 | prompt)
    p2 = p[:, L].reshape(V, V, V)[:, 0]  # p(t2 | t1): rows t1
    p3 = p[:, L + 1].reshape(V, V, V)  # p(t3 | t1, t2)
    return torch.einsum("a,ab,abc->bc", p1, p2, p3).reshape(-1)


def sample_joint_23(target, draft, prompt, seed):
    gen = torch.Generator().manual_seed(seed)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=2, generator=gen)
    out = target.generate(input_ids=prompt.expand(N, -1), assistant_model=draft, do_sample=True, top_k=0,
                          max_new_tokens=3, spec_config=spec, return_dict_in_generate=True)
    return joint_23_counts(out.sequences, prompt.shape[1], V), out.spec_metrics


def joint_23_counts(sequences, prompt_len, vocab):
    """Counts of each (t2, t3) pair of generated tokens, flattened like ``exact_joint_23``."""
    t2, t3 = sequences[:, prompt_len + 1], sequences[:, prompt_len + 2]
    return torch.bincount(t2 * vocab + t3, minlength=vocab * vocab).double()


def chi_square_pvalue(counts, probs):
    expected = probs * counts.sum()
    keep = expected >= 5
    obs = torch.cat([counts[keep], counts[~keep].sum()[None]])
    exp = torch.cat([expected[keep], expected[~keep].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    return chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue


def wrong_rejection_sample(draft_ids, cu, draft_probs, target_probs, is_greedy, k, generators=None):
    """Rejection sampling with the classic mistake: the recovered token is drawn from p, not max(0, p - q)."""
    B = cu.shape[0]
    uniform = torch.rand(draft_ids.shape[0], dtype=torch.float64)
    exponential = torch.empty(B, target_probs.shape[-1]).exponential_()
    out, n = rejection_sample_reference(draft_ids, cu, draft_probs, target_probs, is_greedy, k, uniform, exponential)
    p = target_probs.reshape(B, k + 1, -1)
    rejected = n < k
    resampled = torch.multinomial(p[torch.arange(B), n], 1).squeeze(1)
    out[torch.arange(B), n] = torch.where(rejected, resampled, out[torch.arange(B), n])
    return out, n


def test_sampled_tokens_follow_target_distribution(pair):
    target, draft = pair
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    counts, metrics = sample_joint_23(target, draft, prompt, seed=0)
    assert 0.05 < metrics.acceptance_rate < 0.95  # both rejections and acceptances are exercised
    assert chi_square_pvalue(counts, exact_joint_23(target, prompt)) > 1e-3


def test_distribution_test_catches_wrong_residual(pair, monkeypatch):
    from hf_specdec.round import fixed_round
    monkeypatch.setattr(fixed_round.kernels, "rejection_sample", wrong_rejection_sample)
    target, draft = pair
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    torch.manual_seed(0)
    counts, _ = sample_joint_23(target, draft, prompt, seed=0)
    assert chi_square_pvalue(counts, exact_joint_23(target, prompt)) < 1e-3


def test_seeded_generator_reproduces(pair):
    target, draft = pair
    prompt = torch.tensor([[2, 7 % V, 1]])
    outs = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(1234)
        outs.append(target.generate(input_ids=prompt.expand(4, -1), assistant_model=draft, do_sample=True, top_k=0,
                                    max_new_tokens=8, spec_config=hf_specdec.SpecConfig(generator=gen,
                                                                                        )))
    assert torch.equal(outs[0], outs[1])
