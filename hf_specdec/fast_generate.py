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
               own) run on the tokens just committed; a stop cuts the row on the device
    shrink     finished rows go back to the call's buffer; waiting rows join in the blocks
               they freed, or the survivors move to a smaller bucket when they fit one
"""
from __future__ import annotations

import time
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
from .runner import RoundSpec, SpecRunner, bucket_for
from .strategies.speculation_length import SpeculationLength


def run_fast(runner: SpecRunner, batch: SequenceBatch, spec: RoundSpec, logits: LogitsPipeline,
             committer: Committer, eos_ids: list[int], metrics: SpecMetrics, timer: StageTimer,
             admission: Admission, policy: SpeculationLength) -> None:
    waves = FastRows(runner, batch, admission, spec, logits, committer, timer)
    if policy.expects_no_drafts:
        runner.defer_draft()  # the draft reads the prompts only if a round drafts
    rows = waves.start()  # prefill and first token of every row the cache budget holds
    if not rows:
        return
    runner.load(rows, eos_ids)
    criteria = committer.criteria
    captured = set()
    generated = {r: batch.gen_len[r] for r in rows}

    def launch(live_rows: list[int], remaining: list[int]) -> tuple:
        """Choose a round's k and start the round in the current bucket (graph replays return before the
        device is done). Called with the device idle (after a sync), so a bucket's first round may capture."""
        bucket = runner.state.size
        if policy.adaptive and bucket not in captured:
            # the two ends price every k between them (round_costs.py's line), timed clean; another k's graphs are
            # captured when the policy first picks it (that round is not timed), so warm-up does not grow with k
            ends = sorted({0, spec.k})
            runner.capture(ends)
            if runner.key.graphs and not policy.has_costs(bucket):
                for k, seconds in runner.time_rounds(ends).items():
                    for sample in seconds:
                        policy.record_cost(bucket, k, sample)
            captured.add(bucket)
        k = policy.choose(bucket, live_rows, remaining)
        warm, start = runner.warmup_seconds, time.perf_counter()
        return k, start, warm, runner.round(k), bucket

    def learn(verdicts: tuple, bucket: int, live_rows: list[int], remaining: list[int]) -> None:
        """With a round running on the device: the policy takes the last round's verdicts and prepares the
        decision after the one just launched."""
        policy.observe(*verdicts)
        policy.prepare(bucket, live_rows, remaining)

    ahead = None  # a round started before the previous round's bookkeeping, which ran while the device worked
    verdicts = None  # a round's verdicts for the policy, observed once the next round is launched
    while True:
        if ahead is None:
            live_rows = [r for r in rows if r is not None]
            remaining = [batch.max_new_tokens - generated.get(r, 0) for r in live_rows]
            ahead = launch(live_rows, remaining)
            if verdicts is not None:  # no round started ahead (rows wait to join, or host criteria): the last
                learn(verdicts, ahead[4], live_rows, remaining)  # verdicts waited for this launch
                verdicts = None
        k, start, warm, caught_up, bucket = ahead
        host = runner.read()  # the round's one sync (of the current bucket: a move to a smaller one came after it)
        seconds = time.perf_counter() - start
        clean = runner.warmup_seconds == warm and not caught_up  # no capture, compile or catch-up inside
        metrics.round_seconds += seconds
        metrics.num_rounds += 1
        live_host = [(r, h) for r, h in zip(rows, host) if r is not None]
        running = [(r, h) for r, h in live_host if not h[0]]
        ahead = None
        if running and not criteria and not admission.waiting:
            # the next round starts now, in this bucket: rows that just finished are done on the device (their
            # results are not kept, and the blocks they write go to no other row: none waits for them). This
            # sync's bookkeeping (the policy's, finished rows leaving, a move to a smaller bucket) runs on the
            # host while the device computes it, and the move follows that round on the device.
            ahead_rows = ([r for r, _ in running], [batch.max_new_tokens - h[1] for _, h in running])
            ahead = launch(*ahead_rows)
        if policy.adaptive:
            verdicts = (bucket, k, seconds if clean else None, [(r, h[3], h[4]) for r, h in live_host])
            if ahead is not None:  # the device is busy: learn now
                learn(verdicts, bucket, *ahead_rows)
                verdicts = None
        generated.update((r, h[1]) for r, h in live_host)
        if criteria:
            cuts = host_criteria(runner, criteria, batch.prompt_width, host)
            if cuts:
                runner.stop_rows(cuts)
                for i, n in cuts.items():
                    host[i][0], host[i][1] = 1, host[i][1] - host[i][2] + n
        live = []
        for i, (done, gen, *_) in enumerate(host):
            if i < len(rows) and rows[i] is not None:
                if done:
                    runner.store(i, rows[i], gen)  # after a round started ahead: its writes past the row's end
                    waves.finish([rows[i]])  # are cut by SequenceBatch.sequences
                    rows[i] = None
                else:
                    live.append(i)
        joined = waves.join(rows, live, host, eos_ids)  # waiting rows start in the blocks freed (none ran ahead)
        if joined is not None:
            policy.rows_joined()
            rows = joined
            generated.update((r, batch.gen_len[r]) for r in rows if r not in generated)
            continue
        if not live:
            if verdicts is not None:
                policy.observe(*verdicts)  # the call's last verdicts (its acceptance goes to the next call's prior)
            break
        if bucket_for(len(live)) < runner.state.size:
            # non_blocking: a plain copy to the device waits for the stream, i.e. for the round started ahead
            runner.shrink(torch.tensor(live).to(batch.device, non_blocking=True))
            rows = [rows[i] for i in live]
    metrics.record_totals(**runner.statistics())
    metrics.k_histogram = dict(sorted(policy.histogram.items()))


def host_criteria(runner: SpecRunner, criteria: StoppingCriteriaList, prompt_width: int,
                  host: list[list[int]]) -> dict[int, int]:
    """Bucket row -> tokens kept of its last run, for rows a criterion stopped. Each criterion sees
    the ``input_ids`` plain generate would pass after each committed token (grouped by length)."""
    s = runner.state
    k1 = s.scores.shape[0] // s.size
    cuts: dict[int, int] = {}
    for j in range(max((h[2] for h in host), default=0)):
        live = [i for i, (done, gen, keep, *_) in enumerate(host) if j < keep and i not in cuts]
        scores = s.scores[torch.tensor(live, dtype=torch.long, device=s.hist.device) * k1 + j]
        lengths = [prompt_width + host[i][1] - host[i][2] + j + 1 for i in live]
        hits = stop_hits(criteria, s.hist, live, lengths, scores)
        cuts.update({i: j + 1 for i, h in zip(live, hits) if h})
    return cuts


def round_spec(k: int, do_sample: bool, acceptance: str, logits_fn, generator: Optional[torch.Generator],
               posterior_threshold: float, posterior_alpha: float, method: str = "draft",
               ngram_sizes: tuple = (1, 3)) -> RoundSpec:
    return RoundSpec(k, do_sample, "greedy" if not do_sample else acceptance, logits_fn, generator,
                     posterior_threshold, posterior_alpha, method, ngram_sizes)
