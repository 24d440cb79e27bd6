"""Triton KV slot write and paged attention vs their torch references (CPU, TRITON_INTERPRET=1)."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton")

from hf_specdec.kernels import paged_attention_reference, write_kv_to_slots_reference  # noqa: E402
from hf_specdec.kernels.paged_attention_triton import (  # noqa: E402
    paged_attention_triton,
    write_kv_to_slots_triton,
)

TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}


def _paged_batch(gen, qlens, ctx_lens, H, KVH, D, block_size, dtype, spare_blocks=3):
    """Random caches, a shuffled block table (blocks of a sequence are not contiguous) and packed queries."""
    qlens = torch.tensor(qlens)
    seq_lens = torch.tensor(ctx_lens) + qlens
    B = len(qlens)
    max_blocks = int((seq_lens.max() + block_size - 1) // block_size) + 1  # one unused trailing entry
    num_blocks = B * max_blocks + spare_blocks
    block_tables = torch.randperm(num_blocks, generator=gen)[: B * max_blocks].view(B, max_blocks).int()
    key_cache = torch.randn(num_blocks, block_size, KVH, D, generator=gen).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, KVH, D, generator=gen).to(dtype)
    T = int(qlens.sum())
    query = torch.randn(T, H, D, generator=gen).to(dtype)
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.long), qlens.cumsum(0)]).int()
    return query, key_cache, value_cache, block_tables, seq_lens.int(), query_start_loc, int(qlens.max())


def _check(args, scale, window=None, softcap=None):
    got = paged_attention_triton(*args, scale, window, softcap)
    want = paged_attention_reference(*args, scale, window, softcap)
    assert got.dtype == want.dtype == args[0].dtype
    assert got.shape == want.shape
    assert torch.isfinite(got.float()).all()
    tol = TOL[args[0].dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize(
    "qlens,ctx_lens",
    [
        ([1, 1, 1], [5, 17, 40]),  # decode
        ([2, 2], [9, 0]),  # bonus-token expansion: two tokens
        ([5, 3, 1], [12, 30, 7]),  # k+1 verify, ragged
        ([150, 1, 5], [20, 33, 0]),  # a prefill chunk next to decode and verify rows
    ],
)
@pytest.mark.parametrize("H,KVH", [(4, 4), (8, 2), (6, 2)])
@pytest.mark.parametrize("wide", [True, False])
def test_paged_attention_fp32(qlens, ctx_lens, H, KVH, wide, monkeypatch):
    """With and without the wide launch allowed (float32 takes it only when the knob says so)."""
    import hf_specdec.kernels.paged_attention_triton as pa

    monkeypatch.setattr(pa, "LAUNCH_OVERRIDE", dict(wide_tiles=wide))
    gen = torch.Generator().manual_seed(sum(qlens) * 31 + H + KVH)
    args = _paged_batch(gen, qlens, ctx_lens, H, KVH, 16, 4, torch.float32)
    _check(args, 16 ** -0.5)


@pytest.mark.parametrize("D,block_size", [(64, 16), (80, 16), (128, 16), (16, 16)])
def test_paged_attention_head_dims(D, block_size):
    gen = torch.Generator().manual_seed(D + block_size)
    args = _paged_batch(gen, [1, 5, 2], [30, 11, 0], 4, 2, D, block_size, torch.float32)
    _check(args, D ** -0.5)


@pytest.mark.parametrize("window,softcap", [(8, None), (None, 5.0), (6, 30.0), (1, None)])
def test_paged_attention_window_softcap(window, softcap):
    gen = torch.Generator().manual_seed(window or 0)
    args = _paged_batch(gen, [1, 5, 40], [25, 9, 3], 8, 2, 16, 4, torch.float32)
    _check(args, 0.7, window, softcap)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_attention_half(dtype):
    gen = torch.Generator().manual_seed(2)
    args = _paged_batch(gen, [1, 5, 33], [20, 7, 4], 8, 2, 64, 16, dtype)
    _check(args, 64 ** -0.5)
    _check(args, 64 ** -0.5, 16, 20.0)


def test_paged_attention_reads_only_own_blocks():
    """Poisoning every block outside a sequence's table (and its positions past seq_len) changes nothing."""
    gen = torch.Generator().manual_seed(4)
    args = _paged_batch(gen, [3, 1], [6, 10], 4, 2, 16, 4, torch.float32, spare_blocks=5)
    query, kc, vc, bt, seq_lens, qsl, mq = args
    want = paged_attention_triton(*args, 0.25)
    used = torch.zeros(kc.shape[0], kc.shape[1], dtype=torch.bool)
    for b in range(bt.shape[0]):
        for pos in range(int(seq_lens[b])):
            used[bt[b, pos // 4], pos % 4] = True
    kc2, vc2 = kc.clone(), vc.clone()
    kc2[~used] = float("nan")
    vc2[~used] = float("nan")
    got = paged_attention_triton(query, kc2, vc2, bt, seq_lens, qsl, mq, 0.25)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    ref = paged_attention_reference(query, kc2, vc2, bt, seq_lens, qsl, mq, 0.25)
    torch.testing.assert_close(ref, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cache_dtype,in_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                  (torch.float16, torch.float16), (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("KVH,D,block_size", [(2, 16, 4), (8, 80, 16), (3, 64, 16)])
def test_write_kv_to_slots(cache_dtype, in_dtype, KVH, D, block_size):
    gen = torch.Generator().manual_seed(KVH * D + block_size)
    num_blocks, T = 12, 23
    key = torch.randn(T, KVH, D, generator=gen).to(in_dtype)
    value = torch.randn(T, KVH, D, generator=gen).to(in_dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:T]
    kc = torch.randn(num_blocks, block_size, KVH, D, generator=gen).to(cache_dtype)
    vc = torch.randn(num_blocks, block_size, KVH, D, generator=gen).to(cache_dtype)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    write_kv_to_slots_triton(key, value, kc, vc, slots)
    write_kv_to_slots_reference(key, value, kc_ref, vc_ref, slots)
    if cache_dtype == in_dtype:
        assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
    else:
        # Triton's CPU interpreter rounds float32 -> bfloat16 toward zero (the GPU rounds to
        # nearest even, like torch): allow one bfloat16 ulp here.
        written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
        written[slots] = True
        assert torch.equal(kc.view(-1, KVH, D)[~written], kc_ref.view(-1, KVH, D)[~written])
        torch.testing.assert_close(kc, kc_ref, atol=0, rtol=2 ** -7)
        torch.testing.assert_close(vc, vc_ref, atol=0, rtol=2 ** -7)


def test_write_kv_non_contiguous_key_and_padding_slot():
    """Keys sliced out of a fused qkv projection (strided rows); slot -1 marks a padding token to skip."""
    gen = torch.Generator().manual_seed(7)
    T, KVH, D, bs = 6, 2, 16, 4
    qkv = torch.randn(T, 3, KVH, D, generator=gen)
    key, value = qkv[:, 1], qkv[:, 2]
    kc = torch.zeros(4, bs, KVH, D)
    vc = torch.zeros(4, bs, KVH, D)
    slots = torch.tensor([3, 0, 9, -1, 15, 4])
    write_kv_to_slots_triton(key, value, kc, vc, slots)
    kc_ref, vc_ref = torch.zeros_like(kc), torch.zeros_like(vc)
    write_kv_to_slots_reference(key, value, kc_ref, vc_ref, slots)  # the reference skips it too
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
    keep = slots >= 0
    assert kc_ref.view(-1, KVH, D)[slots[keep]].abs().sum() > 0 and int(kc_ref.ne(0).any(-1).any(-1).sum()) == 5


def test_write_then_attend_matches_reference():
    """A verify step end to end: write the k+1 new keys into their slots, then attend."""
    gen = torch.Generator().manual_seed(12)
    H, KVH, D, bs = 4, 2, 16, 4
    qlens, ctx = [5, 1, 3], [7, 12, 0]
    query, kc, vc, bt, seq_lens, qsl, mq = _paged_batch(gen, qlens, ctx, H, KVH, D, bs, torch.float32)
    pos = torch.cat([torch.arange(c, c + q) for q, c in zip(qlens, ctx)])
    seq_of = torch.repeat_interleave(torch.arange(len(qlens)), torch.tensor(qlens))
    slots = bt[seq_of, pos // bs].long() * bs + pos % bs
    k_new = torch.randn(len(pos), KVH, D, generator=gen)
    v_new = torch.randn(len(pos), KVH, D, generator=gen)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    write_kv_to_slots_triton(k_new, v_new, kc, vc, slots)
    write_kv_to_slots_reference(k_new, v_new, kc_ref, vc_ref, slots)
    got = paged_attention_triton(query, kc, vc, bt, seq_lens, qsl, mq, 0.25)
    want = paged_attention_reference(query, kc_ref, vc_ref, bt, seq_lens, qsl, mq, 0.25)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype,window,softcap", [(torch.float32, None, None), (torch.float32, 300, 30.0),
                                                  (torch.bfloat16, None, None)])
def test_split_kv_decode(dtype, window, softcap, monkeypatch):
    """Small batch, long context: keys split over several programs (flash-decoding) and combined."""
    import hf_specdec.kernels.paged_attention_triton as pa

    monkeypatch.setattr(pa, "LAUNCH_OVERRIDE", dict(wide_tiles=False))  # the small grid's launch (on CPU 4 kv
    # programs already make a wide grid)

    old = pa.MAX_KV_SPLITS
    pa.MAX_KV_SPLITS = 16  # off by default (see the module); exercised here
    try:
        _split_kv_decode(pa, dtype, window, softcap)
    finally:
        pa.MAX_KV_SPLITS = old


def _split_kv_decode(pa, dtype, window, softcap):
    gen = torch.Generator().manual_seed(33)
    qlens, ctx = [1, 3], [1100, 700]
    H, KVH, D, bs = 8, 2, 64, 16
    args = _paged_batch(gen, qlens, ctx, H, KVH, D, bs, dtype)
    _, _, block_n, _ = pa._tile_sizes(args[-1], H // KVH, D)
    programs = len(qlens) * KVH  # one query block per sequence
    target = pa._num_programs_target(torch.device("cpu"))
    assert pa._num_kv_splits(programs, args[3].shape[1] * bs, block_n, target) > 1
    _check(args, D ** -0.5, window, softcap)
    split = paged_attention_triton(*args, D ** -0.5, window, softcap)
    pa.MAX_KV_SPLITS = 1
    whole = paged_attention_triton(*args, D ** -0.5, window, softcap)
    pa.MAX_KV_SPLITS = 16
    torch.testing.assert_close(split.float(), whole.float(), atol=TOL[dtype], rtol=TOL[dtype])


def test_prefill_queries_never_split(monkeypatch):
    """A prompt's prefill never splits its keys, whatever its length; a round's short queries still split
    when the grid is small (the split count is a runtime argument: no new kernel variant either way)."""
    import hf_specdec.kernels.paged_attention_triton as pa

    seen = []
    kernel = pa._paged_attention_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append(kw["num_kv_splits"])
                return kernel[grid](*args, **kw)
            return launch

    monkeypatch.setattr(pa, "_paged_attention_kernel", Spy())
    gen = torch.Generator().manual_seed(5)
    for qlen in (40, 70, 100):  # one row's prompt (after 900 cached tokens): a grid of 3 to 7 query blocks
        _check(_paged_batch(gen, [qlen], [900], 4, 1, 32, 16, torch.float32), 0.2)
    assert seen == [1, 1, 1]
    _check(_paged_batch(gen, [5], [900], 4, 1, 32, 16, torch.float32), 0.2)  # a verify at batch 1
    assert seen[-1] > 1


def test_launch_override_changes_the_launch_not_the_output(monkeypatch):
    """benchmarks/attention_sweep.py's knobs: one-tile splits split more, a 16-key tile and 2 warps run; the output
    stays the reference's."""
    import hf_specdec.kernels.paged_attention_triton as pa

    assert pa._num_kv_splits(2, 256, 32, 8) == 2  # four tiles a split at least: 256 // 128
    monkeypatch.setattr(pa, "LAUNCH_OVERRIDE", dict(min_tiles=1, block_n=16, num_warps=2))
    assert pa._num_kv_splits(2, 256, 32, 8) == 4  # the target's 8 programs
    assert pa._tile_sizes(1, 4, 64)[2] == 16
    gen = torch.Generator().manual_seed(7)
    _check(_paged_batch(gen, [1, 3], [300, 200], 8, 2, 64, 16, torch.float32), 64 ** -0.5)
    # a grid of a quarter of the programs a split aims for runs unsplit over 128-key tiles; a smaller one splits
    monkeypatch.setattr(pa, "LAUNCH_OVERRIDE", {})
    wide = pa._attention_launch(2, 5, 8, 4, 64, 1024, 32, torch.bfloat16, None, None)
    small = pa._attention_launch(1, 5, 8, 4, 64, 1024, 32, torch.bfloat16, None, None)
    assert wide[0] == 1 and wide[2]["BLOCK_N"] == 128 and small[0] > 1 and small[2]["BLOCK_N"] == 64
    # scoped to a query class: a verify's knobs leave a decode's launch alone
    monkeypatch.setattr(pa, "LAUNCH_OVERRIDE", dict(verify=dict(max_splits=1, block_n=16)))
    assert pa._num_kv_splits(2, 256, 32, 8, max_query_len=5) == 1 and pa._num_kv_splits(2, 256, 32, 8) == 2
    assert pa._tile_sizes(5, 4, 64)[2] == 16 and pa._tile_sizes(1, 4, 64)[2] == 64


@pytest.mark.parametrize("dtype,D,window,softcap", [(torch.bfloat16, 128, None, None), (torch.float16, 80, 37, 30.0),
                                                    (torch.float32, 64, 37, None)])
@pytest.mark.parametrize("qlens", [[1, 1], [5, 3]])
def test_wide_and_small_launches_match_the_reference(monkeypatch, dtype, D, window, softcap, qlens):
    """Decode and verify on both launches over contexts of several 128-key tiles: a wide grid's unsplit 128-key
    tiles and a small grid's split short tiles; window, softcap, 16-bit and float32, a padded head_dim."""
    import hf_specdec.kernels.paged_attention_triton as pa

    gen = torch.Generator().manual_seed(D + sum(qlens))
    args = _paged_batch(gen, qlens, [300, 260], 4, 1, D, 16, dtype)
    target = pa._num_programs_target(torch.device("cpu"))  # 8: the 2 sequences' programs are a quarter
    for launch in (dict(wide_tiles=True), dict(wide_tiles=False, min_tiles=1)):
        monkeypatch.setattr(pa, "LAUNCH_OVERRIDE", launch)
        splits, _, attention, _ = pa._attention_launch(2, max(qlens), 4, 1, D, args[3].shape[1] * 16, target, dtype,
                                                       window, softcap)
        wide = launch["wide_tiles"]
        assert (splits == 1 and attention["BLOCK_N"] == 128) if wide else (splits > 1 and attention["BLOCK_N"] < 128)
        _check(args, D ** -0.5, window, softcap)
