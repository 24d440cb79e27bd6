"""How many tokens to propose this round: k in [0, k_max], chosen from measured costs.

A round of k drafts emits, for a row whose drafts are accepted independently with
probability ``a`` (and, for n-gram rows, which find a match with probability ``m``),

    E_row(k) = 1 + m * (a + a^2 + ... + a^k)      (at most the row's remaining tokens)

tokens, and costs ``c(B, k)`` seconds for the whole bucket of B rows (draft steps plus a
verify of k+1 tokens per row; k = 0 is a plain decoding step through the same verify).
A call ends when its slowest row ends, so the policy minimises the time to finish the
bottleneck row: ``argmin_k c(B, k) * max_rows remaining_row / E_row(k)``. At batch 1 that is
the row's own tokens per second; in a batch it follows the row with the most work left per
token a round gives it (measured on an H100: maximising the batch's summed tokens per second
instead picked long rounds that the fastest rows enjoyed while the slowest set the pace).

* ``a`` and ``m`` per row: decayed counts of accepted / rejected drafts (a run that stops
  before the row's count is one rejection) over a prior: this call's acceptance over all
  rows, or before that the acceptance of earlier calls (else 0.5). Rounds of k = 0 say
  nothing about the draft, so during them the counts decay faster toward the prior: a row
  whose draft dipped on hard text is retried, while a useless draft (prior near 0) is not.
* ``c(B, k)``: the wall time of rounds of that bucket and k on this machine (graph
  replays: stable), kept across calls by the caller. Until ``k_max`` and ``0`` are both
  measured for a bucket, the policy tries them; other k are interpolated linearly from
  the measured ones until tried.
* After a run of k = 0 the policy probes k > 0 once (after 16, 32, 64 ... 256 rounds, a
  schedule kept across calls) so that a draft which starts to agree again is noticed.

Buckets fix the shape of a round, so k is one number per round.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

_DECAY = 0.97  # weight of older rounds in a row's acceptance counts (a short memory chases noise)
_PRIOR_WEIGHT = 4.0  # pseudo-rounds of the prior
_IDLE_DECAY = 0.9  # per round of k = 0: estimates drift back to the prior (an H100 run stuck at 0 after dips)
_COST_EMA = 0.3  # weight of the newest measurement of a round's cost
_FIRST_PROBE = 16
_MAX_PROBE = 256


class SpeculationLength:
    def __init__(self, k_max: int, adaptive: bool, method: str, memory: Optional[dict] = None):
        """``memory``: what outlives a call (kept on the runner): round costs, the acceptance seen, the
        probing schedule. A fresh dict starts from nothing."""
        self.k_max, self.adaptive, self.method = k_max, adaptive, method
        self.memory = memory if memory is not None else {}
        self.costs = self.memory.setdefault("costs", {})  # (bucket, k) -> seconds
        prior = self.memory.get("acceptance")
        self.call_prior = 0.5 if prior is None else prior
        self.seen = [0.0, 0.0]  # this call's accepted drafts and rejections over all rows (not decayed)
        self.rows: dict[int, list[float]] = {}  # row -> [accepted, rejected, matched, unmatched] (decayed)
        self.histogram: Counter = Counter()
        self.memory.setdefault("zero_streak", 0)
        self.memory.setdefault("probe_every", _FIRST_PROBE)

    def choose(self, bucket: int, rows: list[int], remaining: list[int]) -> int:
        """``rows``: the live rows; ``remaining``: tokens each may still emit."""
        k = self._choose(bucket, rows, remaining)
        self.histogram[k] += 1
        return k

    def _choose(self, bucket: int, rows: list[int], remaining: list[int]) -> int:
        if not self.adaptive or self.k_max == 0:
            return self.k_max
        for k in (self.k_max, 0):  # both ends measured first
            if (bucket, k) not in self.costs:
                return k
        rounds_left = self.bottleneck_rounds(rows, remaining)
        rates = [1.0 / (self.cost(bucket, k) * rounds_left[k]) for k in range(self.k_max + 1)]
        best = max(range(self.k_max + 1), key=rates.__getitem__)
        mem = self.memory
        if best > 0:
            mem["zero_streak"], mem["probe_every"] = 0, _FIRST_PROBE
            return best
        mem["zero_streak"] += 1
        if mem["zero_streak"] < mem["probe_every"]:
            return 0
        mem["zero_streak"], mem["probe_every"] = 0, min(mem["probe_every"] * 2, _MAX_PROBE)
        return max(range(1, self.k_max + 1), key=rates.__getitem__)

    def bottleneck_rounds(self, rows: list[int], remaining: list[int]) -> list[float]:
        """For k = 0..k_max: rounds the slowest row still needs, ``max_rows remaining / E_row(k)``."""
        worst = [1.0] * (self.k_max + 1)
        for r, left in zip(rows, remaining):
            a, m, left = self.acceptance(r), self.match_rate(r), max(left, 1)
            power, run = 1.0, 0.0
            worst[0] = max(worst[0], float(left))
            for k in range(1, self.k_max + 1):
                power *= a
                run += power
                worst[k] = max(worst[k], left / min(1.0 + m * run, left))
        return worst

    @property
    def prior(self) -> float:
        """This call's acceptance so far once it has seen a few drafts, else the previous calls'."""
        acc, rej = self.seen
        p = acc / (acc + rej) if acc + rej >= 4 else self.call_prior
        return min(max(p, 0.02), 0.98)

    def acceptance(self, row: int) -> float:
        acc, rej, *_ = self.rows.get(row, (0.0, 0.0, 0.0, 0.0))
        return (acc + _PRIOR_WEIGHT * self.prior) / (acc + rej + _PRIOR_WEIGHT)

    def match_rate(self, row: int) -> float:
        if self.method != "ngram":
            return 1.0
        *_, hit, miss = self.rows.get(row, (0.0, 0.0, 0.0, 0.0))
        return (hit + _PRIOR_WEIGHT * 0.5) / (hit + miss + _PRIOR_WEIGHT)

    def cost(self, bucket: int, k: int) -> float:
        """Measured seconds of a round, or a line through the measured ones (k >= 1 preferred)."""
        measured = {j: c for (b, j), c in self.costs.items() if b == bucket}
        if k in measured:
            return measured[k]
        points = sorted((j, c) for j, c in measured.items() if j >= 1)
        if len(points) < 2:
            points = sorted(measured.items())
        (k0, c0), (k1, c1) = points[0], points[-1]
        slope = (c1 - c0) / (k1 - k0) if k1 != k0 else 0.0
        return max(c0 + slope * (k - k0), 1e-9)

    def observe(self, bucket: int, k: int, seconds: Optional[float], verdicts: list[tuple[int, int, int]]) -> None:
        """After a round: its wall time (None when it included capture or compilation) and, per live row,
        ``(row, accepted, count)`` (count: drafts the row really proposed)."""
        if seconds is not None:
            old = self.costs.get((bucket, k))
            self.costs[(bucket, k)] = seconds if old is None else (1 - _COST_EMA) * old + _COST_EMA * seconds
        if k == 0:  # no verdicts: each row's estimate relaxes toward the prior, so a dip is retried
            for row, *_ in verdicts:
                if row in self.rows:
                    self.rows[row] = [x * _IDLE_DECAY for x in self.rows[row]]
            return
        for row, accepted, count in verdicts:
            acc, rej, hit, miss = (x * _DECAY for x in self.rows.get(row, (0.0, 0.0, 0.0, 0.0)))
            if count > 0:
                acc, rej, hit = acc + accepted, rej + (accepted < count), hit + 1
                self.seen[0] += accepted
                self.seen[1] += accepted < count
            else:
                miss += 1
            self.rows[row] = [acc, rej, hit, miss]

    def end_call(self) -> None:
        """The acceptance seen in this call becomes the next call's prior (unchanged if nothing was drafted)."""
        acc, rej = self.seen
        if acc + rej:
            self.memory["acceptance"] = acc / (acc + rej)
