"""Device helpers shared by the paged attention kernels: one online-softmax step over a key tile, and the
program's result (the normalised output, or a split's unnormalised partial for the combine).

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
