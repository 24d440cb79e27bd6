"""Hugging Face's own logits processors, applied to the many positions of a speculative round.

Plain generate calls the processor list once per step with the batch's left-padded
``input_ids`` (prompt padding included). A round scores k+1 positions per sequence and
the sequences have generated different numbers of tokens, so row ``(b, j)`` must be
processed with exactly the ``input_ids`` plain generate would have had there: the
sequence's padded prompt, its generated tokens and its first ``j`` drafts. Rows are
grouped by that history length (``history_groups.py``, as for stopping criteria) and each group goes through the list once, laid out as
the whole batch because processors may keep per-row state.

Processors that never read ``input_ids`` (temperature, top-k, top-p, min-p, typical,
epsilon, eta) take all rows in one call.
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

_HISTORY_FREE = (
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper,
    TypicalLogitsWarper, EpsilonLogitsWarper, EtaLogitsWarper,
)


class LogitsPipeline:
    def __init__(self, processors: LogitsProcessorList | None):
        self.processors = processors or LogitsProcessorList()
        self.history_free = all(isinstance(p, _HISTORY_FREE) for p in self.processors)

    def __call__(self, scores: torch.Tensor, tokens: torch.Tensor, rows: list[int], history_lens: list[int]) -> torch.Tensor:
        """Process ``scores`` ``(R, V)``; row ``i`` belongs to buffer row ``rows[i]`` whose history is
        ``tokens[rows[i], :history_lens[i]]``."""
        if not self.processors:
            return scores
        if self.history_free:
            return self.processors(tokens[:, :1].new_zeros(scores.shape[0], 1), scores)
        groups = by_length(history_lens)
        # Processors may hold per-batch-row state (e.g. repetition penalty's prompt_ignore_length), so each
        # group is processed as the whole batch, its rows in their own places; other rows are discarded.
        out = torch.empty_like(scores)
        for length, members in groups.items():
            index = torch.tensor(members, device=scores.device)
            batch_rows = torch.tensor([rows[i] for i in members], device=scores.device)
            full = scores.new_zeros(tokens.shape[0], scores.shape[1])
            full[batch_rows] = scores[index]
            out[index] = self.processors(tokens[:, :length], full)[batch_rows]
        return out
