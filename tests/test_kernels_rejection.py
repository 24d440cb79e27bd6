"""Triton rejection sampler vs its torch reference (exact), and the sampler's output distribution.

Runs the Triton kernel on CPU tensors under TRITON_INTERPRET=1.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton")
scipy_stats = pytest.importorskip("scipy.stats")

from hf_specdec.kernels import draw_acceptance_noise, rejection_sample_reference  # noqa: E402
from hf_specdec.kernels.rejection_sampler_triton import rejection_sample_triton  # noqa: E402


def _make_batch(gen, counts, V, *, greedy_frac=0.5, has_q=True, match_frac=0.6, dtype=torch.float32):
    """Random ragged batch; a fraction of drafts equal the target argmax so that runs get accepted."""
    counts = torch.as_tensor(counts, dtype=torch.long)
    B = counts.shape[0]
    cu = counts.cumsum(0)
    N = int(counts.sum())
    target = torch.softmax(torch.randn(N + B, V, generator=gen) * 3, -1).to(dtype)
    draft_probs = torch.softmax(torch.randn(N, V, generator=gen) * 3, -1).to(dtype) if has_q else None
    rows = torch.arange(N) + torch.repeat_interleave(torch.arange(B), counts)
    argmax = target.float()[rows].argmax(-1)
    draft = torch.where(torch.rand(N, generator=gen) < match_frac, argmax, torch.randint(0, V, (N,), generator=gen))
    is_greedy = torch.rand(B, generator=gen) < greedy_frac
    return draft, cu, draft_probs, target, is_greedy


def _both(draft, cu, draft_probs, target, is_greedy, K, seed=0):
    torch.manual_seed(seed)
    u, e = draw_acceptance_noise(cu, draft.shape[0], target.shape[-1], target.device)
    got = rejection_sample_triton(draft, cu, draft_probs, target, is_greedy, K, u, e)
    want = rejection_sample_reference(draft, cu, draft_probs, target, is_greedy, K, u, e)
    return got, want


def _assert_same(got, want):
    assert torch.equal(got[1], want[1]), (got[1], want[1])
    assert torch.equal(got[0], want[0]), (got[0], want[0])


@pytest.mark.parametrize("V", [7, 1000, 32001])
@pytest.mark.parametrize("greedy_frac", [0.0, 1.0, 0.5])
@pytest.mark.parametrize("has_q", [True, False])
def test_matches_reference(V, greedy_frac, has_q):
    gen = torch.Generator().manual_seed(V * 7 + int(greedy_frac * 10) + has_q)
    B, K = (12, 4) if V < 32000 else (4, 3)
    counts = torch.randint(0, K + 1, (B,), generator=gen)
    counts[0] = 0  # some sequences propose nothing
    counts[-1] = K
    batch = _make_batch(gen, counts, V, greedy_frac=greedy_frac, has_q=has_q)
    got, want = _both(*batch, K)
    _assert_same(got, want)
    assert got[0].dtype == torch.int64 and got[1].dtype == torch.int64


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_probs(dtype):
    gen = torch.Generator().manual_seed(3)
    batch = _make_batch(gen, [3, 1, 0, 3, 2], 257, dtype=dtype)
    _assert_same(*_both(*batch, 3))


def test_large_vocab_small_batch():
    gen = torch.Generator().manual_seed(11)
    V = 128256
    for greedy_frac in (0.0, 1.0):
        batch = _make_batch(gen, [2, 2], V, greedy_frac=greedy_frac, match_frac=0.5)
        _assert_same(*_both(*batch, 2))


def test_all_accepted_greedy_copy_of_target():
    """A draft equal to the target's argmax is accepted in full and followed by the bonus argmax."""
    gen = torch.Generator().manual_seed(5)
    K, V = 4, 301
    draft, cu, dp, target, _ = _make_batch(gen, [K] * 6, V, match_frac=1.0)
    greedy = torch.ones(6, dtype=torch.bool)
    got, want = _both(draft, cu, dp, target, greedy, K)
    _assert_same(got, want)
    assert torch.equal(got[1], torch.full((6,), K))
    bonus_rows = cu + torch.arange(6)
    assert torch.equal(got[0][:, K], target[bonus_rows].argmax(-1))


def test_all_accepted_random_when_q_equals_p():
    """q == p accepts every draft (u < 1), then the bonus token is drawn from p_{k+1}."""
    gen = torch.Generator().manual_seed(6)
    K, V, B = 3, 50, 8
    draft, cu, _, target, _ = _make_batch(gen, [K] * B, V)
    rows = torch.arange(B * K) + torch.repeat_interleave(torch.arange(B), K)
    draft_probs = target[rows].clone()
    draft = torch.multinomial(draft_probs, 1, generator=gen).squeeze(1)
    got, want = _both(draft, cu, draft_probs, target, torch.zeros(B, dtype=torch.bool), K)
    _assert_same(got, want)
    assert torch.equal(got[1], torch.full((B,), K))


def test_all_rejected_and_zeros():
    """Drafts where p is zero are always rejected; the recovered token avoids p's zeros."""
    gen = torch.Generator().manual_seed(8)
    B, K, V = 10, 3, 40
    counts = torch.full((B,), K)
    counts[3] = 0
    N = int(counts.sum())
    cu = counts.cumsum(0)
    target = torch.rand(N + B, V, generator=gen)
    target[:, :20] = 0.0  # p is zero on the first half of the vocabulary
    target /= target.sum(-1, keepdim=True)
    draft_probs = torch.rand(N, V, generator=gen)
    draft_probs[:, 20:30] = 0.0  # q has zeros too
    draft_probs /= draft_probs.sum(-1, keepdim=True)
    draft = torch.randint(0, 20, (N,), generator=gen)
    for greedy in (torch.zeros(B, dtype=torch.bool), torch.ones(B, dtype=torch.bool)):
        for dp in (draft_probs, None):
            got, want = _both(draft, cu, dp, target, greedy, K)
            _assert_same(got, want)
            assert torch.equal(got[1], torch.zeros(B, dtype=torch.long))
            assert (got[0][:, 0] >= 20).all()
            assert (got[0][:, 1:] == -1).all()


def test_residual_rounding_fallback():
    """q >= p everywhere leaves an all-zero residual at the rejection: both fall back to p."""
    V, K = 16, 1
    p = torch.softmax(torch.randn(1, V), -1)
    target = torch.cat([p, p])
    draft = torch.tensor([int(p.argmin())])
    cu = torch.tensor([1])
    greedy = torch.tensor([False])
    u = torch.tensor([1.0 - 1e-12], dtype=torch.float64)  # u * q(x) = ~1 > p(x): rejected
    e = torch.empty(1, V).exponential_().clamp_(min=1e-10)
    q_big = torch.ones(1, V)
    got = rejection_sample_triton(draft, cu, q_big, target, greedy, K, u, e)
    want = rejection_sample_reference(draft, cu, q_big, target, greedy, K, u, e)
    _assert_same(got, want)
    assert int(got[1][0]) == 0
    assert int(got[0][0, 0]) == int((p[0] / e[0]).argmax())


def test_padding_and_ragged_layout():
    gen = torch.Generator().manual_seed(9)
    K = 5
    batch = _make_batch(gen, [0, 5, 1, 0, 3, 5, 2], 33)
    got, want = _both(*batch, K)
    _assert_same(got, want)
    out, n = got
    for b in range(out.shape[0]):
        assert (out[b, : n[b] + 1] >= 0).all()
        assert (out[b, n[b] + 1:] == -1).all()


# ---------------------------------------------------------------- distribution tests

P_ROWS = torch.tensor([
    [0.40, 0.30, 0.15, 0.10, 0.05, 0.00],  # p_1 (zero on token 5)
    [0.05, 0.10, 0.20, 0.25, 0.15, 0.25],  # p_2
    [0.30, 0.05, 0.05, 0.30, 0.10, 0.20],  # p_3 (bonus)
], dtype=torch.float64)
Q_ROWS = torch.tensor([
    [0.00, 0.10, 0.15, 0.30, 0.35, 0.10],  # q_1 (zero where p_1 is large, mass where p_1 is zero)
    [0.30, 0.30, 0.10, 0.10, 0.10, 0.10],  # q_2
], dtype=torch.float64)


def _identical_batch(n, with_q, gen):
    K, V = Q_ROWS.shape[0], Q_ROWS.shape[1]
    target = P_ROWS.float().repeat(n, 1)
    cu = torch.arange(1, n + 1) * K
    if with_q:
        draft_probs = Q_ROWS.float().repeat(n, 1)
        draft = torch.multinomial(draft_probs, 1, generator=gen).squeeze(1)  # x_j ~ q_j, independently
    else:  # n-gram: a fixed proposal, q one-hot
        draft_probs = None
        draft = torch.tensor([0, 3]).repeat(n)
    return draft, cu, draft_probs, target, torch.zeros(n, dtype=torch.bool), K


def _sample_positions(sampler, n, with_q, seed):
    gen = torch.Generator().manual_seed(seed)
    draft, cu, dp, target, greedy, K = _identical_batch(n, with_q, gen)
    torch.manual_seed(seed)
    u, e = draw_acceptance_noise(cu, draft.shape[0], target.shape[-1], target.device)
    out, _ = sampler(draft, cu, dp, target, greedy, K, u, e)
    return out


def _chi2_pvalue(tokens, probs):
    counts = torch.bincount(tokens, minlength=probs.shape[0]).double()
    support = probs > 0
    assert counts[~support].sum() == 0, f"emitted a token of probability zero: {counts}"
    expected = probs[support] / probs[support].sum() * counts.sum()
    return scipy_stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue


def _position_pvalues(out):
    """p-values of emitted position 1, 2 (when x_1 accepted) and 3 (bonus, when both accepted) vs p_1, p_2, p_3."""
    pvals = []
    for j in range(3):
        tokens = out[:, j]
        tokens = tokens[tokens >= 0]
        assert tokens.numel() > 2000
        pvals.append(_chi2_pvalue(tokens, P_ROWS[j]))
    return pvals


@pytest.mark.parametrize("with_q", [True, False])
def test_emitted_tokens_follow_target_distribution(with_q):
    out = _sample_positions(rejection_sample_triton, 20000, with_q, seed=1234 + with_q)
    pvals = _position_pvalues(out)
    assert min(pvals) > 1e-3, pvals


def _wrong_sampler(draft, cu, draft_probs, target, is_greedy, K, u, e):
    """Same accept rule, but the recovered token is drawn from p rather than norm(max(p - q, 0))."""
    out, n = rejection_sample_reference(draft, cu, draft_probs, target, is_greedy, K, u, e)
    B = cu.shape[0]
    rows = (cu - K) + torch.arange(B) + n  # target row of the emitted token
    from_p = (target[rows].float() / e).argmax(-1)
    rejected = n < K
    out = out.clone()
    out[torch.arange(B)[rejected], n[rejected]] = from_p[rejected]
    return out, n


@pytest.mark.parametrize("with_q", [True, False])
def test_distribution_test_rejects_wrong_recovery(with_q):
    """The chi-square check above has power: it rejects a sampler with the wrong recovered distribution."""
    out = _sample_positions(_wrong_sampler, 20000, with_q, seed=99 + with_q)
    pvals = _position_pvalues(out)
    assert pvals[0] < 1e-3, pvals


def test_split_vocab_path_small_batch():
    """Small batches split each row over several programs (combined through an atomic ticket):
    mixed greedy/random, k_i = 0, no q, and the all-zero-residual fallback all go through it."""
    from hf_specdec.kernels import rejection_sampler_triton as rs

    V = 5000  # 3 chunks of SPLIT_BLOCK_V: 3 programs per sequence on CPU
    assert triton_cdiv(V, rs.SPLIT_BLOCK_V) >= 3 and rs._num_programs_target(torch.device("cpu")) // 2 >= 3
    gen = torch.Generator().manual_seed(21)
    for has_q in (True, False):
        for greedy_frac in (0.0, 0.5, 1.0):
            batch = _make_batch(gen, [0, 3], V, greedy_frac=greedy_frac, has_q=has_q, match_frac=0.7)
            _assert_same(*_both(*batch, 3))
    # the fallback: q >= p everywhere leaves no residual at the rejection
    p = torch.softmax(torch.randn(1, V, generator=gen), -1)
    target, draft, cu = torch.cat([p, p]), torch.tensor([int(p.argmin())]), torch.tensor([1])
    u = torch.tensor([1.0 - 1e-12], dtype=torch.float64)
    e = torch.empty(1, V).exponential_(generator=gen).clamp_(min=1e-10)
    args = (draft, cu, torch.ones(1, V), target, torch.tensor([False]), 1, u, e)
    got, want = rejection_sample_triton(*args), rejection_sample_reference(*args)
    _assert_same(got, want)
    assert int(got[0][0, 0]) == int((p[0] / e[0]).argmax())


def triton_cdiv(a, b):
    return (a + b - 1) // b
