"""Whether the rows left in a call move to a smaller bucket now.

A round runs every row of its bucket, finished ones as padding, and a smaller bucket makes it only a little
cheaper: the project's pair on an H200, k = 1, 1.28 ms a round at bucket 32, 1.17 at 8 and 1.16 at 1 (k = 0: 0.98,
0.89, 0.78). With CUDA graphs a bucket is that cheap only once its graphs exist. The first move into one captures its
rounds (0.02-0.08 s a graph, a few per bucket), and below the attention's wide-grid threshold JIT-compiles other
kernels: the tail of a first b = 32 call stepped down through buckets 24, 16, 8, ... 1 in 3.8-5.9 s of captures
(three fresh processes) for a few milliseconds saved. So:

- without graphs, or in a tensor-parallel call (its ranks must move together): move to the smallest bucket;
- into a bucket whose graphs exist: move (the smallest such bucket that holds the rows);
- else each round run while the rows would fit the smallest bucket credits that bucket with ``SAVING`` of the
  round's time, across the calls of one runner key; once the credit pays for ``GRAPHS`` captures at the key's mean
  capture time, the rows move there and it is captured (ski rental: a key that keeps meeting such tails gets them).
"""
from __future__ import annotations

from typing import Optional

from ..runner import SpecRunner, bucket_for

SAVING = 0.1  # share of a round's time a bucket the rows fit saves (8-20% measured for 32 -> 8..1, above)
GRAPHS = 4  # captures a bucket's first rounds need at least: k = 0 and the largest k, each propose and verify
DEFAULT_CAPTURE_S = 0.1  # a capture's cost before this key has captured anything


class BucketMoves:
    def __init__(self, runner: SpecRunner, lockstep: bool = False):
        """``lockstep``: ranks of a tensor-parallel call, which must move together; the credit follows each one's
        own timings, so they move at once, as without graphs."""
        self.runner, self.lockstep = runner, lockstep

    def target(self, rows: int) -> Optional[int]:
        """The bucket the ``rows`` still running move to now, or None: they stay in the current one."""
        runner, current = self.runner, self.runner.state.size
        smallest = bucket_for(rows)
        if smallest >= current:
            return None
        if not runner.graphed or self.lockstep:
            return smallest
        captured, mean = runner.slot.captures()
        if runner.slot.move_credit.get(smallest, 0.0) >= GRAPHS * (DEFAULT_CAPTURE_S if mean is None else mean):
            return smallest
        return next((b for b in _buckets_between(smallest, current) if b in captured), None)

    def credit(self, rows: int, round_seconds: float) -> None:
        """A round ran in a larger bucket than ``rows`` need (they stayed): credit the smallest bucket holding them."""
        slot, smallest = self.runner.slot, bucket_for(rows)
        if self.runner.graphed and smallest < self.runner.state.size and smallest not in slot.captures()[0]:
            slot.move_credit[smallest] = slot.move_credit.get(smallest, 0.0) + SAVING * round_seconds


def _buckets_between(smallest: int, current: int) -> list[int]:
    """The buckets from ``smallest`` up to (not including) ``current``, ascending."""
    out, b = [], smallest
    while b < current:
        out.append(b)
        b = bucket_for(b + 1)
    return out
