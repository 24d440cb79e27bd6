"""Costs of a round's pieces on this machine, for benchmarks and for the ideal-speedup formula.

After a ``generate()`` call the runner still holds each bucket's state and graphs. This
times, on one bucket, a draft step (1 token per row), the draft's first step (2 tokens),
the target's verify forward (k+1 tokens), a plain target step (1 token) and a whole
round (the captured propose + verify graphs), each as a captured graph replayed many
times between CUDA events. A forward's inputs are made before it is captured: its time
is the model's kernels alone, as in a round, where they are an earlier kernel's output.
All rows are marked done first, so the replays change no length: the shapes, and so the
costs, are those of live rows.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch

from .graphs import StageGraph
from .spec_runner import SpecRunner


def median_ms(fn: Callable[[], None], repeats: int, device: torch.device) -> float:
    """Median milliseconds of one call of ``fn`` (a graph replay or eager code) after 3 warm-up calls: between
    CUDA events on a GPU, else by the host clock."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


@torch.no_grad()  # as in generate(): a forward with autograd on would compile another graph
def time_stages(runner: SpecRunner, bucket: int, repeats: int = 50,
                pieces_out: Optional[dict] = None) -> dict[str, float]:
    """Milliseconds per piece at ``bucket`` rows (a bucket the runner has used). ``pieces_out``: receives each
    piece by name as (what was timed: its graph or the eager stage, the eager stage), for a caller that profiles
    them further."""
    s = runner.slot.states[bucket]
    s.done.fill_(True)
    spec, k = runner.spec, runner.spec.k
    target = runner.models["target"]
    device = s.hist.device
    # Each forward's inputs are made here, once, outside what is timed: a round's steps read tensors an earlier
    # kernel left (a draft step the tokens the last one chose), so gathering them is not part of a step's cost.
    step_ids, step_positions = s.hist[:, 0].contiguous(), s.length - 1
    verify_ids = s.hist[:, : k + 1].reshape(-1).contiguous()
    verify_positions = ((s.length - 1)[:, None] + torch.arange(k + 1, device=device)).view(-1)
    pieces: dict[str, Callable[[], object]] = {
        "target_step": lambda: target.forward(step_ids, step_positions, s.target_tables, s.length, 1, True),
        "verify_forward": lambda: target.forward(verify_ids, verify_positions, s.target_tables, s.length + k, k + 1,
                                                 False, hidden=s.features is not None),
    }
    stages = dict(spec.stages(s, runner.models, k))  # the round's own: propose (k > 0), verify and commit
    pieces["verify_and_commit"] = stages["verify"]
    if k:
        draft = runner.models["draft"]
        head = draft.reads_hidden  # a draft head reads features with its tokens
        step_in = dict(features=s.features[:, 0].contiguous()) if head else {}
        step_in["float_logits"] = spec.draft_logits_in_float  # as the round's steps read them
        pieces["draft_step"] = lambda: draft.forward(step_ids, step_positions, s.draft_tables, s.length, 1, True,
                                                     **step_in)
        first = k + 1 if head else 2  # a head's first step reads the last round's k+1 pairs; a model's, 2 tokens
        first_ids = s.hist[:, :first].reshape(-1).contiguous()
        first_positions = ((s.length - first)[:, None] + torch.arange(first, device=device)).view(-1)
        first_in = dict(features=s.features[:, :first].reshape(-1, s.features.shape[-1]).contiguous()) if head else {}
        first_in["float_logits"] = spec.draft_logits_in_float
        pieces["draft_first_step"] = lambda: draft.forward(first_ids, first_positions, s.draft_tables, s.length,
                                                           first, True, **first_in)
        pieces["propose"] = stages["propose"]
    out = {}
    for name, fn in pieces.items():
        run = StageGraph(fn, s.tensors()) if runner.graphed else fn
        out[name] = median_ms(run, repeats, device)
        if pieces_out is not None:
            pieces_out[name] = (run, fn)
    out["round"] = out["verify_and_commit"] + out.get("propose", 0.0)
    return out
