"""Triton typical acceptance vs its torch reference (CPU, TRITON_INTERPRET=1), and what it means."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import math

import pytest
import torch

pytest.importorskip("triton")

from hf_specdec.kernels import draw_acceptance_noise, typical_accept, typical_accept_reference  # noqa: E402
from hf_specdec.kernels.typical_acceptance_triton import typical_accept_triton  # noqa: E402


def _batch(gen, counts, V, match_frac=0.7, temp=3.0, dtype=torch.float32):
    counts = torch.as_tensor(counts, dtype=torch.long)
    B = counts.shape[0]
    cu = counts.cumsum(0)
    N = int(counts.sum())
    target = torch.softmax(torch.randn(N + B, V, generator=gen) * temp, -1).to(dtype)
    rows = torch.arange(N) + torch.repeat_interleave(torch.arange(B), counts)
    argmax = target.float()[rows].argmax(-1)
    draft = torch.where(torch.rand(N, generator=gen) < match_frac, argmax, torch.randint(0, V, (N,), generator=gen))
    return draft, cu, target


def _both(draft, cu, target, K, thr, alpha, seed=0):
    torch.manual_seed(seed)
    _, e = draw_acceptance_noise(cu, draft.shape[0], target.shape[-1], target.device)
    got = typical_accept_triton(draft, cu, target, K, thr, alpha, e)
    want = typical_accept_reference(draft, cu, target, K, thr, alpha, e)
    assert torch.equal(got[1], want[1]), (got[1], want[1])
    assert torch.equal(got[0], want[0]), (got[0], want[0])
    return got, e


@pytest.mark.parametrize("V", [7, 1000, 32001])
@pytest.mark.parametrize("thr,alpha", [(0.09, 0.3), (0.3, 0.9), (0.0, 0.0), (1.0, 1e6)])
def test_matches_reference(V, thr, alpha):
    gen = torch.Generator().manual_seed(V + int(thr * 100))
    B, K = (10, 4) if V < 32000 else (3, 3)
    counts = torch.randint(0, K + 1, (B,), generator=gen)
    counts[0], counts[-1] = 0, K
    draft, cu, target = _batch(gen, counts, V)
    (out, n), _ = _both(draft, cu, target, K, thr, alpha)
    if thr == 0.0:  # threshold 0: every draft of non-zero probability is accepted
        assert torch.equal(n, counts)
    if thr == 1.0:  # threshold min(1, 1e6 e^-H) = 1 > any p(x) of a non-one-hot p
        assert (n == 0).all()


def test_large_vocab_and_half_precision():
    gen = torch.Generator().manual_seed(1)
    draft, cu, target = _batch(gen, [2, 1], 128256, temp=8.0)
    _both(draft, cu, target, 2, 0.09, 0.3)
    draft, cu, target = _batch(gen, [3, 0, 2], 301, dtype=torch.bfloat16)
    _both(draft, cu, target, 3, 0.09, 0.3)


def test_entropy_sets_the_threshold():
    """Same draft probability 1/8: accepted under a flat (high-entropy) target, rejected under a peaked one."""
    V = 8
    flat = torch.full((V,), 1.0 / V)
    peaked = torch.zeros(V)
    peaked[3], peaked[5] = 0.875, 0.125
    bonus = torch.softmax(torch.randn(V), -1)
    # two sequences, one draft each: token 5 under the flat target, token 5 under the peaked one
    target = torch.stack([flat, bonus, peaked, bonus])
    draft = torch.tensor([5, 5])
    cu = torch.tensor([1, 2])
    thr, alpha = 0.2, 0.3
    # flat: min(0.2, 0.3 * e^{-ln 8}) = 0.0375 < 0.125: accept; peaked: min(0.2, 0.3 * e^{-H}) = 0.2 > 0.125
    h_peaked = -(0.875 * math.log(0.875) + 0.125 * math.log(0.125))
    assert min(thr, alpha * math.exp(-h_peaked)) > 0.125
    (out, n), e = _both(draft, cu, target, 1, thr, alpha)
    assert n.tolist() == [1, 0]
    assert out[0, 0] == 5 and out[0, 1] == int((bonus / e[0]).argmax())  # bonus drawn from p_{k+1}
    assert out[1].tolist() == [3, -1]  # rejected: the target's argmax


def test_dispatch_with_generators_is_reproducible():
    gen = torch.Generator().manual_seed(2)
    draft, cu, target = _batch(gen, [2, 2, 0], 50, match_frac=1.0, temp=0.1)

    def run():
        gens = [torch.Generator().manual_seed(100 + i) for i in range(3)]
        return typical_accept(draft, cu, target, 2, 0.0, 0.0, generators=gens)

    a, b = run(), run()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[1].tolist() == [2, 2, 0]


def test_split_vocab_path_small_batch():
    """Small batch, vocabulary split over programs and combined through an atomic ticket."""
    from hf_specdec.kernels import rejection_sampler_triton as rs

    V = 5000
    assert (V + rs.SPLIT_BLOCK_V - 1) // rs.SPLIT_BLOCK_V >= 3
    gen = torch.Generator().manual_seed(4)
    for thr, alpha in [(0.09, 0.3), (0.0, 0.0), (1.0, 1e6)]:
        draft, cu, target = _batch(gen, [3, 0], V, temp=4.0)
        (out, n), _ = _both(draft, cu, target, 3, thr, alpha)
        if thr == 0.0:
            assert n.tolist() == [3, 0]
