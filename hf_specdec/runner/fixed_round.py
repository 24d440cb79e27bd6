"""One speculative round as fixed-shape tensor code over a ``BucketState``: what the graphs capture.

    propose   draft step 1 feeds 2 tokens per row (positions length-2, length-1: the last
              draft plus the bonus token after a fully accepted round, otherwise an already
              cached token re-fed, an identical K/V rewrite); steps 2..k feed 1 token.
              Drafts go into ``hist`` after the committed tokens.
    verify    one target forward of k+1 tokens per row ([y_last, x_1..x_k]), the same
              logits processors, then greedy / rejection / typical acceptance (kernels/).
    commit    cut at EOS and max_new_tokens, append, advance lengths: on the device.

No host synchronisation, no value-dependent shape, no Python branch on tensor values:
the same code runs eagerly on CPU (the tests) and captured in CUDA graphs on GPU. Cache
"rollback" is implicit: the next round writes from ``length-2`` (draft) and ``length-1``
(target) on, and attention reads only up to each row's length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .. import kernels
from ..sampling import choose_tokens
from .bucket_state import BucketState
from .paged_model import PagedModel

# scores (R, V), history (B, W), history row of each score row (R,), input_ids length (R,),
# batch_rows= the call's batch row of each score row (R,) -> scores; see graph_logits.GraphLogits
LogitsFn = Callable[..., torch.Tensor]


@dataclass
class RoundSpec:
    """What a round does; everything here is fixed for the life of a captured graph."""

    k: int
    do_sample: bool
    acceptance: str  # "greedy", "rejection" or "typical"
    logits: LogitsFn
    generator: Optional[torch.Generator] = None
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3


def propose(s: BucketState, draft: PagedModel, spec: RoundSpec) -> None:
    """k draft steps; ``s.drafts`` (and ``s.draft_probs`` when sampling) receive the proposals."""
    B, device = s.size, s.hist.device
    rows = torch.arange(B, device=device)
    two = torch.arange(2, device=device)
    end = s.pads + s.length  # history column of the first draft
    positions = ((s.length - 2)[:, None] + two).view(-1)
    input_ids = s.hist.gather(1, (end - 2)[:, None] + two).view(-1)
    for j in range(spec.k):
        logits = draft.forward(input_ids, positions, s.draft_tables, s.length + j, 2 if j == 0 else 1, True)
        scores = spec.logits(logits, s.hist, rows, end + j, batch_rows=s.batch_row)
        tokens, probs = choose_tokens(scores, spec.do_sample, spec.generator)
        s.hist.scatter_(1, (end + j)[:, None], tokens[:, None])
        s.drafts[:, j] = tokens
        if probs is not None:
            s.draft_probs[:, j] = probs
        input_ids, positions = tokens, s.length + j


def verify_and_commit(s: BucketState, target: PagedModel, spec: RoundSpec) -> None:
    """Score every row's drafts in one forward, accept, and commit the emitted tokens."""
    k, B, device = spec.k, s.size, s.hist.device
    span = torch.arange(k + 1, device=device)
    end = s.pads + s.length
    input_ids = s.hist.gather(1, (end - 1)[:, None] + span).view(-1)
    positions = ((s.length - 1)[:, None] + span).view(-1)
    logits = target.forward(input_ids, positions, s.target_tables, s.length + k, k + 1, False)
    rows = torch.arange(B, device=device).repeat_interleave(k + 1)
    scores = spec.logits(logits, s.hist, rows, (end[:, None] + span).view(-1), batch_rows=s.batch_row[rows])
    s.scores = scores  # read by host stopping criteria; a captured graph rewrites this same memory
    emitted, accepted = accept(s, scores, spec)
    commit(s, emitted, accepted, k)


def accept(s: BucketState, scores: torch.Tensor, spec: RoundSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Emitted tokens ``(B, k+1)`` (-1 after the run) and accepted draft counts ``(B,)``."""
    k, B, device = spec.k, s.size, s.hist.device
    if k == 0:  # plain decoding: the target's own choice
        tokens, _ = choose_tokens(scores, spec.do_sample, spec.generator)
        return tokens[:, None], torch.zeros(B, dtype=torch.long, device=device)
    drafts = s.drafts.reshape(-1)
    cu = torch.arange(1, B + 1, device=device, dtype=torch.int32) * k
    generators = None if spec.generator is None else [spec.generator] * B
    if spec.acceptance == "greedy":
        greedy = torch.ones(B, dtype=torch.bool, device=device)
        return kernels.rejection_sample(drafts, cu, None, scores, greedy, k, generators, all_greedy=True)
    target_probs = torch.softmax(scores, dim=-1)
    if spec.acceptance == "typical":
        return kernels.typical_accept(drafts, cu, target_probs, k, spec.posterior_threshold, spec.posterior_alpha,
                                      generators)
    random = torch.zeros(B, dtype=torch.bool, device=device)
    return kernels.rejection_sample(drafts, cu, s.draft_probs.reshape(B * k, -1), target_probs, random, k, generators)


def commit(s: BucketState, emitted: torch.Tensor, accepted: torch.Tensor, k: int) -> None:
    """Append each live row's run up to its first EOS and its max_new_tokens; update lengths,
    done flags and the acceptance statistics."""
    span = torch.arange(k + 1, device=emitted.device)
    live = ~s.done
    limit = torch.minimum(accepted + 1, s.max_new - s.gen)
    is_eos = (emitted[:, :, None] == s.eos).any(-1) & (span < limit[:, None])
    hit_eos = is_eos.any(1)
    keep = torch.where(hit_eos, is_eos.int().argmax(1) + 1, limit)
    keep = torch.where(live, keep, 0)
    columns = (s.pads + s.length)[:, None] + span
    old = s.hist.gather(1, columns)
    s.hist.scatter_(1, columns, torch.where(span < keep[:, None], emitted, old))
    s.keep.copy_(keep)
    s.gen.add_(keep)
    s.length.add_(keep)
    s.done.logical_or_(live & (hit_eos | (s.gen >= s.max_new)))
    if k:
        s.stat_drafts.add_(live.sum())
        s.stat_accepted.add_(torch.where(live, accepted, 0).sum())
        s.stat_per_position.add_(((accepted[:, None] > span[:k]) & live[:, None]).sum(0))
