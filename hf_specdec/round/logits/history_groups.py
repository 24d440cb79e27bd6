"""Rows grouped by history length: how Hugging Face's processors and criteria see a round's positions.

Plain generate calls a logits processor or a stopping criterion once per step with the whole
batch's ``input_ids``, all of one length. The positions of a speculative round have histories of
different lengths (rows have generated different numbers of tokens, and position j of a row's run
has j more tokens), so each call is made once per length, with the rows of that length.
"""
from __future__ import annotations

from collections import defaultdict

import torch
from transformers.generation.stopping_criteria import StoppingCriteriaList


def by_length(lengths: list[int]) -> dict[int, list[int]]:
    """Indices of ``lengths`` grouped by value (groups and their members in first-seen order)."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, length in enumerate(lengths):
        groups[length].append(i)
    return groups


def stop_hits(criteria: StoppingCriteriaList, history: torch.Tensor, rows: list[int], lengths: list[int],
              scores: torch.Tensor) -> list[bool]:
    """Whether ``criteria`` stop entry ``i``: its ``input_ids`` are ``history[rows[i], :lengths[i]]``, its
    scores ``scores[i]``; one call per length, with the entries of that length."""
    hits = [False] * len(rows)
    for length, members in by_length(lengths).items():
        ids = history.index_select(0, torch.tensor([rows[i] for i in members], device=history.device))[:, :length]
        hit = criteria(ids, scores[torch.tensor(members, device=scores.device)]).tolist()
        for i, h in zip(members, hit):
            hits[i] = bool(h)
    return hits
