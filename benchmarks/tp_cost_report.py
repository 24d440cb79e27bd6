"""Markdown tables of benchmarks/tp_cost.py's results: per-step costs and the speedups they give.

With E = (1 - a^(k+1)) / (1 - a) the expected tokens per round at acceptance rate a (docs/end_to_end.md):

    ideal_forwards = E * target_step / (k * draft_step + (draft_first_step - draft_step) + verify_forward)
    ideal          = E * target_step / round
    vs 1 GPU       = E * target_step(target on one GPU, same batch) / round

The first two compare speculative decoding with plain decoding on the same placement; the third
with plain decoding of the target on one GPU.
"""
from __future__ import annotations

ALPHAS = (0.5, 0.7, 0.9)
STEPS = ("draft_step", "draft_first_step", "verify_forward", "target_step", "round")


def expected_tokens(alpha: float, k: int) -> float:
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def speedups(row: dict, k: int, one_gpu_step: float | None) -> dict:
    forwards = k * row["draft_step"] + (row["draft_first_step"] - row["draft_step"]) + row["verify_forward"]
    out = {}
    for a in ALPHAS:
        e = expected_tokens(a, k)
        out[a] = (e * row["target_step"] / forwards, e * row["target_step"] / row["round"],
                  None if one_gpu_step is None else e * one_gpu_step / row["round"])
    return out


def _placement(row: dict) -> str:
    return f"target TP={row['target_tp']}, draft TP={row['draft_tp']}"


def report(results: list[dict], k: int = 4) -> str:
    rows = [r for res in results for r in res["rows"]]
    k = rows[0].get("k", k) if rows else k
    one_gpu = {r["batch"]: r["target_step"] for r in rows if r["target_tp"] == 1 and "target_step" in r}
    gpus = sorted({res.get("gpu", "?") for res in results})
    lines = [f"GPU: {', '.join(gpus)}; k = {k}; prompt {rows[0]['prompt'] if rows else '?'} tokens; ms are medians "
             "of CUDA-graph replays.", "",
             "| placement | batch | draft step | draft first step (2 tok) | verify (k+1 tok) | target step (plain) "
             "| round |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r[s]:.3f}" if s in r else "-" for s in STEPS]
        lines.append(f"| {_placement(r)} | {r['batch']} | " + " | ".join(cells) + " |")
    lines += ["", "Speedup over plain decoding: ideal_forwards / ideal / vs 1 GPU", "",
              "| placement | batch | " + " | ".join(f"a = {a}" for a in ALPHAS) + " |",
              "|---|---|" + "---|" * len(ALPHAS)]
    for r in rows:
        if not all(s in r for s in STEPS):
            lines.append(f"| {_placement(r)} | {r['batch']} | " + " | ".join("-" for _ in ALPHAS) + " |")
            continue
        sp = speedups(r, k, one_gpu.get(r["batch"]))
        cells = [" / ".join("-" if x is None else f"{x:.2f}" for x in sp[a]) for a in ALPHAS]
        lines.append(f"| {_placement(r)} | {r['batch']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
