"""Sampling with a reduced-vocabulary draft follows the target's distribution exactly.

The draft keeps 3 of 8 tokens; the target puts most of its mass outside them. As in
``test_sampling_exact.py``, the joint law of generated tokens 2 and 3 over one large batch is
compared with the target's exact law (chi-square), on the eager path and the runner. The same
test must reject a sampler that makes the classic reduced-vocabulary mistake: drawing the
recovered token from the residual restricted to the draft's own (kept) tokens. The Triton
rejection kernel must equal its reference on such draft probabilities (zeros outside the set).
"""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

import hf_specdec
from hf_specdec import kernels
from hf_specdec.kernels import draw_acceptance_noise, rejection_sample_reference
from hf_specdec.reduced_vocab import ReducedVocabHead, reduce_vocab
from models import make_model
from test_sampling_exact import N, chi_square_pvalue, exact_joint_23, joint_23_counts

V = 8
KEPT = torch.tensor([1, 4, 6])
PROMPT = torch.tensor([[3, 1, 4, 1, 5]])


@pytest.fixture(scope="module")
def pair():
    target = hf_specdec.enable(make_model("llama", seed=11, vocab=V, sharpen=2.0))
    draft = reduce_vocab(make_model("llama", seed=12, vocab=V, sharpen=2.0), KEPT)
    for m in (target, draft):
        m.config.eos_token_id = m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    return target, draft


def sample_joint_23(target, draft):
    gen = torch.Generator().manual_seed(0)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=2, generator=gen)
    out = target.generate(input_ids=PROMPT.expand(N, -1), assistant_model=draft, do_sample=True, top_k=0,
                          max_new_tokens=3, spec_config=spec, return_dict_in_generate=True)
    return joint_23_counts(out.sequences, PROMPT.shape[1], V), out.spec_metrics


def kept_only_rejection_sample(draft_ids, cu, draft_probs, target_probs, is_greedy, k, generators=None, **kw):
    """Rejection sampling whose recovered token comes from norm(max(0, p - q)) over the kept tokens only."""
    B = cu.shape[0]
    uniform, exponential = draw_acceptance_noise(cu, draft_ids.shape[0], target_probs.shape[-1], target_probs.device)
    out, n = rejection_sample_reference(draft_ids, cu, draft_probs, target_probs, is_greedy, k, uniform, exponential)
    rows = torch.arange(B)
    p = target_probs.reshape(B, k + 1, -1)[rows, n]
    q = draft_probs.reshape(B, k, -1)[rows, n.clamp(max=k - 1)]
    residual = torch.zeros_like(p)
    residual[:, KEPT] = (p - q).clamp(min=0)[:, KEPT] + 1e-12
    rejected = n < k
    out[rows, n] = torch.where(rejected, torch.multinomial(residual, 1).squeeze(1), out[rows, n])
    return out, n


def test_target_mass_lies_mostly_outside_the_kept_set(pair):
    """Without this the test below could not tell a wrong residual from the right one."""
    target, _ = pair
    with torch.no_grad():
        p = torch.softmax(target(PROMPT).logits[0, -1], -1)
    assert float(p[KEPT].sum()) < 0.6


def test_sampled_tokens_follow_target_distribution(pair):
    target, draft = pair
    counts, metrics = sample_joint_23(target, draft)
    assert 0.05 < metrics.acceptance_rate < 0.95
    assert chi_square_pvalue(counts, exact_joint_23(target, PROMPT)) > 1e-3


def test_distribution_test_catches_residual_over_kept_tokens_only(pair, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(kernels, "rejection_sample", kept_only_rejection_sample)
    torch.manual_seed(0)
    counts, _ = sample_joint_23(target, draft)
    assert chi_square_pvalue(counts, exact_joint_23(target, PROMPT)) < 1e-3


@pytest.mark.parametrize("vocab", [64, 4099])
def test_triton_rejection_kernel_equals_reference_on_reduced_draft_probs(vocab):
    """Draft probabilities from a reduced head (exact zeros outside a quarter of the vocabulary), drafts
    drawn from them, a target with mass everywhere: the Triton kernel gives the reference's tokens."""
    pytest.importorskip("triton")
    from hf_specdec.kernels.rejection_sampler_triton import rejection_sample_triton

    gen = torch.Generator().manual_seed(vocab)
    B, k = 5, 3
    kept = torch.randperm(vocab, generator=gen)[: vocab // 4]
    head = ReducedVocabHead(torch.randn(len(kept), 16, generator=gen), kept, vocab)
    with torch.no_grad():
        q = torch.softmax(head(torch.randn(B * k, 16, generator=gen) * 2), -1)
    drafts = torch.multinomial(q, 1, generator=gen).squeeze(1)
    p = torch.softmax(torch.randn(B * (k + 1), vocab, generator=gen) * 2, -1)
    cu = torch.arange(1, B + 1) * k
    is_greedy = torch.tensor([False, False, True, False, False])
    torch.manual_seed(1)
    u, e = draw_acceptance_noise(cu, B * k, vocab, p.device)
    got = rejection_sample_triton(drafts, cu, q, p, is_greedy, k, u, e)
    want = rejection_sample_reference(drafts, cu, q, p, is_greedy, k, u, e)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    emitted = want[0][want[0] >= 0]
    outside = torch.ones(vocab, dtype=torch.bool)
    outside[kept] = False
    assert bool(outside[emitted].any())  # recovered / bonus tokens outside the kept set were emitted
