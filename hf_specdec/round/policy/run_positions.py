"""Runs of agreement for the speculation-length policy (its docstring, ``speculation_length.py``, gives
the math): per run position j, the pooled log-odds correction ``d_j`` of a row's acceptance there, and
the tokens per round of each k, ``E[L + 1] / E[ceil((L + 1) / (k + 1))]``, that the corrected hazards
give. A round of k that accepts all k drafts emits the target's token free at position k + 1, so on a
pair whose 5th token of a run is hard, k = 4 beats k = 3 by more than a single rate per row says.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

_RUN_DECAY = 0.998  # per round that drafts: weight of older rounds in the run-position corrections d_j
_RUN_PRIOR = 8.0  # pseudo-drafts of d_j's prior (d_(j-1), or 0 if higher) in d_j
_RUN_SPAN = 2  # run positions modelled, in rounds of k_max + 1 (the last d_j repeats beyond)
_RUN_REFRESH = 8  # rounds that drafted before the d_j are rebuilt


class RunPositions:
    """Per run position j = 1..P (``_RUN_SPAN`` rounds of k_max + 1; later ones count as P), pooled over rows
    and calls (``memory["runs"][k_max]``), decayed: drafts tested there, accepted, and the row rates they met."""

    def __init__(self, k_max: int, memory: dict):
        self.k_max, self.span = k_max, _RUN_SPAN * (k_max + 1)
        self.table = memory.setdefault("runs", {}).setdefault(k_max, np.zeros((3, self.span)))  # per k_max
        self._odds: Optional[np.ndarray] = None  # exp(d_j), rebuilt after _RUN_REFRESH rounds
        self._fresh = 0
        ks, positions = np.arange(k_max + 1), np.arange(self.span + 1)
        self._every = (positions[:, None] % (ks + 1) == 0).astype(np.float64)  # S_j summed where k + 1 divides j
        self._tail = (self.span // (ks + 1) + 1) * (ks + 1) - self.span  # the first such j past P, minus P
        self._offset, self._lengths = np.arange(k_max), ks + 1
        self._columns = (np.arange(3) * self.span)[:, None, None]

    def observe(self, a: np.ndarray, accepted: np.ndarray, count: np.ndarray, start: np.ndarray) -> np.ndarray:
        """A round that drafted: a row whose run position ``start`` is known tested ``start + i`` for
        i < min(accepted + 1, count), the first ``accepted`` agreeing, at its rate ``a``. Returns where each
        row's next round starts: 1 after a rejection, past the emitted token after a round that accepted
        all, 0 (unknown) after a round without drafts or from an unknown start."""
        position = np.minimum(np.maximum(start, 1)[:, None] + self._offset, self.span) - 1
        tested = (self._offset < np.minimum(accepted + 1, count)[:, None]) & (start[:, None] > 0)
        weights = np.stack([tested, tested & (self._offset < accepted[:, None]), tested * a[:, None]])
        self.table *= _RUN_DECAY
        self.table += np.bincount((position + self._columns).ravel(), weights.ravel(),
                                  minlength=3 * self.span).reshape(3, -1)
        self._fresh += 1
        return np.where(accepted < count, 1, np.where(start > 0, start + count + 1, 0)) * (count > 0)

    def odds_factors(self) -> np.ndarray:
        """exp(d_j), j = 1..P: the log-odds of the drafts accepted at j over the row rates they met, less their
        mean if negative, toward d_(j-1) (or 0 if higher) by ``_RUN_PRIOR`` pseudo-drafts."""
        if self._odds is None or self._fresh >= _RUN_REFRESH:
            tested, accepted, expected = self.table
            seen = np.clip(accepted / np.maximum(tested, 1e-9), 5e-3, 0.995)
            rate = np.clip(expected / np.maximum(tested, 1e-9), 5e-3, 0.995)
            raw = np.log(seen * (1.0 - rate) / ((1.0 - seen) * rate))
            raw -= min((tested * raw).sum() / max(tested.sum(), 1e-9), 0.0)  # never below the rows' rates
            corrections, previous = [], 0.0
            for n, d in zip(tested.tolist(), raw.tolist()):  # O(P) scalars
                previous = (n * d + _RUN_PRIOR * max(previous, 0.0)) / (n + _RUN_PRIOR)
                corrections.append(previous)
            self._odds, self._fresh = np.exp(corrections), 0
        return self._odds

    def tokens_per_round(self, a: np.ndarray) -> np.ndarray:
        """Rows x k = 0..k_max: ``E[L + 1] / E[ceil((L + 1) / (k + 1))] = sum_j S_j / sum_n S_n(k+1)``, S_j =
        P(L >= j) from each row's hazards (geometric past P)."""
        a = np.clip(a, 1e-3, 0.999)
        odds = (a / (1.0 - a))[:, None] * self.odds_factors()
        survival = np.ones((len(a), self.span + 1))
        h = np.minimum(odds / (1.0 + odds), 0.995)
        np.cumprod(h, axis=1, out=survival[:, 1:])
        last, tail = survival[:, -1:], h[:, -1:]
        tokens = survival.sum(axis=1, keepdims=True) + last * tail / (1.0 - tail)
        rounds = survival @ self._every + last * tail ** self._tail / (1.0 - tail ** self._lengths)
        return tokens / rounds
