"""Triton paged-cache kernels: KV slot write and paged attention over ragged queries.

Same signatures and layout as ``paged_attention_reference.py``:

* caches ``(num_blocks, block_size, kv_heads, head_dim)``; position ``pos`` of sequence
  ``b`` lives in slot ``block_tables[b, pos // block_size] * block_size + pos % block_size``;
* packed queries ``(T, heads, head_dim)``, sequence ``b`` owns rows
  ``query_start_loc[b] : query_start_loc[b+1]``; ``seq_lens[b]`` counts its tokens after
  this step, so its new token ``i`` sits at position ``seq_lens[b] - qlen_b + i``.

``_write_kv_kernel``: one program per new token, copies its ``kv_heads x head_dim`` key
and value rows into their slot (casting to the cache dtype). A negative slot is skipped
(padding tokens).

``_paged_attention_kernel``: one program per (sequence, block of ``BLOCK_Q`` query tokens,
kv head); grid ``(B, cdiv(max_query_len, BLOCK_Q), kv_heads)``, programs past a sequence's
own query length exit at once. The program's query tile stacks the ``G = heads /
kv_heads`` query heads that share the kv head with its ``BLOCK_Q`` tokens: row ``m`` is
token ``m // G``, head ``kv_head * G + m % G``. ``BLOCK_M = BLOCK_Q * G`` is padded to at
least 16 rows so that ``tl.dot`` gets a legal tile even for one decode token, and the
head dimension is padded to a power of two (80 -> 128) with masked loads. The program
then walks the sequence's keys in tiles of ``BLOCK_N`` positions (gathering each
position's slot through the block table, so any block size works), from the first key
any of its queries may see (``q_pos - window + 1`` for sliding windows) to its last
query's position, with an online softmax (flash-attention / flash-decoding):

    s = q k^T * scale;  s = tanh(s / softcap) * softcap;  s = -inf where k_pos > q_pos
        or q_pos - k_pos >= window;
    m' = max(m, rowmax s);  l = l * 2^(m - m') + rowsum 2^(s - m');
    acc = acc * 2^(m - m') + 2^(s - m') v;     out = acc / l      (in log2 units)

Matmuls run in the input dtype with float32 accumulation (float32 inputs use IEEE
float32, not tf32). Output is in the query's dtype.

Small grids (decode and verify at small batch) split each sequence's key range over ``S``
programs (flash-decoding): grid ``(B, q_blocks, kv_heads * S)``, each program leaves its
unnormalised ``(acc, m, l)`` in float32 scratch and ``_combine_kv_splits_kernel`` merges them.
``S`` is a runtime argument and every query of 2..``QUERY_TILE`` tokens gets the same tile, so
split count and the speculation length (k = 1..7) never compile a new variant; wide grids (large
batches) run unsplit over longer key tiles, a second variant per query class.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from .acceptance_common_triton import _num_programs_target
from .attention_tile_triton import (
    attend_cached_keys,
    program_coordinates,
    query_tile_rows,
    split_share,
    store_attention_result,
)
from .pdl import pdl_launch
from .pdl_triton import wait_for_previous_then_release_next

# Triton's CPU interpreter multiplies bfloat16 tiles as raw bits in tl.dot; there (only) the
# kernel upcasts bfloat16 operands to float32. Compiled kernels use bfloat16 tensor-core dots.
_INTERPRET_BF16 = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr,
    num_kv_heads, head_dim, block_size,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kc_blk, stride_kc_pos, stride_kc_h,
    stride_vc_blk, stride_vc_pos, stride_vc_h,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_previous_then_release_next(USE_PDL)  # before reading what earlier kernels wrote (kernels/pdl.py)
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        blk = slot // block_size
        off = slot % block_size
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        m = (h < num_kv_heads) & (d < head_dim)
        k = tl.load(key_ptr + t.to(tl.int64) * stride_kt + h * stride_kh + d, mask=m)
        v = tl.load(value_ptr + t.to(tl.int64) * stride_vt + h * stride_vh + d, mask=m)
        tl.store(key_cache_ptr + blk * stride_kc_blk + off * stride_kc_pos + h * stride_kc_h + d,
                 k.to(key_cache_ptr.dtype.element_ty), mask=m)
        tl.store(value_cache_ptr + blk * stride_vc_blk + off * stride_vc_pos + h * stride_vc_h + d,
                 v.to(value_cache_ptr.dtype.element_ty), mask=m)


def write_kv_to_slots_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``(T, kv_heads, head_dim)`` into the flat slots ``slot_mapping`` ``(T,)``, in place."""
    T, KVH, D = key.shape
    if T == 0:
        return
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1, "caches need a contiguous head_dim"
    _write_kv_kernel[(T,)](
        key, value, key_cache, value_cache, slot_mapping,
        KVH, D, key_cache.shape[1],
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        BLOCK_H=triton.next_power_of_2(KVH), BLOCK_D=triton.next_power_of_2(D),
        num_warps=4 if KVH * D >= 1024 else 1, **pdl_launch(key.device),
    )


@triton.jit(do_not_specialize=["num_kv_splits"])
def _paged_attention_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    scale, softcap, sliding_window,
    head_dim, block_size, num_groups,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kc_blk, stride_kc_pos, stride_kc_h,
    stride_vc_blk, stride_vc_pos, stride_vc_h,
    stride_bt,
    part_acc_ptr, part_ml_ptr,  # split-KV partials (T, H, S, D) and (T, H, S, 2); unused when num_kv_splits == 1
    num_kv_splits,  # a runtime int: every split count runs the same compiled kernel
    HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, IEEE_FP32: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_previous_then_release_next(USE_PDL)  # before reading what earlier kernels wrote (kernels/pdl.py)
    # Typed scalars: a float arriving as fp64 would turn the online softmax's carried m_i into fp64.
    scale = tl.cast(scale, tl.float32)
    softcap = tl.cast(softcap, tl.float32)
    b, q_start, q_len, kv_head, kv_split, first_tok = program_coordinates(query_start_loc_ptr, num_kv_splits, BLOCK_Q)
    if first_tok < q_len:
        seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
        ctx_len = seq_len - q_len  # position of the first new token

        # Query tile: row m = token m // G of this block, head kv_head * G + m % G.
        tok, head, row_ok = query_tile_rows(first_tok, kv_head, num_groups, q_len, BLOCK_Q, BLOCK_M)
        q_pos = ctx_len + tok
        d = tl.arange(0, BLOCK_D)
        d_ok = d < head_dim
        q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)

        # Key range seen by any query of the tile.
        last_pos = ctx_len + tl.minimum(q_len, first_tok + BLOCK_Q) - 1
        hi = tl.minimum(last_pos + 1, seq_len)
        lo = 0
        if HAS_WINDOW:
            lo = tl.maximum(ctx_len + first_tok - sliding_window + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        lo, hi = split_share(lo, hi, kv_split, num_kv_splits, BLOCK_N)  # flash-decoding: this program's share

        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
        m_i, l_i, acc = attend_cached_keys(
            q, q_pos, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, bt_row, lo, hi, block_size, kv_head, stride_kc_blk,
            stride_kc_pos, stride_kc_h, stride_vc_blk, stride_vc_pos, stride_vc_h, d, d_ok, scale, softcap,
            sliding_window, HAS_SOFTCAP, HAS_WINDOW, IEEE_FP32, UPCAST, BLOCK_N)

        store_attention_result(out_ptr, part_acc_ptr, part_ml_ptr, acc, m_i, l_i, q_start + tok, head, row_ok, d, d_ok,
                               stride_ot, stride_oh, num_groups * (tl.num_programs(2) // num_kv_splits), kv_split,
                               num_kv_splits, BLOCK_D)


@triton.jit(do_not_specialize=["num_kv_splits"])
def _combine_kv_splits_kernel(out_ptr, part_acc_ptr, part_ml_ptr, num_heads, head_dim, stride_ot, stride_oh,
                              num_kv_splits, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr):
    """out[t, h] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s over the KV splits (``BLOCK_S`` covers
    the largest split count the launcher can choose; lanes past ``num_kv_splits`` are masked)."""
    wait_for_previous_then_release_next(USE_PDL)  # before reading what earlier kernels wrote (kernels/pdl.py)
    t = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    s_ok = sp < num_kv_splits
    d = tl.arange(0, BLOCK_D)
    row = (t.to(tl.int64) * num_heads + h) * num_kv_splits + sp
    m = tl.load(part_ml_ptr + row * 2, mask=s_ok, other=-1.0e30)
    l = tl.load(part_ml_ptr + row * 2 + 1, mask=s_ok, other=0.0)
    acc = tl.load(part_acc_ptr + row[:, None] * BLOCK_D + d[None, :], mask=s_ok[:, None] & (d < head_dim)[None, :],
                  other=0.0)
    w = tl.exp2(m - tl.max(m, axis=0))
    denom = tl.sum(w * l, axis=0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.where(denom > 0.0, denom, 1.0)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty),
             mask=d < head_dim)


# Launch knobs for benchmarks/attention_sweep.py and profile_round.py (empty: the rules below): "block_n",
# "num_warps", "num_stages", "programs_per_sm" (the programs a split aims for, per SM), "min_tiles" (the fewest
# key tiles a split takes), "max_splits" (may exceed MAX_KV_SPLITS), "wide_tiles" (True / False: wide grids take /
# skip the wide launch whatever the dtype), "wide_splits" (KV splits of a wide launch), "block_new" (the fused
# rotary kernel's tile of new keys), "maxnreg" (Triton's register cap a thread); under "decode" (1-token queries),
# "verify" (2..QUERY_TILE) or "prefill": that class only.
LAUNCH_OVERRIDE: dict = {}


def _knob(name: str, default, max_query_len: int):
    """LAUNCH_OVERRIDE's value of ``name`` for this query length's class, else its global one, else ``default``."""
    tokens = max(int(max_query_len), 1)
    scope = "decode" if tokens == 1 else "verify" if tokens <= QUERY_TILE else "prefill"
    return LAUNCH_OVERRIDE.get(scope, {}).get(name, LAUNCH_OVERRIDE.get(name, default))


# A decode or verify whose grid has at least 1 / WIDE_GRID_SHARE of the programs a split aims for (2 per SM) runs
# unsplit over 128-key tiles (8 warps at head_dim 128): at batch 32 the pair's 5-token verify 27.5 -> 20.0 us a
# call and its draft's decode 13.6 -> 12.8 us (H200, benchmarks/attention_sweep.py, context 416). Small grids keep
# short tiles and their splits; so do a head_dim over 128 and float32 (128-key tiles would not fit registers).
WIDE_GRID_SHARE = 4

# Queries of 2..QUERY_TILE tokens (the verify of k = 1..7 drafts, a draft's catch-up step) share one tile
# sized for QUERY_TILE tokens, so the adaptive k never compiles a new variant (before, G = 4 tiled up to 4
# tokens in 16 rows and more in 32: two variants). Same bytes read; a shorter query leaves tile rows idle.
# A decode step (one token: every draft step, a round of k = 0) keeps its own smallest tile, as before:
# it is the most frequent call, and its one compile per model comes in the first round either way.
QUERY_TILE = 8


def _tile_sizes(max_query_len: int, num_groups: int, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_Q, BLOCK_M, BLOCK_N, BLOCK_D): the query tile stacks BLOCK_Q tokens x G heads, >= 16 rows."""
    tokens = max(int(max_query_len), 1)
    rows = (QUERY_TILE if 1 < tokens < QUERY_TILE else tokens) * num_groups
    block_m = 16 if rows <= 16 else (32 if rows <= 32 else 64)
    block_m = max(block_m, triton.next_power_of_2(num_groups))
    block_q = max(1, block_m // num_groups)
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_n = 64 if block_d <= 64 else 32
    if block_m >= 64 and block_d <= 128:
        block_n = 64
    return block_q, block_m, _knob("block_n", block_n, max_query_len), block_d


def _attention_launch(num_seqs: int, max_query_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                      max_context: int, programs_target: int, dtype: torch.dtype, sliding_window: Optional[int],
                      softcap: Optional[float], min_tiles: int = 4) -> tuple[int, tuple[int, int, int], dict, dict]:
    """A launch decided from host-side shapes only: (KV splits, grid, the attention kernel's constexpr
    kwargs, the combine kernel's constexpr kwargs; the combine runs when splits > 1). Each distinct kwargs
    dict is a JIT compile: they depend on the model, the dtype, the query length's class (1 token,
    2..``QUERY_TILE``, longer) and the grid's (small or wide), never on the split count or k = 1..7."""
    G = num_heads // num_kv_heads
    block_q, block_m, block_n, block_d = _tile_sizes(max_query_len, G, head_dim)
    n_qblocks = triton.cdiv(max(int(max_query_len), 1), block_q)
    num_warps = 4
    wide_knob = _knob("wide_tiles", None, max_query_len)  # None: 16-bit inputs only
    wide = (dtype.itemsize == 2 if wide_knob is None else wide_knob) and max_query_len <= QUERY_TILE and \
        block_d <= 128 and num_seqs * n_qblocks * num_kv_heads * WIDE_GRID_SHARE >= programs_target
    if wide:  # unsplit, unless a knob asks (benchmarks/attention_fusion.py --override '{"wide_splits": 2}')
        block_n, num_warps = _knob("block_n", 128, max_query_len), (8 if block_d >= 128 else 4)
        splits = min(max(int(_knob("wide_splits", 1, max_query_len)), 1), _max_kv_splits(max_query_len))
    else:
        splits = 1 if max_query_len > SPLIT_MAX_QUERY else _num_kv_splits(
            num_seqs * n_qblocks * num_kv_heads, max_context, block_n, programs_target, max_query_len, min_tiles)
    upcast = _INTERPRET_BF16 and dtype == torch.bfloat16
    attention = dict(HAS_SOFTCAP=softcap is not None, HAS_WINDOW=sliding_window is not None,
                     IEEE_FP32=dtype == torch.float32 or upcast, UPCAST=upcast,
                     BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
                     num_warps=_knob("num_warps", num_warps, max_query_len),
                     num_stages=_knob("num_stages", 2, max_query_len))
    maxnreg = _knob("maxnreg", None, max_query_len)  # a register cap (more programs resident a SM), tried only
    if maxnreg is not None:
        attention["maxnreg"] = int(maxnreg)
    combine = dict(BLOCK_S=triton.next_power_of_2(max(MAX_KV_SPLITS, splits, 1)), BLOCK_D=block_d, num_warps=4)
    return splits, (num_seqs, n_qblocks, num_kv_heads * splits), attention, combine


def paged_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    """Triton twin of ``paged_attention_reference``: ``(T, heads, head_dim)`` in the query's dtype."""
    T, H, D = query.shape
    B = block_tables.shape[0]
    KVH = key_cache.shape[2]
    out = torch.empty(T, H, D, dtype=query.dtype, device=query.device)  # contiguous, as the op's fake says
    if T == 0 or B == 0:
        return out
    if query.stride(-1) != 1:
        query = query.contiguous()
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1, "caches need a contiguous head_dim"
    splits, grid, attention, combine = _attention_launch(
        B, max_query_len, H, KVH, D, block_tables.shape[1] * key_cache.shape[1],
        _programs_target(query.device, max_query_len), query.dtype, sliding_window, softcap)
    pdl = pdl_launch(query.device)  # the attention's and the combine's launch alike
    part_acc, part_ml = split_partials(T, H, splits, attention["BLOCK_D"], query.device)
    _paged_attention_kernel[grid](
        out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
        float(scale), float(softcap) if softcap is not None else 1.0,
        int(sliding_window) if sliding_window is not None else 0,
        D, key_cache.shape[1], H // KVH,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        part_acc, part_ml, num_kv_splits=splits, **attention, **pdl,
    )
    combine_splits(out, part_acc, part_ml, splits, combine, pdl)
    return out


def split_partials(T: int, H: int, splits: int, block_d: int, device: torch.device):
    """The float32 scratch of a split launch, ``(T, H, S, block_d)`` and ``(T, H, S, 2)``; unsplit, empty tensors
    (never touched; float32 like the partials, so that both cases share one compiled kernel)."""
    if splits > 1:
        return (torch.empty(T, H, splits, block_d, dtype=torch.float32, device=device),
                torch.empty(T, H, splits, 2, dtype=torch.float32, device=device))
    empty = torch.empty(0, dtype=torch.float32, device=device)
    return empty, empty


def combine_splits(out: torch.Tensor, part_acc: torch.Tensor, part_ml: torch.Tensor, splits: int, combine: dict,
                   pdl: dict) -> None:
    """Merge a split launch's partials into ``out`` ``(T, heads, D)`` (nothing to do unsplit)."""
    if splits > 1:
        T, H, D = out.shape
        _combine_kv_splits_kernel[(T, H)](out, part_acc, part_ml, H, D, out.stride(0), out.stride(1),
                                          num_kv_splits=splits, **combine, **pdl)


# Split-KV (flash-decoding) for grids too small to fill the device. Measured on an H100 inside the
# fast path's graphs (benchmarks/profile_round.py, 453M/29M pair shapes, context ~400, 2026-11-23):
# the 32 attention calls of a k=4 round cost 573 us unsplit, 223 us with up to 4 splits and 123 us
# with up to 16 at batch 1 (round 4.21 -> 3.84 ms); 660 -> 427 us (+130 us combine) at batch 32.
# (An earlier eager-launch measurement found splitting slower: there each extra launch cost more.)
MAX_KV_SPLITS = 16
# Only a round's queries split (k+1 verify tokens, 16-token catch-up windows); prefill runs unsplit, as
# measured. The split count is a runtime argument: every count runs the same two compiled kernels (when
# it was a constexpr, each new count JIT-compiled mid-call: a 259-token Gemma prompt's prefill took 14 s).
SPLIT_MAX_QUERY = 32


def _programs_target(device: torch.device, max_query_len: int) -> int:
    """The programs a split aims for: the acceptance kernels' rule, or the ``programs_per_sm`` knob's."""
    per_sm = _knob("programs_per_sm", None, max_query_len)
    if per_sm is not None and device.type == "cuda":
        return per_sm * torch.cuda.get_device_properties(device).multi_processor_count
    return _num_programs_target(device)


def _num_kv_splits(programs: int, max_context: int, block_n: int, target: int, max_query_len: int = 1,
                   min_tiles: int = 4) -> int:
    """Split each sequence's keys over several programs when the grid alone cannot fill the
    device (decode and verify at small batch): about ``target`` programs (two per SM), at least
    ``min_tiles`` key tiles of the widest context per split. Decided from host-side shapes only (no
    synchronisation)."""
    most = _max_kv_splits(max_query_len)
    if programs >= target or most <= 1:
        return 1
    min_tiles = _knob("min_tiles", min_tiles, max_query_len)
    splits = max(1, min(most, triton.cdiv(target, programs), max_context // (min_tiles * block_n)))
    # A power of two (at most MAX_KV_SPLITS, or the max_splits knob; the combine's BLOCK_S covers either): few
    # distinct counts.
    return 1 << (splits.bit_length() - 1)


def _max_kv_splits(max_query_len: int) -> int:
    """The most splits a launch may take: ``MAX_KV_SPLITS``, or the ``max_splits`` knob (which may exceed it)."""
    return int(_knob("max_splits", MAX_KV_SPLITS, max_query_len))
