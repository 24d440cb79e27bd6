#!/usr/bin/env python
"""Where a fast-path call spends its time on the host, configuration by configuration.

Issue 12's b = 32 benchmarks (H200, bf16) found adaptive calls 4-10 ms a call slower than fixed k
outside their rounds (``decode_seconds - round_seconds``), erratically, while their rounds were as
fast or faster. This tool wraps the runner's, the policy's and the rows' methods with timers (the
library is not changed), runs each configuration's calls interleaved after two warm-up sweeps, and
reports per configuration the median over calls of:

    call         the whole generate() call, synchronised on both ends
    before       the call's start to its first round's launch (setup, prefill, first token, load)
    launch       inside ``runner.round`` (the choice of k is outside it: ``choose``)
    wait         inside ``runner.read`` (the device finishing the round; the one sync)
    ahead_gap    read's end to the next launch where the next round started at once
    leave_gap    the same where rows left first (store, finish, shrink, a decision for a new bucket)
    after        the last read's end to the call's end (statistics, output)
    gc_ms        Python garbage collections during the call

and the time in each wrapped method (``methods``). Output: JSON with every call's split, and a table.

GPU:  PYTHONPATH=. python benchmarks/host_timeline.py --target runs/pair/target --draft runs/pair/draft \\
          --prompts .devshim/he/HumanEval.jsonl.gz --out $OUT/host_timeline.json
CPU smoke: python benchmarks/host_timeline.py --target runs/tiny_pair/target --draft runs/tiny_pair/draft \\
          --batch-size 4 --max-new-tokens 12 --k-max 3 --calls 2 --bucketed --out /tmp/t.json
"""
from __future__ import annotations

import argparse
import copy
import functools
import gc
import json
import os
import random
import sys
import time
from statistics import median

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import Timer, load_pair, pick_device, pick_dtype  # noqa: E402
from benchmarks.e2e_spec import bucket_warmups  # noqa: E402
from benchmarks.strategies import batches, prompt_sets  # noqa: E402

EVENTS: list = []  # (name, start, end) of every wrapped method call, this call's
GC: list = []  # seconds of each collection during this call


def _wrap(owner, attr: str, name: str) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((name, start, time.perf_counter()))

    setattr(owner, attr, timed)


def instrument() -> None:
    from hf_specdec import fast_generate, generate
    from hf_specdec.fast_rows import FastRows
    from hf_specdec.runner.spec_runner import SpecRunner
    from hf_specdec.strategies.speculation_length import SpeculationLength

    for attr in ("begin", "prefill", "load", "round", "read", "store", "shrink", "capture", "time_rounds",
                 "catch_up", "statistics", "defer_draft"):
        _wrap(SpecRunner, attr, attr)
    for attr in ("choose", "observe", "prepare", "end_call", "__init__"):
        _wrap(SpeculationLength, attr, "policy." + attr.strip("_"))
    for attr in ("start", "finish", "join"):
        _wrap(FastRows, attr, "rows." + attr)
    for attr in ("cache_budget", "check_request", "choose_path", "_finish", "run_fast"):
        _wrap(generate, attr, attr.strip("_"))
    _wrap(fast_generate, "host_criteria", "host_criteria")

    def collected(phase, info):
        if phase == "start":
            collected.began = time.perf_counter()
        else:
            GC.append(time.perf_counter() - collected.began)

    gc.callbacks.append(collected)


def split(call_start: float, call_end: float) -> dict:
    """One call's events as the parts the docstring names (milliseconds)."""
    rounds = [(s, e) for n, s, e in EVENTS if n == "round"]
    reads = [(s, e) for n, s, e in EVENTS if n == "read"]
    leaving = [s for n, s, e in EVENTS if n in ("store", "rows.finish", "shrink", "rows.join")]
    out = {"call": call_end - call_start, "rounds": len(rounds),
           "before": (rounds[0][0] - call_start) if rounds else 0.0,
           "launch": sum(e - s for s, e in rounds), "wait": sum(e - s for s, e in reads),
           "after": (call_end - reads[-1][1]) if reads else 0.0, "ahead_gap": 0.0, "leave_gap": 0.0,
           "leave_syncs": 0, "gc_ms": sum(GC), "gc_count": len(GC)}  # seconds until the conversion below
    for (_, read_end), (next_start, _) in zip(reads, rounds[1:]):
        left = any(read_end <= t <= next_start for t in leaving)
        out["leave_gap" if left else "ahead_gap"] += next_start - read_end
        out["leave_syncs"] += left
    # a launch's end to its sync: host work beside the device (hidden unless it outlasts the round)
    out["host_while_device"] = sum(read_start - launch_end for (_, launch_end), (read_start, _) in zip(rounds, reads))
    methods: dict = {}
    for n, s, e in EVENTS:
        methods[n] = methods.get(n, 0.0) + e - s
    ms = {k: 1e3 * v if isinstance(v, float) else v for k, v in out.items()}
    ms["methods"] = {k: round(1e3 * v, 3) for k, v in sorted(methods.items())}
    return ms


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", default=None)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-prompt-tokens", type=int, default=192)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--fixed", default="2,3", help="fixed k rows")
    p.add_argument("--calls", type=int, default=8, help="timed calls per configuration, interleaved")
    p.add_argument("--bucketed", action="store_true", help="force the runner (CPU smoke)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import hf_specdec

    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    tok, target, draft = load_pair(args.target, args.draft, device, dtype)
    torch.manual_seed(0)
    useless = type(draft)(copy.deepcopy(draft.config)).to(device=device, dtype=dtype).eval()
    hf_specdec.enable(target)
    x = batches(tok, prompt_sets(args, tok)["code"], args.batch_size, args.batch_size, args.max_prompt_tokens,
                device)[0]

    def ours(draft_model, **spec):
        base = dict(bucketed=True if args.bucketed else None)
        return lambda inputs: target.generate(
            input_ids=inputs[0], attention_mask=inputs[1], assistant_model=draft_model,
            max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, return_dict_in_generate=True,
            spec_config=hf_specdec.SpecConfig(**base, **spec))

    configs = {"plain": ours(None, num_speculative_tokens=0)}
    for k in [int(v) for v in args.fixed.split(",") if v]:
        configs[f"fixed k={k}"] = ours(draft, num_speculative_tokens=k, adaptive=False)
    configs["adaptive"] = ours(draft, num_speculative_tokens=args.k_max)
    configs["useless adaptive"] = ours(useless, num_speculative_tokens=4)
    for _ in range(2):
        for call in configs.values():
            for w in bucket_warmups(x, args.batch_size):
                call(w)
    instrument()
    calls: dict = {name: [] for name in configs}
    for rep in range(args.calls):
        for name in random.Random(rep).sample(list(configs), len(configs)):
            gc.collect()
            EVENTS.clear()
            GC.clear()
            with Timer(device) as t:
                start = time.perf_counter()
                out = configs[name](x)
            entry = split(start, start + t.seconds)
            m = out.spec_metrics
            entry.update(k_histogram=m.k_histogram, decode_ms=1e3 * m.decode_seconds, round_ms=1e3 * m.round_seconds)
            calls[name].append(entry)
    summary = {}
    for name, entries in calls.items():
        keys = [k for k, v in entries[0].items() if isinstance(v, (int, float))]
        summary[name] = {k: round(median(e[k] for e in entries), 3) for k in keys}
        names = sorted({n for e in entries for n in e["methods"]})
        summary[name]["methods"] = {n: round(median(e["methods"].get(n, 0.0) for e in entries), 3) for n in names}
    report = {"args": vars(args), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "summary": summary, "calls": calls}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    cols = ("call", "before", "launch", "wait", "ahead_gap", "leave_gap", "leave_syncs", "after", "host_while_device",
            "gc_ms", "rounds")
    print(f"{'ms (median)':18s}" + "".join(f"{c:>11s}" for c in cols))
    for name, s in summary.items():
        print(f"{name:18s}" + "".join(f"{s[c]:11.3f}" for c in cols))
    for name, s in summary.items():
        print(f"{name}: " + ", ".join(f"{n} {v:.2f}" for n, v in s["methods"].items()))


if __name__ == "__main__":
    main()
