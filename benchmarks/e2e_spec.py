"""The hf_specdec rows of benchmarks/e2e.py: speculative decoding and k=0, both on the runner.

Per (batch size, mode) and each k: "fast k=K" (SpecConfig(k): runner + CUDA graphs + compile on
CUDA, the runner without graphs on CPU), "head k=K" / "head[NAME] k=K" (the same with each draft head of
e2e.py --head), then runner_plain "k=0" (no draft). The rows warm up
every bucket their rows can shrink into, so the timed calls capture and compile nothing (their
spec_metrics.warmup_seconds is reported: it should be 0). After a row's timed calls,
time_stages measures the cost of each piece of a round at the row's first bucket (CUDA only),
for the ideal speedup and the time outside forwards (e2e_report.py).
"""
from __future__ import annotations

import os
import re
import traceback

from benchmarks.common import acceptance_length_histogram, aggregate_metrics
from hf_specdec.runner import BUCKETS, bucket_for, runner_for  # library internals: imported here only
from hf_specdec.runner.stage_timing import time_stages


def spec_fields(warm_metrics, timed_metrics, repeats, k):
    """What a speculative row reports from its calls' spec_metrics (per pass: sum over its calls)."""
    agg = aggregate_metrics(timed_metrics)
    paths = sorted({m.get("fast_path") or "?" for m in warm_metrics + timed_metrics})
    out = {
        "fast_path": " | ".join(paths),
        "warmup_seconds": sum(m.get("warmup_seconds", 0.0) for m in warm_metrics),
        "timed_warmup_seconds": agg.get("warmup_seconds", 0.0),
        "decode_seconds_total": agg.get("decode_seconds"),
        "num_rounds_total": agg.get("num_rounds"),
        "decode_seconds": agg.get("decode_seconds", 0.0) / repeats,
        "num_rounds": agg.get("num_rounds", 0) / repeats,
        "spec_metrics": agg,
        "acceptance_rate": agg.get("acceptance_rate"),
        "mean_acceptance_length": agg.get("mean_acceptance_length"),
    }
    if k:
        out["acceptance_length_histogram"] = acceptance_length_histogram(agg, k)
    return out


def stage_costs(target, draft, b, device, repeats):
    """time_stages on the runner this row used, at the bucket of its first round (CUDA only)."""
    if device.type != "cuda":
        return {"stage_note": f"time_stages needs CUDA events: skipped on {device.type}"}
    bucket = bucket_for(b)
    return {"stage_bucket": bucket, "stage_ms": time_stages(runner_for(target, draft), bucket, repeats)}


def bucket_warmups(batch, b):
    """The first batch, then its first m rows for every bucket m below b's: rows finish at different
    rounds and move to smaller buckets, whose graphs are then captured here rather than in a timed call."""
    return [batch] + [(batch[0][:m], batch[1][:m]) for m in sorted(BUCKETS, reverse=True) if m < bucket_for(b)]


def run_spec_row(bench, method, variant, b, mode, batches, spec_config, draft):
    k = spec_config.num_speculative_tokens
    kw = bench.gen_kwargs(mode)
    # every batch once too (each prompt's prefill shape is captured before the timed calls)
    warm = bucket_warmups(batches[0], b) + batches[1:]
    settings = {name: getattr(spec_config, name)
                for name in ("num_speculative_tokens", "cuda_graphs", "compile", "capture_every_k")}
    entry = bench.run(method, variant, b, mode,
                      lambda x: bench.generate(x, kw, assistant_model=draft, spec_config=spec_config),
                      batches, warm, extra={"k": k, "spec_config": settings}, k=k)
    if entry.get("tokens_per_s"):
        try:  # after the row's timed calls: time_stages marks the bucket's rows done
            entry.update(stage_costs(bench.target, draft, b, bench.device, bench.args.stage_repeats))
        except Exception as exc:
            entry["stage_note"] = f"time_stages failed: {type(exc).__name__}: {exc}"
            bench.errors.append({"method": "time_stages", "variant": variant, "batch_size": b, "mode": mode,
                                 "error": entry["stage_note"], "traceback": traceback.format_exc()[-3000:]})
        if "stage_note" in entry:
            bench.note(entry["stage_note"])
    return entry


def run_spec(bench):
    """The "fast k=K" rows of every k, then the runner_plain "k=0" row, per (batch size, mode)."""
    import hf_specdec

    hf_specdec.enable(bench.target)
    compile = True if bench.args.compile_wait else None
    every_k = not bench.args.lazy_k_capture  # every k of a bucket captured in the warm-up, none in a timed call
    for b, mode, batches in bench.configs():
        for k in bench.ks:
            spec = hf_specdec.SpecConfig(num_speculative_tokens=k, compile=compile, capture_every_k=every_k)
            run_spec_row(bench, "hf_specdec", f"fast k={k}", b, mode, batches, spec, bench.draft)
            for label, head in getattr(bench, "heads", ()):
                run_spec_row(bench, "hf_specdec", f"{label} k={k}", b, mode, batches, spec, head)
        run_spec_row(bench, "runner_plain", "k=0", b, mode, batches,
                     hf_specdec.SpecConfig(num_speculative_tokens=0, compile=compile), None)


def head_label_and_path(spec: str) -> tuple[str, str]:
    """``[NAME=]DIR`` -> (row label, directory): "head" for a bare directory, "head[NAME]" for a named one. A
    directory that exists, or text before '=' that is not a plain name (``runs/lr=1e-3/head``), is a bare path."""
    name, sep, path = spec.partition("=")
    if sep and re.fullmatch(r"[\w.-]+", name) and not os.path.isdir(spec):
        return f"head[{name}]", path
    return "head", spec


def load_heads(specs: list, target, params: dict) -> list:
    """``--head`` arguments -> [(row label, loaded head)], each head's parameter count in ``params``."""
    labelled = [head_label_and_path(spec) for spec in specs]
    labels = [label for label, _ in labelled]
    for label in set(labels):
        if labels.count(label) > 1:
            raise SystemExit(f"--head: {labels.count(label)} heads labelled {label!r}; give each its own NAME=DIR")
    import hf_specdec

    heads = []
    for label, path in labelled:
        head = hf_specdec.load_draft_head(path, target=target)
        params[label] = sum(p.numel() for p in head.parameters())
        heads.append((label, head))
    return heads
