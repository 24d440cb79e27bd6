"""Summary and plot of benchmarks/strategies.py rows (also runs alone on a saved JSON:
``python benchmarks/strategies_report.py results.json [plot.png]``)."""
from __future__ import annotations

import json
import sys


def _find(rows, section, b, name) -> dict:
    """The row ``name`` of a prompt set at a batch size ({} when it was not measured)."""
    return next((r for r in rows if (r["section"], r["batch_size"], r["row"]) == (section, b, name)), {})


def _rate(rows, section, b, name):
    return _find(rows, section, b, name).get("tokens_per_s") or None


def _ratio(a, b):
    return round(a / b, 3) if a and b else None


def _same(rows, section, b, name, reference="runner_plain"):
    """Share of output rows equal to the reference row's (greedy; bf16 near-ties may flip a few)."""
    a, ref = (_find(rows, section, b, n).get("sequences") for n in (name, reference))
    if not a or not ref:
        return None
    flat_a = [row for batch in a for row in batch]
    flat_r = [row for batch in ref for row in batch]
    return round(sum(x == y for x, y in zip(flat_a, flat_r)) / len(flat_r), 3)


def _metrics(rows, section, b, name):
    m = _find(rows, section, b, name).get("spec_metrics") or {}
    return {key: m.get(key) for key in ("k_histogram", "acceptance_rate", "match_fraction") if key in m}


def _paired(rows, section, b, name, reference) -> float | None:
    """Median over passes of (reference's pass time / name's): the passes of one index ran side by side."""
    a, ref = (_find(rows, section, b, n).get("pass_seconds") for n in (name, reference))
    if not a or not ref:
        return None
    ratios = sorted(y / x for x, y in zip(a, ref))
    return round(ratios[len(ratios) // 2], 3)


def _median_ratio(rows, section, b, name, reference) -> float | None:
    """reference's median pass time / name's: robust where many passes ran (the fastest pass favours the row
    whose passes spread most)."""
    a, ref = (_find(rows, section, b, n).get("median_seconds") for n in (name, reference))
    return round(ref / a, 3) if a and ref else None


def summarise(rows) -> dict:
    out = {}
    for b in sorted({r["batch_size"] for r in rows}):
        s = {}
        hf, plain = _rate(rows, "code", b, "hf_compiled"), _rate(rows, "code", b, "runner_plain")
        fixed = {r["k"]: r["tokens_per_s"] for r in rows if r["section"] == "code" and r["batch_size"] == b
                 and r["row"].startswith("fixed") and r.get("tokens_per_s")}
        if fixed:
            best_k = max(fixed, key=fixed.get)
            medians = {r["k"]: r["median_seconds"] for r in rows if r["section"] == "code" and r["batch_size"] == b
                       and r["row"].startswith("fixed") and r.get("median_seconds")}
            best_median = min(medians, key=medians.get) if medians else None
            adaptive = _rate(rows, "code", b, "adaptive")
            s["code"] = {
                "hf_compiled_tok_s": hf, "runner_plain_tok_s": plain, "fixed_tok_s": fixed, "best_fixed_k": best_k,
                "adaptive_tok_s": adaptive, "adaptive_vs_best_fixed": _ratio(adaptive, fixed[best_k]),
                "adaptive_vs_best_fixed_paired": _paired(rows, "code", b, "adaptive", f"fixed k={best_k}"),
                "best_fixed_k_by_median": best_median,
                "adaptive_vs_best_fixed_median": _median_ratio(rows, "code", b, "adaptive", f"fixed k={best_median}"),
                "variants_vs_best_fixed": {r["row"]: _ratio(r["tokens_per_s"], fixed[best_k]) for r in rows
                                           if (r["section"], r["batch_size"]) == ("code", b) and r.get("setting")
                                           and r.get("tokens_per_s")},
                "adaptive_vs_hf_compiled": _ratio(adaptive, hf), "adaptive": _metrics(rows, "code", b, "adaptive"),
                "useless_adaptive_vs_runner_plain": _ratio(_rate(rows, "code", b, "useless adaptive"), plain),
                "useless_adaptive_vs_runner_plain_paired": _paired(rows, "code", b, "useless adaptive", "runner_plain"),
                "useless_adaptive_vs_runner_plain_median": _median_ratio(rows, "code", b, "useless adaptive",
                                                                         "runner_plain"),
                "useless_fixed_vs_runner_plain": _ratio(_rate(rows, "code", b, "useless fixed"), plain),
                "useless_adaptive": _metrics(rows, "code", b, "useless adaptive"),
                "same_as_runner_plain": {n: _same(rows, "code", b, n) for n in ("adaptive", "useless adaptive")},
            }
        hf_e, plain_e = _rate(rows, "edit", b, "hf_compiled"), _rate(rows, "edit", b, "runner_plain")
        lookup = _rate(rows, "edit", b, "hf_prompt_lookup")
        edit = {"hf_compiled_tok_s": hf_e, "runner_plain_tok_s": plain_e, "hf_prompt_lookup_tok_s": lookup}
        for name in ("ngram fixed", "ngram adaptive"):
            rate = _rate(rows, "edit", b, name)
            edit[name] = {"tok_s": rate, "vs_hf_compiled": _ratio(rate, hf_e), "vs_runner_plain": _ratio(rate, plain_e),
                          "vs_hf_prompt_lookup": _ratio(rate, lookup), "same_as_runner_plain": _same(rows, "edit", b, name),
                          **_metrics(rows, "edit", b, name)}
        if hf_e or plain_e:
            s["edit"] = edit
        out[f"b={b}"] = s
    return out


def plot(rows, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", flush=True)
        return
    sizes = sorted({r["batch_size"] for r in rows if r["section"] == "code"})
    if not sizes:
        return
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
    for ax, b in zip(axes[0], sizes):
        fixed = sorted((r["k"], r["tokens_per_s"]) for r in rows if r["section"] == "code" and r["batch_size"] == b
                       and r["row"].startswith("fixed") and r.get("tokens_per_s"))
        plain = _rate(rows, "code", b, "runner_plain")
        points = ([(0, plain)] if plain else []) + fixed
        if points:
            ax.plot(*zip(*points), "o-", label="fixed k (k=0: runner_plain)")
        adaptive = _find(rows, "code", b, "adaptive")
        if adaptive.get("tokens_per_s"):
            hist = adaptive["spec_metrics"]["k_histogram"]
            mean_k = sum(int(k) * n for k, n in hist.items()) / max(sum(hist.values()), 1)
            ax.axhline(adaptive["tokens_per_s"], color="C1", ls="--", label="adaptive")
            ax.plot([mean_k], [adaptive["tokens_per_s"]], "*", color="C1", ms=14, label=f"adaptive, mean k={mean_k:.1f}")
        hf = _rate(rows, "code", b, "hf_compiled")
        if hf:
            ax.axhline(hf, color="gray", ls=":", label="HF compiled plain")
        ax.set_title(f"batch {b}")
        ax.set_xlabel("k (draft tokens per round)")
        ax.set_ylabel("tokens/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}", flush=True)


if __name__ == "__main__":
    report = json.load(open(sys.argv[1]))
    print(json.dumps(summarise(report["rows"]), indent=1))
    if len(sys.argv) > 2:
        plot(report["rows"], sys.argv[2])
