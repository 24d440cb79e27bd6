"""How many tokens to propose this round: k in [0, k_max], chosen from measured costs.

Where the draft agrees with the target, a text has runs of agreement, each ended by a token the
draft gets wrong. A round of k that starts at a run's first token accepts drafts along the run
and emits one token more: the target's own where the run ends, a free one after k accepted
drafts. A run of L agreements and its end take ceil((L + 1) / (k + 1)) rounds, so a row (an
n-gram row finding a match with probability ``m``) emits per round

    E_row(k) = 1 + m * (E[L + 1] / E[ceil((L + 1) / (k + 1))] - 1)   (at most its remaining tokens)

tokens; with one acceptance rate a for every draft (L geometric) that is 1 + m(a + ... + a^k).
On an H100 pair (fp32) it was not: the 2nd and 5th tokens of a run agreed with 0.56 and 0.36,
the others with 0.91-0.94, and k = 4 (whose 5th token is the free one) gave 28% more tokens per
round than k = 3 where a + ... + a^k expected 12-14%. A round costs ``c(B, k)`` seconds for the
whole bucket of B rows (draft steps plus a verify of k+1 tokens per row; k = 0 is a plain
decoding step through the same verify). A call ends when its slowest row ends, so the policy
minimises the time to finish the bottleneck row: ``argmin_k c(B, k) * max_rows remaining_row /
E_row(k)``. At batch 1 that is the row's own tokens per second; in a batch it follows the row
with the most work left per token a round gives it (measured on an H100: maximising the batch's
summed tokens per second instead picked long rounds that the fastest rows enjoyed while the
slowest set the pace).

* L per row: the j-th token of a run agrees, given the earlier ones, with the row's acceptance
  ``a`` moved in log-odds by ``d_j``, the log-odds of the drafts accepted at run position j over
  the row rates they were tested at, pooled over rows and calls (j up to two rounds of k_max + 1,
  the last repeating beyond; all d_j = 0 is the geometric model). A round after a rejection
  starts a run, one after a round that accepted all continues it past the token emitted (after
  other rounds the position is unknown and not counted). Where few drafts were seen lately, d_j
  leans on d_(j-1), or on 0 if higher, and a mean of the d_j below 0 is dropped: a position the
  rounds no longer reach is not judged worse than the one before (a longer round gets tried), and
  a row is not judged below its own rate, where rounds of k = 0 would bring no verdicts to undo
  it. Replayed on traces of that pair's shape (``benchmarks/synthetic_traces.py``) at batch 1 this
  reached 0.98-1.00 of the best fixed k, where ``a + ... + a^k`` reached 0.91-0.97.
* ``a`` per row: decayed counts of accepted / rejected drafts (a run that stops before the
  row's count is one rejection) on two memories. The short one (about five rounds) follows
  hard stretches of text; its prior, worth 16 drafts, is the row's long memory (about thirty
  rounds: a row whose text the draft never learned), whose own prior, worth 32 drafts, is the
  call's: this call's acceptance over all rows together with the earlier calls' (worth 32
  drafts; else 0.5). ``m`` (n-gram rows): matched / unmatched rounds on the long memory.
  Rounds of k = 0 say nothing about the draft, so during them the counts decay faster toward
  the prior: a row whose draft dipped on hard text is retried, while a useless draft (prior
  near 0) is not. The constants come from replaying this class on agreement traces of the
  project's pair (``benchmarks/policy_replay.py``): the call's own first verdicts as the
  prior, or a single per-row memory of about thirty rounds, left it 5-8% behind the best
  fixed k there.
* ``c(B, k)``: the wall time of rounds of that bucket and k on this machine (``round_costs.py``: the
  median of recent clean measurements, others on a line). The runner times rounds of k = 0 and k_max
  when it first uses a bucket (other k are captured and measured when first chosen); without graphs it learns
  them from its rounds: until ``k_max`` and ``0`` are both measured for a bucket, the policy tries them.
* The slowest row at a call's start: rows that have not drafted yet are all at the prior, but the slowest
  of them is not; they count as the slowest of as many rows spread as the batch's rows are
  (``row_spread.py``). That sets the length, not whether to draft: a k = 0 it alone chose would bring no
  verdicts, and the rows would stay unknown until the next probe.
* A call with no earlier call's acceptance to go on does not stop drafting before it has judged the draft: until
  it has seen ``_JUDGED_VERDICTS`` verdicts (or run ``_JUDGED_ROUNDS`` rounds of k > 0: n-gram rows without a match
  bring none) any k = 0 it would choose becomes its best k > 0 (unless no row has a second token left). Where a
  round of k_max costs about twice a plain step (a one-token step's fused layers against a verify's; the pair at
  b = 1 on an H200: 1.27 against 0.65 ms) 0.5 is the break-even, and rounds of k = 0 bring no verdicts.
* After a run of k = 0 the policy probes k > 0 for ``_PROBE_ROUNDS`` rounds (after 16, 32, 64, 128 rounds, a
  schedule kept across calls) so that a draft which starts to agree again is noticed; a probe that rows joining cut
  short is made again at the next decision of k = 0. Where k_max costs about twice a plain step (the break-even
  near acceptance 0.5), probes of one round, at most every 1024, left calls whose estimate had dipped below it at
  k = 0 with a draft that agreed 0.6-0.75 (an H200 e2e run's b = 1 benchmark of the pair: 1015 of 1016 rounds).
  Replays of synthetic traces at those costs, worst / mean of the best fixed k: 0.88 / 0.99 then, 0.975 / 1.017
  now; a useless draft 0.999 / 0.978 of plain steps, its catch-ups after each run of k = 0 not counted.
* The host work per round is a few array operations over rows x positions (numpy), not Python
  loops: at batch 32 a round lasts about 2 ms and per-row Python cost a tenth of it (H100). On
  CUDA graphs a decision stands two rounds (k = 0 sixteen; a probe four on either path); the cost table is
  rebuilt after every 16 new measurements, the d_j after 8 rounds that drafted.

Buckets fix the shape of a round, so k is one number per round.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .round_costs import RoundCosts
from .row_spread import between_rows_variance, slowest_quantile
from .run_positions import RunPositions

_DECAY = 0.8  # weight of older rounds in a row's short-memory counts: hard stretches of text are short
_LONG_DECAY = 0.97  # ... in its long-memory counts: a row whose text the draft never learned
_ROW_PRIOR_WEIGHT = 16.0  # pseudo-drafts of the row's long-memory acceptance in its short-memory one
_LONG_PRIOR_WEIGHT = 32.0  # pseudo-drafts of the call's prior in a row's long-memory acceptance
_ROW_SPREAD = 1  # rows whose rate is unknown (a call's start) count as the slowest of rows that differ (row_spread.py)
_SPREAD_STOPS_DRAFTING = False  # True: the spread may also choose k = 0 (before 2026-11-28; policy_replay --set)
_SPREAD_MIN_DRAFTS = 8.0  # long-memory drafts of a row before its rate is its own (and counts toward the spread)
_SPREAD_MIN_ROWS = 4  # ... and rows with that many before the spread is estimated (else the last call's)
_PRIOR_WEIGHT = 4.0  # pseudo-rounds of the prior in a row's match rate, and of 0.5 in a first call's prior
_CALL_PRIOR_WEIGHT = 32.0  # pseudo-drafts of the earlier calls' acceptance in a call's prior
_IDLE_DECAY = 0.9  # per round of k = 0: estimates drift back to the prior (an H100 run stuck at 0 after dips)
GRAPH_HOLD_ROUNDS = 2  # rounds a decision stands on CUDA graphs, where a round lasts a millisecond or two
_ZERO_HOLD = 8  # a decision of k = 0 on graphs stands this many times longer (a useless draft's rounds)
_FIRST_PROBE = 16
_JUDGED_VERDICTS = 4  # verdicts (accepted or rejected drafts) a call without earlier acceptance sees before k = 0
_JUDGED_ROUNDS = 8  # ... or rounds of k > 0 it runs (n-gram rows without a match bring no verdicts)
_PROBE_ROUNDS = 4  # rounds a probe stands: one round's verdicts barely move a row's estimate
_MAX_PROBE = 128  # a probe after long runs of 0 costs a catch-up of the draft model too


@dataclass
class _Decision:
    """A k chosen for a shape of round, standing for rounds (held) or made ahead (``prepare``)."""
    shape: tuple  # (bucket, live rows)
    k: int
    stands: int  # held: rounds it still stands after this one; made ahead: rounds it will stand
    probing: bool  # a probe of k > 0 after rounds of 0


class SpeculationLength:
    def __init__(self, k_max: int, adaptive: bool, method: str, memory: Optional[dict] = None,
                 hold_rounds: int = 1, execution: Optional[tuple] = None):
        """``memory``: what outlives a call (kept on the runner): round costs, the acceptance seen, the
        run-position corrections, the probing schedule. A fresh dict starts from nothing. ``hold_rounds``:
        a decision stands this many rounds of the same bucket while no row joins (the fast path's rounds last a
        millisecond or two, and the host's policy work delays the next one; estimates move slowly anyway).
        ``execution``: how this call's rounds run (the runner's (graphs, compiled code)); round costs are kept
        per execution, the rest of the memory is shared (None: the costs live in ``memory`` itself)."""
        self.k_max, self.adaptive, self.method = k_max, adaptive, method
        self.hold_rounds = hold_rounds
        self._held: Optional[_Decision] = None  # the decision that stands
        self.decisions_taken = 0  # rounds of ``choose`` that did not follow a standing decision
        self._stands = hold_rounds  # rounds the decision being made stands (set by _choose)
        self._probing = False  # the decision being made is a probe (set by _choose)
        self._pending: Optional[_Decision] = None  # a decision made ahead by prepare
        self.memory = memory if memory is not None else {}
        # A call that switches to the compiled code times its rounds afresh: the costs measured on the models'
        # uncompiled graphs (while compiling in the background) priced every k > 0 at about twice its cost, and
        # only k = 0, the one chosen, was measured again (an H200 pair at b = 32: k = 0 in 126 of 127 rounds).
        costs = self.memory if execution is None else \
            self.memory.setdefault("costs_by_execution", {}).setdefault(execution, {})
        self.costs = RoundCosts(k_max, costs, first_round_untimed=hold_rounds == 1)  # c(B, k) (round_costs.py)
        prior = self.memory.get("acceptance")
        self.call_prior = 0.5 if prior is None else prior
        self.seen = [0.0, 0.0]  # this call's accepted drafts and rejections over all rows (not decayed)
        self.drafting_rounds = 0  # this call's observed rounds of k > 0
        # per call row, decayed: accepted, rejected (short memory), matched, unmatched, accepted, rejected (long),
        # and the long memory's sum over rounds of weight^2 * verdicts (its sampling variance, row_spread)
        self.stats = np.zeros((0, 7))
        self.run_at = np.zeros(0, dtype=np.int64)  # per call row: its next round's run position (0: unknown)
        self.runs = RunPositions(k_max, self.memory)
        # per column of stats: per round observed, and per round of k = 0 (estimates drift back to the prior)
        self._decays = np.array([_DECAY] * 2 + [_LONG_DECAY] * 4 + [_LONG_DECAY ** 2])
        self._idle_decays = np.array([_IDLE_DECAY] * 6 + [_IDLE_DECAY ** 2])
        self.histogram: Counter = Counter()
        self._spread: Optional[float] = None  # row_spread(), until the stats move
        self.memory.setdefault("zero_streak", 0)
        self.memory.setdefault("probe_every", _FIRST_PROBE)

    def choose(self, bucket: int, rows: list[int], remaining: list[int]) -> int:
        """``rows``: the live rows; ``remaining``: tokens each may still emit."""
        shape = (bucket, len(rows))
        pending, self._pending = self._pending, None
        if self._holds(shape):
            self._held.stands -= 1
            k = self._held.k
        else:
            self._drop_probe(self._held)  # one that stood for rounds left, in a shape it does not fit
            if pending is not None and _fits(pending.shape, shape):
                k, self._stands, self._probing = pending.k, pending.stands, pending.probing
            else:
                self._drop_probe(pending)
                k = self._decide(bucket, rows, remaining)
            self._held = _Decision(shape, k, self._stands - 1, self._probing)
            self.decisions_taken += 1
            if self.adaptive and not self._probing:  # a fixed k leaves the memory to the adaptive calls
                self.memory["last_k"] = k
        self.histogram[k] += 1
        return k

    def prepare(self, bucket: int, rows: list[int], remaining: list[int]) -> None:
        """Make the next fresh decision now, while the device computes a round: the next ``choose`` of the
        same bucket (no row joined) takes it instead of deciding between a sync and the launch it delays (on an
        H100 host a decision cost 0.1-0.3 ms against rounds of about 1 ms at batch 1). It sees the
        estimates one round older; a decision whose shape no longer fits (``_fits``) is dropped."""
        if not self.adaptive or self._holds((bucket, len(rows))):
            return  # the next round follows the decision that stands
        k = self._decide(bucket, rows, remaining)
        self._pending = _Decision((bucket, len(rows)), k, self._stands, self._probing)

    def rows_joined(self) -> None:
        """Rows started since the last decision (waves under a cache budget; rows may have left at the same
        sync, so the count alone does not show it): the next round decides afresh."""
        self._drop_probe(self._held)
        self._drop_probe(self._pending)
        self._held = self._pending = None

    def _drop_probe(self, decision: Optional[_Decision]) -> None:
        """A probe (held with rounds left, or prepared) that will not run them: the next decision of k = 0 probes
        again instead of waiting out the schedule its start had moved on."""
        if decision is not None and decision.probing and decision.stands > 0:
            self.memory["zero_streak"] = self.memory["probe_every"]

    def _holds(self, shape: tuple) -> bool:
        """A decision that fits this (bucket, live rows) still stands a round."""
        held = self._held
        return held is not None and _fits(held.shape, shape) and held.stands > 0

    def _decide(self, bucket: int, rows: list[int], remaining: list[int]) -> int:
        """A fresh decision; ``_choose`` sets how long it stands and whether it is a probe."""
        self._stands, self._probing = self.hold_rounds, False
        return self._choose(bucket, rows, remaining)

    def _choose(self, bucket: int, rows: list[int], remaining: list[int]) -> int:
        """This round's k; ``self._stands``: the rounds it stands. A decision of 0 on graphs stands longer
        (until the next probe at most): the estimates then change only by drifting to the prior; a probe
        stands ``_PROBE_ROUNDS``."""
        if not self.adaptive or self.k_max == 0:
            return self.k_max
        for k in (self.k_max, 0):  # both ends measured first
            if (bucket, k) not in self.costs:
                self._stands = 1
                return k
        costs = self.cost_table(bucket)
        rates = 1.0 / (costs * self.bottleneck_rounds(rows, remaining))
        best = int(np.argmax(rates))
        # Rounds of k = 0 bring no verdicts: neither a draft not judged yet nor the spread below the prior (which
        # may shorten rounds) stops drafting, or the rows would stay unknown, and as pessimistic, until the next probe.
        if best == 0 and ((not self.judged and max(remaining, default=0) > 1) or (
                not _SPREAD_STOPS_DRAFTING
                and np.argmax(1.0 / (costs * self.bottleneck_rounds(rows, remaining, spread=False))) > 0)):
            best = 1 + int(np.argmax(rates[1:]))
        mem = self.memory
        if best > 0:
            mem["zero_streak"], mem["probe_every"] = 0, _FIRST_PROBE
            return best
        if mem["zero_streak"] < mem["probe_every"]:
            hold = self.hold_rounds * (_ZERO_HOLD if self.hold_rounds > 1 else 1)
            self._stands = max(1, min(hold, mem["probe_every"] - mem["zero_streak"]))
            mem["zero_streak"] += self._stands  # counted in rounds
            return 0
        mem["zero_streak"], mem["probe_every"] = 0, min(mem["probe_every"] * 2, _MAX_PROBE)
        self._stands, self._probing = _PROBE_ROUNDS, True
        return 1 + int(np.argmax(rates[1:]))

    @property
    def judged(self) -> bool:
        """Whether the draft has been judged: an earlier call's acceptance is known, or this call has seen enough
        verdicts or rounds that drafted to stop drafting on."""
        return ("acceptance" in self.memory or sum(self.seen) >= _JUDGED_VERDICTS
                or self.drafting_rounds >= _JUDGED_ROUNDS)

    @property
    def expects_no_drafts(self) -> bool:
        """The last decision (of this call or an earlier one; probes aside) was k = 0: a draft model not worth
        running."""
        return self.adaptive and self.method == "draft" and self.k_max > 0 and self.memory.get("last_k") == 0

    def bottleneck_rounds(self, rows: list[int], remaining: list[int], spread: bool = True) -> np.ndarray:
        """For k = 0..k_max: rounds the slowest row still needs, ``max_rows remaining / E_row(k)``; ``spread``:
        rows not yet known count as the slowest of rows that differ."""
        left = np.maximum(np.asarray(remaining, dtype=np.float64), 1.0)[:, None]
        index = self._rows(rows)  # first: it may grow the stats
        st = self.stats[index]
        m, a = self._matches(st)[:, None], self._rates(st)
        unknown = st[:, 4] + st[:, 5] < _SPREAD_MIN_DRAFTS  # rows whose own rate is not known yet
        n_unknown = int(unknown.sum())
        if spread and n_unknown > 1:  # the slowest of them, z_m spreads below the prior (row_spread.py)
            tau2 = self.row_spread()  # only here: most of a call's decisions know every row's rate
            if tau2 > 0.0:
                slowest = slowest_quantile(n_unknown) * np.sqrt(tau2)
                a = np.where(unknown, np.maximum(a - slowest, 1e-3), a)
        emitted = np.minimum(1.0 + m * (self.runs.tokens_per_round(a) - 1.0), left)
        return np.maximum((left / emitted).max(axis=0), 1.0)

    @property
    def prior(self) -> float:
        """This call's acceptance so far over the earlier calls' (worth ``_CALL_PRIOR_WEIGHT`` drafts): the
        first few verdicts of a call must not decide it (an H100 replay: a call that began on hard text
        judged its draft useless from a handful of rejections and stopped drafting for 48 rounds)."""
        acc, rej = self.seen
        weight = _CALL_PRIOR_WEIGHT if "acceptance" in self.memory else _PRIOR_WEIGHT
        p = (acc + weight * self.call_prior) / (acc + rej + weight)
        return min(max(p, 0.02), 0.98)

    def _rows(self, rows) -> np.ndarray:
        """The stats of these rows (grown with zeros for rows not seen yet)."""
        index = np.asarray(rows, dtype=np.int64)
        if index.size and index.max() >= len(self.stats):
            grow = int(index.max()) + 1 - len(self.stats)
            self.stats = np.concatenate([self.stats, np.zeros((grow, 7))])
            self.run_at = np.concatenate([self.run_at, np.zeros(grow, dtype=np.int64)])
        return index

    def _acceptance(self, rows) -> np.ndarray:
        index = self._rows(rows)  # first: it may grow the stats
        return self._rates(self.stats[index])

    def _rates(self, st: np.ndarray) -> np.ndarray:
        """Each row's acceptance from its stats: short memory over long memory over the call's prior."""
        long = (st[:, 4] + _LONG_PRIOR_WEIGHT * self.prior) / (st[:, 4] + st[:, 5] + _LONG_PRIOR_WEIGHT)
        return (st[:, 0] + _ROW_PRIOR_WEIGHT * long) / (st[:, 0] + st[:, 1] + _ROW_PRIOR_WEIGHT)

    def row_spread(self) -> float:
        """``tau^2``, how much this call's rows differ in acceptance (``row_spread.py``; kept for the next
        calls), else the last call's that had one (a call's start, batch 1), else 0."""
        if not _ROW_SPREAD:
            return 0.0
        if self._spread is None:
            st = self.stats
            tau2 = between_rows_variance(st[:, 4], st[:, 4] + st[:, 5], st[:, 6], _SPREAD_MIN_DRAFTS,
                                         _SPREAD_MIN_ROWS)
            if tau2 is not None:
                self.memory["row_spread"] = tau2
            self._spread = tau2 if tau2 is not None else self.memory.get("row_spread", 0.0)
        return self._spread

    def _match_rate(self, rows) -> np.ndarray:
        index = self._rows(rows)
        return self._matches(self.stats[index])

    def _matches(self, st: np.ndarray) -> np.ndarray:
        """Each row's n-gram match rate from its stats (a draft model always proposes)."""
        if self.method != "ngram":
            return np.ones(len(st))
        return (st[:, 2] + _PRIOR_WEIGHT * 0.5) / (st[:, 2] + st[:, 3] + _PRIOR_WEIGHT)

    def acceptance(self, row: int) -> float:
        return float(self._acceptance([row])[0])

    def match_rate(self, row: int) -> float:
        return float(self._match_rate([row])[0])

    def cost(self, bucket: int, k: int) -> float:
        return float(self.costs.table(bucket)[k])

    def cost_table(self, bucket: int) -> np.ndarray:
        return self.costs.table(bucket)

    def has_costs(self, bucket: int) -> bool:
        return self.costs.complete(bucket)

    def record_cost(self, bucket: int, k: int, seconds: float, drafted: bool = True) -> None:
        self.costs.record(bucket, k, seconds, drafted)

    def observe(self, bucket: int, k: int, seconds: Optional[float], verdicts: list[tuple[int, int, int]]) -> None:
        """After a round: its wall time (None when it included capture or compilation) and, per live row,
        ``(row, accepted, count)`` (count: drafts the row really proposed). A fixed k learns nothing."""
        if not self.adaptive:
            return
        v = np.asarray(verdicts, dtype=np.int64).reshape(-1, 3)
        self.drafting_rounds += k > 0
        if seconds is not None and not self.costs.warming_up(bucket, k):
            self.record_cost(bucket, k, seconds, drafted=k == 0 or not len(v) or bool(v[:, 2].any()))
        if not len(v):
            return
        self._spread = None  # the stats move
        index = self._rows(v[:, 0])
        if k == 0:  # no verdicts: each row's estimate relaxes toward the prior, so a dip is retried
            self.stats[index] *= self._idle_decays
            self.run_at[index] = 0
            return
        self.run_at[index] = self.runs.observe(self._acceptance(index), v[:, 1], v[:, 2], self.run_at[index])
        count = v[:, 2]
        drafted = count > 0
        accepted = np.where(drafted, v[:, 1], 0).astype(np.float64)
        rejected = ((v[:, 1] < count) & drafted).astype(np.float64)
        # one (rows, 7) increment in the stats' column order (a column at a time cost the host twice as much)
        self.stats[index] = self.stats[index] * self._decays + np.stack(
            [accepted, rejected, drafted, ~drafted, accepted, rejected, accepted + rejected], axis=1)
        self.seen[0] += float(accepted.sum())
        self.seen[1] += float(rejected.sum())

    def cost_summary(self) -> dict:
        return self.costs.summary()

    def end_call(self, metrics=None) -> None:
        """This call's prior at its end (its acceptance over the earlier calls') becomes the next call's
        (unchanged if nothing was drafted);
        the round costs the policy used go to ``metrics.round_costs_ms``."""
        if metrics is not None and self.adaptive:
            metrics.round_costs_ms = self.cost_summary()
        self.row_spread()  # the spread of this call's rows at its end, for the next call's start
        if self.seen[0] + self.seen[1]:
            self.memory["acceptance"] = self.prior


def _fits(made_for: tuple, shape: tuple) -> bool:
    """A decision made for (bucket, live rows) serves this one: no larger a bucket and no more live rows (rows
    that finished leave the bottleneck row where it was). At batch 32 rows leave at about a third of the
    syncs, and deciding afresh there put the policy's host work between the sync and the next launch
    (H200, bf16: about 80 us a round that ``prepare`` did not hide). A smaller bucket prices the k
    differently, but only for the rounds the decision still stands: the next one, prepared while the
    device works, is the new bucket's (H200: deciding at each of a b = 32 call's five moves to a
    smaller bucket took 0.27 ms of the host between a sync and the next launch)."""
    return shape[0] <= made_for[0] and shape[1] <= made_for[1]
