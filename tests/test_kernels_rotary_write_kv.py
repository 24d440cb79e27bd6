"""Rotary + K/V write in one launch (kernels/rotary_write_kv_*.py): the Triton kernel against its torch reference
(CPU, TRITON_INTERPRET=1), and the reference against what transformers' own rotary and the plain slot write give."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

pytest.importorskip("triton")

from hf_specdec.kernels import rotary_write_kv_reference, write_kv_to_slots_reference  # noqa: E402
from hf_specdec.kernels.rotary_write_kv_triton import rotary_write_kv_triton  # noqa: E402


def _step(T, H, KVH, D, dtype, gen, strided=False, blocks=6, block_size=4):
    """Projections as a fused q/k/v matmul leaves them (views with a row stride) when ``strided``; angles of
    arbitrary positions; a shuffled slot for each token, the last one padding (-1)."""
    width = (H + 2 * KVH) * D
    if strided:
        qkv = torch.randn(T, width, generator=gen).to(dtype)
        q, k, v = qkv[:, :H * D], qkv[:, H * D:(H + KVH) * D], qkv[:, (H + KVH) * D:]
        q, k, v = q.view(T, H, D), k.view(T, KVH, D), v.view(T, KVH, D)
    else:
        q, k, v = (torch.randn(T, n, D, generator=gen).to(dtype) for n in (H, KVH, KVH))
    angles = torch.rand(T, D // 2, generator=gen) * 50
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    slots = torch.randperm(blocks * block_size, generator=gen)[:T]
    slots[-1] = -1
    caches = [torch.randn(blocks, block_size, KVH, D, generator=gen).to(dtype) for _ in range(2)]
    return (q, k, v, cos, sin, *caches, slots)


@pytest.mark.parametrize("H,KVH,D", [(4, 2, 16), (8, 8, 64), (6, 2, 80), (2, 1, 128), (40, 20, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("return_key", [False, True])
def test_triton_matches_reference(H, KVH, D, dtype, strided, return_key):
    gen = torch.Generator().manual_seed(H * 100 + D)
    args = _step(7, H, KVH, D, dtype, gen, strided)
    ref_caches = [c.clone() for c in args[5:7]]
    want_q, want_k = rotary_write_kv_reference(*args[:5], *ref_caches, args[7], return_key)
    got_q, got_k = rotary_write_kv_triton(*args, return_key)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: the kernel rounds once, the reference after each op
    for got, want in ((got_q, want_q), (got_k, want_k)):
        assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    assert got_k.shape == ((7, KVH, D) if return_key else (0,))
    for mine, theirs in zip(args[5:7], ref_caches):  # the padding token's slot and every other slot as the reference
        torch.testing.assert_close(mine.float(), theirs.float(), atol=tol, rtol=tol)


def test_reference_is_transformers_rotary_then_the_slot_write():
    gen = torch.Generator().manual_seed(0)
    q, k, v, cos, sin, kc, vc, slots = _step(5, 4, 2, 32, torch.float32, gen)
    got_q, got_k = rotary_write_kv_reference(q, k, v, cos, sin, kc, vc, slots, True)
    # transformers' layout: (batch, heads, T, D) and angles (batch, T, D)
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    assert torch.equal(got_q, q_hf[0].transpose(0, 1))  # bit for bit in fp32
    assert torch.equal(got_k, k_hf[0].transpose(0, 1))
    kc2, vc2 = kc.clone(), vc.clone()
    kc.zero_(), vc.zero_()
    want_k, want_v = torch.zeros_like(kc), torch.zeros_like(vc)
    write_kv_to_slots_reference(k_hf[0].transpose(0, 1), v, want_k, want_v, slots)
    rotary_write_kv_reference(q, k, v, cos, sin, kc, vc, slots, False)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert not torch.equal(kc2, kc)  # the write really happened (the caches were random before)
