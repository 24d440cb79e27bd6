#!/usr/bin/env python
"""Replay the speculation-length policy on recorded agreement traces: judge it on the CPU, exactly.

Greedy decoding in fp32 writes the same text whatever k is, and so does the draft: at position t
it proposes argmax q(. | text[:t]) for as long as its earlier proposals were accepted. One
teacher-forced draft forward over the final text therefore gives ``agree[t]`` (the draft's
argmax after text[:t] is text[t]), and a round of k drafts that starts at t accepts
``min(k, run of agree from t)`` tokens and emits one more. With the round costs c(B, k) that
the runner measured on the GPU, the rounds and round time of any policy on those texts follow
without the GPU, for fixed k and for ``SpeculationLength`` itself (the real class, fed the
verdicts the runner would report).

    trace   (GPU)  texts from the runner at k = 0, the draft's (and a random draft's)
                   agreement along each, the policy's round costs at batch 1 and --batch
    replay  (CPU)  fixed k = 0..K and the adaptive policy on the traces, one call per batch of
                   rows, calls in order with the policy's memory kept across them (as in
                   benchmarks/strategies.py); prints rounds, round seconds and ratios

GPU:  PYTHONPATH=. python benchmarks/policy_replay.py trace --target runs/pair/target \\
          --draft runs/pair/draft --prompts .devshim/he/HumanEval.jsonl.gz --out $OUT/traces.json
CPU:  python benchmarks/policy_replay.py replay --traces traces.json --batch 1
      (--costs RESULT.json: another run's round costs on the same texts, e.g. a bf16 strategies
      result's; benchmarks/synthetic_traces.py writes traces of a chosen acceptance shape)
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from collections import Counter

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import load_pair, pick_device, pick_dtype, policy_constants  # noqa: E402
from hf_specdec.runner import bucket_for  # noqa: E402  (library internals: imported here only)
from hf_specdec.round.policy import speculation_length as sl  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace", help="record texts, agreement and round costs (GPU)")
    t.add_argument("--target", required=True)
    t.add_argument("--draft", required=True)
    t.add_argument("--prompts", default=None)
    t.add_argument("--num-prompts", type=int, default=64)
    t.add_argument("--max-prompt-tokens", type=int, default=192)
    t.add_argument("--max-new-tokens", type=int, default=128)
    t.add_argument("--k-max", type=int, default=8)
    t.add_argument("--batch", type=int, default=32, help="a second bucket whose round costs are recorded")
    t.add_argument("--device", default="auto")
    t.add_argument("--dtype", default="float32", help="fp32: the text does not depend on k")
    t.add_argument("--out", required=True)
    r = sub.add_parser("replay", help="fixed k and the adaptive policy on recorded traces (CPU)")
    r.add_argument("--traces", required=True)
    r.add_argument("--batch", type=int, default=1, help="rows per call (costs of that bucket)")
    r.add_argument("--num-prompts", type=int, default=None, help="the first N traces (default all)")
    r.add_argument("--draft", default="draft", choices=("draft", "useless"))
    r.add_argument("--passes", type=int, default=3, help="passes over the calls (the policy's memory persists)")
    r.add_argument("--costs", default=None, metavar="JSON",
                   help="round costs from another run: a strategies result (its adaptive row's round_costs_ms, "
                        "e.g. the bf16 run's) or a traces file (default: the traces' own)")
    r.add_argument("--shrink", action="store_true",
                   help="the bucket follows the live rows as they finish (32 -> 24 -> 16 ...), each at its costs")
    r.add_argument("--decision-ms", type=float, default=0.0, help="host time of a fresh policy decision")
    r.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="override a module constant of round/policy/speculation_length.py (e.g. _DECAY=0.99)")
    return p.parse_args(argv)


def trace(args) -> None:
    import hf_specdec
    from benchmarks.strategies import batches, prompt_sets

    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    tok, target, draft = load_pair(args.target, args.draft, device, dtype)
    torch.manual_seed(0)  # the random draft of benchmarks/strategies.py
    useless = type(draft)(copy.deepcopy(draft.config)).to(device=device, dtype=dtype).eval()
    hf_specdec.enable(target)
    kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
              eos_token_id=tok.eos_token_id, return_dict_in_generate=True)
    work = batches(tok, prompt_sets(args, tok)["code"], 1, args.num_prompts, args.max_prompt_tokens, device)
    rows = []
    for i, (ids, mask) in enumerate(work):
        if i % 16 == 0:  # progress: a run cut short on the device still says how far it came
            print(f"trace: text {i + 1} of {len(work)}", flush=True)
        out = target.generate(input_ids=ids, attention_mask=mask, **kw,
                              spec_config=hf_specdec.SpecConfig(num_speculative_tokens=0))
        full = out.sequences[:1]
        new = full[0, ids.shape[1]:]
        if tok.pad_token_id is not None:
            new = new[new != tok.pad_token_id]
        entry = {"prompt_tokens": ids.shape[1], "new_tokens": int(new.numel())}
        entry.update((name, agreement(model, ids[0], new)) for name, model in (("draft", draft), ("useless", useless)))
        rows.append(entry)
    costs = {}
    for b in sorted({1, args.batch}):
        ids, mask = work[0] if b == 1 else _stack(work, b)
        print(f"trace: round costs at batch {b} (adaptive k = 0..{args.k_max}: every k's graphs captured)", flush=True)
        out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, **kw,
                              spec_config=hf_specdec.SpecConfig(num_speculative_tokens=args.k_max))
        costs.update(out.spec_metrics.round_costs_ms)
    report = {"args": vars(args), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "costs_ms": {str(b): {str(k): c for k, c in v.items()} for b, v in costs.items()}, "traces": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    agree = np.mean([np.mean([c == "1" for c in r["draft"]]) for r in rows])
    print(f"traces: {len(rows)} texts, draft agreement {agree:.3f}, costs (ms) {report['costs_ms']}", flush=True)


def agreement(draft, prompt: torch.Tensor, new: torch.Tensor) -> str:
    """'1' where the draft's greedy token after prompt + new[:j] is new[j] (teacher-forced, one forward)."""
    with torch.no_grad():
        pred = draft(torch.cat([prompt, new])[None]).logits[0, len(prompt) - 1:-1].argmax(-1)
    return "".join("1" if a else "0" for a in (pred == new).tolist())


def _stack(work, b):
    """b single-row prompts as one left-padded batch."""
    ids = [w[0][0] for w in (work * b)[:b]]
    width = max(len(x) for x in ids)
    pad = torch.zeros((b, width), dtype=torch.long, device=ids[0].device)
    mask = torch.zeros_like(pad)
    for i, x in enumerate(ids):
        pad[i, width - len(x):], mask[i, width - len(x):] = x, 1
    return pad, mask


def runs_of_agreement(bits: str) -> np.ndarray:
    """run[t]: how many consecutive agreements start at new-token position t."""
    run = np.zeros(len(bits) + 1, dtype=np.int64)
    for t in range(len(bits) - 1, -1, -1):
        run[t] = run[t + 1] + 1 if bits[t] == "1" else 0
    return run


def replay_call(policy, bucket: int, runs: list[np.ndarray], cost: np.ndarray, decision_s: float,
                shrink: dict = None) -> tuple:
    """One call: rows start after the prefill's token; each round emits min(k, run) + 1 per live row.
    ``shrink``: bucket -> costs; the bucket follows the live rows (``bucket_for``), as in the runner.
    Returns (rounds, seconds)."""
    pos = [1] * len(runs)
    ends = [len(r) - 1 for r in runs]
    rounds, seconds = 0, 0.0
    while True:
        live = [i for i in range(len(runs)) if pos[i] < ends[i]]
        if not live:
            return rounds, seconds
        if shrink is not None:
            bucket = bucket_for(len(live))
            cost = shrink[bucket]
        before = policy.decisions_taken
        k = policy.choose(bucket, live, [ends[i] - pos[i] for i in live])
        fresh = policy.decisions_taken != before
        verdicts = []
        for i in live:
            n = min(k, int(runs[i][pos[i]]))
            verdicts.append((i, n, k))
            pos[i] = min(pos[i] + n + 1, ends[i])
        rounds += 1
        seconds += float(cost[k]) + (decision_s if fresh else 0.0)
        policy.observe(bucket, k, float(cost[k]), verdicts)


def costs_of(path: str) -> dict:
    """Round costs (ms per bucket and k) of a traces file, of a strategies result's adaptive row or of an e2e
    result's first speculative row (``benchmarks/e2e.py``: the adaptive fast path's)."""
    with open(path) as fh:
        report = json.load(fh)
    if "costs_ms" in report:
        return report["costs_ms"]
    for row in report.get("rows", []):
        if row.get("row") == "adaptive" and (row.get("spec_metrics") or {}).get("round_costs_ms"):
            return row["spec_metrics"]["round_costs_ms"]
    for row in report.get("results", []):
        if row.get("method") == "hf_specdec" and (row.get("spec_metrics") or {}).get("round_costs_ms"):
            return row["spec_metrics"]["round_costs_ms"]
    raise SystemExit(f"{path}: no costs_ms and no adaptive row with round_costs_ms")


def round_costs(costs_ms: dict, bucket: int, source: str) -> np.ndarray:
    """Seconds of a round of k = 0..K at ``bucket``."""
    table = costs_ms.get(str(bucket))
    if table is None:
        raise SystemExit(f"no round costs for bucket {bucket} in {source} (recorded: {sorted(costs_ms)})")
    return np.array([table[str(k)] for k in range(len(table))]) / 1e3


def replay(args) -> dict:
    with policy_constants(args.set):  # --set NAME=VALUE: the policy's constants, restored after
        return _replay(args)


def _replay(args) -> dict:
    with open(args.traces) as fh:
        report = json.load(fh)
    traces = report["traces"][:args.num_prompts]
    bucket = bucket_for(args.batch)
    table, source = (report["costs_ms"], args.traces) if args.costs is None else (costs_of(args.costs), args.costs)
    cost = round_costs(table, bucket, source)
    k_max = len(cost) - 1
    shrink = None
    if args.shrink:
        shrink = {b: round_costs(table, b, source)
                  for b in sorted({bucket_for(n) for n in range(1, args.batch + 1)})}
    runs = [runs_of_agreement(t[args.draft]) for t in traces]
    calls = [runs[i:i + args.batch] for i in range(0, len(runs), args.batch)]
    results = {}
    for name, k, adaptive in [(f"fixed k={k}", k, False) for k in range(k_max + 1)] + [("adaptive", k_max, True)]:
        memory = {"costs": {(b, j): [float(c)] for b, row in (shrink or {bucket: cost}).items()
                            for j, c in enumerate(row)}}
        total_rounds, total_seconds, histogram = 0, 0.0, Counter()
        for p in range(args.passes):
            for call in calls:
                policy = sl.SpeculationLength(k, adaptive, "draft", memory, hold_rounds=sl.GRAPH_HOLD_ROUNDS)
                rounds, seconds = replay_call(policy, bucket, call, cost, args.decision_ms / 1e3, shrink)
                policy.end_call()
                if p == args.passes - 1:  # the last pass: the policy's memory is warm, as in a timed pass
                    total_rounds, total_seconds = total_rounds + rounds, total_seconds + seconds
                    histogram.update(policy.histogram)
        results[name] = {"rounds": total_rounds, "seconds": total_seconds, "k_histogram": dict(sorted(histogram.items()))}
    best = min((r for n, r in results.items() if n.startswith("fixed k=") and n != "fixed k=0"),
               key=lambda r: r["seconds"])
    tokens = sum(len(r) - 2 for r in runs)
    for name, r in results.items():
        print(f"{name:12s} rounds {r['rounds']:6d}  round s {r['seconds']:8.4f}  tok/s {tokens / r['seconds']:9.1f}"
              + (f"  k {r['k_histogram']}" if name == "adaptive" else ""))
    ratio = best["seconds"] / results["adaptive"]["seconds"]
    print(f"adaptive / best fixed k: {ratio:.3f}   adaptive / k=0: "
          f"{results['fixed k=0']['seconds'] / results['adaptive']['seconds']:.3f}")
    return {"results": results, "adaptive_vs_best_fixed": ratio}


def main(argv=None):
    args = parse_args(argv)
    trace(args) if args.cmd == "trace" else replay(args)


if __name__ == "__main__":
    main()
