"""benchmarks/round_launches.py on the CPU: a round's bookkeeping stays a few dozen device operations (each a
kernel launch in a round's CUDA graph), the commit and each forward's metadata one launch each."""
import json

from benchmarks import round_launches


def test_a_round_issues_few_launches_outside_the_models(tmp_path):
    out = tmp_path / "launches.json"
    round_launches.main(["--new-tokens", "24", "--out", str(out)])
    rows = {(r["method"], r["k"], r["do_sample"]): r for r in json.loads(out.read_text())["rows"]}
    greedy, plain = rows[("draft", 4, False)], rows[("draft", 0, False)]
    assert greedy["ops"].get("commit_round") == 1.0  # one launch a round (the torch commit was about forty)
    assert greedy["ops"].get("step_metadata") == 5.0  # one per forward: 4 draft steps and the verify
    # 185 and 60 with the commit and the metadata in torch ops: a return to per-op bookkeeping fails here
    assert greedy["ops_per_round"] < 100 and plain["ops_per_round"] < 30, (greedy, plain)
    assert rows[("draft", 4, True)]["ops_per_round"] > greedy["ops_per_round"]  # sampling also copies the probs
