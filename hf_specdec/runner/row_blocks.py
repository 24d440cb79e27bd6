"""The runner's rows in both caches: blocks reserved when a row starts, freed when it finishes.

A row holds its whole budget (prompt + max_new_tokens + k + 1 tokens) from its start, so a round
never touches the allocator; cache row ``b + 1`` is the call's batch row ``b`` (row 0 is the
scratch sequence of padding rows). Rows start in waves when the cache budget cannot hold the
whole batch: a finished row's blocks can go to a row that starts later, and ``rejoin`` then
rebuilds the bucket before the next round, because until the finished row leaves the bucket a
round still computes it and writes K/V into its old blocks.
"""
from __future__ import annotations

import torch

from .spec_runner import SpecRunner


def reserve_rows(runner: SpecRunner, rows: list[int]) -> None:
    """Both caches give each of ``rows`` (batch rows) its whole budget."""
    batch = runner.batch
    for pm in runner.models.values():
        pm.cache.reserve([b + 1 for b in rows], [batch.budget_tokens(b) for b in rows])


def free_rows(runner: SpecRunner, rows: list[int]) -> None:
    """Finished batch ``rows`` give their blocks back in both caches."""
    for pm in runner.models.values():
        pm.cache.free([b + 1 for b in rows])


def rejoin(runner: SpecRunner, live: list[int], live_rows: list[int], live_gen: list[int], new_rows: list[int],
           eos_ids: list[int]) -> None:
    """Rebuild the bucket: the ``live`` bucket rows (batch rows ``live_rows``, ``live_gen`` generated tokens
    each), then ``new_rows`` (started since: prompt and first token in the batch). The acceptance
    statistics summed so far and the tokens the draft model has still to read carry over."""
    s, batch = runner.state, runner.batch
    if live:
        index = torch.tensor(live, device=batch.device)
        batch.tokens[torch.tensor(live_rows, device=batch.device)] = s.hist.index_select(0, index)[
            :, : batch.tokens.shape[1]]
        for b, gen in zip(live_rows, live_gen):
            batch.gen_len[b] = gen
    stats = [t.clone() for t in s.stats()]
    head_reads = s.head_reads(live)  # a draft head's next read of the survivors
    # the survivors' draft model has still to read what it missed (new rows re-read cached tokens)
    runner.load(live_rows + new_rows, eos_ids, behind=runner.draft_behind)
    s = runner.state
    s.restore_head_reads(head_reads)
    for t, saved in zip(s.stats(), stats):
        t.add_(saved)
