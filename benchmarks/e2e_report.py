"""Derived numbers, tables, summary and JSON of benchmarks/e2e.py.

For the rows of hf_specdec (hf_specdec "fast k=K", runner_plain "k=0"; all on the runner):

  round_ms          measured round time = decode_seconds / num_rounds over the timed calls
  bandwidth_gb_s    target weight bytes x target forwards per second (one verify forward a round)
  forwards_ms       k * draft_step + (draft_first_step - draft_step) + verify_forward   (time_stages)
  outside_forwards  1 - forwards_ms / round_ms  (and *_stages: against time_stages' "round")

and for "fast k=K", with E = (1 - alpha^(k+1)) / (1 - alpha) from the measured acceptance rate:

  ideal_speedup           = E * target_step / (propose + verify_and_commit)
  ideal_speedup_forwards  = E * target_step / forwards_ms
  speedup_vs_runner_plain = tok/s / tok/s of runner_plain k=0 (same b, mode)
  efficiency_vs_ideal     = speedup_vs_runner_plain / ideal_speedup   (and *_forwards)
"""
from __future__ import annotations

import json
import math
import os
import platform

import torch

from benchmarks.common import expected_tokens_per_round, weight_bytes
from benchmarks.divergence import summary_line as divergence_summary
from benchmarks.divergence import table_lines as divergence_table

METHODS = ("plain_eager", "plain_compiled", "hf_assisted", "hf_specdec", "runner_plain")


def new_report(args, device, dtype, target, draft, pool, sources, padded_len, prompt_paths):
    import transformers

    pair_summary = None
    sp = os.path.join(os.path.dirname(os.path.abspath(args.target)), "summary.json")
    if os.path.exists(sp):
        with open(sp) as fh:
            s = json.load(fh)
        keys = ("target", "draft", "vocab_size", "tokens_seen_per_model", "target_better")
        pair_summary = {k: s.get(k) for k in keys}
    return {
        "env": {"device": str(device),
                "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else
                (platform.processor() or platform.machine() or "cpu"),
                "torch": torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version(), "dtype": str(dtype).replace("torch.", "")},
        "config": dict(vars(args)),
        "target": os.path.abspath(args.target), "draft": os.path.abspath(args.draft),
        "params": {"target": sum(p.numel() for p in target.parameters()),
                   "draft": sum(p.numel() for p in draft.parameters())},
        "target_weight_bytes": weight_bytes(target),
        "pair_summary": pair_summary,
        "prompts": {"paths": prompt_paths, "pool": len(pool), "padded_len": padded_len,
                    "sources": {s: sources.count(s) for s in set(sources)}},
        "hf_specdec": None,
        "results": [],
        "errors": [],
        "total_seconds": None,
    }


def write_json(path, report):
    """The report without the generated tokens (kept in memory for the identity check)."""
    rows = [{k: v for k, v in r.items() if k != "outputs"} for r in report["results"]]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump({**report, "results": rows}, fh, indent=2, default=str)


# --------------------------------------------------------------------------- #
def find(results, method, b, mode, variant=None):
    for r in results:
        if (r["method"], r["batch_size"], r["mode"]) == (method, b, mode) and r.get("tokens_per_s") \
                and (variant is None or r["variant"] == variant):
            return r
    return None


def identical_share(a, b):
    if not a or not b or len(a) != len(b):
        return None
    return sum(1 for x, y in zip(a, b) if x == y) / len(a)


def add_speedups(r, results):
    b, mode, tps = r["batch_size"], r["mode"], r["tokens_per_s"]
    for key, other in (("plain_eager", find(results, "plain_eager", b, mode)),
                       ("plain_compiled", find(results, "plain_compiled", b, mode)),
                       ("runner_plain", find(results, "runner_plain", b, mode))):
        if other and other is not r and (key != "runner_plain" or r["method"] == "hf_specdec"):
            r[f"speedup_vs_{key}"] = tps / other["tokens_per_s"]
            if key == "plain_compiled":  # against its fastest pass: HF's compiled passes can differ by half
                r["speedup_vs_plain_compiled_fastest"] = tps / fastest_pass(other)
    if b == 1 and r["method"] != "hf_assisted":
        default = find(results, "hf_assisted", 1, mode, "default")
        assisted = [x for x in results if x["method"] == "hf_assisted" and x["mode"] == mode and x.get("tokens_per_s")]
        if default:
            r["speedup_vs_assisted_default"] = tps / default["tokens_per_s"]
        if assisted:
            best = max(assisted, key=lambda x: x["tokens_per_s"])
            r["speedup_vs_assisted_best"] = tps / best["tokens_per_s"]
            r["assisted_best_variant"] = best["variant"]
    eager_greedy = find(results, "plain_eager", b, "greedy")
    if mode == "greedy" and eager_greedy and r is not eager_greedy:
        r["identical_to_plain_eager_greedy"] = identical_share(r.get("outputs"), eager_greedy.get("outputs"))


def forwards_ms(stage, k):
    """The model forwards of one round: the draft loop (first step feeds 2 tokens) and the verify."""
    if not k:
        return stage["verify_forward"]
    return k * stage["draft_step"] + stage["draft_first_step"] - stage["draft_step"] + stage["verify_forward"]


def add_runner_figures(r, target_bytes):
    seconds, rounds = r.get("decode_seconds_total"), r.get("num_rounds_total")
    if seconds and rounds:
        r["round_ms"] = 1e3 * seconds / rounds
        r["target_forwards_per_s"] = rounds / seconds
        r["bandwidth_gb_s"] = target_bytes * rounds / seconds / 1e9
    stage = r.get("stage_ms")
    if stage:
        r["forwards_ms"] = fwd = forwards_ms(stage, r["k"])
        r["outside_forwards_stages"] = 1.0 - fwd / stage["round"]
        if r.get("round_ms"):
            r["outside_forwards"] = 1.0 - fwd / r["round_ms"]


def add_ideal(r):
    stage, alpha, k = r.get("stage_ms"), r.get("acceptance_rate"), r["k"]
    if not stage or alpha is None or not k:
        return
    e = expected_tokens_per_round(alpha, k)
    r["expected_tokens_per_round"] = e
    r["ideal_speedup"] = e * stage["target_step"] / stage["round"]
    r["ideal_speedup_forwards"] = e * stage["target_step"] / forwards_ms(stage, k)
    if r.get("speedup_vs_runner_plain"):
        r["efficiency_vs_ideal"] = r["speedup_vs_runner_plain"] / r["ideal_speedup"]
        r["efficiency_vs_forwards"] = r["speedup_vs_runner_plain"] / r["ideal_speedup_forwards"]


def add_derived(report):
    results = report["results"]
    for r in results:
        if not r.get("tokens_per_s"):
            continue
        add_speedups(r, results)
        if "fast_path" in r:
            add_runner_figures(r, report["target_weight_bytes"])
            if r["variant"].startswith("fast"):
                add_ideal(r)


# --------------------------------------------------------------------------- #
def f(v, width, prec):
    return f"{v:{width}.{prec}f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else f"{'-':>{width}}"


def ordered(results, modes):
    return sorted(results, key=lambda r: (METHODS.index(r["method"]), r["batch_size"],
                                          modes.index(r["mode"]) if r["mode"] in modes else 0))


def status(r):
    if r.get("error"):
        return f"  ERROR: {r['error'][:80]}"
    return f"  SKIPPED: {r['skipped']}" if r.get("skipped") else ""


def print_main_table(rows):
    hdr = (f"{'method':<15}{'variant':<22}{'b':>4} {'mode':<7}{'tok/s':>10}{'x eager':>8}{'x compl':>8}"
           f"{'x asst':>7}{'x asst*':>8}{'x k=0':>7}{'acc':>7}{'len':>6}{'same':>6}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for r in rows:
        print(f"{r['method']:<15}{r['variant']:<22}{r['batch_size']:>4} {r['mode']:<7}{f(r.get('tokens_per_s'), 10, 1)}"
              f"{f(r.get('speedup_vs_plain_eager'), 8, 2)}{f(r.get('speedup_vs_plain_compiled'), 8, 2)}"
              f"{f(r.get('speedup_vs_assisted_default'), 7, 2)}{f(r.get('speedup_vs_assisted_best'), 8, 2)}"
              f"{f(r.get('speedup_vs_runner_plain'), 7, 2)}{f(r.get('acceptance_rate'), 7, 3)}"
              f"{f(r.get('mean_acceptance_length'), 6, 2)}{f(r.get('identical_to_plain_eager_greedy'), 6, 2)}"
              + status(r))
    print("(x = speedup over: plain eager, plain compiled, HF assisted default / best variant (b=1), runner_plain "
          "k=0; acc = acceptance rate; len = mean acceptance length; same = share of greedy outputs identical to "
          "plain eager greedy)")


def print_runner_table(rows):
    rows = [r for r in rows if "fast_path" in r]
    if not rows:
        return
    hdr = (f"{'method':<13}{'variant':<10}{'b':>4} {'mode':<7}{'path':<16}{'warm-up':>8}{'timed wu':>9}"
           f"{'decode s':>9}{'rounds':>7}{'ms/rnd':>8}{'GB/s':>7}{'fwd ms':>7}{'outside':>8}{'out st':>7}"
           f"{'ideal':>6}{'ideal f':>8}{'eff':>6}{'eff f':>6}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for r in rows:
        print(f"{r['method']:<13}{r['variant']:<10}{r['batch_size']:>4} {r['mode']:<7}{r['fast_path'][:15]:<16}"
              f"{f(r.get('warmup_seconds'), 8, 1)}{f(r.get('timed_warmup_seconds'), 9, 2)}"
              f"{f(r.get('decode_seconds'), 9, 2)}{f(r.get('num_rounds'), 7, 0)}{f(r.get('round_ms'), 8, 2)}"
              f"{f(r.get('bandwidth_gb_s'), 7, 1)}{f(r.get('forwards_ms'), 7, 2)}{f(r.get('outside_forwards'), 8, 2)}"
              f"{f(r.get('outside_forwards_stages'), 7, 2)}{f(r.get('ideal_speedup'), 6, 2)}"
              f"{f(r.get('ideal_speedup_forwards'), 8, 2)}{f(r.get('efficiency_vs_ideal'), 6, 2)}"
              f"{f(r.get('efficiency_vs_forwards'), 6, 2)}" + status(r))
    print("(per pass: decode s, rounds; warm-up = capture+compile s in the row's warm-up calls, timed wu = in its "
          "timed calls (should be 0); GB/s = target weights x verify forwards/s; outside = share of a round not in "
          "model forwards, against the measured round (ms/rnd) and time_stages' round (out st); ideal = "
          "E*target_step/round, ideal f = with forwards only; eff = (x k=0) / ideal)")


def print_stage_table(rows):
    rows = [r for r in rows if r.get("stage_ms")]
    if not rows:
        return
    keys = ("target_step", "verify_forward", "verify_and_commit", "draft_first_step", "draft_step", "propose", "round")
    hdr = f"{'stage ms':<13}{'variant':<10}{'b':>4} {'mode':<7}{'bucket':>7}" + "".join(f"{k[:14]:>15}" for k in keys)
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for r in rows:
        print(f"{r['method']:<13}{r['variant']:<10}{r['batch_size']:>4} {r['mode']:<7}{r['stage_bucket']:>7}"
              + "".join(f(r["stage_ms"].get(k), 15, 3) for k in keys))


def fastest_pass(r):
    """A row's tokens/s in its fastest timed pass (``tokens_per_s`` is the median over passes)."""
    return max(n / t for n, t in zip(r["new_tokens_all"], r["seconds_all"]))


def summary_row(res, b, mode, k):
    comp = find(res, "plain_compiled", b, mode) or {}
    plain0 = find(res, "runner_plain", b, mode) or {}
    fast = find(res, "hf_specdec", b, mode, f"fast k={k}") or {}
    ratio = fast["tokens_per_s"] / comp["tokens_per_s"] if fast and comp else None
    cells = [(comp.get("tokens_per_s"), 10, 1), (fast.get("tokens_per_s"), 9, 1), (plain0.get("tokens_per_s"), 9, 1),
             (ratio, 9, 2), (fast.get("speedup_vs_plain_compiled_fastest"), 9, 2),
             (fast.get("speedup_vs_runner_plain"), 9, 2),
             (fast.get("efficiency_vs_ideal"), 6, 2), (fast.get("acceptance_rate"), 7, 3),
             (fast.get("outside_forwards"), 8, 2), (fast.get("bandwidth_gb_s"), 10, 1),
             (plain0.get("bandwidth_gb_s"), 9, 1), (fast.get("warmup_seconds"), 10, 1)]
    return f"{b:>4} {mode:<7}{k:>3}" + "".join(f(*c) for c in cells) + f"  {fast.get('fast_path', '-')}"


def summary_lines(report, modes):
    """The last block printed: the figures the issue asks for, per (b, mode, k)."""
    env, res = report["env"], report["results"]
    yield (f"== summary | {env['device_name']} | torch {env['torch']} | transformers {env['transformers']} | "
           f"{env['dtype']} | target {report['params']['target']/1e6:.1f}M params "
           f"({report['target_weight_bytes']/1e9:.2f} GB), draft {report['params']['draft']/1e6:.1f}M ==")
    yield (f"{'b':>4} {'mode':<7}{'k':>3}{'compiled':>10}{'fast':>9}{'k=0':>9}{'fast/cmp':>9}{'/cmp max':>9}"
           f"{'fast/k=0':>9}{'eff':>6}{'acc':>7}{'outside':>8}{'GB/s fast':>10}{'GB/s k=0':>9}{'warm-up s':>10}  path")
    ks = sorted({r["k"] for r in res if r["method"] == "hf_specdec"}) or ["-"]
    for b in sorted({r["batch_size"] for r in res}):
        for mode in modes:
            for k in ks:
                yield summary_row(res, b, mode, k)
    yield ("(tok/s: plain_compiled, hf_specdec fast, runner_plain k=0; /cmp max = fast against plain_compiled's fastest "
           "pass; eff = (fast/k=0) / ideal)")
    yield from head_lines(res)
    yield from summary_notes(report)


def head_lines(res):
    """A draft head against the draft model, same k, b and mode: tokens/s, acceptance length, draft step cost."""
    heads = [r for r in res if r["method"] == "hf_specdec" and r["variant"].startswith("head") and r.get("tokens_per_s")]
    if not heads:
        return
    yield (f"{'b':>4} {'mode':<7}{'k':>3} {'head row':<18}{'head':>9}{'draft':>9}{'head/drf':>9}{'head/cmp':>9}"
           f"{'len head':>9}{'len drf':>8}{'step h ms':>10}{'step d ms':>10}{'h/d step':>9}")
    for r in heads:
        b, mode, k = r["batch_size"], r["mode"], r["k"]
        d = find(res, "hf_specdec", b, mode, f"fast k={k}") or {}
        comp = find(res, "plain_compiled", b, mode) or {}
        hs, ds = (r.get("stage_ms") or {}).get("draft_step"), (d.get("stage_ms") or {}).get("draft_step")
        ratio = lambda x, y: x / y if x and y else None  # noqa: E731
        cells = [(r["tokens_per_s"], 9, 1), (d.get("tokens_per_s"), 9, 1),
                 (ratio(r["tokens_per_s"], d.get("tokens_per_s")), 9, 2),
                 (ratio(r["tokens_per_s"], comp.get("tokens_per_s")), 9, 2), (r.get("mean_acceptance_length"), 9, 2),
                 (d.get("mean_acceptance_length"), 8, 2), (hs, 10, 3), (ds, 10, 3), (ratio(hs, ds), 9, 2)]
        yield f"{b:>4} {mode:<7}{k:>3} {r['variant'].rsplit(' k=', 1)[0]:<18}" + "".join(f(*c) for c in cells)
    yield "(head: the draft head's rows; draft: the draft model's fast rows; len: mean acceptance length)"


def summary_notes(report):
    res = report["results"]
    pair = report.get("pair_summary") or {}
    if pair.get("target_better") is False:  # evals/build_pair.py's own verdict on held-out text
        losses = [(pair.get(m) or {}).get("heldout_loss") for m in ("target", "draft")]
        yield (f"warning: this pair's target is no better than its draft on held-out text (held-out loss {losses[0]} "
               f"against {losses[1]}, uniform {math.log(pair.get('vocab_size') or 1):.2f}): an undertrained pair, "
               f"whose acceptance says nothing of a trained one; build it again with a longer --time-budget-s")
    notes = sorted({r["stage_note"] for r in res if r.get("stage_note")})
    for note in notes:
        yield f"note: {note}"
    divergence = divergence_summary(res)
    if divergence:
        yield divergence
    warm = [f"{r['method']} {r['variant']} b={r['batch_size']} {r['mode']}: {r['timed_warmup_seconds']:.2f} s"
            for r in res if r.get("timed_warmup_seconds")]
    yield ("timed calls' warm-up (capture+compile): " + ("; ".join(warm) if warm else "0.00 s in every spec row"))
    skipped = [f"{r['method']} {r['variant']} b={r['batch_size']} {r['mode']}" for r in res if r.get("skipped")]
    if skipped:
        yield f"skipped past --deadline-s: {', '.join(skipped)}"
    for e in report["errors"]:
        yield f"error: {e.get('method', '')} {e.get('variant', '')} b={e.get('batch_size')} {e.get('mode', '')}: " \
              f"{str(e.get('error'))[:160]}"


def finish_report(report):
    modes = [m.strip() for m in report["config"]["modes"].split(",") if m.strip()]
    add_derived(report)
    rows = ordered(report["results"], modes)
    print_main_table(rows)
    print_runner_table(rows)
    print_stage_table(rows)
    lines = list(divergence_table(rows))
    if lines:
        print("\n" + "\n".join(lines))
    write_json(report["config"]["out"], report)
    print("")
    for line in summary_lines(report, modes):
        print(line)
    print(f"[e2e] wrote {report['config']['out']} in {report['total_seconds']:.1f}s total; "
          f"{len(report['errors'])} errors", flush=True)
