"""Device helpers shared by the paged attention kernels: a program's coordinates and query tile, a split's share
of the keys, a cache row's address, a gathered tile of cached keys and values, one online-softmax step over a key
tile, and the program's result (the normalised output, or a split's unnormalised partial for the combine).

Both ``_paged_attention_kernel`` (``paged_attention_triton.py``) and ``_rotary_paged_attention_kernel``
(``rotary_paged_attention_triton.py``) hold a query tile of ``BLOCK_M`` rows (tokens x the query heads of one kv
head) and walk key tiles with the flash-attention recurrence, in log2 units:

    s = q k^T * scale   (or tanh(q k^T * scale / softcap) * softcap);   s = -inf where not ``allowed``
    m' = max(m, rowmax s);  l = l * 2^(m - m') + rowsum 2^(s - m');  acc = acc * 2^(m - m') + 2^(s - m') v

Triton inlines these helpers: a kernel that calls them compiles to what it did with the code written in place.
"""
import triton
import triton.language as tl


@triton.jit
def program_coordinates(query_start_loc_ptr, num_kv_splits, BLOCK_Q: tl.constexpr):
    """Grid ``(B, q_blocks, kv_heads * S)``: (row b, its packed offset, its query length, kv head, split, the first
    token of this program's query block)."""
    b = tl.program_id(0)
    q_start = tl.load(query_start_loc_ptr + b).to(tl.int64)
    q_len = (tl.load(query_start_loc_ptr + b + 1) - q_start).to(tl.int32)
    return (b, q_start, q_len, tl.program_id(2) // num_kv_splits, tl.program_id(2) % num_kv_splits,
            tl.program_id(1) * BLOCK_Q)


@triton.jit
def query_tile_rows(first_tok, kv_head, num_groups, q_len, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr):
    """The query tile's rows: row m is token ``first_tok + m // G`` and query head ``kv_head * G + m % G`` (the G
    heads sharing the kv head); ``(token, head, row_ok)``, rows past the block or the row's query masked."""
    m_idx = tl.arange(0, BLOCK_M)
    tok = first_tok + m_idx // num_groups
    return tok, kv_head * num_groups + m_idx % num_groups, (m_idx < BLOCK_Q * num_groups) & (tok < q_len)


@triton.jit
def split_share(lo, hi, kv_split, num_kv_splits, BLOCK_N: tl.constexpr):
    """Flash-decoding: split ``kv_split``'s contiguous share of the key tiles in ``[lo, hi)`` (the whole range
    unsplit; an empty range past the last share)."""
    if num_kv_splits > 1:
        per_split = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), num_kv_splits) * BLOCK_N
        lo = lo + kv_split * per_split
        hi = tl.minimum(hi, lo + per_split)
    return lo, hi


@triton.jit
def cache_rows(cache_ptr, blk, off, kv_head, stride_blk, stride_pos, stride_h):
    """The address of one kv head's row in the cache at offset ``off`` of physical block ``blk`` (int64 tensors)."""
    return cache_ptr + blk * stride_blk + off * stride_pos + kv_head * stride_h


@triton.jit
def load_cached_kv(k_cache_ptr, v_cache_ptr, bt_row, k_pos, k_ok, block_size, kv_head,
                   stride_kc_blk, stride_kc_pos, stride_kc_h, stride_vc_blk, stride_vc_pos, stride_vc_h, d, d_ok,
                   UPCAST: tl.constexpr):
    """The cached keys and values ``(BLOCK_N, BLOCK_D)`` of one kv head at positions ``k_pos``, each gathered through
    the sequence's block-table row ``bt_row`` (zeros where not ``k_ok``); float32 under ``UPCAST``."""
    blk = tl.load(bt_row + k_pos // block_size, mask=k_ok, other=0).to(tl.int64)
    off = (k_pos % block_size).to(tl.int64)
    kv_mask = k_ok[:, None] & d_ok[None, :]
    k = tl.load(cache_rows(k_cache_ptr, blk, off, kv_head, stride_kc_blk, stride_kc_pos, stride_kc_h)[:, None]
                + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(cache_rows(v_cache_ptr, blk, off, kv_head, stride_vc_blk, stride_vc_pos, stride_vc_h)[:, None]
                + d[None, :], mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def attend_tile(q, k, v, allowed, m_i, l_i, acc, scale, softcap, HAS_SOFTCAP: tl.constexpr,
                IEEE_FP32: tl.constexpr):
    """``(m, l, acc)`` after the keys ``k`` / values ``v`` ``(BLOCK_N, BLOCK_D)`` of one tile, for the queries
    ``q`` ``(BLOCK_M, BLOCK_D)``; ``allowed`` ``(BLOCK_M, BLOCK_N)`` masks keys a query may not see. Matmuls in the
    inputs' dtype with float32 accumulation (float32 inputs: IEEE float32, not tf32)."""
    if IEEE_FP32:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if HAS_SOFTCAP:
        x = s * (scale / softcap)
        # tanh(x) = 1 - 2 / (exp(2x) + 1): exact limits at +-inf, no libdevice needed
        s = (1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)) * (softcap * 1.4426950408889634)
    else:
        s = s * (scale * 1.4426950408889634)
    s = tl.where(allowed, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE_FP32:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def attend_cached_keys(q, q_pos, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, bt_row, lo, hi, block_size, kv_head,
                       stride_kc_blk, stride_kc_pos, stride_kc_h, stride_vc_blk, stride_vc_pos, stride_vc_h, d, d_ok,
                       scale, softcap, sliding_window, HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr,
                       IEEE_FP32: tl.constexpr, UPCAST: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(m, l, acc)`` after the cached keys at positions ``[lo, hi)`` in tiles of ``BLOCK_N`` (causal against each
    row's position ``q_pos``, and the sliding window)."""
    for n_start in range(lo, hi, BLOCK_N):
        k_pos = n_start + tl.arange(0, BLOCK_N)
        k_ok = k_pos < hi
        k, v = load_cached_kv(k_cache_ptr, v_cache_ptr, bt_row, k_pos, k_ok, block_size, kv_head, stride_kc_blk,
                              stride_kc_pos, stride_kc_h, stride_vc_blk, stride_vc_pos, stride_vc_h, d, d_ok, UPCAST)
        allowed = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
        if HAS_WINDOW:
            allowed = allowed & ((q_pos[:, None] - k_pos[None, :]) < sliding_window)
        m_i, l_i, acc = attend_tile(q, k, v, allowed, m_i, l_i, acc, scale, softcap, HAS_SOFTCAP, IEEE_FP32)
    return m_i, l_i, acc


@triton.jit
def store_attention_result(out_ptr, part_acc_ptr, part_ml_ptr, acc, m_i, l_i, token, head, row_ok, d, d_ok,
                           stride_ot, stride_oh, num_heads, kv_split, num_kv_splits, BLOCK_D: tl.constexpr):
    """Unsplit: ``acc / l`` to ``out[token, head]`` in the output's dtype. Split: the unnormalised ``(acc, m, l)``
    to the float32 partials ``(T, H, S, BLOCK_D)`` / ``(T, H, S, 2)`` that ``_combine_kv_splits_kernel`` merges (an
    empty share leaves m = -1e30, l = 0, acc = 0). ``token`` is the packed row of each tile row."""
    o_mask = row_ok[:, None] & d_ok[None, :]
    if num_kv_splits == 1:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / l_safe[:, None]
        tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        row = (token * num_heads + head) * num_kv_splits + kv_split
        tl.store(part_acc_ptr + row[:, None] * BLOCK_D + d[None, :], acc, mask=o_mask)
        tl.store(part_ml_ptr + row * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=row_ok)
