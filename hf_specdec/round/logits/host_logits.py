"""Hugging Face's logits processors as their own objects, for a round that runs without CUDA graphs.

A processor with no fixed-shape rebuild (``graph_logits.py`` names why) still runs on the runner: the
round is the same code, executed eagerly, and this pipeline calls the processor list the way plain
``generate()`` does. Plain generate calls it once per step with the batch's left-padded ``input_ids``;
a round scores positions whose histories differ in length, so positions are grouped by history length
and each group goes through the list once, laid out as the whole batch (row ``b`` of plain generate's
batch at row ``b``: processors may keep per-row state). Two positions of one batch row in one group
(a bucket's padding rows all say batch row 0) go through separate calls.

Processors that never read ``input_ids`` (temperature, top-k, top-p, min-p, typical, epsilon, eta)
take all positions in one call. Same signature as ``GraphLogits.__call__``.
"""
from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from .history_groups import by_length

_HISTORY_FREE = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper,
                 TypicalLogitsWarper, EpsilonLogitsWarper, EtaLogitsWarper)


class HostLogits:
    """``processors`` applied per position with the ``input_ids`` plain generate would pass there."""

    needs_batch_rows = True
    reads_live = True  # skips rows nobody reads (graphs never run this pipeline: a host read costs nothing extra)
    reads_history = True  # the user's processors, whatever they read

    def __init__(self, processors: LogitsProcessorList, batch_size: int):
        self.processors, self.batch_size = processors, batch_size
        # exact classes only: a subclass may read input_ids in its own __call__
        self.history_free = all(type(p) in _HISTORY_FREE for p in processors)
        self.signature = ("host",)  # graphs never run this pipeline: nothing to keep apart between calls

    def __call__(self, scores: torch.Tensor, history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor,
                 batch_rows: torch.Tensor | None = None, live: torch.Tensor | None = None) -> torch.Tensor:
        """``scores`` (R, V); row ``i`` reads ``history[rows[i], :lengths[i]]``; ``batch_rows`` (R,): its row in
        plain generate's batch (default ``rows``); ``live`` (R,): False for rows whose result nobody reads (done
        and bucket padding rows), which are returned unprocessed."""
        if self.history_free:
            return self.processors(history[:, :1].new_zeros(scores.shape[0], 1), scores)
        batch_rows = rows if batch_rows is None else batch_rows
        out = scores.clone()
        keep = None if live is None else live.tolist()
        for length, members in by_length(lengths.tolist()).items():
            members = [i for i in members if keep is None or keep[i]]
            if not members:
                continue
            for call in _distinct(members, batch_rows[members].tolist()):
                index = torch.tensor(call, device=scores.device)
                at = batch_rows[index]
                ids = history.new_zeros(self.batch_size, length)
                ids[at] = history[rows[index], :length]
                full = scores.new_zeros(self.batch_size, scores.shape[1])
                full[at] = scores[index]
                out[index] = self.processors(ids, full)[at]
        return out


def _distinct(members: list[int], batch_rows: list[int]) -> list[list[int]]:
    """``members`` split into calls in which no batch row appears twice."""
    calls: list[tuple[set, list]] = []
    for i, row in zip(members, batch_rows):
        target = next((c for c in calls if row not in c[0]), None)
        if target is None:
            target = (set(), [])
            calls.append(target)
        target[0].add(row)
        target[1].append(i)
    return [c[1] for c in calls]
