"""Proposers: what fills a round's drafts. The interface the round calls (after transformers'
``CandidateGenerator``: small, one method per round), implemented here by a draft model, a draft
head on the target's hidden states and prompt lookup.

    model           the paged model it drafts with, by the runner's name for it ("draft"), or None.
                    The runner gives that model a paged cache, prefills it with the prompts, and
                    calls ``catch_up`` when the model has missed tokens (rounds of k = 0).
    every_round     ``propose`` runs in rounds of k = 0 too (it reads what the last round committed
                    then, so the model never falls behind and needs no ``catch_up``).
    propose(s, models, spec, k)
                    writes the drafts into ``s.hist`` after each row's
                    committed tokens, ``s.counts`` (real drafts per row, at most k) and, when
                    sampling from a distribution, ``s.draft_probs[:, :k]`` (None: point masses).

Both are fixed-shape tensor code over a ``BucketState``: no host synchronisation, no shape that
depends on values, so they run eagerly on CPU and captured in a CUDA graph on a GPU.
"""
from __future__ import annotations

from typing import Optional, Protocol

import torch

from .. import kernels
from ..runner.bucket_state import BucketState
from ..runner.paged_model import PagedModel
from .sampling import choose_tokens


class Proposer(Protocol):
    model: Optional[str]
    every_round: bool

    def propose(self, s: BucketState, models: dict, spec, k: int) -> None:
        """Up to ``k`` drafts per row of ``s`` (see the module's docstring)."""

    # and, where ``model`` is not None:
    # catch_up(s, model: PagedModel, width: int, compiled: bool): the model reads ``width`` missed tokens


def draft_token(s: BucketState, spec, logits: torch.Tensor, rows: torch.Tensor, column: torch.Tensor,
                j: int) -> torch.Tensor:
    """Draft ``j`` of every row from a model's logits ``(B, V)``: the call's processors (at history column
    ``column`` ``(B,)``), then argmax or a sample; written to ``s.hist`` and (sampling) ``s.draft_probs``."""
    scores = spec.logits(logits, s.hist, rows, column, batch_rows=s.batch_row,
                         live=~s.done if spec.logits.reads_live else None)
    tokens, probs = choose_tokens(scores, spec.do_sample, spec.generator)
    s.hist.scatter_(1, column[:, None], tokens[:, None])
    if probs is not None:
        s.draft_probs[:, j] = probs
    return tokens


class DraftModelProposer:
    """k autoregressive steps of a small model on its own paged cache. Step 1 feeds 2 tokens per row
    (positions length-2, length-1: the last draft plus the bonus token after a fully accepted round,
    otherwise an already cached token re-fed, an identical K/V rewrite); steps 2..k feed 1 token."""

    model = "draft"
    every_round = False

    def propose(self, s: BucketState, models: dict, spec, k: int) -> None:
        draft: PagedModel = models["draft"]
        B, device = s.size, s.hist.device
        rows = torch.arange(B, device=device)
        steps = torch.arange(max(k, 2), device=device)
        end = s.pads + s.length  # history column of the first draft
        positions = ((s.length - 2)[:, None] + steps[:2]).view(-1)
        input_ids = s.hist.gather(1, (end - 2)[:, None] + steps[:2]).view(-1)
        lens, columns = _two_wide_at_one_row(s.length) + steps[:, None], end + steps[:, None]  # (k, B): step j's
        # lengths (row j passed as a model's positions and lengths), draft columns
        s.counts.fill_(k)
        for j in range(k):
            logits = draft.forward(input_ids, positions, s.draft_tables, lens[j, :B], 2 if j == 0 else 1, True,
                                   float_logits=spec.draft_logits_in_float)
            tokens = draft_token(s, spec, logits, rows, columns[j], j)
            input_ids, positions = tokens, lens[j, :B]

    @staticmethod
    def catch_up(s: BucketState, draft: PagedModel, width: int, compiled: bool) -> None:
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
        draft.forward(input_ids, positions.reshape(-1), s.draft_tables, seq_lens, width, True, eager=not compiled,
                      float_logits=False)  # nothing reads them
        s.behind.sub_(width).clamp_(min=0)


def _two_wide_at_one_row(length: torch.Tensor) -> torch.Tensor:
    """``length`` (B,), seen twice wide when B = 1 (a view: no kernel), for tables whose row j is passed to the model
    (``[j, :B]``): Triton keys its kernels on each pointer's 16-byte alignment, and row j of a (k, 1) int64 table
    starts at 8j bytes (at one row the step metadata's kernel compiled twice more)."""
    return length.expand(2) if length.shape[0] == 1 else length


class HeadProposer:
    """A draft head on the target's features (``draft_head.py``): head position i reads (f_i, t_{i+1}) and
    proposes t_{i+2}. Its first step reads, with the target's own features (``s.features``, from the last
    verify), every pair since the last round: K+1 tokens per row from position ``length - keep - 1``, the pairs
    of the tokens that round committed (positions past them hold rejected drafts; later steps and the next round
    rewrite them before anything reads them). Its output at the last committed pair proposes the first draft;
    steps 2..k read (its own guess g of the next feature, the token just drafted). At k = 0 only the first step
    runs, without logits: the head reads every committed position, so it never needs a catch-up."""

    model = "draft"
    every_round = True

    def propose(self, s: BucketState, models: dict, spec, k: int) -> None:
        head: PagedModel = models["draft"]
        B, width, device = s.size, s.features.shape[1], s.hist.device
        rows = torch.arange(B, device=device)
        span = torch.arange(width, device=device)
        first = s.length - s.keep - 1  # the first position the head has not read with the target's feature
        input_ids = s.hist.gather(1, (s.pads + first + 1)[:, None] + span).view(-1)
        positions = (first[:, None] + span).view(-1)
        pick = rows * width + (s.keep - 1).clamp(min=0)  # each row's last committed pair
        in_float = spec.draft_logits_in_float
        logits, g = head.forward(input_ids, positions, s.draft_tables, first + width, width, False,
                                 features=s.features.view(B * width, -1), rows=pick if k else pick[:0],
                                 float_logits=in_float)
        s.counts.fill_(k)
        if not k:
            return
        g = g[pick]
        at = _two_wide_at_one_row(s.length) + torch.arange(-1, k, device=device)[:, None]  # (k+1, B): length-1+j
        columns = s.pads + at[:, :B]  # row j+1: draft j's history column
        for j in range(k):
            tokens = draft_token(s, spec, logits, rows, columns[j + 1], j)
            if j + 1 < k:  # step j+2 reads draft j at position length-1+j
                logits, g = head.forward(tokens, at[j, :B], s.draft_tables, at[j + 1, :B], 1, True, features=g,
                                         float_logits=in_float)


class NgramProposer:
    """Prompt lookup (``kernels/ngram_lookup.py``): the tokens that followed the longest earlier match of each
    row's last n tokens (n from ``spec.ngram_sizes``); a row without a match proposes nothing."""

    model = None
    every_round = False

    def propose(self, s: BucketState, models: dict, spec, k: int) -> None:
        drafts, counts = kernels.ngram_drafts(s.hist, s.pads, s.length, k, *spec.ngram_sizes)
        end = s.pads + s.length
        s.hist.scatter_(1, end[:, None] + torch.arange(k, device=s.hist.device), drafts)
        s.counts.copy_(counts)


PROPOSERS = {"draft": DraftModelProposer(), "head": HeadProposer(), "ngram": NgramProposer()}
