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
    # over this short call (its setup counts): about 200 and 60 with the commit and the metadata in torch ops, 86 and
    # 22 with the constants and each draft step's positions made every round, 66 and 18 now; a return fails here
    assert greedy["ops_per_round"] < 75 and plain["ops_per_round"] < 20, (greedy, plain)
    # none a round (the call's setup has a few): the verify's constants are kept, and it has no processors to feed
    assert all(greedy["ops"].get(name, 0) < 1 for name in ("ones", "ones_like", "repeat_interleave")), greedy["ops"]
    assert rows[("draft", 4, True)]["ops_per_round"] > greedy["ops_per_round"]  # sampling also copies the probs
    lookup = rows[("ngram", 4, False)]  # the search is one launch a round (in torch ops about ten per n: 111 a round)
    assert lookup["ops"].get("ngram_drafts") == 1.0 and lookup["ops_per_round"] < 50, lookup
