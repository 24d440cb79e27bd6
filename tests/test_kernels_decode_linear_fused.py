"""The decode GEMV with the layer's pointwise work in it (kernels/decode_linear_triton.py: RMSNorm before the
matmul, SiLU·up and the residual add after it) against its reference, and as a custom op (CPU,
TRITON_INTERPRET=1)."""
import itertools
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from hf_specdec.kernels import decode_linear, decode_linear_reference, rms_norm_reference  # noqa: E402
from hf_specdec.kernels import decode_linear_triton as dl  # noqa: E402

LAUNCHES = [dict(block_n=2, block_k=512, num_warps=2, num_stages=1),  # K in one tile, no loop
            dict(block_n=4, block_k=128, num_warps=4, num_stages=2),  # a K loop, its last tile ragged
            dict(tma=True, block_n=8, block_k=64, num_warps=4, num_stages=3)]  # tiles by TMA descriptor
FUSIONS = list(itertools.product([False, True], repeat=4))  # (norm, gated, residual, bias)


def inputs(n, k, norm, gated, residual, bias, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(1, 1, k, generator=gen)).to(dtype)  # a residual stream's scale: the norm matters
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    nw = (1 + 0.5 * torch.randn(k, generator=gen)).to(dtype) if norm else None
    r = torch.randn(1, 1, n // 2 if gated else n, generator=gen).to(dtype) if residual else None
    return x, w, b, nw, r


def rounded_like_the_model(x, w, b, nw, eps, gated, r):
    """The reference with the model's roundings: each operation's output rounded to the row's dtype, the matmul's
    sum in float32. The interpreter's casts to half precision truncate where the GPU's round to nearest: each of
    up to four roundings (the matmul's, SiLU's, the product's, the residual add's) may then be a unit in the last
    place off, and SiLU·up carries the gate's and up's errors into its product."""
    if nw is not None:
        x = rms_norm_reference(x, nw, eps)
    y = F.linear(x.float(), w.float(), None if b is None else b.float()).to(x.dtype)
    return decode_linear_reference(y, torch.eye(y.shape[-1], dtype=y.dtype), None, None, 0.0, gated, r)


@pytest.fixture
def launch(request, monkeypatch):
    dl.LAUNCH_OVERRIDE.update(request.param)
    monkeypatch.setattr(dl, "_unfused", lambda *a: pytest.fail("ran the unfused operations"))
    yield request.param
    dl.LAUNCH_OVERRIDE.clear()


@pytest.mark.parametrize("launch", LAUNCHES, indirect=True)
@pytest.mark.parametrize("norm,gated,residual,bias", FUSIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_gemv_matches_reference(launch, norm, gated, residual, bias, dtype):
    n, k = 74, 304  # ragged outputs and K: the masks at both ends (gated: 37 outputs of 2 x 37 rows)
    x, w, b, nw, r = inputs(n, k, norm, gated, residual, bias, dtype, seed=n + 2 * norm + 3 * gated)
    got = dl.decode_linear_triton(x, w, b, nw, 1e-5, gated, r)
    want = rounded_like_the_model(x, w, b, nw, 1e-5, gated, r)
    assert got.shape == want.shape == (1, 1, n // 2 if gated else n) and got.dtype == dtype
    tol = 5 * (2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("launch", LAUNCHES[1:2], indirect=True)
def test_fusions_are_each_what_they_say(launch):
    """Each fusion alone changes the output as its operation would: no norm is an identity, gate and up are not
    swapped, the residual is added once."""
    n, k = 64, 256
    x, w, b, nw, r = inputs(n, k, True, False, True, False, seed=5)
    plain = dl.decode_linear_triton(x, w, None)
    normed = dl.decode_linear_triton(x, w, None, nw, 1e-5)
    assert (normed.float() - plain.float()).abs().max() > 1.0  # x's scale is 3: the norm changes the output
    torch.testing.assert_close(dl.decode_linear_triton(x, w, None, residual=r[..., :n]).float(),
                               (plain.float() + r.float()), rtol=2 ** -6, atol=2 ** -6)
    gated = dl.decode_linear_triton(x, w, None, gated=True).float()
    gate, up = plain.float().chunk(2, dim=-1)
    torch.testing.assert_close(gated, F.silu(gate) * up, rtol=2 ** -6, atol=2 ** -6)
    assert (gated - F.silu(up) * gate).abs().max() > 0.1


def test_unfused_path_runs_the_same_operations():
    """float32, several rows, or a norm weight of another dtype: the operations one by one, equal to the reference
    (the same kernels' references on the CPU)."""
    x, w, b, nw, r = inputs(24, 64, True, True, True, True, dtype=torch.float32)
    x3 = torch.randn(1, 3, 64)
    r3 = torch.randn(1, 3, 12)
    for args in ((x, w, b, nw, 1e-6, True, r), (x3, w, b, nw, 1e-6, True, r3)):
        dl.LAUNCH_OVERRIDE.update(LAUNCHES[0])  # the GEMV would be chosen if the shape allowed it
        try:
            got = dl.decode_linear_triton(*args)
        finally:
            dl.LAUNCH_OVERRIDE.clear()
        torch.testing.assert_close(got, decode_linear_reference(*args), rtol=1e-5, atol=1e-5)
    xb, wb, _, _, rb = inputs(24, 64, False, False, True, False)
    assert not dl._fusable(xb, torch.ones(64), rb, False, 24, 64, 24)  # a float32 norm weight on a bf16 row
    assert not dl._fusable(xb, None, rb, True, 23, 64, 11)  # an odd [gate; up] weight


def test_fused_op_schema_and_reference():
    x, w, b, nw, r = inputs(16, 32, True, True, True, True, dtype=torch.float32)
    op = torch.ops.hf_specdec.decode_linear_fused.default
    torch.library.opcheck(op, (x, w, b, nw, 1e-6, True, r))
    torch.library.opcheck(op, (x, w, None, None, 0.0, False, None))
    got = decode_linear(x, w, b, norm_weight=nw, eps=1e-6, gated=True, residual=r)
    assert got.shape == (1, 1, 8)
    assert torch.equal(got, decode_linear_reference(x, w, b, nw, 1e-6, True, r))


def test_fused_launch_table(monkeypatch):
    """On a Hopper GPU every fused launch runs the GEMV (the default where no shape of its own is listed); elsewhere
    none does."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    cpu = torch.device("cpu")
    assert dl.gemv_config(6144, 4096, cpu) is None  # 8B q/k/v alone: cuBLAS
    assert dl.gemv_config(6144, 4096, cpu, fused=True) is not None  # with its norm: the GEMV
    assert dl.gemv_config(1000, 300, cpu, fused=True) == dl._FUSED_DEFAULT  # a shape never measured
    assert dl.gemv_config(1024, 512, cpu, fused=True) == dl.gemv_config(1024, 512, cpu)  # the plain GEMV's launch
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert dl.gemv_config(6144, 4096, cpu, fused=True) is None


def test_a_shape_listed_as_none_runs_the_operations_one_by_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setitem(dl._FUSED["H200"], (24, 64), None)
    cpu = torch.device("cpu")
    assert dl.gemv_config(24, 64, cpu, fused=True) is None and dl.gemv_config(24, 128, cpu, fused=True)
    x, w, b, nw, r = inputs(24, 64, True, True, True, True)
    ran = []
    monkeypatch.setattr(dl, "_unfused", lambda *a: ran.append(1) or decode_linear_reference(*a))
    dl.decode_linear_triton(x, w, b, nw, 1e-6, True, r)
    assert ran == [1]


@pytest.mark.parametrize("rows,norm,gated,residual,kernel", [(5, True, True, False, "dot"),
                                                             (17, False, False, True, "dot"),
                                                             (5, True, True, False, "registers"),
                                                             (3, False, False, True, "registers"),
                                                             (5, True, True, True, "accumulate"),
                                                             (2, False, False, True, "accumulate"),
                                                             (8, True, False, False, "accumulate")])
def test_few_rows_probe_kernel_matches_reference(rows, norm, gated, residual, kernel):
    """``benchmarks/few_rows_probe.py``'s kernels (tensor-core tiles over a few rows; the rows against each tile on
    the CUDA cores, reduced every tile or once at the end; float16: the interpreter's ``tl.dot`` multiplies bfloat16
    as raw bits) against the reference."""
    from benchmarks.few_rows_probe import few_rows_fused

    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 192, generator=gen).to(torch.float16)
    w = (torch.randn(102, 192, generator=gen) / 192 ** 0.5).to(torch.float16)  # 51 or 102 outputs: a partial tile
    nw = (1 + 0.3 * torch.randn(192, generator=gen)).to(torch.float16) if norm else None
    r = torch.randn(rows, 51 if gated else 102, generator=gen).to(torch.float16) if residual else None
    cfg = {"dot": dict(block_n=32, block_k=64, num_stages=3),
           "registers": dict(block_n=8, block_k=64, num_stages=3, kernel="registers"),
           "accumulate": dict(block_n=4, block_k=128, num_warps=4, kernel="accumulate")}[kernel]
    got = few_rows_fused(x, w, nw, 1e-5, gated, r, cfg)
    as32 = (lambda t: None if t is None else t.float())  # noqa: E731
    want = decode_linear_reference(x.float(), w.float(), None, as32(nw), 1e-5, gated, as32(r))
    torch.testing.assert_close(got.float(), want, rtol=5 * 2 ** -10, atol=5 * 2 ** -10)
