"""The runner's post-grad passes: an outer product written as a matmul becomes a multiply, bit for bit, and only
then; both passes run as the one pass Inductor takes, and its cache key follows each pass."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from hf_specdec.runner.inductor_passes import OuterProductAsMul, PostGradPasses, inductor_options


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _rotary_angles(inv_freq, positions):
    """transformers 5.17's Llama rotary angles: (B, d/2, 1) float32 @ (B, 1, T) float32, then cos and sin."""
    freqs = (inv_freq[None, :, None].expand(positions.shape[0], -1, 1) @ positions[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def test_outer_product_matmuls_become_bit_identical_multiplies():
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
    positions = torch.tensor([[0, 1, 7, 4095, 131071]])
    gm = make_fx(_rotary_angles)(inv_freq, positions)
    assert torch.ops.aten.bmm.default in _targets(gm)
    want = gm(inv_freq, positions)
    OuterProductAsMul()(gm.graph)
    gm.recompile()
    assert torch.ops.aten.bmm.default not in _targets(gm) and torch.ops.aten.mul.Tensor in _targets(gm)
    for got, ref in zip(gm(inv_freq, positions), want):
        assert torch.equal(got, ref)  # one product per element: nothing to round differently
    mul = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    assert mul.meta["original_aten"] is torch.ops.aten.mul.Tensor  # Inductor names its kernel after a multiply


@pytest.mark.parametrize("dtype,tf32,converted", [(torch.float32, True, False), (torch.float32, False, True),
                                                  (torch.bfloat16, True, True)])
def test_float32_cuda_outer_products_stay_matmuls_while_tf32_is_allowed(dtype, tf32, converted):
    """cuBLAS may round float32 inputs to TF32 there: the multiply would not give what the matmul gives."""
    gm = make_fx(lambda a, b: torch.bmm(a, b))(torch.randn(1, 4, 1), torch.randn(1, 1, 6))
    with FakeTensorMode():  # what the graph holds when Inductor compiles for a GPU
        vals = iter((torch.empty(1, 4, 1, dtype=dtype, device="cuda"), torch.empty(1, 1, 6, dtype=dtype, device="cuda")))
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["val"] = next(vals)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        OuterProductAsMul()(gm.graph)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert (torch.ops.aten.bmm.default not in _targets(gm)) is converted


def test_real_matmuls_are_left_alone_and_one_wide_ones_of_any_float_dtype_converted():
    def three(a, b, c, d):
        return a @ b, (c @ d).sum(), torch.mm(a.double()[:, :1], b.double()[:1])

    args = (torch.randn(4, 3), torch.randn(3, 5), torch.randn(2, 4, 2), torch.randn(2, 2, 6))
    gm = make_fx(three)(*args)
    before = _targets(gm)
    want = gm(*args)
    OuterProductAsMul()(gm.graph)
    gm.recompile()
    after = _targets(gm)
    assert after.count(torch.ops.aten.mm.default) == before.count(torch.ops.aten.mm.default) - 1  # the 1-wide one
    assert after.count(torch.ops.aten.bmm.default) == before.count(torch.ops.aten.bmm.default)  # inner dim 2
    for got, ref in zip(gm(*args), want):
        assert torch.equal(got, ref)


def test_inductor_gets_both_passes_under_one_key():
    combined = inductor_options()["post_grad_custom_post_pass"]
    assert isinstance(combined, PostGradPasses)
    assert [type(p).__name__ for p in combined.passes] == ["SharedMatmulCSE", "OuterProductAsMul"]
    assert combined.uuid() == PostGradPasses().uuid() and len(combined.uuid()) == 64


def test_cache_key_covers_the_passes_helpers(monkeypatch):
    """Inductor reuses compiled code by this key: a change in a helper that decides where a pass fires must change
    it, not only a change in the pass's class."""
    import inspect

    import hf_specdec.runner.inductor_passes as passes

    before = PostGradPasses().uuid()
    real = inspect.getsource
    monkeypatch.setattr(inspect, "getsource",
                        lambda obj: real(obj) + ("\n# edited helper" if obj is passes else ""))
    assert PostGradPasses().uuid() != before
    assert passes.OuterProductAsMul().uuid() == passes.SharedMatmulCSE().uuid() == PostGradPasses().uuid()
