"""evals/run_eval.py and benchmarks/e2e.py on a tiny pair and a few HumanEval prompts (CPU)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))


def _humaneval():
    for cand in (os.path.join(REPO, "shared", "datasets", "humaneval", "HumanEval.jsonl.gz"),
                 "/work/shared/datasets/humaneval/HumanEval.jsonl.gz"):
        if os.path.exists(cand):
            return cand
    return None


def _spec_available():
    try:
        import hf_specdec

        hf_specdec.enable  # noqa: B018
        hf_specdec.SpecConfig  # noqa: B018
        return True, ""
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"


HUMANEVAL = _humaneval()
SPEC_OK, SPEC_WHY = _spec_available()
needs_data = pytest.mark.skipif(HUMANEVAL is None, reason="HumanEval.jsonl.gz not found")


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return tiny_pair


@needs_data
@pytest.mark.skipif(not SPEC_OK, reason=f"hf_specdec.enable is not available yet ({SPEC_WHY})")
def test_run_eval_outputs(pair, tmp_path):
    out = tmp_path / "eval"
    cmd = [sys.executable, os.path.join(REPO, "evals", "run_eval.py"), "--target", str(pair / "target"),
           "--draft", str(pair / "draft"), "--data", HUMANEVAL, "--limit", "3", "--max-new-tokens", "12",
           "--k", "3", "--fixed-k", "--out", str(out)]  # fixed k: on CPU adaptive k settles at 0 (nothing drafted)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.load(open(out / "results.json"))
    assert len(report["rows"]) == 3
    assert [r["index"] for r in report["rows"]] == [0, 1, 2]
    for r in report["rows"]:
        for m in ("plain", "hf_specdec"):
            assert r[m]["new_tokens"] > 0 and r[m]["tokens_per_s"] > 0
        assert 0.0 <= r["hf_specdec"]["acceptance_rate"] <= 1.0
        assert 1.0 <= r["hf_specdec"]["mean_acceptance_length"] <= 4.0
        assert r["identical_to_plain"] is True  # greedy speculative output == the target's greedy output (fp32)
    s = report["summary"]
    assert s["identical_to_plain_share"] == 1.0
    assert s["speedup"] > 0
    hist = s["hf_specdec"]["acceptance_length_histogram"]
    assert hist is not None and len(hist) == 4
    png = out / "eval.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_data
def test_e2e_smoke(pair, tmp_path):
    out = tmp_path / "e2e.json"
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "e2e.py"), "--target", str(pair / "target"),
           "--draft", str(pair / "draft"), "--prompts", HUMANEVAL, "--batch-sizes", "1,2",
           "--max-new-tokens", "8", "--num-prompts", "4", "--min-prompts", "2", "--repeats", "1",
           "--assisted-sweep", "3", "--k", "3", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.load(open(out))
    assert report["errors"] == [], report["errors"]
    methods = {(r["method"], r["batch_size"], r["mode"]) for r in report["results"]}
    for b in (1, 2):
        for mode in ("greedy", "sample"):
            assert ("plain_eager", b, mode) in methods
            assert ("plain_compiled", b, mode) in methods
            if SPEC_OK:
                assert ("hf_specdec", b, mode) in methods
                assert ("runner_plain", b, mode) in methods
    assert ("hf_assisted", 1, "greedy") in methods
    for r in report["results"]:
        assert r["tokens_per_s"] > 0
        if r["method"] == "plain_compiled":  # warmed over every batch: a later batch can still recompile
            assert r["warmup_calls"] == r["num_prompts"] // r["batch_size"] > 0
        if r["method"] in ("hf_specdec", "runner_plain"):
            assert r["timed_warmup_seconds"] == 0.0 and r["num_rounds"] > 0 and r["bandwidth_gb_s"] > 0
            assert r["fast_path"] == "bucketed" and "stage_note" in r  # CPU: no graphs; stage costs need CUDA events
            assert r["variant"] == ("k=0" if r["method"] == "runner_plain" else "fast k=3")
            if r["mode"] == "greedy":
                assert r["identical_to_plain_eager_greedy"] == 1.0
        if r["method"] == "hf_specdec":  # against HF's fastest pass: no more than against its median
            assert 0 < r["speedup_vs_plain_compiled_fastest"] <= r["speedup_vs_plain_compiled"]


@needs_data
def test_e2e_stopped_by_a_signal_still_reports_the_rows_it_ran(pair, tmp_path, monkeypatch):
    """`timeout` (or a job's time limit) sends SIGTERM: the rows already run keep their tables and JSON."""
    import signal

    from benchmarks import e2e

    def stopped_here(bench, compiled):
        if not compiled:
            signal.raise_signal(signal.SIGTERM)
        return run_plain(bench, compiled)

    run_plain = e2e.run_plain
    monkeypatch.setattr(e2e, "run_plain", stopped_here)
    previous = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "e2e.json"
    try:
        with pytest.raises(SystemExit, match="SIGTERM"):
            e2e.main(["--target", str(pair / "target"), "--draft", str(pair / "draft"), "--prompts", HUMANEVAL,
                      "--batch-sizes", "1", "--modes", "greedy", "--max-new-tokens", "4", "--num-prompts", "2",
                      "--min-prompts", "1", "--repeats", "1", "--k", "2", "--no-assisted", "--out", str(out)])
    finally:
        signal.signal(signal.SIGTERM, previous)
    report = json.load(open(out))
    assert "SIGTERM" in report["stopped"] and report["total_seconds"] > 0
    methods = {r["method"] for r in report["results"]}
    assert "plain_compiled" in methods and "plain_eager" not in methods
    assert all(r["tokens_per_s"] > 0 for r in report["results"])


def test_e2e_report_against_hf_fastest_pass():
    """The summary's ``/cmp max``: the fast path's median tokens/s over Hugging Face's compiled path's fastest pass."""
    sys.path.insert(0, REPO)
    from benchmarks.e2e_report import add_speedups, fastest_pass

    hf = {"method": "plain_compiled", "variant": "static_cache+compile", "batch_size": 1, "mode": "greedy",
          "new_tokens_all": [512, 512], "seconds_all": [1.159, 1.682], "tokens_per_s": 373.0}
    fast = {"method": "hf_specdec", "variant": "fast k=4", "batch_size": 1, "mode": "greedy", "tokens_per_s": 2075.6}
    assert fastest_pass(hf) == pytest.approx(512 / 1.159)
    add_speedups(fast, [hf, fast])
    assert fast["speedup_vs_plain_compiled"] == pytest.approx(2075.6 / 373.0)
    assert fast["speedup_vs_plain_compiled_fastest"] == pytest.approx(2075.6 * 1.159 / 512)


def test_e2e_report_warns_of_an_undertrained_pair():
    """build_pair's verdict that the target is no better than the draft (a budget spent before training: a 45-s pair
    once read held-out loss 9.40 against a uniform 9.70, acceptance 0) is the summary's first note."""
    sys.path.insert(0, REPO)
    from benchmarks.e2e_report import summary_notes

    report = {"results": [], "errors": [], "pair_summary": {
        "target": {"heldout_loss": 9.40}, "draft": {"heldout_loss": 9.39}, "vocab_size": 16384, "target_better": False}}
    notes = list(summary_notes(report))
    assert notes[0].startswith("warning: this pair's target is no better") and "9.70" in notes[0]
    report["pair_summary"]["target_better"] = True
    assert not any(n.startswith("warning") for n in summary_notes(report))


def _torchrun_eval(pair, out, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(REPO, "evals", "run_eval.py"), "--target", str(pair / "target"), "--draft",
           str(pair / "draft"), "--data", HUMANEVAL, "--limit", "3", "--max-new-tokens", "12", "--k", "3",
           "--out", str(out), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.load(open(out / "results.json")), res.stderr


@needs_data
@pytest.mark.skipif(not SPEC_OK, reason=f"hf_specdec.enable is not available yet ({SPEC_WHY})")
@pytest.mark.parametrize("parallel", ["data", "tensor"])
def test_run_eval_two_processes(pair, tmp_path, parallel):
    """Two gloo processes: prompts sharded (data) or one target split over both (--tp); the main process
    writes every row, its progress bar is the only one."""
    report, stderr = _torchrun_eval(pair, tmp_path / parallel, *(["--tp"] if parallel == "tensor" else []))
    assert report["num_processes"] == 2 and report["parallel"] == parallel
    assert [r["index"] for r in report["rows"]] == [0, 1, 2]
    assert {r["process"] for r in report["rows"]} == ({0, 1} if parallel == "data" else {0})
    assert report["summary"]["identical_to_plain_share"] == 1.0
    assert (tmp_path / parallel / "eval.png").exists()
    assert "eval[1]" not in stderr and "share of process 1" not in stderr


@needs_data
def test_strategies_smoke(pair, tmp_path):
    """benchmarks/strategies.py on CPU: every row of the code set runs its passes in a shuffled order, and the
    speculative rows (fp32 greedy) give runner_plain's own tokens."""
    out = tmp_path / "strategies.json"
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "strategies.py"), "--target", str(pair / "target"),
           "--draft", str(pair / "draft"), "--prompts", HUMANEVAL, "--batch-sizes", "2", "--num-prompts", "2",
           "--max-new-tokens", "10", "--k-max", "2", "--sections", "code", "--passes", "2",
           "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.load(open(out))
    rows = {r["row"]: r for r in report["rows"]}
    assert set(rows) == {"hf_compiled", "runner_plain", "fixed k=1", "fixed k=2", "adaptive", "useless fixed",
                         "useless adaptive"}, [r.get("error") for r in report["rows"]]
    for name, r in rows.items():
        assert len(r["pass_seconds"]) == 2 and r["tokens_per_s"] > 0
        if name != "hf_compiled":
            assert r["sequences"] == rows["runner_plain"]["sequences"], name
    assert {tuple(sorted(r["pass_positions"][p] for r in rows.values())) for p in (0, 1)} == {tuple(range(7))}
    code = report["summary"]["b=2"]["code"]
    assert code["best_fixed_k"] in (1, 2) and code["adaptive_vs_best_fixed_median"] > 0
    assert code["same_as_runner_plain"] == {"adaptive": 1.0, "useless adaptive": 1.0}


@needs_data
def test_host_timeline_splits_a_call_whole(pair, tmp_path):
    """benchmarks/host_timeline.py: the parts it reports from hf_specdec.record_timeline() (before, launches,
    waits, gaps, after, host work beside the device) add up to each call's time, and so do the steps' totals with
    the time outside them."""
    out = tmp_path / "timeline.json"
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "host_timeline.py"), "--target", str(pair / "target"),
           "--draft", str(pair / "draft"), "--batch-size", "3", "--max-new-tokens", "10", "--k-max", "2",
           "--fixed", "1", "--calls", "2", "--prompts", HUMANEVAL, "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.load(open(out))
    assert set(report["calls"]) == {"plain", "fixed k=1", "adaptive", "useless adaptive"}
    for name, calls in report["calls"].items():
        for c in calls:
            parts = sum(c[p] for p in ("before", "launch", "wait", "ahead_gap", "bookkeeping_gap", "after",
                                       "host_while_device"))
            assert c["rounds"] > 0 and abs(parts - c["call"]) < 0.05 * c["call"], (name, c)
            assert c["steps"]["wait"] == pytest.approx(c["wait"], abs=1e-3)
            assert c["steps"]["launch"] == pytest.approx(c["launch"], abs=1e-3)
            assert {"setup", "prefill", "choose", "retire", "join", "finish"} <= set(c["steps"]), c["steps"]
            assert sum(c["steps"].values()) + c["outside_steps"] == pytest.approx(c["call"], abs=1e-2)
            assert 0 <= c["bookkeeping_syncs"] < c["rounds"] and c["fast_path"] == "bucketed"


@needs_data
def test_version_ab_runs_each_variant_in_its_own_process(pair, tmp_path):
    """benchmarks/version_ab.py on CPU: each variant's process imports hf_specdec from its own root (a copy of this
    one here), and every configuration gets a rate per variant."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(os.path.join(REPO, "hf_specdec"), other / "hf_specdec")
    out = tmp_path / "ab.json"
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "version_ab.py"), "--pair", str(pair), "--prompts",
           HUMANEVAL, "--variants", f"copy={other}", f"here={REPO}", "--device", "cpu", "--batch-sizes", "2",
           "--num-prompts", "2", "--max-new-tokens", "6", "--passes", "1", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.load(open(out))
    assert [r["hf_specdec"] for r in report["runs"]] == [str(other / "hf_specdec"), os.path.join(REPO, "hf_specdec")]
    assert set(report["table"]) == {"b2_k3", "b2_k3_scores", "b2_adaptive"}
    assert all(r[k]["tok_s"] > 0 and r[k]["fast_path"] == "bucketed" for r in report["runs"] for k in report["table"])


def test_quickstart_runs_on_a_built_pair(pair):
    """README's first command ends in examples/quickstart.py: with the tiny pair built here it runs every call it
    shows and exits 0 only when greedy speculative output equals plain generate()'s."""
    cmd = [sys.executable, os.path.join(REPO, "examples", "quickstart.py"), "--pair", str(pair), "--max-new-tokens",
           "12", "-k", "3"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "identical to plain generate: True" in res.stdout and "fixed k = 3 [bucketed]" in res.stdout
