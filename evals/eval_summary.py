"""evals/run_eval.py's summary: per method, tokens/s over its generate() calls, greedy outputs identical to
plain greedy, and (hf_specdec) acceptance rate, mean acceptance length and acceptance per position.

``rows`` hold one prompt each (``row[method]["new_tokens"]``, ``row["identical"][method]``); ``calls`` one
generate() call each (``call[method]``: ``seconds``, ``new_tokens``, ``spec_metrics``), a call covering
``--batch-size`` prompts. A method whose call raised has ``call[method]["error"]`` and no timing.
"""
from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from benchmarks.common import acceptance_length_histogram, aggregate_metrics  # noqa: E402


def method_summary(method: str, rows: list[dict], calls: list[dict], k: int) -> dict:
    errors = sorted({c[method]["error"] for c in calls if "error" in c.get(method, {})})
    timed = [c[method] for c in calls if method in c and "error" not in c[method]]
    s = {"calls": len(timed), "prompts": sum(1 for r in rows if "new_tokens" in r.get(method, {}))}
    if errors:
        s["errors"] = errors
    if timed:
        tokens, seconds = sum(c["new_tokens"] for c in timed), sum(c["seconds"] for c in timed)
        s.update(new_tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds if seconds else None,
                 median_tokens_per_s_per_call=statistics.median(
                     [c["tokens_per_s"] for c in timed if c["tokens_per_s"]] or [0.0]))
    same = [r["identical"][method] for r in rows if method in r.get("identical", {})]
    if same:
        s["identical_to_plain"] = sum(same)
        s["rows_compared"] = len(same)
    metrics = [c["spec_metrics"] for c in timed if c.get("spec_metrics")]
    if metrics:
        agg = aggregate_metrics(metrics)
        s.update({key: agg.get(key) for key in ("acceptance_rate", "mean_acceptance_length",
                                                "acceptance_per_position", "acceptance_per_drafted_position",
                                                "k_histogram")})
        s["acceptance_length_histogram"] = acceptance_length_histogram(agg, k)
        s["fast_path"] = sorted({m.get("fast_path") for m in metrics})
    return s


def summarise(rows: list[dict], calls: list[dict], methods: list[str], k: int) -> dict:
    summary = {m: method_summary(m, rows, calls, k) for m in methods}
    plain = summary.get("plain", {}).get("tokens_per_s")
    spec = summary.get("hf_specdec", {}).get("tokens_per_s")
    assisted = summary.get("hf_assisted", {}).get("tokens_per_s")
    compiled = summary.get("hf_compiled", {}).get("tokens_per_s")
    if plain and spec:
        summary["speedup"] = spec / plain
    if compiled and spec:
        summary["speedup_vs_hf_compiled"] = spec / compiled
    if assisted and spec:
        summary["speedup_vs_hf_assisted"] = spec / assisted
    if "rows_compared" in summary.get("hf_specdec", {}):
        s = summary["hf_specdec"]
        summary["identical_to_plain_share"] = s["identical_to_plain"] / s["rows_compared"]
    return summary
