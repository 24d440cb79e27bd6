"""The call loop: a call's fixed-shape rounds on the runner, one host synchronisation each.

    prefill    the target reads the prompts of the rows the cache budget holds, their first
               token is committed on the host (waves.py, committer.py), then the draft reads them
    rounds     policy.choose(): this round's k (round/policy/speculation_length.py);
               runner.round(k): propose + verify + accept + commit on the device (graph
               replays on GPU); runner.read(): the one sync, done flags, lengths, verdicts.
               When no row leaves or joins at a sync, the next round starts right after it
               and the host's bookkeeping of the last one (policy, lengths) runs beside it,
               with the policy's decision for the round after (policy.prepare)
    criteria   stopping criteria that need the host (stop strings, max_time, the user's
               own) run on the tokens just committed; a stop cuts the row on the device;
               output_scores / output_logits copy the verify's scores and logits of those tokens
               (device copies enqueued before the next round); a streamer gets them (the host
               reads the tokens: no round ahead then, as with criteria)
    shrink     finished rows go back to the call's buffer; waiting rows join in the blocks
               they freed, or the survivors move to a smaller bucket when they fit one and
               it pays (with graphs: once captured, or its capture paid for; bucket_moves.py)
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
from transformers.generation.stopping_criteria import StoppingCriteriaList

from ..round.fixed_round import RoundSpec
from ..round.logits.history_groups import stop_hits
from ..round.policy.speculation_length import SpeculationLength
from ..runner import RowAtSync, SpecRunner
from .admission import Admission
from .batch_state import SequenceBatch
from .bucket_moves import BucketMoves
from .committer import Committer
from .metrics import SpecMetrics, StageTimer
from .timeline import span
from .waves import FastRows


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


def run_fast(runner: SpecRunner, batch: SequenceBatch, spec: RoundSpec, committer: Committer, eos_ids: list[int],
             metrics: SpecMetrics, timer: StageTimer, admission: Admission, policy: SpeculationLength,
             capture_every_k: bool = False, lockstep: bool = False) -> None:
    CallLoop(runner, batch, spec, FastRows(runner, batch, admission, spec, committer, timer),
             committer, eos_ids, metrics, admission, policy, capture_every_k, lockstep).run()


class CallLoop:
    """One call's rounds on the runner. ``rows[i]``: the batch row in bucket row i (None once it left)."""

    def __init__(self, runner: SpecRunner, batch: SequenceBatch, spec: RoundSpec, waves: FastRows,
                 committer: Committer, eos_ids: list[int], metrics: SpecMetrics, admission: Admission,
                 policy: SpeculationLength, capture_every_k: bool = False, lockstep: bool = False):
        self.runner, self.batch, self.spec, self.waves, self.committer = runner, batch, spec, waves, committer
        self.criteria = committer.criteria
        # host work on each sync's tokens (criteria, a streamer): no round may start before it is done
        self.host_reads = committer.reads_tokens
        self.eos_ids, self.metrics, self.admission, self.policy = eos_ids, metrics, admission, policy
        self.rows: list = []
        self.generated: dict[int, int] = {}  # batch row -> new tokens, as of the last sync
        self.priced: set[int] = set()  # buckets whose graphs the adaptive policy has timed
        self.capture_every_k = capture_every_k  # SpecConfig.capture_every_k
        self.verdicts: Optional[tuple] = None  # the last round's, for the policy once the next one is launched
        self.moves = BucketMoves(runner, lockstep)  # whether the rows left move to a smaller bucket (bucket_moves.py)

    def run(self) -> None:
        if self.policy.expects_no_drafts:
            self.runner.defer_draft()  # the draft reads the prompts only if a round drafts
        with span("prefill"):
            self.rows = self.waves.start()  # prefill and first token of every row the cache budget holds
        if not self.rows:
            return
        self.runner.load(self.rows, self.eos_ids)
        self.generated = {r: self.batch.gen_len[r] for r in self.rows}
        ahead = None  # a round started before the last one's bookkeeping, which ran while the device worked
        while True:
            launched = ahead or self._launch_after_sync()
            with span("wait"):
                sync = self.runner.read()  # the round's one sync (of the current bucket)
            seconds = time.perf_counter() - launched.started
            clean = self.runner.warmup_seconds == launched.warmup_before and not launched.caught_up  # no capture
            live = [(r, row) for r, row in zip(self.rows, sync) if r is not None]
            with span("host_reads"):
                self._host_reads(sync)  # before a round ahead rewrites the graphs' outputs
            ahead = self._launch_ahead(live)
            self._account(launched, seconds, clean, live, ahead)
            with span("retire"):
                still = self._retire_finished(sync)
            with span("join"):
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
            move = self.moves.target(len(still))
            if move is not None:
                with span("shrink"):  # non_blocking: the copy waits for the stream (the round started ahead)
                    self.runner.shrink(torch.tensor(still).to(self.batch.device, non_blocking=True), move)
                self.rows = [self.rows[i] for i in still]
            elif clean:
                self.moves.credit(len(still), seconds)
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
        if self.committer.keeps_outputs and self.moves.target(len(running)) is not None:
            return None  # the survivors move to a smaller bucket: the round's outputs must be read in this one
        return self._launch([r for r, _ in running], [self.batch.max_new_tokens - row.generated for _, row in running])

    def _launch(self, live_rows: list[int], remaining: list[int]) -> LaunchedRound:
        """Choose a round's k and start it (graph replays return before the device is done). Called with the device
        idle or one round ahead, so a bucket's first round may capture."""
        runner, policy, bucket = self.runner, self.policy, self.runner.state.size
        with span("choose"):
            if policy.adaptive and bucket not in self.priced:
                self._price(bucket)
            k = policy.choose(bucket, live_rows, remaining)
        warm, started = runner.warmup_seconds, time.perf_counter()
        with span("launch"):
            caught_up = runner.round(k)
        return LaunchedRound(k, bucket, started, warm, caught_up, live_rows, remaining)

    def _price(self, bucket: int) -> None:
        """The two ends of k price every k between them (round_costs.py's line), timed clean; another k's graphs
        are captured when the policy first picks it (that round is not timed), so warm-up does not grow with k,
        unless ``SpecConfig.capture_every_k`` asks for every k now."""
        ends = sorted({0, self.spec.k})
        self.runner.capture(range(self.spec.k + 1) if self.capture_every_k else ends)
        if self.runner.graphed and not self.policy.has_costs(bucket):
            for k, seconds in self.runner.time_rounds(ends).items():
                for sample in seconds:
                    self.policy.record_cost(bucket, k, sample)
        self.priced.add(bucket)

    def _account(self, launched: LaunchedRound, seconds: float, clean: bool, live: list,
                 ahead: Optional[LaunchedRound]) -> None:
        """Round time and count; the policy's verdicts (learned now if a round runs ahead, else after the next
        launch; a round with a capture, compile or catch-up inside is no timing); each live row's generated
        tokens."""
        self.metrics.round_seconds += seconds
        self.metrics.num_rounds += 1
        if launched.k:
            self.metrics.record_draft_lengths(row.drafted for _, row in live)
        if self.policy.adaptive:
            self.verdicts = (launched.bucket, launched.k, seconds if clean else None,
                             [(r, row.accepted, row.drafted) for r, row in live])
            if ahead is not None:  # the device is busy: learn now
                self._learn(ahead)
        self.generated.update((r, row.generated) for r, row in live)

    def _learn(self, running: LaunchedRound) -> None:
        """With a round running on the device: the policy takes the last round's verdicts and prepares the
        decision after the one just launched (``running``)."""
        with span("learn"):
            self.policy.observe(*self.verdicts)
            self.policy.prepare(running.bucket, running.live_rows, running.remaining)
        self.verdicts = None

    def _apply_host_criteria(self, sync: list[RowAtSync]) -> None:
        cuts = host_criteria(self.runner, self.criteria, self.batch.prompt_width, sync)
        if cuts:
            self.runner.stop_rows(cuts)
            for i, n in cuts.items():
                sync[i].done, sync[i].generated, sync[i].kept = True, sync[i].generated - sync[i].kept + n, n

    def _host_reads(self, sync: list[RowAtSync]) -> None:
        """Host stopping criteria cut rows first; then ``output_scores`` / ``output_logits`` get the verify's own
        values of each committed token (what plain ``generate()`` returns; copies enqueued on the device, no wait)
        and a streamer its tokens."""
        c = self.committer
        if self.criteria:
            self._apply_host_criteria(sync)
        if not (c.keeps_outputs or c.stream is not None):
            return
        kept = [at.kept if row is not None else 0 for row, at in zip(self.rows, sync)]
        if c.keeps_outputs:
            scores, logits = self.runner.state.last_outputs(kept, c.keep_scores, c.keep_logits)
            c.keep([row for row, n in zip(self.rows, kept) for _ in range(n)], scores, logits)
        if c.stream is not None:
            for row, run, at in zip(self.rows, self.runner.state.last_runs(kept), sync):
                if row is not None:
                    c.stream.add(row, run, at.done)
            c.stream.flush()

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

