"""benchmarks/scale.py --shapes tiny on the CPU: every code path that runs without CUDA (copy bandwidth, weight
bytes and floors, the runner's stage costs, HF's static-cache step, CPU ops in place of kernels, projection,
long-prompt time to first token,
report), and the projection recomputed from the JSON's measured costs by the formula in its docstring."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import scale  # noqa: E402
from benchmarks.scale_report import ALPHAS, KS, report, verify_at  # noqa: E402

STEPS = ("target_step", "plain_round", "plain_step_wall", "draft_step", "draft_first_step", "propose",
         "verify_and_commit", "round", "hf_step")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("scale") / "scale_tiny.json"
    scale.main(["--shapes", "tiny", "--device", "cpu", "--batches", "1,2", "--repeats", "3", "--long-prompts", "40,80",
                "--long-repeats", "2", "--out", str(out)])
    with open(out) as fh:
        return json.load(fh)


def test_bandwidth_and_bytes(result):
    assert result["device"] == "cpu" and result["shapes"] == "tiny"
    assert result["copy"]["gb_per_s"] > 0 and result["copy"]["bytes"] > 0
    for name, (hidden, layers, *_) in (("target", scale.TINY["target"]), ("draft", scale.TINY["draft"])):
        m = result["models"][name]
        assert m["layers"] == layers
        table = 256 * hidden * 4  # fp32 input embedding: not read whole, one row per token
        assert m["fixed_bytes"] == m["param_bytes"] - table
        assert m["per_step_bytes_1tok"] == m["fixed_bytes"] + hidden * 4
        assert m["kv_bytes_per_token"] > 0


def test_rows_have_positive_costs(result):
    assert [r["batch"] for r in result["rows"]] == [1, 2]
    for r in result["rows"]:
        for key in STEPS:
            assert r[key] > 0, key
        assert sorted(r["verify"], key=int) == ["2", "5", "9"] and all(v > 0 for v in r["verify"].values())
        assert set(r["fast_path"]) == {"0", "1", "4", "8"} and all(p == "bucketed" for p in r["fast_path"].values())
        f = r["floor_ms"]
        b, bw = r["batch"], result["copy"]["gb_per_s"] * 1e9
        target = result["models"]["target"]
        assert f["target"] == pytest.approx((target["fixed_bytes"] + b * target["embedding_row_bytes"]) / bw * 1e3)
        assert f["target_with_kv"] > f["target"] and f["draft_2"] > f["draft"] > 0
        assert r["floor_share"]["target_step"] == pytest.approx(f["target"] / r["target_step"])
        assert r["floor_share"]["round"] == pytest.approx((f["draft_2"] + 3 * f["draft"] + f["target_5"]) / r["round"])
        assert r["ratios"]["draft_over_target"] == pytest.approx(r["draft_step"] / r["target_step"])
        for name, model in (("target", "target"), ("draft", "draft"), ("verify", "target")):
            k = r["kernels"][name]
            assert k["per_step"] > 0 and k["top"] and k["source"].startswith("cpu")
            assert k["per_layer"] == pytest.approx(k["per_step"] / result["models"][model]["layers"])
    ratios = result["batch_ratios"]["b2_over_b1"]
    assert ratios["target_step"] == pytest.approx(result["rows"][1]["target_step"] / result["rows"][0]["target_step"])


def _interp(v, q):
    (q0, v0), (q1, v1) = ((2, v["2"]), (5, v["5"])) if q <= 5 else ((5, v["5"]), (9, v["9"]))
    return v0 + (v1 - v0) * (q - q0) / (q1 - q0)


@pytest.mark.parametrize("alpha,k", [(0.8, 3), (0.6, 6), (0.9, 8), (0.7, 1)])
def test_projection_follows_the_formula(result, alpha, k):
    r = result["rows"][-1]
    ds, dfs, v = r["draft_step"], r["draft_first_step"], r["verify"]
    overhead = r["round"] - (4 * ds + (dfs - ds) + v["5"])
    cost = k * ds + (dfs - ds) + _interp(v, k + 1) + overhead
    e = (1 - alpha ** (k + 1)) / (1 - alpha)
    got = r["projection"]["by_alpha"][str(alpha)]["per_k"][str(k)]
    assert r["projection"]["label"] == "projection"
    assert r["projection"]["overhead_ms"] == pytest.approx(overhead)
    assert got["E"] == pytest.approx(e)
    assert got["vs_hf"] == pytest.approx(e * r["hf_step"] / cost)
    assert got["vs_ours"] == pytest.approx(e * r["plain_round"] / cost)


def test_best_k_is_the_argmax(result):
    for r in result["rows"]:
        for a in ALPHAS:
            entry = r["projection"]["by_alpha"][str(a)]
            for basis in ("vs_hf", "vs_ours"):
                best = max(KS, key=lambda k: entry["per_k"][str(k)][basis])
                assert entry["best"][basis]["k"] == best


def test_verify_interpolation():
    v = {"2": 1.0, "5": 4.0, "9": 6.0}
    assert verify_at(v, 2) == 1.0 and verify_at(v, 4) == pytest.approx(3.0) and verify_at(v, 7) == pytest.approx(5.0)
    assert verify_at(v, 11) == pytest.approx(7.0) and verify_at(v, 1) == pytest.approx(0.0)  # linear beyond


def test_report(result, tmp_path):
    text = report([result])
    assert "GPU: cpu; float32; shapes tiny" in text
    assert "| 1 |" in text and "| 2 |" in text and "Projection" in text and "k=8" in text
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    scale.main(["--report", str(path)])  # the command line's --report path


def test_long_prompts_time_the_first_token_of_both(result):
    long = result["long_prompts"]
    assert sorted(long["ttft_ms"], key=int) == ["40", "80"]
    for row in long["ttft_ms"].values():
        assert row["ours"] > 0 and row["hf"] > 0 and row["ours_over_hf"] == pytest.approx(row["ours"] / row["hf"])
        assert row["target_only_over_hf"] == pytest.approx(row["ours_target_only"] / row["hf"])
    assert "b32_memory" not in long  # a CUDA measurement
    assert "Time to first token" in report([result])
