"""Plain torch reference of speculative rejection sampling (the oracle of the Triton kernel).

Math (Leviathan et al. 2023; Chen et al. 2023). Draft tokens ``x_1..x_k`` were drawn from
the draft's distributions ``q_j``; the target scored the same positions, giving ``p_j``
and one more distribution ``p_{k+1}``:

* accept ``x_j`` while ``u_j * q_j(x_j) < p_j(x_j)`` with ``u_j ~ U[0, 1)``, i.e. with
  probability ``min(1, p_j(x_j) / q_j(x_j))``;
* at the first rejection ``r`` emit a *recovered* token from ``norm(max(0, p_r - q_r))``;
* if all ``k`` drafts are accepted emit a *bonus* token from ``p_{k+1}``.

The emitted sequence is then distributed exactly as ``k+1`` tokens from the target.
A proposer without probabilities (n-gram) passes ``draft_probs=None``: ``q`` is one-hot.
Greedy sequences accept while ``x_j == argmax p_j`` and emit ``argmax`` of the first
mismatching (or the bonus) position.

Random draws are inputs, so the kernel and the reference compute the same function:
``uniform_samples`` ``(N,)`` float64 (float32 can round to exactly 0) and
``exponential_samples`` ``(B, V)`` with ``E ~ Exp(1)``: a token is drawn from
unnormalised weights ``w`` as ``argmax(w / E)`` (no normalisation, no multinomial,
no host sync). Each sequence draws at most one recovered-or-bonus token, so one noise
row per sequence suffices. When every sequence is greedy the noise may be ``(1,)`` / ``(1, 1)``
placeholders (``greedy_noise_placeholders``): broadcast here, never read by the kernel.

Layout (vLLM v1): drafts of all sequences flattened to ``(N,)`` with inclusive cumulative
counts ``cu_num_draft_tokens`` ``(B,)``; sequence ``b`` owns drafts
``cu[b-1] : cu[b]`` and target rows ``cu[b-1] + b : cu[b] + b + 1`` of ``target_probs``
``(N + B, V)`` (its ``k_b`` draft positions then the bonus position). Output: token ids
``(B, max_spec_len + 1)`` padded with ``-1`` and accepted draft counts ``(B,)``.
"""
from __future__ import annotations

from typing import Optional

import torch

PLACEHOLDER_TOKEN_ID = -1


def padded_view(draft_token_ids, cu_num_draft_tokens, target_probs, K: int):
    """The flattened ragged layout as padded ``(B, K)`` tensors: per-sequence draft counts, validity
    mask, flat draft index, draft ids (0 where invalid), target probs ``(B, K+1, V)`` (rows past k_b
    repeat the bonus row) and the target probability of each draft."""
    B, N = cu_num_draft_tokens.shape[0], draft_token_ids.shape[0]
    device = target_probs.device
    cu = cu_num_draft_tokens.long()
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    counts = cu - starts
    j = torch.arange(K, device=device)
    valid = j[None, :] < counts[:, None]
    flat = (starts[:, None] + j[None, :]).clamp(max=max(N - 1, 0))
    draft = torch.where(valid, draft_token_ids.long()[flat] if N else flat, torch.zeros_like(flat))
    jj = torch.arange(K + 1, device=device)
    target_rows = starts[:, None] + torch.arange(B, device=device)[:, None] + torch.minimum(jj[None, :], counts[:, None])
    p = target_probs.float()[target_rows]
    p_draft = p[:, :K].gather(-1, draft[..., None]).squeeze(-1)
    return counts, valid, flat, draft, p, p_draft


def rejection_sample_reference(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    target_probs: torch.Tensor,
    is_greedy: torch.Tensor,
    max_spec_len: int,
    uniform_samples: torch.Tensor,
    exponential_samples: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, N, K = cu_num_draft_tokens.shape[0], draft_token_ids.shape[0], int(max_spec_len)
    device = target_probs.device
    counts, valid, flat, draft, p, p_draft = padded_view(draft_token_ids, cu_num_draft_tokens, target_probs, K)
    jj = torch.arange(K + 1, device=device)
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q = draft_probs.float()[flat] if N else torch.zeros(B, K, p.shape[-1], device=device)
        q_draft = q.gather(-1, draft[..., None]).squeeze(-1)

    target_argmax = p.argmax(-1)  # (B, K+1)
    u = uniform_samples.double().expand(N)[flat] if N else torch.zeros(B, K, dtype=torch.float64, device=device)
    accept_random = u * q_draft.double() < p_draft.double()
    accept_greedy = draft == target_argmax[:, :K]
    accept = torch.where(is_greedy[:, None], accept_greedy, accept_random) & valid
    num_accepted = accept.long().cumprod(-1).sum(-1)  # (B,)

    # Token emitted after the accepted run: recovered (rejection) or bonus (all accepted).
    r = num_accepted
    p_r = p.gather(1, r[:, None, None].expand(-1, 1, p.shape[-1])).squeeze(1)  # (B, V)
    rejected = r < counts
    if draft_probs is None:
        q_r = torch.zeros_like(p_r)
        q_r.scatter_(1, draft.gather(1, r.clamp(max=max(K - 1, 0))[:, None]) if K else torch.zeros(B, 1, dtype=torch.long, device=device), 1.0)
    elif K:
        q_r = q.gather(1, r.clamp(max=K - 1)[:, None, None].expand(-1, 1, p.shape[-1])).squeeze(1)
    else:
        q_r = torch.zeros_like(p_r)
    residual = torch.clamp(p_r - q_r, min=0.0)
    # Rounding can leave an all-zero residual; the target distribution is then the right fallback.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_r)
    weights = torch.where(rejected[:, None], residual, p_r)
    sampled = (weights / exponential_samples.float()).argmax(-1)
    greedy_token = target_argmax.gather(1, r[:, None]).squeeze(1)
    emitted = torch.where(is_greedy, greedy_token, sampled)

    out = torch.full((B, K + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device)
    out[:, :K] = torch.where(jj[None, :K] < r[:, None], draft, out[:, :K])
    out.scatter_(1, r[:, None], emitted[:, None])
    return out, num_accepted
