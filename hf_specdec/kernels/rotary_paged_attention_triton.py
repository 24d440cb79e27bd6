"""Triton: a decode or verify step's rotary, K/V cache write and paged attention in one launch.

Same signature as ``rotary_paged_attention_reference.py`` (rotary + write, then attention), and its result to
rounding for the runner's metadata (below): one launch a layer fewer than ``rotary_write_kv`` followed by
``paged_attention``. Grid and tiles are ``paged_attention_triton``'s (``_attention_launch``): one program per
(sequence, block of ``BLOCK_Q`` query tokens, kv head, KV split), the query tile stacking the ``G`` query heads that
share the kv head.

Each program:

* rotates its query tile on load (``cos``/``sin`` of each row's token; float32, rounded once to the query dtype,
  as ``rotary_write_kv`` stores it);
* attends its share of the **cached** keys, positions ``[lo, ctx_len)`` (``ctx_len = seq_len - qlen``: every key
  written by an earlier step), split over the ``S`` programs of its kv head as flash-decoding splits them;
* if it is the last split of its kv head, it also attends the step's **new** keys, positions ``ctx_len + j`` for
  the tokens ``j`` its queries may see (causal among themselves), taken from ``key`` / ``value`` and rotated in
  registers, in tiles of ``BLOCK_NEW``; and it stores the new keys and values of its own query tokens into their
  slots (``slot_mapping``; a negative slot stores nothing).

No program reads a slot this launch writes (the new tokens' slots hold positions past ``ctx_len``), so the write
and the attention need no ordering. Two consequences where the metadata is unusual, neither met by the runner's
forwards: a token whose slot is -1 (stored nowhere) is still attended by the later tokens of its row, from its own
key (the two-kernel path attends whatever the cache holds at its position); and only the tokens inside a row's
``query_start_loc`` span are stored (the runner gives every other token slot -1).

Splits leave partials that ``_combine_kv_splits_kernel`` merges, as the unfused kernel's do. Rounding: the keys are
rounded to the cache's dtype before the dot, as the cache would hold them; the new keys fall in a tile of their
own, so bfloat16 output may differ from the two-kernel path in the last bit (float32: within float32 rounding).

Queries longer than ``SPLIT_MAX_QUERY`` tokens (prompts that are not read from position 0 by the model's own
attention: several rows packed, or a window shorter than the prompt) run the two kernels instead: there every
program would rotate each earlier key of the prompt again, in tiles of 16.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .attention_tile_triton import (
    attend_cached_keys,
    attend_tile,
    cache_rows,
    program_coordinates,
    query_tile_rows,
    split_share,
    store_attention_result,
)
from .paged_attention_triton import (
    SPLIT_MAX_QUERY,
    _attention_launch,
    _knob,
    _programs_target,
    combine_splits,
    paged_attention_triton,
    split_partials,
)
from .pdl import pdl_launch
from .pdl_triton import wait_for_previous_then_release_next
from .rotary_write_kv_triton import rotary_write_kv_triton, rotated_rows


# A small grid's splits: as many as fill the device (up to MAX_KV_SPLITS) and at least MIN_TILES key tiles of the
# block table's width each (the unfused kernel's rule takes four). A program's time is a chain of dependent
# instructions (docs/kernels.md), so the shortest chain wins where the table is narrow (no graphs: tables as long as
# the longest row): H200, a table of 1024 tokens, context 512, one call (benchmarks/attention_fusion.py
# --table-tokens 1024): 8B-shaped b = 1 decode 10.90 -> 9.08 us, 5-token verify 12.60 -> 10.54; 1B-shaped 9.06 ->
# 5.84 and 9.98 -> 6.63. With graphs the tables are as wide as the model's positions: 16 splits either way.
MIN_TILES = 1


@triton.jit
def _angles(ptr, stride, rows, d, mask):
    """float32 ``cos`` or ``sin`` rows of the tokens ``rows`` ``(R,)``, columns ``d``."""
    return tl.load(ptr + rows[:, None] * stride + d[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit(do_not_specialize=["num_kv_splits"])
def _rotary_paged_attention_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    scale, sliding_window, head_dim, block_size, num_groups,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct, stride_st, stride_ot, stride_oh,
    stride_kc_blk, stride_kc_pos, stride_kc_h, stride_vc_blk, stride_vc_pos, stride_vc_h, stride_bt,
    part_acc_ptr, part_ml_ptr,  # split-KV partials, as _paged_attention_kernel's
    num_kv_splits,  # a runtime int: every split count runs the same compiled kernel
    HAS_WINDOW: tl.constexpr, IEEE_FP32: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NEW: tl.constexpr,
    BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_previous_then_release_next(USE_PDL)  # before reading what earlier kernels wrote (kernels/pdl.py)
    scale = tl.cast(scale, tl.float32)  # typed: an fp64 scale would turn the carried m_i into fp64
    b, q_start, q_len, kv_head, kv_split, first_tok = program_coordinates(query_start_loc_ptr, num_kv_splits, BLOCK_Q)
    if first_tok < q_len:
        ctx_len = tl.load(seq_lens_ptr + b).to(tl.int32) - q_len  # position of the first new token
        half = head_dim // 2
        d = tl.arange(0, BLOCK_D)
        d_ok = d < head_dim

        # Query tile, rotated: row m = token m // G of this block, head kv_head * G + m % G.
        tok, head, row_ok = query_tile_rows(first_tok, kv_head, num_groups, q_len, BLOCK_Q, BLOCK_M)
        q_rows = q_start + tok
        q_mask = row_ok[:, None] & d_ok[None, :]
        q = rotated_rows(q_ptr + q_rows * stride_qt + head * stride_qh, d, q_mask,
                         _angles(cos_ptr, stride_ct, q_rows, d, q_mask), _angles(sin_ptr, stride_st, q_rows, d, q_mask),
                         half).to(q_ptr.dtype.element_ty)
        if UPCAST:
            q = q.to(tl.float32)
        q_pos = ctx_len + tok

        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

        # Cached keys [lo, ctx_len): this split's contiguous share of the tiles.
        lo = 0
        if HAS_WINDOW:
            lo = tl.maximum(ctx_len + first_tok - sliding_window + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        hi = tl.maximum(ctx_len, lo)
        lo, hi = split_share(lo, hi, kv_split, num_kv_splits, BLOCK_N)  # flash-decoding: this program's share
        bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
        m_i, l_i, acc = attend_cached_keys(
            q, q_pos, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, bt_row, lo, hi, block_size, kv_head, stride_kc_blk,
            stride_kc_pos, stride_kc_h, stride_vc_blk, stride_vc_pos, stride_vc_h, d, d_ok, scale, 1.0, sliding_window,
            False, HAS_WINDOW, IEEE_FP32, UPCAST, BLOCK_N)

        # The step's new keys, by the last split: rotated here, stored to their slots, attended from registers.
        if kv_split == num_kv_splits - 1:
            seen = tl.minimum(q_len, first_tok + BLOCK_Q)  # new tokens any query of the tile may see
            j_lo = 0
            if HAS_WINDOW:
                j_lo = tl.maximum(first_tok - sliding_window + 1, 0)
            j_lo = (j_lo // BLOCK_NEW) * BLOCK_NEW
            for j0 in range(j_lo, seen, BLOCK_NEW):
                j = j0 + tl.arange(0, BLOCK_NEW)
                j_ok = j < seen
                k_rows = q_start + j
                kv_mask = j_ok[:, None] & d_ok[None, :]
                k = rotated_rows(k_ptr + k_rows * stride_kt + kv_head * stride_kh, d, kv_mask,
                                 _angles(cos_ptr, stride_ct, k_rows, d, kv_mask),
                                 _angles(sin_ptr, stride_st, k_rows, d, kv_mask), half)
                k = k.to(k_cache_ptr.dtype.element_ty)
                v = tl.load(v_ptr + k_rows[:, None] * stride_vt + kv_head * stride_vh + d[None, :], mask=kv_mask,
                            other=0.0).to(v_cache_ptr.dtype.element_ty)
                mine = j_ok & (j >= first_tok)  # this program's own tokens: each slot is stored once
                slot = tl.load(slot_ptr + k_rows, mask=mine, other=-1).to(tl.int64)
                store = (mine & (slot >= 0))[:, None] & d_ok[None, :]
                blk = slot // block_size
                off = slot % block_size
                tl.store(cache_rows(k_cache_ptr, blk, off, kv_head, stride_kc_blk, stride_kc_pos, stride_kc_h)[:, None]
                         + d[None, :], k, mask=store)
                tl.store(cache_rows(v_cache_ptr, blk, off, kv_head, stride_vc_blk, stride_vc_pos, stride_vc_h)[:, None]
                         + d[None, :], v, mask=store)
                if UPCAST:
                    k = k.to(tl.float32)
                    v = v.to(tl.float32)
                allowed = (j[None, :] <= tok[:, None]) & j_ok[None, :]
                if HAS_WINDOW:
                    allowed = allowed & ((tok[:, None] - j[None, :]) < sliding_window)
                m_i, l_i, acc = attend_tile(q, k, v, allowed, m_i, l_i, acc, scale, 1.0, False, IEEE_FP32)

        store_attention_result(out_ptr, part_acc_ptr, part_ml_ptr, acc, m_i, l_i, q_rows, head, row_ok, d, d_ok,
                               stride_ot, stride_oh, num_groups * (tl.num_programs(2) // num_kv_splits), kv_split,
                               num_kv_splits, BLOCK_D)


def rotary_paged_attention_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    slot_mapping: torch.Tensor,
    max_query_len: int,
    scale: float,
    sliding_window: Optional[int] = None,
) -> torch.Tensor:
    """Triton twin of ``rotary_paged_attention_reference``: ``(T, heads, D)`` in the query's dtype; the new keys
    and values written into their slots in place."""
    T, H, D = query.shape
    B = block_tables.shape[0]
    KVH = key_cache.shape[2]
    out = torch.empty(T, H, D, dtype=query.dtype, device=query.device)  # contiguous, as the op's fake says
    if T == 0 or B == 0:
        return out
    if max_query_len > SPLIT_MAX_QUERY:  # a prompt: the two kernels, whose attention walks 64-key tiles of the
        # cache (here every program would rotate each earlier key of the prompt again, in tiles of 16)
        q, _ = rotary_write_kv_triton(query, key, value, cos, sin, key_cache, value_cache, slot_mapping, False)
        return paged_attention_triton(q, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                                      max_query_len, scale, sliding_window, None)
    query, key, value, cos, sin = (x if x.stride(-1) == 1 else x.contiguous() for x in (query, key, value, cos, sin))
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1, "caches need a contiguous head_dim"
    splits, grid, attention, combine = _attention_launch(
        B, max_query_len, H, KVH, D, block_tables.shape[1] * key_cache.shape[1],
        _programs_target(query.device, max_query_len), query.dtype, sliding_window, None, MIN_TILES)
    del attention["HAS_SOFTCAP"]  # a rotary layer of the families served has no soft-cap
    # Four warps, also for the wide launch's 128-key tiles at head_dim 128 (where the unfused kernel takes eight):
    # H200, 8B-shaped layer, context 512, b = 32: 40.1 -> 29.3 us a decode call, 47.2 -> 38.3 a 5-token verify
    # (benchmarks/attention_fusion.py); b = 16: 21.7 -> 23.9 and 25.7 -> 27.6, still level with the two kernels.
    attention["num_warps"] = _knob("num_warps", 4, max_query_len)
    attention["BLOCK_NEW"] = _knob("block_new", max(16, triton.next_power_of_2(attention["BLOCK_Q"])),
                                   max_query_len)  # the new keys' tile: at least 16, a legal tl.dot size
    pdl = pdl_launch(query.device)
    part_acc, part_ml = split_partials(T, H, splits, attention["BLOCK_D"], query.device)
    _rotary_paged_attention_kernel[grid](
        out, query, key, value, cos, sin, key_cache, value_cache, slot_mapping,
        block_tables, seq_lens, query_start_loc,
        float(scale), int(sliding_window) if sliding_window is not None else 0, D, key_cache.shape[1], H // KVH,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        cos.stride(0), sin.stride(0), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), block_tables.stride(0),
        part_acc, part_ml, num_kv_splits=splits, **attention, **pdl,
    )
    combine_splits(out, part_acc, part_ml, splits, combine, pdl)
    return out
