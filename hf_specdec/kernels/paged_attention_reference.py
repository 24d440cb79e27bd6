"""Plain torch reference for the paged-cache kernels: KV slot write and paged attention.

Layout (shared with the Triton kernels in this package):

* ``key_cache`` / ``value_cache``: ``(num_blocks, block_size, num_kv_heads, head_dim)``.
* A forward packs the new tokens of ``B`` sequences into ``T`` rows; sequence ``b``
  owns rows ``query_start_loc[b] : query_start_loc[b + 1]`` (``qlen_b`` tokens).
* ``seq_lens[b]`` is the sequence's length *after* this step (cached + new tokens), so
  new token ``i`` of sequence ``b`` sits at position ``seq_lens[b] - qlen_b + i``.
* ``block_tables[b, j]`` is the physical block of positions ``j*block_size ...``;
  ``slot = block_tables[b, pos // block_size] * block_size + pos % block_size``.
* A query at position ``q`` sees keys at positions ``k <= q`` and, for sliding-window
  layers, ``q - k < sliding_window`` (Hugging Face's convention).

The reference is vectorised over the batch (no host synchronisation) and is the CPU
path of the package and the oracle of the kernel tests.
"""
from __future__ import annotations

from typing import Optional

import torch


def write_kv_to_slots_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``(T, kv_heads, head_dim)`` into the flat slots ``slot_mapping`` ``(T,)``; a
    negative slot (a padding token) writes nothing."""
    num_blocks, block_size = key_cache.shape[:2]
    flat_k = key_cache.view(num_blocks * block_size, *key_cache.shape[2:])
    flat_v = value_cache.view(num_blocks * block_size, *value_cache.shape[2:])
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):  # the reference runs on the CPU: a host check costs nothing there
        slots, key, value = slots[keep], key[keep], value[keep]
    flat_k.index_copy_(0, slots, key.to(key_cache.dtype))
    flat_v.index_copy_(0, slots, value.to(value_cache.dtype))


def paged_attention_reference(
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
    """Causal attention of packed ragged queries ``(T, heads, head_dim)`` over each sequence's cached keys.

    Returns ``(T, heads, head_dim)`` in the query's dtype. GQA: query head ``h`` reads
    kv head ``h // (heads // kv_heads)``.
    """
    T, H, D = query.shape
    B, max_blocks = block_tables.shape
    block_size, KVH = key_cache.shape[1], key_cache.shape[2]
    G = H // KVH
    L = max_blocks * block_size
    device = query.device

    # Gather every sequence's keys/values into a dense (B, L, KVH, D) view.
    keys = key_cache[block_tables.long()].reshape(B, L, KVH, D).float()
    values = value_cache[block_tables.long()].reshape(B, L, KVH, D).float()
    # Slots past a sequence's length were never written (or were rolled back): they may hold
    # anything, NaN included, and 0 * NaN would leak through the masked probabilities.
    in_seq = (torch.arange(L, device=device)[None, :] < seq_lens.long()[:, None])[:, :, None, None]
    keys = keys.masked_fill(~in_seq, 0.0)
    values = values.masked_fill(~in_seq, 0.0)

    # Scatter the packed queries into a padded (B, Qmax, H, D) layout.
    qlens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    Q = max(int(max_query_len), 1)
    qi = torch.arange(Q, device=device)
    rows = query_start_loc[:-1].long()[:, None] + qi[None, :]  # (B, Q)
    valid_q = qi[None, :] < qlens[:, None]
    rows = torch.where(valid_q, rows, torch.zeros_like(rows)).clamp(max=max(T - 1, 0))
    q_pad = query.float()[rows]  # (B, Q, H, D)

    # Position of every padded query; padding rows copy their sequence's last query so
    # that no row is fully masked (their output is discarded).
    q_pos = (seq_lens.long() - qlens)[:, None] + torch.minimum(qi[None, :], (qlens - 1).clamp(min=0)[:, None])
    k_pos = torch.arange(L, device=device)
    allowed = k_pos[None, None, :] <= q_pos[:, :, None]  # (B, Q, L)
    if sliding_window is not None:
        allowed &= (q_pos[:, :, None] - k_pos[None, None, :]) < sliding_window

    q_grouped = q_pad.view(B, Q, KVH, G, D)
    scores = torch.einsum("bqkgd,blkd->bkgql", q_grouped, keys) * scale  # (B, KVH, G, Q, L)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed[:, None, None, :, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bkgql,blkd->bqkgd", probs, values).reshape(B, Q, H, D)

    # Unpad without boolean indexing (its nonzero would synchronise): padding rows go to a spare row T.
    dest = torch.where(valid_q, query_start_loc[:-1].long()[:, None] + qi[None, :], T)
    result = torch.zeros(T + 1, H, D, dtype=torch.float32, device=device)  # tokens of no row (padding): 0
    result[dest.reshape(-1)] = out.reshape(B * Q, H, D)
    return result[:T].to(query.dtype)
