#!/usr/bin/env python
"""Where a call spends its time on the host, configuration by configuration.

Issue 12's b = 32 benchmarks (H200, bf16) found adaptive calls 4-10 ms a call slower than fixed k
outside their rounds (``decode_seconds - round_seconds``), erratically, while their rounds were as
fast or faster. This tool records each call's steps with the public hook ``hf_specdec.record_timeline()``
(``hf_specdec/call/timeline.py``: a ``(name, start, end)`` span per step), runs each configuration's calls
interleaved after two warm-up sweeps, and reports per configuration the median over calls of:

    call               the whole generate() call, synchronised on both ends
    before             the call's start to its first round's launch (setup, prefill, first token, load)
    launch             inside the ``launch`` spans (the rounds being issued; the choice of k is ``choose``)
    wait               inside the ``wait`` spans (the device finishing a round; the one sync)
    ahead_gap          a wait's end to the next launch, where that round was launched right after the sync
                       (the sync's bookkeeping then runs beside the device: part of host_while_device)
    bookkeeping_gap    the same where the next round was launched only after the sync's bookkeeping (a
                       retire, join or shrink span lies in the gap): rows joined, host reads ran (stopping
                       criteria, scores, a streamer) or rows waited to join. The spans do not say whether
                       rows left at a sync (retire and join run at every sync), so no split by that is made
    bookkeeping_syncs  how many gaps were of the second kind
    host_while_device  a launch's end to its wait's start: host work beside the device (hidden unless it
                       outlasts the round)
    after              the last wait's end to the call's end (statistics, padding steps, output)
    gc_ms              Python garbage collections during the call (``gc.callbacks``), and gc_count

These parts add up to ``call``. ``steps``: the milliseconds in each step of the timeline's ``STEPS``
(``Timeline.totals()``), and ``outside_steps``: the call's time in none of them (transformers' generate()
around the call, the round loop's own code). Output: JSON with every call's split, and a table.

GPU:  PYTHONPATH=. python benchmarks/host_timeline.py --target runs/pair/target --draft runs/pair/draft \\
          --prompts .devshim/he/HumanEval.jsonl.gz --out $OUT/host_timeline.json
CPU smoke: python benchmarks/host_timeline.py --target runs/tiny_pair/target --draft runs/tiny_pair/draft \\
          --batch-size 4 --max-new-tokens 12 --k-max 3 --calls 2 --out /tmp/t.json
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import random
import sys
import time
from statistics import median

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hf_specdec  # noqa: E402
from benchmarks.common import Timer, load_pair, pick_device, pick_dtype  # noqa: E402
from benchmarks.e2e_spec import bucket_warmups  # noqa: E402
from benchmarks.strategies import batches, prompt_sets  # noqa: E402

GC: list = []  # seconds of each collection during the call being timed
BOOKKEEPING = ("retire", "join", "shrink")  # a sync's bookkeeping steps (hf_specdec.call.timeline.STEPS)


def watch_gc() -> None:
    """Time every garbage collection from now on into ``GC``."""
    def collected(phase, info):
        if phase == "start":
            collected.began = time.perf_counter()
        elif hasattr(collected, "began"):
            GC.append(time.perf_counter() - collected.began)

    gc.callbacks.append(collected)


def split(spans: list, totals: dict, call_start: float, call_end: float) -> dict:
    """One call's spans as the parts the docstring names (milliseconds)."""
    launches = [(s, e) for n, s, e in spans if n == "launch"]
    waits = [(s, e) for n, s, e in spans if n == "wait"]
    bookkeeping = [s for n, s, e in spans if n in BOOKKEEPING]
    out = {"call": call_end - call_start, "rounds": len(launches),
           "before": (launches[0][0] - call_start) if launches else 0.0,
           "launch": sum(e - s for s, e in launches), "wait": sum(e - s for s, e in waits),
           "after": (call_end - waits[-1][1]) if waits else 0.0, "ahead_gap": 0.0, "bookkeeping_gap": 0.0,
           "bookkeeping_syncs": 0, "gc_ms": sum(GC), "gc_count": len(GC)}  # seconds until the conversion below
    for (_, wait_end), (next_start, _) in zip(waits, launches[1:]):
        held = any(wait_end <= t <= next_start for t in bookkeeping)
        out["bookkeeping_gap" if held else "ahead_gap"] += next_start - wait_end
        out["bookkeeping_syncs"] += held
    # each round is one launch then one wait: a launch's end to its wait's start is host work beside the device
    out["host_while_device"] = sum(wait_start - launch_end for (_, launch_end), (wait_start, _) in zip(launches, waits))
    out["outside_steps"] = out["call"] - sum(totals.values())
    ms = {k: 1e3 * v if isinstance(v, float) else v for k, v in out.items()}
    ms["steps"] = {k: round(1e3 * v, 3) for k, v in sorted(totals.items())}
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
    p.add_argument("--compile-wait", action="store_true",
                   help="SpecConfig(compile=True): the warm-up waits for the compiled models, so that every timed "
                        "call runs the steady state (else calls of the first minute run beside the compilation)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    tok, target, draft = load_pair(args.target, args.draft, device, dtype)
    torch.manual_seed(0)
    useless = type(draft)(copy.deepcopy(draft.config)).to(device=device, dtype=dtype).eval()
    hf_specdec.enable(target)
    x = batches(tok, prompt_sets(args, tok)["code"], args.batch_size, args.batch_size, args.max_prompt_tokens,
                device)[0]

    def ours(draft_model, **spec):
        return lambda inputs: target.generate(
            input_ids=inputs[0], attention_mask=inputs[1], assistant_model=draft_model,
            max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, return_dict_in_generate=True,
            spec_config=hf_specdec.SpecConfig(**({"compile": True} if args.compile_wait else {}), **spec))

    configs = {"plain": ours(None, num_speculative_tokens=0)}
    for k in [int(v) for v in args.fixed.split(",") if v]:
        configs[f"fixed k={k}"] = ours(draft, num_speculative_tokens=k, adaptive=False)
    configs["adaptive"] = ours(draft, num_speculative_tokens=args.k_max)
    configs["useless adaptive"] = ours(useless, num_speculative_tokens=4)
    for _ in range(2):
        for call in configs.values():
            for w in bucket_warmups(x, args.batch_size):
                call(w)
    watch_gc()
    calls: dict = {name: [] for name in configs}
    for rep in range(args.calls):
        for name in random.Random(rep).sample(list(configs), len(configs)):
            gc.collect()
            GC.clear()
            with hf_specdec.record_timeline() as timeline, Timer(device) as t:
                out = configs[name](x)
            entry = split(timeline.spans, timeline.totals(), t.start, t.start + t.seconds)
            m = out.spec_metrics
            entry.update(k_histogram=m.k_histogram, decode_ms=1e3 * m.decode_seconds, round_ms=1e3 * m.round_seconds,
                         fast_path=m.fast_path)
            calls[name].append(entry)
    summary = {}
    for name, entries in calls.items():
        keys = [k for k, v in entries[0].items() if isinstance(v, (int, float))]
        summary[name] = {k: round(median(e[k] for e in entries), 3) for k in keys}
        names = sorted({n for e in entries for n in e["steps"]})
        summary[name]["steps"] = {n: round(median(e["steps"].get(n, 0.0) for e in entries), 3) for n in names}
        summary[name]["fast_path"] = " | ".join(sorted({e["fast_path"] for e in entries}))
    report = {"args": vars(args), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "summary": summary, "calls": calls}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    cols = ("call", "before", "launch", "wait", "ahead_gap", "bookkeeping_gap", "bookkeeping_syncs", "after",
            "host_while_device", "gc_ms", "rounds")
    widths = [max(len(c), 9) + 1 for c in cols]
    print(f"{'ms (median)':18s}" + "".join(f"{c:>{w}s}" for c, w in zip(cols, widths)))
    for name, s in summary.items():
        print(f"{name:18s}" + "".join(f"{s[c]:{w}.3f}" for c, w in zip(cols, widths)))
    for name, s in summary.items():
        print(f"{name} [{s['fast_path']}]: " + ", ".join(f"{n} {v:.2f}" for n, v in s["steps"].items())
              + f", outside steps {s['outside_steps']:.2f}")


if __name__ == "__main__":
    main()
