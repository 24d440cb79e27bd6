"""evals/gemma_step_costs.py on CPU with --tiny: the Gemma 3 270M config shrunk, random weights, the draft built
as distill_draft builds it; every eager cost present (the runner's CUDA-graph costs need a GPU)."""
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "evals"))

import gemma_step_costs  # noqa: E402


def test_tiny_costs_on_cpu(tmp_path):
    out = tmp_path / "costs.json"
    report = gemma_step_costs.main(["--tiny", "--device", "cpu", "--num-kept", "1024", "--layers", "2",
                                    "--dtypes", "float32,bfloat16", "--batches", "1,2", "--context", "8",
                                    "--repeats", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert [(r["dtype"], r["batch"]) for r in report["results"]] == [
        ("float32", 1), ("float32", 2), ("bfloat16", 1), ("bfloat16", 2)]
    for r in report["results"]:
        assert set(r["eager"]) == {"target_step", "draft_step", "target_verify", "draft_over_target"}
        assert all(v > 0 for v in r["eager"].values()) and "runner" not in r
    for name in ("float32", "bfloat16"):
        b = report["bytes_per_step"][name]
        assert 0 < b["draft"] < b["target"]
    assert report["bytes_per_step"]["bfloat16"]["target"] * 2 == report["bytes_per_step"]["float32"]["target"]
