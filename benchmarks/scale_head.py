"""benchmarks/scale.py --head: a draft head (hf_specdec.DraftHead, random weights) on the 8B-shaped target.

Per batch size: one generate() at k = ROUND_K with the head as the assistant (graphs + compile, as the draft
model's rows), then ``time_stages`` on its runner: the head's step (1 token a row, its own features in),
its first step (the last round's k+1 pairs re-read with the target's features), the propose stage and the
whole round. ``head_step / target_step`` is the issue's ratio (goal 0.06 or less); the projection is the draft
model's formula (scale_report.projection) with the head's step, first step and round in place of the draft's.
``--head-vocab N``: the head's own output layer over N tokens (a 128k-token output layer is most of a head).
"""
from __future__ import annotations

import torch

import hf_specdec
from benchmarks.scale_report import ROUND_K, projection
from hf_specdec.runner import bucket_for, runner_for
from hf_specdec.runner.stage_timing import time_stages


def head_costs(target, head, row: dict, run_call, args) -> dict:
    """The head's costs at ``row``'s batch size (ms), its ratios to the target's step and its projection."""
    metrics, _ = run_call(target, head, ROUND_K, row["batch"], args)
    costs = time_stages(runner_for(target, head), bucket_for(row["batch"]), args.repeats)
    out = {"fast_path": metrics.fast_path, "head_step": costs["draft_step"],
           "head_first_step": costs["draft_first_step"], "propose": costs["propose"], "round": costs["round"],
           "params": sum(p.numel() for p in head.parameters())}
    out["head_step_vs_target_step"] = out["head_step"] / row["target_step"]
    if row.get("draft_step"):
        out["head_step_vs_draft_step"] = out["head_step"] / row["draft_step"]
    out["projection"] = projection(dict(row, draft_step=out["head_step"], draft_first_step=out["head_first_step"],
                                        round=out["round"]))
    return out


def build_head(target, kept: int = 0) -> "hf_specdec.DraftHead":
    """A random head; ``kept`` > 0: with an output layer of its own over the first ``kept`` token ids (the cost of
    a reduced-vocabulary head does not depend on which ids)."""
    return hf_specdec.DraftHead.for_target(target, kept_ids=torch.arange(kept) if kept else None)


def head_lines(rows: list[dict]) -> list[str]:
    """Markdown: the head's step against the target's and the draft's, and its best projected speedups."""
    rows = [r for r in rows if r.get("head")]
    if not rows:
        return []
    lines = ["", "| b | head step ms | / target step | / draft step | head round k=4 ms | projected vs HF at a = "
             "0.6 / 0.7 / 0.8 / 0.9 (best k) |", "|---|---|---|---|---|---|"]
    for r in rows:
        h = r["head"]
        best = [h["projection"]["by_alpha"][a]["best"].get("vs_hf") for a in ("0.6", "0.7", "0.8", "0.9")]
        proj = " / ".join(f"{b['speedup']:.2f}x (k={b['k']})" if b else "-" for b in best)
        vs_draft = f"{h['head_step_vs_draft_step']:.2f}" if "head_step_vs_draft_step" in h else "-"
        lines.append(f"| {r['batch']} | {h['head_step']:.3f} | {h['head_step_vs_target_step']:.3f} | {vs_draft} | "
                     f"{h['round']:.3f} | {proj} |")
    lines.append("(projection: scale_report.py's formula with the head's measured step, first step and round)")
    return lines
