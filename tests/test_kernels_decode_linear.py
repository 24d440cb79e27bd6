"""The decode GEMV (kernels/decode_linear_triton.py) against its reference, as a custom op, and in the CSE pass
(CPU, TRITON_INTERPRET=1)."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

pytest.importorskip("triton")

from hf_specdec.kernels import decode_linear, decode_linear_reference  # noqa: E402
from hf_specdec.kernels import decode_linear_triton as dl  # noqa: E402
from hf_specdec.runner.inductor_passes import SharedMatmulCSE  # noqa: E402

CONFIGS = [dict(block_n=2, block_k=512, num_warps=2, num_stages=4), dict(block_n=4, block_k=128, num_warps=4,
                                                                          num_stages=2),
           dict(block_n=2, block_k=1024, num_warps=4, num_stages=1)]  # every K below in one tile, no loop


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


TMA_CONFIGS = [dict(tma=True, block_n=8, block_k=64, num_warps=4, num_stages=3),
               dict(tma=True, block_n=16, block_k=128, num_warps=4, num_stages=2)]


@pytest.mark.parametrize("launch", TMA_CONFIGS, indirect=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(37, 304), (64, 1024), (5, 136)])  # rows and K tiles past the ends: zeros
@pytest.mark.parametrize("with_bias", [False, True])
def test_tma_gemv_matches_reference(launch, dtype, n, k, with_bias, monkeypatch):
    """The TMA kernel (tiles by tensor descriptor, K loop pipelined), neither cuBLAS's fallback nor the other GEMV."""
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if with_bias else None
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    monkeypatch.setattr(F, "linear", lambda *a: pytest.fail("fell back to F.linear"))
    monkeypatch.setattr(dl, "_gemv_kernel", None)  # indexing it would fail
    got = dl.decode_linear_triton(x, w, b)
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    torch.testing.assert_close(got.float(), want, rtol=ulp, atol=ulp)


@pytest.mark.parametrize("launch", TMA_CONFIGS[:1], indirect=True)
def test_tma_launch_of_a_misaligned_weight_runs_linear_itself(launch):
    """A TMA descriptor needs a 16-byte aligned base and row stride: a view one column in, or K = 300 (600-byte
    rows), runs ``F.linear`` as is."""
    x, w = torch.randn(1, 64).to(torch.bfloat16), torch.randn(24, 65).to(torch.bfloat16)
    assert not dl.tma_readable(w[:, 1:]) and not dl.tma_readable(torch.empty(8, 300, dtype=torch.bfloat16))
    assert torch.equal(dl.decode_linear_triton(x, w[:, 1:], None), F.linear(x, w[:, 1:]))


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
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    cpu = torch.device("cpu")
    assert dl.gemv_config(4096, 4096, cpu) is not None  # 8B o_proj: the GEMV beat cuBLAS
    assert dl.gemv_config(128256, 2048, cpu) is not None  # a 1B output layer
    assert dl.gemv_config(28672, 4096, cpu) is None  # 8B gate/up: cuBLAS is as fast
    assert dl.gemv_config(6144, 4096, cpu) is None  # 8B q/k/v: cuBLAS faster inside the step
    assert dl.gemv_config(1024, 1024, cpu) is None  # not measured
    assert dl.gemv_config(1024, 4096, cpu) is None  # an unfused 8B k_proj: not measured
    assert dl.gemv_config(151936, 896, cpu) is None  # an output layer of a hidden size not measured
    assert dl.gemv_config(4096, 14336, cpu) is None  # 8B down_proj
    assert dl.gemv_config(3072, 2048, cpu) is None  # 1B q/k/v: cuBLAS again with PDL off (2026-11-27 sweep)
    for n, k in ((1024, 512), (512, 512), (3072, 512), (512, 1536)):  # every matmul of the pair's draft model
        assert dl.gemv_config(n, k, cpu) is not None
    assert dl.gemv_config(16384, 512, cpu) is None and dl.gemv_config(16384, 1536, cpu) is None  # its output layers
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert dl.gemv_config(4096, 4096, cpu) is None  # not measured there: cuBLAS


@pytest.mark.parametrize("name", ["NVIDIA H200", "NVIDIA GH200 480GB"])
def test_h200_table_leaves_output_layers_to_cublas(monkeypatch, name):
    """On an H200 cuBLAS reads a 128k-token output layer faster than the GEMV; o_proj still goes to the GEMV."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    cpu = torch.device("cpu")
    assert dl.measured_gpu(cpu) == "H200"
    assert dl.gemv_config(128256, 4096, cpu) is None and dl.gemv_config(128256, 2048, cpu) is None
    assert dl.gemv_config(4096, 4096, cpu)["block_n"] == 8  # the H200's own launch, not the H100's
    assert dl.gemv_config(2048, 2048, cpu) is not None
    assert dl.gemv_config(28672, 4096, cpu) is None
    assert dl.gemv_config(3072, 2048, cpu)["tma"]  # the 1B q/k/v: the TMA kernel (cuBLAS beat the other one)
    assert dl.gemv_config(4096, 4096, cpu)["tma"]  # the 8B o_proj too
    assert dl.gemv_config(512, 512, cpu)["block_n"] == 2  # the pair draft's o_proj, swept on the H200 too
    for n, k in ((1536, 512), (2688, 512), (512, 1344), (512, 3072)):  # a narrow head's (hidden 512) matmuls
        assert dl.gemv_config(n, k, cpu) is not None


def test_a_sweep_file_is_read_before_the_tables(monkeypatch, tmp_path):
    """``HF_SPECDEC_GEMV_TABLE``: a decode_linear.py sweep of this GPU chooses the GEMV where it won by 5% and cuBLAS
    where it did not, for the shapes it holds; the built-in table answers the rest; another GPU's file is not used;
    a file that is no sweep is refused, naming the variable and the fix."""
    import json

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    cpu, fast = torch.device("cpu"), dict(block_n=4, block_k=256, num_warps=8, num_stages=1)
    row = dict(rows=1, pdl="off", config=fast)
    sweep = {"gpu": "NVIDIA H200", "rows": [dict(row, n=1536, k=512, cublas_over_triton=1.4),  # won
                                            dict(row, n=512, k=512, cublas_over_triton=1.02),  # level: cuBLAS
                                            dict(row, n=700, k=300, cublas_over_triton=2.0, pdl="on")]}  # PDL on
    path = tmp_path / "gemv.json"
    path.write_text(json.dumps(sweep))
    monkeypatch.setenv(dl.TABLE_ENV, str(path))
    dl.swept_launches.cache_clear()
    assert dl.gemv_config(1536, 512, cpu) == fast
    assert dl.gemv_config(512, 512, cpu) is None  # in the built-in table, but the file says cuBLAS
    assert dl.gemv_config(700, 300, cpu) is None  # swept with PDL on only, which is off here
    assert dl.gemv_config(2048, 2048, cpu)["block_k"] == 2048  # not in the file: the built-in table's
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(sweep, gpu="NVIDIA A100-SXM4-80GB")))
    monkeypatch.setenv(dl.TABLE_ENV, str(other))
    with pytest.warns(RuntimeWarning, match="not this 'NVIDIA H200'"):
        assert dl.gemv_config(512, 512, cpu)["block_n"] == 2  # the built-in table's, not the file's cuBLAS
    (tmp_path / "bad.json").write_text("{}")
    monkeypatch.setenv(dl.TABLE_ENV, str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="HF_SPECDEC_GEMV_TABLE=.*decode_linear.py --sweep"):
        dl.gemv_config(1536, 512, cpu)
    no_ratio = dict(sweep, rows=[dict(row, n=1536, k=512)])  # a row without cublas_over_triton
    (tmp_path / "no_ratio.json").write_text(json.dumps(no_ratio))
    monkeypatch.setenv(dl.TABLE_ENV, str(tmp_path / "no_ratio.json"))
    with pytest.raises(ValueError, match="KeyError.*cublas_over_triton.*decode_linear.py --sweep"):
        dl.gemv_config(1536, 512, cpu)
    no_stages = dict(sweep, rows=[dict(row, n=1536, k=512, cublas_over_triton=1.4, config=dict(block_n=4, block_k=256,
                                                                                              num_warps=8))])
    (tmp_path / "no_stages.json").write_text(json.dumps(no_stages))
    monkeypatch.setenv(dl.TABLE_ENV, str(tmp_path / "no_stages.json"))
    with pytest.raises(ValueError, match="KeyError.*num_stages.*decode_linear.py --sweep"):
        dl.gemv_config(1536, 512, cpu)
    dl.swept_launches.cache_clear()


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
    SharedMatmulCSE()(gm.graph)
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
    SharedMatmulCSE()(gm.graph)
    gm.recompile()
    assert sum(n.target is torch.ops.hf_specdec.decode_linear.default for n in gm.graph.nodes) == 3
    torch.testing.assert_close(gm(*args), want)
