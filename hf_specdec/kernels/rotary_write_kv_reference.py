"""Rotary embedding of a step's new queries and keys, and the write of its keys and values into their cache slots.

A decode or verify forward of a Llama-family layer rotates q and k (transformers' ``apply_rotary_pos_emb``, the
``rotate_half`` layout) and then writes k and v into the paged cache. Compiled, that was three launches a layer
(Inductor's rotary of q, of k, then ``write_kv_to_slots``); ``rotary_write_kv_triton.py`` does it in one program
per token. Layout, per token ``t`` of the packed step and head dimension ``D`` (even):

    x' = x * cos[t] + rotate_half(x) * sin[t],    rotate_half(x) = cat(-x[D/2:], x[:D/2])

for every query head and key head; the rotated keys and the values go to slot ``slot_mapping[t]`` (a negative slot,
a padding token, writes nothing); the rotated queries ``(T, heads, D)`` are returned, and the rotated keys too where
asked (a prompt, whose attention the model's own implementation computes over them). This reference computes the
rotary as transformers does, in the inputs' dtype (fp32 on the CPU: the model's own numbers bit for bit).
"""
from __future__ import annotations

import torch

from .paged_attention_reference import write_kv_to_slots_reference


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``(T, heads, D)``, ``cos``/``sin`` ``(T, D)``: transformers' formula in ``x``'s dtype."""
    cos, sin = cos.to(x.dtype)[:, None, :], sin.to(x.dtype)[:, None, :]
    return (x * cos) + (rotate_half(x) * sin)


def rotary_write_kv_reference(
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
    """``query`` ``(T, heads, D)``, ``key``/``value`` ``(T, kv_heads, D)``, ``cos``/``sin`` ``(T, D)``: rotates
    the queries and keys, writes keys and values into ``slot_mapping`` (in place) and returns the rotated queries
    and, when ``return_key``, the rotated keys (else an empty tensor); both contiguous."""
    rotated_key = apply_rotary(key, cos, sin)
    write_kv_to_slots_reference(rotated_key, value, key_cache, value_cache, slot_mapping)
    return apply_rotary(query, cos, sin).contiguous(), rotated_key.contiguous() if return_key else key.new_empty(0)
