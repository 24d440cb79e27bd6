#!/usr/bin/env python
"""Synthetic agreement traces with a chosen acceptance shape, for ``policy_replay.py replay``.

The policy models a row's drafts as accepted independently at one rate, so the tokens a round of
k gives grow like ``a + a^2 + ... + a^k``. An H100 pair's fp32 texts were far from that: of the
rounds' drafts, the 1st was accepted with 0.91, the 2nd given the 1st with 0.56, then 0.94, 0.94,
0.36 (fixed k = 8's per-position counts), and the policy chose k = 3 where k = 4 was best. Its
traces were not recorded; these reproduce the shape. Each text is a renewal process: after a
disagreement, a run of agreements whose j-th token agrees with ``hazards[j-1]`` given the earlier
ones (the last hazard repeats), then a disagreement. A round that starts after a disagreement (every
round after one that rejected a draft) accepts its j-th draft with exactly that hazard. The round
costs are copied from a traces file or a strategies result (``policy_replay.costs_of``).

    python benchmarks/synthetic_traces.py --costs benchmarks/results/2026-11-23-h100-policy-traces-fp32.json \\
        --out /tmp/synthetic.json
    python benchmarks/policy_replay.py replay --traces /tmp/synthetic.json --batch 1
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.policy_replay import costs_of  # noqa: E402

H100_FP32_HAZARDS = (0.91, 0.56, 0.94, 0.94, 0.36, 0.5)
# an H200 pair in bf16: with a row's log-odds moved by 0.8 * N(0, 1) (``--logit-spread``), fixed k's rounds match
# that pair's within 4% at batch 32 (the slowest row of 32 per call: 92.5, 87, 84.5, 82.5, 80.5 ... for k = 1..8;
# the mean row: 70, 51, 42, 37, 33, 31, 29, 28) and at batch 1; rows differ as much as HumanEval's texts did
H200_HAZARDS = (0.78, 0.82, 0.88, 0.92, 0.94)
H200_LOGIT_SPREAD = 0.8


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--costs", required=True, help="round costs: a traces file or a strategies result")
    p.add_argument("--hazards", default=",".join(map(str, H100_FP32_HAZARDS)),
                   help="acceptance of the j-th draft of a run given the earlier ones (the last repeats)")
    p.add_argument("--spread", type=float, default=0.0,
                   help="rows differ: row r's hazards are h ** exp(spread * N(0, 1)) (0: every row alike)")
    p.add_argument("--logit-spread", type=float, default=0.0,
                   help="rows differ: row r's hazards move by logit-spread * N(0, 1) in log-odds (the H200 pair: 0.8)")
    p.add_argument("--h200-shape", action="store_true",
                   help="an H200 bf16 pair's shape: its hazards and --logit-spread 0.8")
    p.add_argument("--num-traces", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def agreement_bits(hazards: np.ndarray, length: int, rng: np.random.Generator) -> str:
    """One text's agreement: runs drawn from ``hazards`` (the last one repeats), each ended by a '0'."""
    bits = []
    while len(bits) < length:
        j = 0
        while rng.random() < hazards[min(j, len(hazards) - 1)]:
            bits.append("1")
            j += 1
        bits.append("0")
    return "".join(bits[:length])


def synthetic_report(costs_ms: dict, hazards, num_traces: int, new_tokens: int, spread: float = 0.0,
                     seed: int = 0, logit_spread: float = 0.0) -> dict:
    """A traces report (``policy_replay`` reads it): every text ``new_tokens`` long, a draft following
    ``hazards`` and a useless one (never agrees)."""
    rng = np.random.default_rng(seed)
    base = np.asarray(hazards, dtype=np.float64)
    traces = []
    for _ in range(num_traces):
        h = base ** np.exp(spread * rng.standard_normal()) if spread else base
        if logit_spread:
            h = 1.0 / (1.0 + np.exp(logit_spread * rng.standard_normal() - np.log(h / (1.0 - h))))
        traces.append({"prompt_tokens": 0, "new_tokens": new_tokens, "draft": agreement_bits(h, new_tokens, rng),
                       "useless": "0" * new_tokens})
    return {"args": {"synthetic": True, "hazards": list(map(float, base)), "spread": spread,
                     "logit_spread": logit_spread, "seed": seed},
            "device": "synthetic", "costs_ms": costs_ms, "traces": traces}


def conditional_acceptance(bits: list[str], positions: int) -> np.ndarray:
    """Of runs that reached position j (j-1 agreements after a '0' or the start), the share that agreed
    at j: the hazards a renewal trace was drawn with."""
    reached, agreed = np.zeros(positions), np.zeros(positions)
    for text in bits:
        for run in (len(r) for r in text.split("0")[:-1]):  # runs ended by a disagreement
            n = min(run + 1, positions)
            reached[:n] += 1
            agreed[:min(run, positions)] += 1
    return agreed / np.maximum(reached, 1)


def main(argv=None):
    args = parse_args(argv)
    hazards = [float(x) for x in args.hazards.split(",")]
    if args.h200_shape:
        hazards, args.logit_spread = list(H200_HAZARDS), H200_LOGIT_SPREAD
    report = synthetic_report(costs_of(args.costs), hazards, args.num_traces, args.new_tokens, args.spread,
                              args.seed, args.logit_spread)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh)
    seen = conditional_acceptance([t["draft"] for t in report["traces"]], len(hazards))
    print(f"{args.num_traces} traces, conditional acceptance {np.round(seen, 3).tolist()} -> {args.out}")


if __name__ == "__main__":
    main()
