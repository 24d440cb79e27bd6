"""Triton: rotary of a step's queries and keys, and the keys' and values' cache write, in one launch.

Same signature and layout as ``rotary_write_kv_reference.py``. One program per token ``t``: it loads the token's
``cos``/``sin`` row once, rotates its query heads (stored to the returned ``(T, heads, D)`` tensor) and its key
heads (stored into slot ``slot_mapping[t]`` with its value heads, cast to the cache's dtype; a negative slot stores
no key or value; with ``return_key`` also to a ``(T, kv_heads, D)`` tensor, a prompt's keys for the model's own
attention). ``rotate_half`` is a second load of each row at the partner column ``(d + D/2) mod D``, negated
in the first half. The rotary runs in float32 and rounds once to the output dtype, as Inductor's compiled rotary
does (transformers' eager formula rounds after each product in bfloat16: at most an ulp apart).

One compiled variant serves every model and both uses: heads go in tiles of ``BLOCK_H`` (a loop), a head's columns
in one tile of 128 (256 past that), the head counts are not specialised and whether to return the keys is a
runtime flag. A target and its draft (and a prompt and a decode step) then share one JIT compile inside a
process's first call, where per-model tiles cost four (0.3 s each on an H200 host).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import pdl_launch
from .pdl_triton import wait_for_previous_then_release_next


@triton.jit
def rotated_rows(row_ptr, d, mask, cos, sin, half):
    """The rotated float32 tile ``x * cos + rotate_half(x) * sin`` of the rows starting at ``row_ptr`` ``(R,)``,
    columns ``d`` ``(BLOCK_D,)``; ``cos``/``sin`` broadcast to ``(R, BLOCK_D)``; zeros where not ``mask``."""
    partner = tl.where(d < half, d + half, d - half)
    x = tl.load(row_ptr[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
    y = tl.load(row_ptr[:, None] + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    return x * cos + tl.where(d[None, :] < half, -y, y) * sin


@triton.jit
def _rotate_rows(ptr, stride_h, num_heads, cos, sin, half, head_dim, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """The rotated ``(BLOCK_H, BLOCK_D)`` float32 tile of one token's heads at ``ptr`` (masked past the sizes)."""
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    return rotated_rows(ptr + h * stride_h, d, (h < num_heads)[:, None] & (d < head_dim)[None, :], cos, sin, half)


_BLOCK_H = 16  # heads per tile
_UNSPECIALISED = ("num_heads", "num_kv_heads", "store_k")  # one variant for 12 or 32 heads; 1 is a flag's value


@triton.jit(do_not_specialize=_UNSPECIALISED)
def _rotary_write_kv_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr, key_cache_ptr, value_cache_ptr, slot_ptr,
    num_heads, num_kv_heads, head_dim, block_size, store_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct, stride_st, stride_ot, stride_oh,
    stride_kot, stride_koh, stride_kc_blk, stride_kc_pos, stride_kc_h, stride_vc_blk, stride_vc_pos, stride_vc_h,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_previous_then_release_next(USE_PDL)  # before reading what earlier kernels wrote (kernels/pdl.py)
    t = tl.program_id(0).to(tl.int64)
    half = head_dim // 2
    dd = tl.arange(0, BLOCK_D)[None, :]
    cos = tl.load(cos_ptr + t * stride_ct + dd, mask=dd < head_dim, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + t * stride_st + dd, mask=dd < head_dim, other=0.0).to(tl.float32)
    for h0 in range(0, num_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)[:, None]
        q = _rotate_rows(q_ptr + t * stride_qt + h0 * stride_qh, stride_qh, num_heads - h0, cos, sin, half, head_dim,
                         BLOCK_H, BLOCK_D)
        tl.store(q_out_ptr + t * stride_ot + h * stride_oh + dd, q.to(q_out_ptr.dtype.element_ty),
                 mask=(h < num_heads) & (dd < head_dim))
    slot = tl.load(slot_ptr + t).to(tl.int64)
    blk = slot // block_size
    off = slot % block_size
    for h0 in range(0, num_kv_heads, BLOCK_H):
        kh = h0 + tl.arange(0, BLOCK_H)[:, None]
        m = (kh < num_kv_heads) & (dd < head_dim)
        k = _rotate_rows(k_ptr + t * stride_kt + h0 * stride_kh, stride_kh, num_kv_heads - h0, cos, sin, half,
                         head_dim, BLOCK_H, BLOCK_D)
        if store_k != 0:  # a prompt's keys, for the model's own attention over them
            tl.store(k_out_ptr + t * stride_kot + kh * stride_koh + dd, k.to(k_out_ptr.dtype.element_ty), mask=m)
        if slot >= 0:
            v = tl.load(v_ptr + t * stride_vt + kh * stride_vh + dd, mask=m)
            tl.store(key_cache_ptr + blk * stride_kc_blk + off * stride_kc_pos + kh * stride_kc_h + dd,
                     k.to(key_cache_ptr.dtype.element_ty), mask=m)
            tl.store(value_cache_ptr + blk * stride_vc_blk + off * stride_vc_pos + kh * stride_vc_h + dd,
                     v.to(value_cache_ptr.dtype.element_ty), mask=m)


def rotary_write_kv_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    return_key: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``rotary_write_kv_reference``: the rotated queries ``(T, heads, D)`` and keys (empty unless
    ``return_key``); keys and values written in place."""
    T, H, D = query.shape
    KVH = key.shape[1]
    out = torch.empty((T, H, D), dtype=query.dtype, device=query.device)
    key_out = torch.empty((T, KVH, D) if return_key else (0,), dtype=key.dtype, device=key.device)
    if T == 0:
        return out, key_out
    query, key, value, cos, sin = (x if x.stride(-1) == 1 else x.contiguous() for x in (query, key, value, cos, sin))
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1, "caches need a contiguous head_dim"
    _rotary_write_kv_kernel[(T,)](
        query, key, value, cos, sin, out, key_out, key_cache, value_cache, slot_mapping,
        H, KVH, D, key_cache.shape[1], int(return_key),
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        cos.stride(0), sin.stride(0), out.stride(0), out.stride(1),
        KVH * D if return_key else 0, D if return_key else 0,
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        BLOCK_H=_BLOCK_H, BLOCK_D=max(128, triton.next_power_of_2(D)), num_warps=4, **pdl_launch(query.device),
    )
    return out, key_out
