"""One speculative round of k drafts as fixed-shape tensor code over a ``BucketState``: what the
runner executes, eagerly or captured in CUDA graphs (one pair of graphs per bucket and per k the
speculation-length policy picks). ``RoundSpec.stages`` hands the runner the round's two stages:

    propose   the proposer of ``SpecConfig.method`` (proposers.py: a draft model, a draft head,
              prompt lookup) writes up to k drafts per row after its committed tokens.
    verify    one target forward of k+1 tokens per row ([y_last, x_1..x_k]), the call's logits
              processors (logits/), then greedy / rejection / typical acceptance (kernels/).
    commit    cut at EOS and max_new_tokens, append, advance lengths: on the device.

No host synchronisation, no value-dependent shape, no Python branch on tensor values:
the same code runs eagerly on CPU (the tests) and captured in CUDA graphs on GPU. Cache
"rollback" is implicit: the next round writes from ``length-2`` (draft) and ``length-1``
(target) on, and attention reads only up to each row's length.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import torch

from .. import kernels
from ..runner.bucket_state import BucketState
from ..runner.paged_model import PagedModel
from .proposers import PROPOSERS
from .sampling import choose_tokens, cut_to_counts

# scores (R, V), history (B, W), history row of each score row (R,), input_ids length (R,),
# batch_rows= the call's batch row of each score row (R,) -> scores; see logits/graph_logits.py
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
    method: str = "draft"  # the proposer (proposers.PROPOSERS): "draft", "head" or "ngram"
    ngram_sizes: tuple = (1, 3)  # (min n, max n) of the prompt lookup

    @property
    def draft_model(self) -> Optional[str]:
        """The runner's name of the model the proposer drafts with (None: it needs none, or k = 0)."""
        return PROPOSERS[self.method].model if self.k else None

    @property
    def proposes_every_round(self) -> bool:
        """The proposer reads what every round committed, rounds of k = 0 included (``every_round``): its model
        never falls behind, so it needs no catch-up and no deferred prefill."""
        return bool(self.k) and PROPOSERS[self.method].every_round

    @property
    def draft_logits_in_float(self) -> bool:
        """Drafts are chosen from float32 logits when sampling or the call's processors read them; a greedy draft
        without processors takes the argmax in the model's dtype (the same token: the cast is exact), one cast
        kernel fewer a draft step."""
        return self.do_sample or getattr(self.logits, "reads_history", True)

    def stages(self, s: BucketState, models: dict, k: int) -> list[tuple[str, Callable[[], None]]]:
        """A round of ``k <= self.k`` drafts: ``[(name, stage)]``, propose (k > 0, or a proposer that reads every
        round) then verify and commit."""
        verify = ("verify", partial(verify_and_commit, s, models["target"], self, k))
        proposer = PROPOSERS[self.method]
        if not (k or self.proposes_every_round):
            return [verify]
        return [("propose", partial(proposer.propose, s, models, self, k)), verify]

    def catch_up(self, s: BucketState, models: dict, width: int, compiled: bool) -> None:
        """The proposer's model reads ``width`` of the tokens it missed (``DraftModelProposer.catch_up``)."""
        PROPOSERS[self.method].catch_up(s, models[self.draft_model], width, compiled)


def verify_and_commit(s: BucketState, target: PagedModel, spec: RoundSpec, k: int) -> None:
    """Score every row's k drafts in one forward, accept, and commit the emitted tokens."""
    B, device = s.size, s.hist.device
    span = torch.arange(k + 1, device=device)
    end = s.pads + s.length
    input_ids = s.hist.gather(1, (end - 1)[:, None] + span).view(-1)
    positions = ((s.length - 1)[:, None] + span).view(-1)
    if s.features is None:
        logits = target.forward(input_ids, positions, s.target_tables, s.length + k, k + 1, False)
    else:  # a draft head reads these features next round
        logits, hidden = target.forward(input_ids, positions, s.target_tables, s.length + k, k + 1, False, hidden=True)
        s.features[:, : k + 1] = hidden.view(B, k + 1, -1)
    scores = logits
    if spec.logits.reads_history:  # no processors: no rows and positions to build for them
        rows = torch.arange(B, device=device).repeat_interleave(k + 1)
        scores = spec.logits(logits, s.hist, rows, (end[:, None] + span).view(-1), batch_rows=s.batch_row[rows],
                             live=~s.done[rows] if spec.logits.reads_live else None)
    s.scores, s.logits = scores, logits  # read at the sync (host criteria, output_scores/logits); a captured
    # graph rewrites this same memory
    emitted, accepted = accept(s, scores, spec, k, input_ids.view(B, k + 1)[:, 1:])
    if spec.method == "ngram" and k:
        emitted, accepted = cut_to_counts(emitted, accepted, s.counts, scores, spec.do_sample, spec.generator)
    commit(s, emitted, accepted, k)


def accept(s: BucketState, scores: torch.Tensor, spec: RoundSpec, k: int,
           drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Emitted tokens ``(B, k+1)`` (-1 after the run) and accepted draft counts ``(B,)``; ``drafts`` ``(B, k)``: the
    tokens the verify read after each row's last committed one."""
    B, device = s.size, s.hist.device
    if k == 0:  # plain decoding: the target's own choice
        tokens, _ = choose_tokens(scores, spec.do_sample, spec.generator)
        return tokens[:, None], torch.zeros(B, dtype=torch.long, device=device)
    drafts = drafts.reshape(-1)
    cu = kernels.device_constant(("draft offsets", B, k), device,  # (B,) each row's drafts end at (b+1) * k
                                 lambda: torch.arange(1, B + 1, device=device, dtype=torch.int32) * k)
    generators = None if spec.generator is None else [spec.generator] * B
    if spec.acceptance == "greedy":
        greedy = kernels.all_true(B, device)
        return kernels.rejection_sample(drafts, cu, None, scores, greedy, k, generators, all_greedy=True)
    target_probs = torch.softmax(scores, dim=-1)
    if spec.acceptance == "typical":
        return kernels.typical_accept(drafts, cu, target_probs, k, spec.posterior_threshold, spec.posterior_alpha,
                                      generators)
    random = kernels.device_constant(("all false", B), device, lambda: torch.zeros(B, dtype=torch.bool, device=device))
    q = None if s.draft_probs is None else s.draft_probs[:, :k].reshape(B * k, -1)  # None: n-gram point masses
    return kernels.rejection_sample(drafts, cu, q, target_probs, random, k, generators)


def commit(s: BucketState, emitted: torch.Tensor, accepted: torch.Tensor, k: int) -> None:
    """Append each live row's run up to its first EOS and its max_new_tokens; update lengths,
    done flags and the acceptance statistics (one launch on CUDA: ``kernels.commit_round``)."""
    kernels.commit_round(emitted, accepted, s.hist, s.pads, s.length, s.gen, s.done, s.max_new, s.eos, s.counts,
                         s.keep, s.accepted, s.stats(), k)
