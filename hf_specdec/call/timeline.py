"""A public hook to see where a call spends its host time: ``with hf_specdec.record_timeline() as tl:``.

The call loop marks its steps (``STEPS``) with ``span(name)``; while a timeline is being recorded each
span appends ``(name, start, end)`` (``time.perf_counter`` seconds) to it, otherwise ``span`` costs a
global read. Benchmarks (``benchmarks/host_timeline.py``) observe calls through this, not by wrapping
the library's private methods.
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterator, Optional

STEPS = {
    "setup": "request checks, path choice, cache sizing, runner.begin",
    "prefill": "rows start: the target reads their prompts, first tokens committed, the draft reads them",
    "choose": "the speculation-length policy picks a round's k (and times buckets it has not priced)",
    "launch": "a round's graph replays are issued (without graphs: its code runs)",
    "wait": "the round's one host synchronisation (the device finishing it)",
    "learn": "the policy takes the last round's verdicts and prepares its next decision",
    "host_reads": "host stopping criteria, output_scores/logits and the streamer on the round's tokens",
    "retire": "finished rows go back to the batch and free their blocks",
    "join": "waiting rows start in freed blocks and the bucket is rebuilt",
    "shrink": "the survivors move to a smaller bucket",
    "finish": "statistics, padding steps and the output",
}


class Timeline:
    def __init__(self):
        self.spans: list[tuple[str, float, float]] = []

    def totals(self) -> dict[str, float]:
        """Seconds per step name, summed."""
        out: dict[str, float] = {}
        for name, start, end in self.spans:
            out[name] = out.get(name, 0.0) + end - start
        return out


_active: Optional[Timeline] = None


@contextlib.contextmanager
def record_timeline() -> Iterator[Timeline]:
    """Record the steps of every call made inside the block (one thread's calls; not nested)."""
    global _active
    previous, _active = _active, Timeline()
    try:
        yield _active
    finally:
        _active = previous


@contextlib.contextmanager
def _recorded(timeline: Timeline, name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timeline.spans.append((name, start, time.perf_counter()))


def span(name: str):
    """Mark one step of a call (a no-op unless a timeline is being recorded)."""
    return _recorded(_active, name) if _active is not None else contextlib.nullcontext()
