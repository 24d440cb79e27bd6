"""``c(B, k)`` for the speculation-length policy: the wall time of a round of k drafts at a bucket of B rows
on this machine, from the rounds it measured (``speculation_length.py`` decides with it).

A round's cost is the median of its last few clean measurements (graph replays are steady; a host stall
in one round must not price a k out for good); a k not measured lies on the line through the measured
ones (through the measured k >= 1 where two exist: a round that drafts pays for the draft). The samples
live in the policy's memory (``memory["costs"]``: (bucket, k) -> seconds), one memory per way the rounds run
(graphs, compiled code), so they outlive a call; the runner seeds them on graphs by timing rounds of k = 0
and k_max when it first uses a bucket on that way (the line prices the k between until their own rounds are
measured). Without graphs the
first round of each (bucket, k) in a call is not timed (one-time work), and a round in which no row
drafted (no n-gram match) stands in for its k only until a round that drafted is measured.
"""
from __future__ import annotations

from collections import Counter
from statistics import median

import numpy as np

_TABLE_REFRESH = 16  # new cost measurements of a bucket before its table is rebuilt
_COST_SAMPLES = 7  # clean measurements of a round's cost kept (their median is the cost)


class RoundCosts:
    def __init__(self, k_max: int, memory: dict, first_round_untimed: bool):
        """``first_round_untimed``: a call's first round of each (bucket, k) carries one-time work (no graphs)."""
        self.k_max, self.first_round_untimed = k_max, first_round_untimed
        self.samples = memory.setdefault("costs", {})  # (bucket, k) -> recent clean seconds
        self.stand_ins = memory.setdefault("stand_ins", set())  # (bucket, k) priced by a round without drafts
        self._tables: dict[int, np.ndarray] = {}  # bucket -> table, until _TABLE_REFRESH new measurements
        self._fresh: Counter = Counter()  # bucket -> measurements since its table was built
        self._timed: set = set()  # (bucket, k) whose first round of this call was dropped as warm-up

    def __contains__(self, key: tuple) -> bool:
        return key in self.samples

    def table(self, bucket: int) -> np.ndarray:
        """Seconds of a round of k = 0..k_max at this bucket."""
        table = self._tables.get(bucket)
        if table is None:
            table = self._tables[bucket] = self._build(bucket)
        return table

    def _build(self, bucket: int) -> np.ndarray:
        measured = {k: median(c) for (b, k), c in self.samples.items() if b == bucket and k <= self.k_max}
        points = sorted((k, c) for k, c in measured.items() if k >= 1)
        if len(points) < 2:
            points = sorted(measured.items())
        ks = np.arange(self.k_max + 1, dtype=np.float64)
        if not points:
            return np.ones(self.k_max + 1)
        (k0, c0), (k1, c1) = points[0], points[-1]
        slope = (c1 - c0) / (k1 - k0) if k1 != k0 else 0.0
        table = np.maximum(c0 + slope * (ks - k0), 1e-9)
        for k, c in measured.items():
            table[k] = c
        return table

    def complete(self, bucket: int) -> bool:
        """Both ends of this bucket (k = 0 and k_max) measured, in this call or an earlier one: the line through
        them prices the k between until their own rounds are measured."""
        return all((bucket, k) in self.samples for k in {0, self.k_max})

    def record(self, bucket: int, k: int, seconds: float, drafted: bool = True) -> None:
        """One clean measurement of a round of ``k`` at ``bucket`` rows. The table follows at once while a k
        has few samples (the runner's first timings), else after ``_TABLE_REFRESH`` of them. A round of
        k > 0 in which no row drafted (n-gram rows without a match) only stands in until a round that
        drafted is measured: it did not do a drafting round's work."""
        key, stand_ins = (bucket, k), self.stand_ins
        if not drafted:
            if key in self.samples and key not in stand_ins:
                return
            stand_ins.add(key)
        elif key in stand_ins:
            stand_ins.discard(key)
            self.samples.pop(key, None)
        samples = self.samples.setdefault(key, [])
        self._fresh[bucket] += 1
        if len(samples) < 3 or self._fresh[bucket] >= _TABLE_REFRESH:
            self._tables.pop(bucket, None)
            self._fresh[bucket] = 0
        samples.append(seconds)
        del samples[:-_COST_SAMPLES]

    def warming_up(self, bucket: int, k: int) -> bool:
        """Without graphs the first round of each (bucket, k) in a call is not timed: it carries one-time work
        (a fresh process's first n-gram round on the CPU took 13.4 ms, later ones 7.3, and priced drafting
        out of its call), as the fast path drops rounds that captured."""
        if not self.first_round_untimed or (bucket, k) in self._timed:
            return False
        self._timed.add((bucket, k))
        return True

    def summary(self) -> dict:
        """Milliseconds of a round per bucket and k as the policy sees them (for spec_metrics)."""
        buckets = sorted({b for b, _ in self.samples})
        return {b: {k: round(float(c) * 1e3, 3) for k, c in enumerate(self.table(b))} for b in buckets}
