"""One speculative round of k drafts as fixed-shape tensor code over a ``BucketState``: what the
graphs capture (one pair of graphs per bucket and per k the round length policy picks).

    propose   n-gram: prompt lookup over ``hist`` (kernels/ngram_lookup.py), per-row counts.
              draft model: step 1 feeds 2 tokens per row (positions length-2, length-1: the last
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
from ..sampling import choose_tokens, cut_to_counts
from .bucket_state import BucketState
from .paged_model import PagedModel

# scores (R, V), history (B, W), history row of each score row (R,), input_ids length (R,),
# batch_rows= the call's batch row of each score row (R,) -> scores; see graph_logits.GraphLogits
LogitsFn = Callable[..., torch.Tensor]


@dataclass
class RoundSpec:
    """What a round does; everything here is fixed for the life of a captured graph."""

    k: int  # the most drafts a round proposes; each round's own k is an argument
    do_sample: bool
    acceptance: str  # "greedy", "rejection" or "typical"
    logits: LogitsFn
    generator: Optional[torch.Generator] = None
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    method: str = "draft"  # or "ngram"
    ngram_sizes: tuple = (1, 3)  # (min n, max n) of the prompt lookup


def propose_ngram(s: BucketState, spec: RoundSpec, k: int) -> None:
    """Prompt lookup: ``s.drafts[:, :k]`` and ``s.counts`` (rows without a match propose nothing)."""
    drafts, counts = kernels.ngram_drafts(s.hist, s.pads, s.length, k, *spec.ngram_sizes)
    end = s.pads + s.length
    s.hist.scatter_(1, end[:, None] + torch.arange(k, device=s.hist.device), drafts)
    s.drafts[:, :k] = drafts
    s.counts.copy_(counts)


def catch_up_draft(s: BucketState, draft: PagedModel, width: int, compiled: bool) -> None:
    """The draft model read nothing during ``s.behind`` rounds of k = 0 (one token each): feed it ``width``
    of those tokens, the oldest first, and count them off ``s.behind`` (a graph of a fixed width replays
    until none is left; the last window ends at position ``length-3``, so that ``propose`` finds its usual
    state). Feeding more than were missed re-feeds cached tokens (identical K/V); a row shorter than
    ``width + 2`` starts at position 0 and writes K/V past its length, which later rounds overwrite before
    reading. Done and padding rows write only positions 0 and 1 of their own (or the scratch) blocks.
    ``compiled=False`` runs the uncompiled draft (an odd ``width`` would recompile it)."""
    device = s.hist.device
    span = torch.arange(width, device=device)
    start = torch.minimum(s.length - 2 - s.behind, s.length - 2 - width).clamp(min=0)
    positions = torch.where(s.done[:, None], span % 2, start[:, None] + span)
    input_ids = s.hist.gather(1, (s.pads + start)[:, None] + span).view(-1)
    seq_lens = torch.where(s.done, width, start + width)
    draft.forward(input_ids, positions.reshape(-1), s.draft_tables, seq_lens, width, True,
                  eager=not compiled)
    s.behind.sub_(width).clamp_(min=0)


def propose(s: BucketState, draft: PagedModel, spec: RoundSpec, k: int) -> None:
    """k draft steps; ``s.drafts[:, :k]`` (and ``s.draft_probs`` when sampling) receive the proposals."""
    B, device = s.size, s.hist.device
    rows = torch.arange(B, device=device)
    two = torch.arange(2, device=device)
    end = s.pads + s.length  # history column of the first draft
    positions = ((s.length - 2)[:, None] + two).view(-1)
    input_ids = s.hist.gather(1, (end - 2)[:, None] + two).view(-1)
    s.counts.fill_(k)
    for j in range(k):
        logits = draft.forward(input_ids, positions, s.draft_tables, s.length + j, 2 if j == 0 else 1, True)
        scores = spec.logits(logits, s.hist, rows, end + j, batch_rows=s.batch_row)
        tokens, probs = choose_tokens(scores, spec.do_sample, spec.generator)
        s.hist.scatter_(1, (end + j)[:, None], tokens[:, None])
        s.drafts[:, j] = tokens
        if probs is not None:
            s.draft_probs[:, j] = probs
        input_ids, positions = tokens, s.length + j


def verify_and_commit(s: BucketState, target: PagedModel, spec: RoundSpec, k: int) -> None:
    """Score every row's k drafts in one forward, accept, and commit the emitted tokens."""
    B, device = s.size, s.hist.device
    span = torch.arange(k + 1, device=device)
    end = s.pads + s.length
    input_ids = s.hist.gather(1, (end - 1)[:, None] + span).view(-1)
    positions = ((s.length - 1)[:, None] + span).view(-1)
    logits = target.forward(input_ids, positions, s.target_tables, s.length + k, k + 1, False)
    rows = torch.arange(B, device=device).repeat_interleave(k + 1)
    scores = spec.logits(logits, s.hist, rows, (end[:, None] + span).view(-1), batch_rows=s.batch_row[rows])
    s.scores = scores  # read by host stopping criteria; a captured graph rewrites this same memory
    emitted, accepted = accept(s, scores, spec, k)
    if spec.method == "ngram" and k:
        emitted, accepted = cut_to_counts(emitted, accepted, s.counts, scores, spec.do_sample, spec.generator)
    commit(s, emitted, accepted, k)


def accept(s: BucketState, scores: torch.Tensor, spec: RoundSpec, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Emitted tokens ``(B, k+1)`` (-1 after the run) and accepted draft counts ``(B,)``."""
    B, device = s.size, s.hist.device
    if k == 0:  # plain decoding: the target's own choice
        tokens, _ = choose_tokens(scores, spec.do_sample, spec.generator)
        return tokens[:, None], torch.zeros(B, dtype=torch.long, device=device)
    drafts = s.drafts[:, :k].reshape(-1)
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
    q = None if s.draft_probs is None else s.draft_probs[:, :k].reshape(B * k, -1)  # None: n-gram point masses
    return kernels.rejection_sample(drafts, cu, q, target_probs, random, k, generators)


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
    s.accepted.copy_(torch.where(live, accepted, 0))
    s.gen.add_(keep)
    s.length.add_(keep)
    s.done.logical_or_(live & (hit_eos | (s.gen >= s.max_new)))
    if k:
        s.stat_rows.add_(live.sum())
        drafted = live & (s.counts > 0)
        s.stat_drafts.add_(drafted.sum())
        s.stat_draft_tokens.add_(torch.where(live, s.counts, 0).sum())
        s.stat_accepted.add_(torch.where(live, accepted, 0).sum())
        s.stat_per_position[:k].add_(((accepted[:, None] > span[:k]) & live[:, None]).sum(0))
