"""Plain torch reference of typical acceptance (the oracle of the Triton kernel).

Typical acceptance (Medusa, Cai et al. 2024; vLLM's ``TypicalAcceptanceSampler``) trades
exactness for acceptance: a draft token is kept when the target finds it *typical*
rather than through a probability ratio, so no draft probabilities are needed.

For sequence ``b`` with drafts ``x_1..x_k`` and target distributions ``p_1..p_{k+1}``:

* ``H_j = -sum_v p_j(v) log p_j(v)`` (with ``0 log 0 = 0``);
* accept ``x_j`` while ``p_j(x_j) > min(posterior_threshold, posterior_alpha * exp(-H_j))``;
* at the first rejection ``r`` emit ``argmax p_r`` (the greedy recovered token);
* if all ``k`` drafts are accepted emit the bonus token ``argmax_v p_{k+1}(v) / E_b(v)``
  (a draw from ``p_{k+1}`` by the exponential race, ``E ~ Exp(1)``).

Layout as ``rejection_sample_reference``: flattened drafts ``(N,)``, inclusive cumulative
counts ``(B,)``, ``target_probs`` ``(N + B, V)`` (each sequence's ``k_b`` rows then its bonus
row), ``exponential_samples`` ``(B, V)``. Output ``(B, max_spec_len + 1)`` ids padded with
``-1`` and accepted counts ``(B,)``.
"""
from __future__ import annotations

import torch

from .rejection_sampler_reference import PLACEHOLDER_TOKEN_ID, padded_view


def typical_accept_reference(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    max_spec_len: int,
    posterior_threshold: float,
    posterior_alpha: float,
    exponential_samples: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, K = cu_num_draft_tokens.shape[0], int(max_spec_len)
    device = target_probs.device
    counts, valid, flat, draft, p, p_draft = padded_view(draft_token_ids, cu_num_draft_tokens, target_probs, K)
    jj = torch.arange(K + 1, device=device)

    entropy = -torch.special.xlogy(p[:, :K], p[:, :K]).sum(-1)  # (B, K)
    threshold = torch.clamp(posterior_alpha * torch.exp(-entropy), max=posterior_threshold)
    accept = (p_draft > threshold) & valid
    num_accepted = accept.long().cumprod(-1).sum(-1)  # (B,)

    r = num_accepted
    p_r = p.gather(1, r[:, None, None].expand(-1, 1, p.shape[-1])).squeeze(1)  # (B, V)
    recovered = p_r.argmax(-1)
    bonus = (p_r / exponential_samples.float()).argmax(-1)
    emitted = torch.where(r < counts, recovered, bonus)

    out = torch.full((B, K + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device)
    out[:, :K] = torch.where(jj[None, :K] < r[:, None], draft, out[:, :K])
    out.scatter_(1, r[:, None], emitted[:, None])
    return out, num_accepted
