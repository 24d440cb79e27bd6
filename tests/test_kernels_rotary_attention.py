"""Rotary + K/V write + paged attention in one launch (kernels/rotary_paged_attention_*.py): the Triton kernel
against its torch reference (CPU, TRITON_INTERPRET=1), outputs and both caches, for decode, bonus-token and
verify steps, ragged rows, GQA groups, sliding windows, split and unsplit launches; and the reference against the
two kernels' references it stands for."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton")

import hf_specdec.kernels.paged_attention_triton as pa  # noqa: E402
import hf_specdec.kernels.rotary_paged_attention_triton as rpa  # noqa: E402
from hf_specdec.kernels import (  # noqa: E402
    paged_attention_reference,
    rotary_paged_attention_reference,
    rotary_write_kv_reference,
    slots_of,
)
from hf_specdec.kernels.rotary_paged_attention_triton import rotary_paged_attention_triton  # noqa: E402

TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _step(gen, qlens, ctx_lens, H, KVH, D, block_size, dtype, strided=False):
    """A step's pre-rotary q/k/v (views of one fused projection when ``strided``), angles at each token's position,
    random caches (the new tokens' slots hold garbage before the step) under a shuffled block table, and the
    metadata ``step_metadata`` would give: packed offsets, lengths after the step, each token's slot."""
    qlens_t = torch.tensor(qlens)
    seq_lens = torch.tensor(ctx_lens) + qlens_t
    B, T = len(qlens), int(qlens_t.sum())
    max_blocks = int((seq_lens.max() + block_size - 1) // block_size) + 1
    num_blocks = B * max_blocks + 2
    tables = torch.randperm(num_blocks, generator=gen)[: B * max_blocks].view(B, max_blocks).int()
    caches = [torch.randn(num_blocks, block_size, KVH, D, generator=gen).to(dtype) for _ in range(2)]
    if strided:
        qkv = torch.randn(T, (H + 2 * KVH) * D, generator=gen).to(dtype)
        q = qkv[:, :H * D].view(T, H, D)
        k = qkv[:, H * D:(H + KVH) * D].view(T, KVH, D)
        v = qkv[:, (H + KVH) * D:].view(T, KVH, D)
    else:
        q, k, v = (torch.randn(T, n, D, generator=gen).to(dtype) for n in (H, KVH, KVH))
    rows = torch.repeat_interleave(torch.arange(B), qlens_t)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), qlens_t.cumsum(0)])
    positions = (seq_lens - qlens_t)[rows] + torch.arange(T) - starts[rows]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat([positions[:, None].float() * inv_freq] * 2, dim=-1)
    slots = slots_of(tables, rows, positions, block_size)
    return (q, k, v, emb.cos().to(dtype), emb.sin().to(dtype), *caches, tables, seq_lens.int(), starts.int(), slots,
            max(qlens))


def _check(args, scale, window=None):
    ref_caches = [c.clone() for c in args[5:7]]
    want = rotary_paged_attention_reference(*args[:5], *ref_caches, *args[7:], scale, window)
    got = rotary_paged_attention_triton(*args, scale, window)
    assert got.shape == want.shape and got.dtype == want.dtype == args[0].dtype and got.is_contiguous()
    tol = TOL[args[0].dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    for mine, theirs in zip(args[5:7], ref_caches):  # every new slot written once, nothing else touched
        torch.testing.assert_close(mine.float(), theirs.float(), atol=tol, rtol=tol)


STEPS = [
    ([1, 1, 1], [5, 17, 40]),  # decode
    ([2, 2], [29, 1]),  # a draft's first step: two tokens a row
    ([5, 3, 1], [12, 30, 7]),  # a k + 1 verify, ragged
    ([8], [63]),  # a verify of k = 7
    ([20, 1], [3, 33]),  # a catch-up window: several query blocks
]


def _launches(monkeypatch, split: bool) -> list:
    """Split: 16-key tiles, one a split at least, 64 programs aimed for (a CPU aims for 8); else unsplit. Returns
    the split count of each launch, as the combine sees it."""
    monkeypatch.setattr(pa, "LAUNCH_OVERRIDE", dict(wide_tiles=False, block_n=16, min_tiles=1) if split
                        else dict(wide_tiles=False, max_splits=1))
    monkeypatch.setattr(rpa, "_programs_target", lambda device, max_query_len: 64)
    seen, combine = [], rpa.combine_splits
    monkeypatch.setattr(rpa, "combine_splits", lambda out, acc, ml, splits, *a: (seen.append(splits),
                                                                                 combine(out, acc, ml, splits, *a)))
    return seen


@pytest.mark.parametrize("qlens,ctx_lens", STEPS)
@pytest.mark.parametrize("H,KVH", [(4, 4), (8, 2), (6, 2)])
@pytest.mark.parametrize("split", [False, True])
def test_matches_reference_fp32(qlens, ctx_lens, H, KVH, split, monkeypatch):
    """Unsplit (one program per kv head takes every key) and split (the last split takes the new keys)."""
    seen = _launches(monkeypatch, split)
    gen = torch.Generator().manual_seed(sum(qlens) * 31 + H + KVH)
    _check(_step(gen, qlens, ctx_lens, H, KVH, 16, 4, torch.float32), 16 ** -0.5)
    assert (seen[0] > 1) == (split and max(qlens) <= pa.SPLIT_MAX_QUERY), seen


def test_small_grid_splits_down_to_one_tile(monkeypatch):
    """A small grid's fused launch splits until each split holds one key tile of the table's width (MIN_TILES), where
    the unfused kernel's rule keeps four tiles a split: a 108-token table of 16-key tiles splits 4 ways, not 1."""
    seen = _launches(monkeypatch, False)
    monkeypatch.setattr(pa, "LAUNCH_OVERRIDE", dict(wide_tiles=False, block_n=16))
    gen = torch.Generator().manual_seed(8)
    args = _step(gen, [1], [100], 4, 2, 16, 4, torch.float32)
    assert args[7].shape[1] * 4 == 108
    _check(args, 0.25)
    assert rpa.MIN_TILES == 1 and seen == [4]
    assert pa._num_kv_splits(2, 108, 16, 64) == 1  # the unfused rule (four tiles a split)


@pytest.mark.parametrize("qlens,ctx_lens,window", [
    ([20], [3], 2),  # the new keys' lower bound: one below a tile's start
    ([1], [17], 3),  # the cached keys' lower bound: one below a tile's start
    ([5], [13], 2),
])
def test_window_bounds_on_tile_edges(qlens, ctx_lens, window, monkeypatch):
    """Windows whose first visible key sits next to a 16-key tile's edge (an off-by-one in either lower bound would
    drop or add a key)."""
    _launches(monkeypatch, True)
    gen = torch.Generator().manual_seed(0)
    _check(_step(gen, qlens, ctx_lens, 8, 2, 16, 4, torch.float32), 0.25, window)


@pytest.mark.parametrize("split", [False, True])
def test_empty_cache_and_empty_rows(split, monkeypatch):
    """A row with no cached key (its first step) beside a row of no tokens (a packed forward's empty padding row)."""
    _launches(monkeypatch, split)
    gen = torch.Generator().manual_seed(4)
    _check(_step(gen, [3, 0, 1], [0, 6, 21], 4, 2, 16, 4, torch.float32), 0.25)


def test_long_queries_run_the_two_kernels(monkeypatch):
    """Queries past SPLIT_MAX_QUERY tokens (several prompts packed) run the rotary + write kernel and the paged
    attention, not the fused kernel: the same result."""
    launched = []
    monkeypatch.setattr(rpa, "_rotary_paged_attention_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: lambda *a, **k: launched.append(grid)})())
    gen = torch.Generator().manual_seed(6)
    _check(_step(gen, [40, 33], [0, 5], 4, 2, 16, 4, torch.float32), 0.25)
    assert launched == []


@pytest.mark.parametrize("window", [1, 6, 40])
@pytest.mark.parametrize("split", [False, True])
def test_sliding_window(window, split, monkeypatch):
    seen = _launches(monkeypatch, split)
    gen = torch.Generator().manual_seed(window)
    _check(_step(gen, [1, 5, 20], [25, 9, 3], 8, 2, 16, 4, torch.float32), 0.7, window)
    assert (seen[0] > 1) == split


@pytest.mark.parametrize("D,block_size", [(64, 16), (80, 16), (128, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_dims_and_dtypes(D, block_size, dtype):
    gen = torch.Generator().manual_seed(D + block_size)
    _check(_step(gen, [1, 5, 2], [30, 11, 1], 4, 2, D, block_size, dtype, strided=True), D ** -0.5)


@pytest.mark.parametrize("wide_splits", [1, 2])
def test_wide_launch_bf16(wide_splits, monkeypatch):
    """Wide grids (large batches) run over 128-key tiles, unsplit unless the knob splits them."""
    seen = _launches(monkeypatch, False)
    monkeypatch.setattr(pa, "LAUNCH_OVERRIDE", dict(wide_tiles=True, wide_splits=wide_splits))
    gen = torch.Generator().manual_seed(5)
    _check(_step(gen, [5] * 8, [300, 7, 64, 1, 40, 2, 17, 90], 8, 2, 32, 16, torch.bfloat16), 32 ** -0.5)
    assert seen == [wide_splits]


def test_negative_slot_writes_nothing():
    gen = torch.Generator().manual_seed(9)
    args = list(_step(gen, [3, 1], [6, 9], 4, 2, 16, 4, torch.float32))
    args[10] = args[10].clone()
    args[10][1] = -1  # the second token of the first row: attended from registers, never stored
    before = [c.clone() for c in args[5:7]]
    rotary_paged_attention_triton(*args, 0.25)
    slot = int(slots_of(args[7], torch.tensor([0]), torch.tensor([7]), 4))
    for cache, old in zip(args[5:7], before):
        flat, flat_old = cache.view(-1, 2, 16), old.view(-1, 2, 16)
        assert torch.equal(flat[slot], flat_old[slot])
        assert not torch.equal(cache, old)  # the other new tokens were stored


def test_reference_is_the_two_references():
    gen = torch.Generator().manual_seed(3)
    args = _step(gen, [5, 3, 1], [12, 30, 7], 8, 2, 16, 4, torch.float32)
    caches = [c.clone() for c in args[5:7]]
    got = rotary_paged_attention_reference(*args[:5], *caches, *args[7:], 0.3, 4)
    q, _ = rotary_write_kv_reference(*args[:5], *args[5:7], args[10], False)
    want = paged_attention_reference(q, *args[5:10], args[11], 0.3, 4, None)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(caches, args[5:7]))
