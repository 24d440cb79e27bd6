"""benchmarks/synthetic_traces.py: traces with a chosen acceptance shape, and the policy on an H100 pair's shape
(far from geometric), where a + a^2 + ... + a^k chose k = 3 and fixed k = 4 was best."""
import json
import os
import sys
from collections import Counter

import numpy as np

from hf_specdec.round.policy.speculation_length import GRAPH_HOLD_ROUNDS, SpeculationLength

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import policy_replay  # noqa: E402
from benchmarks.synthetic_traces import H100_FP32_HAZARDS, conditional_acceptance, main, synthetic_report  # noqa: E402

# an H100 pair's fp32 round costs at batch 1 (ms): k = 3 is cheaper than k = 2
FP32_B1_MS = {"1": {"0": 1.489, "1": 2.368, "2": 3.579, "3": 2.866, "4": 3.304, "5": 3.697, "6": 4.666, "7": 4.923,
                    "8": 5.11}}


def test_traces_follow_the_hazards():
    report = synthetic_report(FP32_B1_MS, H100_FP32_HAZARDS, num_traces=200, new_tokens=128, seed=1)
    texts = [t["draft"] for t in report["traces"]]
    assert all(len(t) == 128 for t in texts) and report["traces"][0]["useless"] == "0" * 128
    seen = conditional_acceptance(texts, len(H100_FP32_HAZARDS))
    assert np.abs(seen - np.array(H100_FP32_HAZARDS)).max() < 0.05, seen


def replayed(runs, k, adaptive, memory, passes=1):
    """Round seconds and k histogram of the last of ``passes`` passes over single-row calls."""
    cost = np.array([FP32_B1_MS["1"][str(j)] for j in range(9)]) / 1e3
    for _ in range(passes):
        seconds, histogram = 0.0, Counter()
        for run in runs:
            policy = SpeculationLength(k, adaptive, "draft", memory, hold_rounds=GRAPH_HOLD_ROUNDS)
            seconds += policy_replay.replay_call(policy, 1, [run], cost, 0.0)[1]
            policy.end_call()
            histogram.update(policy.histogram)
    return seconds, histogram


def test_on_the_h100_shape_the_policy_takes_the_fastest_k():
    """Drafts 2 and 5 of a run are hard: k = 4 emits the 5th token free (the target's) and gives more tokens
    per second than k = 3, which geometric acceptance preferred (0.93 of the best fixed k replayed)."""
    report = synthetic_report(FP32_B1_MS, H100_FP32_HAZARDS, num_traces=32, new_tokens=128, seed=2)
    runs = [policy_replay.runs_of_agreement(t["draft"]) for t in report["traces"]]
    fixed = {k: replayed(runs, k, False, {})[0] for k in range(1, 9)}
    best = min(fixed, key=fixed.get)
    measured = {(1, k): [float(c) / 1e3] for k, c in enumerate(FP32_B1_MS["1"].values())}  # as the runner times them
    seconds, histogram = replayed(runs, 8, True, {"costs": measured}, passes=2)
    assert best == 4 and histogram.most_common(1)[0][0] == best, (fixed, histogram)
    assert fixed[best] / seconds >= 0.97


def test_the_script_writes_a_report_the_replay_reads(tmp_path):
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"costs_ms": FP32_B1_MS, "traces": []}))
    out = tmp_path / "syn.json"
    main(["--costs", str(costs), "--num-traces", "4", "--new-tokens", "40", "--out", str(out)])
    result = policy_replay.replay(policy_replay.parse_args(["replay", "--traces", str(out), "--passes", "1"]))
    assert set(result["results"]) == {f"fixed k={k}" for k in range(9)} | {"adaptive"}


def test_h200_shape_matches_its_fixed_k_rounds(tmp_path):
    """The H200 bf16 pair's shape (rows' log-odds spread 0.8): the slowest of 32 rows needs about its fixed-k rounds
    (92.5 at k = 1, 80.5 at k = 8 per call), the mean row about its mean (70 and 28)."""
    from benchmarks.synthetic_traces import H200_HAZARDS, H200_LOGIT_SPREAD
    report = synthetic_report({"1": {"0": 1.0}}, H200_HAZARDS, num_traces=64, new_tokens=128, seed=0,
                              logit_spread=H200_LOGIT_SPREAD)
    runs = [policy_replay.runs_of_agreement(t["draft"]) for t in report["traces"]]

    def rounds(run, k):
        pos, n = 1, 0
        while pos < len(run) - 1:
            pos, n = min(pos + min(k, int(run[pos])) + 1, len(run) - 1), n + 1
        return n
    table = np.array([[rounds(r, k) for k in (1, 8)] for r in runs])
    slowest = (table[:32].max(0) + table[32:].max(0)) / 2
    assert np.all(np.abs(slowest / [92.5, 80.5] - 1) < 0.1), slowest
    assert np.all(np.abs(table.mean(0) / [69.75, 27.9] - 1) < 0.1), table.mean(0)
