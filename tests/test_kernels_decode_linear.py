"""The decode GEMV (kernels/decode_linear_triton.py) against its reference, as a custom op, in the CSE pass, and its
fused form (gated activation and residual add) with the pass that folds the add (CPU, TRITON_INTERPRET=1)."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

pytest.importorskip("triton")

from hf_specdec.kernels import (GATE_ACTS, decode_linear, decode_linear_fused, decode_linear_fused_reference,  # noqa: E402
                                decode_linear_reference)
from hf_specdec.kernels import decode_linear_triton as dl  # noqa: E402
from hf_specdec.runner.decode_passes import fold_residual_adds, shared_matmul_cse  # noqa: E402

CONFIGS = [dict(block_n=2, block_k=512, num_warps=2, num_stages=4), dict(block_n=4, block_k=128, num_warps=4,
                                                                          num_stages=2)]


@pytest.fixture
def launch(request):
    dl.LAUNCH_OVERRIDE.update(request.param)
    yield request.param
    dl.LAUNCH_OVERRIDE.clear()


@pytest.mark.parametrize("launch", CONFIGS, indirect=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(37, 300), (64, 1024), (5, 129)])  # ragged n and k: the masks at both ends
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_reference(launch, dtype, n, k, with_bias):
    gen = torch.Generator().manual_seed(n * k)
    x = torch.randn(1, 1, k, generator=gen).to(dtype)  # (batch, tokens, hidden), as a decode step passes it
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if with_bias else None
    got = dl.decode_linear_triton(x, w, b)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())  # the exact sum, rounded once
    assert got.shape == (1, 1, n) and got.dtype == dtype
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    torch.testing.assert_close(got.float(), want, rtol=ulp, atol=ulp)


@pytest.mark.parametrize("launch", CONFIGS[:1], indirect=True)
def test_gemv_reads_a_strided_row_and_weight_rows(launch):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 96, generator=gen).to(torch.bfloat16)[2:3, ::2]  # one row, stride 2
    w = torch.randn(10, 64, generator=gen).to(torch.bfloat16)[:, :48]  # row stride 64, not K = 48
    torch.testing.assert_close(dl.decode_linear_triton(x, w, None).float(), F.linear(x.float(), w.float()),
                               rtol=2 ** -7, atol=2 ** -7)


@pytest.mark.parametrize("shape,dtype", [((2, 64), torch.bfloat16), ((1, 3, 64), torch.bfloat16),
                                         ((1, 64), torch.float32)])
def test_other_rows_and_float32_run_linear_itself(shape, dtype):
    """Several rows (a verify, a batch) or float32: ``F.linear`` exactly, never the GEMV."""
    dl.LAUNCH_OVERRIDE.update(CONFIGS[0])  # the GEMV would be chosen if the shape allowed it
    try:
        x, w = torch.randn(shape).to(dtype), torch.randn(24, 64).to(dtype)
        assert torch.equal(dl.decode_linear_triton(x, w, None), F.linear(x, w))
    finally:
        dl.LAUNCH_OVERRIDE.clear()


def test_strided_weight_or_bias_runs_linear_itself():
    """A weight or bias with a stride along its last dimension: ``F.linear`` (no per-call copy of the weight)."""
    dl.LAUNCH_OVERRIDE.update(CONFIGS[0])
    try:
        x = torch.randn(1, 32).to(torch.bfloat16)
        w_t = torch.randn(32, 24).to(torch.bfloat16).t()  # (24, 32) with stride (1, 24)
        assert torch.equal(dl.decode_linear_triton(x, w_t, None), F.linear(x, w_t))
        w, b = torch.randn(24, 32).to(torch.bfloat16), torch.randn(48).to(torch.bfloat16)[::2]
        assert torch.equal(dl.decode_linear_triton(x, w, b), F.linear(x, w, b))
    finally:
        dl.LAUNCH_OVERRIDE.clear()


def test_config_table_is_for_hopper_shapes_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cpu = torch.device("cpu")
    assert dl.gemv_config(4096, 4096, cpu) is not None  # 8B o_proj: the GEMV beat cuBLAS
    assert dl.gemv_config(128256, 2048, cpu) is not None  # a 1B output layer
    assert dl.gemv_config(28672, 4096, cpu) is None  # 8B gate/up: cuBLAS is as fast
    assert dl.gemv_config(6144, 4096, cpu) is None  # 8B q/k/v: cuBLAS faster inside the step
    assert dl.gemv_config(1024, 1024, cpu) is None  # not measured
    assert dl.gemv_config(1024, 4096, cpu) is None  # an unfused 8B k_proj: not measured
    assert dl.gemv_config(151936, 896, cpu) is None  # an output layer of a hidden size not measured
    assert dl.gemv_config(4096, 14336, cpu) is None  # 8B down_proj
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert dl.gemv_config(4096, 4096, cpu) is None  # not measured there: cuBLAS


def test_op_schema_and_reference():
    x, w, b = torch.randn(1, 16), torch.randn(8, 16), torch.randn(8)
    torch.library.opcheck(torch.ops.hf_specdec.decode_linear.default, (x, w, b))
    torch.library.opcheck(torch.ops.hf_specdec.decode_linear.default, (x, w, None))
    assert torch.equal(decode_linear(x, w, b), decode_linear_reference(x, w, b))
    assert torch.equal(decode_linear(x, w, b), F.linear(x, w, b))


def test_cse_keeps_one_decode_linear_per_fused_weight():
    """The three slices of a fused q/k/v group read one ``decode_linear`` of the same input and weight."""
    def qkv(x, fused):
        q = torch.ops.hf_specdec.decode_linear(x, fused, None)[..., :8]
        k = torch.ops.hf_specdec.decode_linear(x, fused, None)[..., 8:12]
        v = torch.ops.hf_specdec.decode_linear(x, fused, None)[..., 12:]
        return q.sum() + k.sum() * 2 + v.sum() * 3

    x, fused = torch.randn(1, 16), torch.randn(16, 16)
    gm = make_fx(qkv)(x, fused)  # aten-level, as Inductor's post-grad passes see it
    want = gm(x, fused)
    calls = lambda: [n for n in gm.graph.nodes if n.target is torch.ops.hf_specdec.decode_linear.default]  # noqa: E731
    assert len(calls()) == 3
    shared_matmul_cse(gm.graph)
    gm.recompile()
    assert len(calls()) == 1
    torch.testing.assert_close(gm(x, fused), want)


def test_cse_keeps_calls_on_other_weights_or_inputs_apart():
    def three(x, y, w1, w2):
        a = torch.ops.hf_specdec.decode_linear(x, w1, None)
        b = torch.ops.hf_specdec.decode_linear(x, w2, None)  # another weight
        c = torch.ops.hf_specdec.decode_linear(y, w1, None)  # another input
        return a.sum() + b.sum() * 2 + c.sum() * 3

    args = (torch.randn(1, 16), torch.randn(1, 16), torch.randn(8, 16), torch.randn(8, 16))
    gm = make_fx(three)(*args)
    want = gm(*args)
    shared_matmul_cse(gm.graph)
    gm.recompile()
    assert sum(n.target is torch.ops.hf_specdec.decode_linear.default for n in gm.graph.nodes) == 3
    torch.testing.assert_close(gm(*args), want)


@pytest.mark.parametrize("launch", CONFIGS, indirect=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gate_act", ["", "silu", "gelu_tanh"])
@pytest.mark.parametrize("with_residual,with_bias", [(True, False), (False, True), (True, True)])
def test_fused_gemv_matches_reference(launch, dtype, gate_act, with_residual, with_bias):
    """The gated activation read with the row and the residual added before the store: the unfused modules'
    result (CPU interpreter: its float32 -> bfloat16 casts truncate, so a few units in the last place)."""
    n, k = 37, 300
    gen = torch.Generator().manual_seed(len(gate_act) * 7 + with_residual)
    x = (2 * torch.randn(1, 1, 2 * k if gate_act else k, generator=gen)).to(dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if with_bias else None
    r = torch.randn(1, 1, n, generator=gen).to(dtype) if with_residual else None
    got = dl.decode_linear_fused_triton(x, w, b, r, gate_act)
    want = decode_linear_fused_reference(x, w, b, r, gate_act)
    assert got.shape == (1, 1, n) and got.dtype == dtype
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    torch.testing.assert_close(got.float(), want.float(), rtol=4 * ulp, atol=4 * ulp)
    if gate_act:  # not the ungated product: the activation is applied
        plain = decode_linear_fused_reference(x[..., :k], w, b, r, "")
        assert (got.float() - plain.float()).abs().max() > 0.1


@pytest.mark.parametrize("gate_act", ["silu", "gelu_tanh"])
def test_gated_rows_kernel_matches_reference(gate_act):
    """Several rows (a verify, a batch): the activation in one launch, then the linear layer."""
    gen = torch.Generator().manual_seed(11)
    x = (3 * torch.randn(5, 2 * 70, generator=gen)).to(torch.bfloat16)
    out = torch.empty(5, 70, dtype=torch.bfloat16)
    dl._gated_rows_kernel[(5, 1)](x, out, 70, x.stride(0), GATE_ACT=dl._GATE_CODES[gate_act], BLOCK=128)
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(out.float(), (GATE_ACTS[gate_act](gate) * up).float(), rtol=2 ** -5, atol=2 ** -5)


def test_fused_op_other_rows_and_float32_run_torch_itself():
    """No GEMV: float32 exactly the modules' ops; half precision with a residual adds it in the matmul's
    epilogue (one rounding of the sum), with a bias after the linear layer."""
    dl.LAUNCH_OVERRIDE.update(CONFIGS[0])
    try:
        gen = torch.Generator().manual_seed(5)
        x, w, r = torch.randn(3, 2 * 64, generator=gen), torch.randn(24, 64, generator=gen), torch.randn(3, 24)
        want = r + F.linear(F.silu(x[:, :64]) * x[:, 64:], w)
        assert torch.equal(dl.decode_linear_fused_triton(x, w, None, r, "silu"), want)
        xh, wh, rh = x[:, :64].to(torch.bfloat16), w.to(torch.bfloat16), r.to(torch.bfloat16)
        got = dl.decode_linear_fused_triton(xh, wh, None, rh, "")
        assert torch.equal(got, torch.addmm(rh, xh, wh.t()))
        torch.testing.assert_close(got.float(), rh.float() + F.linear(xh.float(), wh.float()), rtol=2 ** -7,
                                   atol=2 ** -6)
        b = torch.randn(24, generator=gen).to(torch.bfloat16)
        assert torch.equal(dl.decode_linear_fused_triton(xh, wh, b, rh, ""), rh + F.linear(xh, wh, b))
    finally:
        dl.LAUNCH_OVERRIDE.clear()


def test_fused_op_schema_reference_and_bad_activation():
    x, w, b, r = torch.randn(1, 32), torch.randn(8, 16), torch.randn(8), torch.randn(1, 8)
    for args in ((x, w, b, r, "silu"), (x[:, :16], w, None, None, ""), (x, w, None, r, "gelu_tanh")):
        torch.library.opcheck(torch.ops.hf_specdec.decode_linear_fused.default, args)
        assert torch.equal(decode_linear_fused(*args), decode_linear_fused_reference(*args))
    assert torch.equal(decode_linear_fused(x, w, b, r, "silu"), r + F.linear(F.silu(x[:, :16]) * x[:, 16:], w, b))
    with pytest.raises(ValueError, match="gate_act='relu'"):
        decode_linear_fused(x, w, b, r, "relu")


def _fold(fn, *args):
    gm = make_fx(fn)(*args)
    want = gm(*args)
    fold_residual_adds(gm.graph)
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    torch.testing.assert_close(gm(*args), want, rtol=2 ** -7, atol=2 ** -6)  # half: the folded sum rounds once
    return targets


def test_fold_takes_the_residual_add_into_the_projection():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 16, generator=gen).to(torch.bfloat16), torch.randn(8, 16, generator=gen).to(torch.bfloat16)
    r = torch.randn(1, 8, generator=gen).to(torch.bfloat16)
    fused = torch.ops.hf_specdec.decode_linear_fused.default
    targets = _fold(lambda x, w, r: r + torch.ops.hf_specdec.decode_linear(x, w, None), x, w, r)
    assert targets == [fused]
    gated = lambda x, w, r: torch.ops.hf_specdec.decode_linear_fused(x, w, None, None, "silu") + r  # noqa: E731
    assert _fold(gated, torch.cat([x, x], -1), w, r) == [fused]


def test_fold_leaves_other_adds_alone():
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(1, 16, generator=gen).to(torch.bfloat16), torch.randn(8, 16, generator=gen).to(torch.bfloat16)
    r = torch.randn(1, 8, generator=gen).to(torch.bfloat16)
    linear = torch.ops.hf_specdec.decode_linear.default
    add = torch.ops.aten.add.Tensor
    # float32: the add stays its own rounding step
    assert add in _fold(lambda x, w, r: r + torch.ops.hf_specdec.decode_linear(x, w, None), x.float(), w.float(),
                        r.float())
    # a broadcast residual, a projection read twice, a scalar add
    assert add in _fold(lambda x, w, r: r[:, :1] + torch.ops.hf_specdec.decode_linear(x, w, None), x, w, r)

    def twice(x, w, r):
        y = torch.ops.hf_specdec.decode_linear(x, w, None)
        return y + r, y * 2

    assert linear in _fold(twice, x, w, r)
    assert add in _fold(lambda x, w: torch.ops.hf_specdec.decode_linear(x, w, None) + 1, x, w)

    def doubled(x, w):
        y = torch.ops.hf_specdec.decode_linear(x, w, None)
        return y + y

    assert add in _fold(doubled, x, w)  # the projection is not its own residual
