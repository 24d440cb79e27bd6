"""benchmarks/policy_replay.py's premise: on fp32 greedy texts, a teacher-forced draft forward predicts every
round of the runner exactly, so the policy can be judged on the CPU from traces recorded on the GPU."""
import json
import os
import sys

import numpy as np
import pytest
import torch

import hf_specdec
from hf_specdec.round.policy.speculation_length import SpeculationLength
from models import left_padded_prompts, make_draft, make_model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.policy_replay import agreement, costs_of, replay_call, round_costs, runs_of_agreement  # noqa: E402


def test_runs_of_agreement():
    assert runs_of_agreement("0110111").tolist() == [0, 2, 1, 0, 3, 2, 1, 0]


def test_round_costs_from_traces_or_a_strategies_result(tmp_path):
    """``replay --costs``: a traces file's costs_ms, or a strategies result's adaptive row (another run's
    round costs, e.g. bf16's, on the same texts)."""
    table = {"1": {"0": 1.0, "1": 1.5}}
    traces, strategies = tmp_path / "traces.json", tmp_path / "strategies.json"
    traces.write_text(json.dumps({"costs_ms": table, "traces": []}))
    strategies.write_text(json.dumps({"rows": [{"row": "fixed k=1", "spec_metrics": {}},
                                               {"row": "adaptive", "spec_metrics": {"round_costs_ms": table}}]}))
    for path in (traces, strategies):
        assert round_costs(costs_of(str(path)), 1, str(path)).tolist() == [1e-3, 1.5e-3]
    with pytest.raises(SystemExit, match="bucket 8"):
        round_costs(table, 8, "traces.json")


@pytest.mark.parametrize("k", [1, 3, 5])
def test_replayed_rounds_match_the_runner(k):
    target = hf_specdec.enable(make_model("llama", seed=3))
    draft = make_draft(target, "mix")
    runs, rounds, accepted = [], 0, 0
    for seed in (1, 2, 3):
        ids, mask = left_padded_prompts(1, seed=seed)
        kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=40, eos_token_id=None,
                  return_dict_in_generate=True)
        out = target.generate(**kw, assistant_model=draft,
                              spec_config=hf_specdec.SpecConfig(num_speculative_tokens=k, adaptive=False,
                                                                block_size=4))
        rounds += out.spec_metrics.num_rounds
        accepted += out.spec_metrics.num_accepted_tokens
        runs.append(runs_of_agreement(agreement(draft, ids[0], out.sequences[0, ids.shape[1]:])))
    assert 0 < accepted < rounds * k  # partial acceptance: the replay has something to predict
    cost = np.arange(1.0, k + 2.0)
    replayed, predicted_accepted = 0, 0
    for run in runs:
        policy = SpeculationLength(k, False, "draft")
        observed = []
        policy.observe = lambda bucket, kk, s, verdicts: observed.extend(verdicts)
        n, _ = replay_call(policy, 1, [run], cost, 0.0)
        replayed += n
        predicted_accepted += sum(v[1] for v in observed)
    assert replayed == rounds
    # a call's last round may accept drafts past its last token, which the trace cannot know
    assert predicted_accepted <= accepted <= predicted_accepted + len(runs) * k


def test_shrinking_buckets_follow_the_live_rows(tmp_path):
    """--shrink: a call's rounds are priced at the bucket of its live rows (a row that ends early leaves
    the other at bucket 1's cost)."""
    costs = {"1": {"0": 1.0, "1": 1.5}, "2": {"0": 2.0, "1": 3.0}}
    traces = {"costs_ms": costs, "traces": [{"draft": "0" * 4, "useless": "0" * 4},
                                            {"draft": "0" * 8, "useless": "0" * 8}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(traces))
    from benchmarks import policy_replay
    out = policy_replay.replay(policy_replay.parse_args(
        ["replay", "--traces", str(path), "--batch", "2", "--passes", "1", "--shrink"]))
    k0 = out["results"]["fixed k=0"]
    # row 0: 3 rounds at bucket 2; row 1: 7 rounds, the last 4 alone at bucket 1
    assert k0["rounds"] == 7 and abs(k0["seconds"] - (3 * 2.0 + 4 * 1.0) / 1e3) < 1e-9, k0
