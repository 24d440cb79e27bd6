"""The fast path's round loop: fixed-shape rounds on the runner, one host synchronisation each.

    prefill    both models read the prompts of the rows the cache budget holds; the target's
               first token is committed as on the eager path (fast_rows.py)
    rounds     policy.choose(): this round's k (strategies/speculation_length.py);
               runner.round(k): propose + verify + accept + commit on the device (graph
               replays on GPU); runner.read(): the one sync, done flags, lengths, verdicts.
               When no row leaves or joins at a sync, the next round starts right after it
               and the host's bookkeeping of the last one (policy, lengths) runs beside it,
               with the policy's decision for the round after (policy.prepare)
    criteria   stopping criteria that need the host (stop strings, max_time, the user's
               own) run on the tokens just committed; a stop cuts the row on the device;
               output_scores copies the verify's scores of those tokens (no round ahead then)
    shrink     finished rows go back to the call's buffer; waiting rows join in the blocks
               they freed, or the survivors move to a smaller bucket when they fit one
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
from transformers.generation.stopping_criteria import StoppingCriteriaList

from .admission import Admission
from .batch_state import SequenceBatch
from .commit import Committer
from .fast_rows import FastRows
from .history_groups import stop_hits
from .logits import LogitsPipeline
from .metrics import SpecMetrics, StageTimer
from .runner import RoundSpec, RowAtSync, SpecRunner, bucket_for
from .strategies.speculation_length import SpeculationLength


@dataclass
class LaunchedRound:
    """A round started on the device and not read yet."""
    k: int
    bucket: int
    started: float  # perf_counter at its launch
    warmup_before: float  # the runner's warm-up seconds then: a capture inside makes the round's time unclean
    caught_up: bool  # the draft read missed tokens first (not a clean timing either)
    live_rows: list  # the batch rows it runs, and the tokens each has left: what the policy chose k for
    remaining: list


def run_fast(runner: SpecRunner, batch: SequenceBatch, spec: RoundSpec, logits: LogitsPipeline,
             committer: Committer, eos_ids: list[int], metrics: SpecMetrics, timer: StageTimer,
             admission: Admission, policy: SpeculationLength) -> None:
    CallLoop(runner, batch, spec, FastRows(runner, batch, admission, spec, logits, committer, timer),
             committer, eos_ids, metrics, admission, policy).run()


class CallLoop:
    """One call's rounds on the runner. ``rows[i]``: the batch row in bucket row i (None once it left)."""

    def __init__(self, runner: SpecRunner, batch: SequenceBatch, spec: RoundSpec, waves: FastRows,
                 committer: Committer, eos_ids: list[int], metrics: SpecMetrics, admission: Admission,
                 policy: SpeculationLength):
        self.runner, self.batch, self.spec, self.waves, self.committer = runner, batch, spec, waves, committer
        self.criteria = committer.criteria
        # host work on each sync's tokens: no round may start ahead (it would rewrite the scores read here)
        self.host_reads = bool(self.criteria) or committer.keep_scores
        self.eos_ids, self.metrics, self.admission, self.policy = eos_ids, metrics, admission, policy
        self.rows: list = []
        self.generated: dict[int, int] = {}  # batch row -> new tokens, as of the last sync
        self.priced: set[int] = set()  # buckets whose graphs the adaptive policy has timed
        self.verdicts: Optional[tuple] = None  # the last round's, for the policy once the next one is launched

    def run(self) -> None:
        if self.policy.expects_no_drafts:
            self.runner.defer_draft()  # the draft reads the prompts only if a round drafts
        self.rows = self.waves.start()  # prefill and first token of every row the cache budget holds
        if not self.rows:
            return
        self.runner.load(self.rows, self.eos_ids)
        self.generated = {r: self.batch.gen_len[r] for r in self.rows}
        ahead = None  # a round started before the last one's bookkeeping, which ran while the device worked
        while True:
            launched = ahead or self._launch_after_sync()
            sync = self.runner.read()  # the round's one sync (of the current bucket: a move to a smaller one follows)
            seconds = time.perf_counter() - launched.started
            clean = self.runner.warmup_seconds == launched.warmup_before and not launched.caught_up  # no capture
            live = [(r, row) for r, row in zip(self.rows, sync) if r is not None]
            ahead = self._launch_ahead(live)
            self._account(launched, seconds, clean, live, ahead)
            if self.criteria:
                self._apply_host_criteria(sync)
            if self.committer.keep_scores:
                self._keep_scores(sync)
            still = self._retire_finished(sync)
            joined = self.waves.join(self.rows, still, sync, self.eos_ids)  # waiting rows start in freed blocks
            if joined is not None:
                self.policy.rows_joined()
                self.rows = joined
                self.generated.update((r, self.batch.gen_len[r]) for r in joined if r not in self.generated)
                continue
            if not still:
                if self.verdicts is not None:
                    self.policy.observe(*self.verdicts)  # the call's last (its acceptance: the next call's prior)
                break
            if bucket_for(len(still)) < self.runner.state.size:
                # non_blocking: a plain copy to the device waits for the stream, i.e. for the round started ahead
                self.runner.shrink(torch.tensor(still).to(self.batch.device, non_blocking=True))
                self.rows = [self.rows[i] for i in still]
        self.metrics.record_totals(**self.runner.statistics())
        self.metrics.k_histogram = dict(sorted(self.policy.histogram.items()))

    def _launch_after_sync(self) -> LaunchedRound:
        """The next round, launched after the last one's bookkeeping (rows left or joined, or host criteria ran);
        the last round's verdicts go to the policy once it is launched."""
        live_rows = [r for r in self.rows if r is not None]
        launched = self._launch(live_rows, [self.batch.max_new_tokens - self.generated.get(r, 0) for r in live_rows])
        if self.verdicts is not None:
            self._learn(launched)
        return launched

    def _launch_ahead(self, live: list) -> Optional[LaunchedRound]:
        """The next round right after the sync, in this bucket, when no host work must come first: rows that just
        finished are done on the device (their results are not kept; the blocks they write go to no other row,
        since none waits). This sync's bookkeeping then runs on the host while the device computes."""
        running = [(r, row) for r, row in live if not row.done]
        if not running or self.host_reads or self.admission.waiting:
            return None
        return self._launch([r for r, _ in running], [self.batch.max_new_tokens - row.generated for _, row in running])

    def _launch(self, live_rows: list[int], remaining: list[int]) -> LaunchedRound:
        """Choose a round's k and start it (graph replays return before the device is done). Called with the device
        idle or one round ahead, so a bucket's first round may capture."""
        runner, policy, bucket = self.runner, self.policy, self.runner.state.size
        if policy.adaptive and bucket not in self.priced:
            # the two ends price every k between them (round_costs.py's line), timed clean; another k's graphs are
            # captured when the policy first picks it (that round is not timed), so warm-up does not grow with k
            ends = sorted({0, self.spec.k})
            runner.capture(ends)
            if runner.key.graphs and not policy.has_costs(bucket):
                for k, seconds in runner.time_rounds(ends).items():
                    for sample in seconds:
                        policy.record_cost(bucket, k, sample)
            self.priced.add(bucket)
        k = policy.choose(bucket, live_rows, remaining)
        warm, started = runner.warmup_seconds, time.perf_counter()
        return LaunchedRound(k, bucket, started, warm, runner.round(k), live_rows, remaining)

    def _account(self, launched: LaunchedRound, seconds: float, clean: bool, live: list,
                 ahead: Optional[LaunchedRound]) -> None:
        """Round time and count; the policy's verdicts (learned now if a round runs ahead, else after the next
        launch; a round with a capture, compile or catch-up inside is no timing); each live row's generated
        tokens."""
        self.metrics.round_seconds += seconds
        self.metrics.num_rounds += 1
        if self.policy.adaptive:
            self.verdicts = (launched.bucket, launched.k, seconds if clean else None,
                             [(r, row.accepted, row.drafted) for r, row in live])
            if ahead is not None:  # the device is busy: learn now
                self._learn(ahead)
        self.generated.update((r, row.generated) for r, row in live)

    def _learn(self, running: LaunchedRound) -> None:
        """With a round running on the device: the policy takes the last round's verdicts and prepares the
        decision after the one just launched (``running``)."""
        self.policy.observe(*self.verdicts)
        self.policy.prepare(running.bucket, running.live_rows, running.remaining)
        self.verdicts = None

    def _apply_host_criteria(self, sync: list[RowAtSync]) -> None:
        cuts = host_criteria(self.runner, self.criteria, self.batch.prompt_width, sync)
        if cuts:
            self.runner.stop_rows(cuts)
            for i, n in cuts.items():
                sync[i].done, sync[i].generated, sync[i].kept = True, sync[i].generated - sync[i].kept + n, n

    def _keep_scores(self, sync: list[RowAtSync]) -> None:
        """``output_scores``: the processed scores of each token this round committed, from the verify's own (the
        values plain ``generate()`` returns), copied out of the graph's memory in one gather."""
        scores = self.runner.state.scores
        per_row = scores.shape[0] // self.runner.state.size
        kept = [(self.rows[i], i * per_row + j) for i, at in enumerate(sync[: len(self.rows)])
                if self.rows[i] is not None for j in range(at.kept)]
        if kept:
            picked = scores[torch.tensor([at for _, at in kept], device=scores.device)]
            for (row, _), row_scores in zip(kept, picked):
                self.committer.scores[row].append(row_scores)

    def _retire_finished(self, sync: list[RowAtSync]) -> list[int]:
        """Finished rows go back to the batch (after a round started ahead: its writes past a row's end are cut by
        SequenceBatch.sequences) and free their blocks; returns the bucket rows still running."""
        still = []
        for i, (row, at) in enumerate(zip(self.rows, sync)):
            if row is None:
                continue
            if at.done:
                self.runner.store(i, row, at.generated)
                self.waves.finish([row])
                self.rows[i] = None
            else:
                still.append(i)
        return still


def host_criteria(runner: SpecRunner, criteria: StoppingCriteriaList, prompt_width: int,
                  sync: list[RowAtSync]) -> dict[int, int]:
    """Bucket row -> tokens kept of its last run, for rows a criterion stopped. Each criterion sees
    the ``input_ids`` plain generate would pass after each committed token (grouped by length)."""
    s = runner.state
    k1 = s.scores.shape[0] // s.size
    cuts: dict[int, int] = {}
    for j in range(max((row.kept for row in sync), default=0)):
        live = [i for i, row in enumerate(sync) if j < row.kept and i not in cuts]
        scores = s.scores[torch.tensor(live, dtype=torch.long, device=s.hist.device) * k1 + j]
        lengths = [prompt_width + sync[i].generated - sync[i].kept + j + 1 for i in live]
        hits = stop_hits(criteria, s.hist, live, lengths, scores)
        cuts.update({i: j + 1 for i, h in zip(live, hits) if h})
    return cuts


def round_spec(k: int, do_sample: bool, acceptance: str, logits_fn, generator: Optional[torch.Generator],
               posterior_threshold: float, posterior_alpha: float, method: str = "draft",
               ngram_sizes: tuple = (1, 3)) -> RoundSpec:
    return RoundSpec(k, do_sample, "greedy" if not do_sample else acceptance, logits_fn, generator,
                     posterior_threshold, posterior_alpha, method, ngram_sizes)
