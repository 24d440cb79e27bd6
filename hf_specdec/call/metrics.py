"""Acceptance and timing statistics of one speculative generate() call."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch


@dataclass
class SpecMetrics:
    """Counts follow vLLM: a *draft* is one sequence's proposal in one round; accepted tokens
    count the accepted prefix only; mean acceptance length counts the bonus token too."""

    num_speculative_tokens: int = 0
    num_rounds: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    accepted_per_position: list = field(default_factory=list)
    draft_lengths: dict = field(default_factory=dict)  # tokens a draft proposed -> drafts (each round's sync)
    prefill_seconds: float = 0.0  # rows' prefills and first tokens (capture excluded: warm-up)
    round_seconds: float = 0.0  # launch to sync of every round
    total_seconds: float = 0.0
    k_histogram: dict = field(default_factory=dict)  # k -> rounds that proposed k tokens
    round_costs_ms: dict = field(default_factory=dict)  # adaptive k: bucket -> k -> a round's cost it used
    num_row_rounds: int = 0  # live rows summed over rounds
    fast_path: str = ""  # "graphs+compile", "graphs", "bucketed" or "bucketed: <why no graphs>" (call/path_choice.py)
    warmup_seconds: float = 0.0  # graph capture and compilation inside this call

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def match_fraction(self) -> float:
        """Rows that proposed something, per row and round that could (n-gram: rows that found a match)."""
        return self.num_drafts / self.num_row_rounds if self.num_row_rounds else 0.0

    @property
    def acceptance_per_position(self) -> list:
        """Share of drafts whose j-th token was accepted (as part of the accepted prefix): vLLM's definition, whose
        later positions read low where rounds proposed fewer tokens (adaptive k)."""
        return [a / self.num_drafts if self.num_drafts else 0.0 for a in self.accepted_per_position]

    @property
    def drafted_per_position(self) -> list:
        """Drafts that proposed a j-th token."""
        return drafts_reaching(self.draft_lengths, len(self.accepted_per_position))

    @property
    def acceptance_per_drafted_position(self) -> list:
        """Share of the drafts that proposed a j-th token in which it was accepted (with every token before it):
        the draft's agreement at each position whatever lengths the rounds chose."""
        return [a / n if n else 0.0 for a, n in zip(self.accepted_per_position, self.drafted_per_position)]

    def record_draft_lengths(self, lengths) -> None:
        """One round's draft lengths, a row each (0: the row proposed nothing), as its sync read them."""
        hist = self.draft_lengths
        for d in lengths:
            if d:
                hist[d] = hist.get(d, 0) + 1

    def record_totals(self, rows: int, drafts: int, draft_tokens: int, accepted: int, per_position: list) -> None:
        """Statistics of rounds that proposed (summed on the device over the call)."""
        self.num_row_rounds += rows
        self.num_drafts += drafts
        self.num_draft_tokens += draft_tokens
        self.num_accepted_tokens += accepted
        width = max(len(self.accepted_per_position), len(per_position))
        old = self.accepted_per_position + [0] * (width - len(self.accepted_per_position))
        new = list(per_position) + [0] * (width - len(per_position))
        self.accepted_per_position = [a + b for a, b in zip(old, new)]

    @property
    def decode_seconds(self) -> float:
        """Wall time after prefill, without graph capture and compilation."""
        return self.total_seconds - self.prefill_seconds - self.warmup_seconds

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, match_fraction=self.match_fraction,
                 mean_acceptance_length=self.mean_acceptance_length,
                 acceptance_per_position=self.acceptance_per_position, drafted_per_position=self.drafted_per_position,
                 acceptance_per_drafted_position=self.acceptance_per_drafted_position,
                 decode_seconds=self.decode_seconds)
        return d


def drafts_reaching(draft_lengths: dict, positions: int) -> list:
    """From a histogram of draft lengths (length -> drafts; string keys as JSON writes them too): the drafts that
    proposed a j-th token, for j < ``positions``."""
    return [sum(n for d, n in draft_lengths.items() if int(d) > j) for j in range(positions)]


class StageTimer:
    """Adds wall time of a stage to a SpecMetrics field; optionally synchronises the device first."""

    def __init__(self, metrics: SpecMetrics, device: torch.device, sync: bool):
        self.metrics = metrics
        self.sync = sync and device.type == "cuda"
        self.device = device

    @contextmanager
    def __call__(self, field_name: str):
        if self.sync:
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize(self.device)
            setattr(self.metrics, field_name, getattr(self.metrics, field_name) + time.perf_counter() - start)
