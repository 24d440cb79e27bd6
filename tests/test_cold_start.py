"""CPU smoke of benchmarks/cold_start.py: its tiny shapes end to end, one fresh process per (method, batch).

Two drivers run side by side (batch 3 with the warm second processes, batch 1 without), each with a part of
the methods (Hugging Face's rows in both: the tokens' reference), seven processes in all. Every row must be
present with positive times, the speculative and runner rows' greedy tokens (first, steady, new-length call, and
the warm process's first call) must equal plain Hugging Face greedy's in fp32, each cold process must have
had its own fresh cache directories and its warm process the same ones; rows not run are skipped
with the reason. ``check_report`` is also shown to fail on a doctored report.
"""
import copy
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "cold_start.py")
METHODS = "hf_compiled,runner_plain,spec_default,spec_k4,runner_plain_graphs"
RUN = {3: "hf_compiled,spec_k4,runner_plain_graphs", 1: "hf_compiled,runner_plain,spec_default,runner_plain_graphs"}
CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "HF_SPECDEC_CACHE")
NEW_TOKENS, PROMPT, DELTA = 10, 12, 37


def launch(out, methods, *extra):
    cmd = [sys.executable, SCRIPT, "--shapes", "tiny", "--methods", methods, "--max-new-tokens", str(NEW_TOKENS),
           "--prompt-len", str(PROMPT), "--length-delta", str(DELTA), "--out", str(out), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, out):
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout[-3000:]
    with open(out) as fh:
        return json.load(fh), stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cold_start")
    with_second = launch(tmp / "b3.json", RUN[3], "--batch-sizes", "3")
    without = launch(tmp / "b1.json", RUN[1], "--batch-sizes", "1", "--no-second-process")
    return {3: finish(with_second, tmp / "b3.json"), 1: finish(without, tmp / "b1.json")}


def check_report(report, batch, second):
    """AssertionError where the report of a tiny run at this batch size is wrong."""
    rows = {(r["method"], r["batch_size"]): r for r in report["rows"]}
    assert sorted(rows) == sorted((m, batch) for m in RUN[batch].split(","))
    graphs = rows.pop(("runner_plain_graphs", batch))
    assert "CUDA" in graphs["skipped"] and "first_call_s" not in graphs
    assert report["env"]["torch"] and report["env"]["device_name"] == "cpu"
    hf = rows[("hf_compiled", batch)]
    seen_dirs = set()
    for (method, _), row in rows.items():
        assert "skipped" not in row and "error" not in row, row.get("error") or row.get("skipped")
        for key in ("first_call_s", "steady_call_s", "new_length_s", "ms_per_token", "load_s"):
            assert row[key] > 0, (method, key, row[key])
        calls = row["cold_process"]["calls"]
        assert [c["prompt_len"] for c in calls.values()] == [PROMPT, PROMPT, PROMPT + DELTA]
        assert calls["first"]["tokens"] == calls["steady"]["tokens"]
        for name, call in calls.items():
            assert len(call["tokens"]) == batch and all(len(t) == NEW_TOKENS for t in call["tokens"])
            assert call["tokens"] == hf["cold_process"]["calls"][name]["tokens"], (method, name, "differs from HF")
        dirs = row["cold_process"]["env"]["caches"]
        assert all(dirs[v] for v in CACHE_VARS) and not seen_dirs & set(dirs.values()), "cache dirs shared"
        seen_dirs |= set(dirs.values())
        if method == "hf_compiled":
            assert row["compiled"] is False and "did not compile" in row["note"]  # CPU: no auto-compile
        else:  # spec_metrics read from the output
            assert row["fast_path"] == "bucketed", (method, row["fast_path"])  # CPU: the runner without graphs
            assert row["first_warmup_seconds"] == 0.0
            assert row["same_tokens_as_hf_compiled"] is True
        if second:
            assert row["second_process_first_call_s"] > 0
            warm = row["second_process"]
            assert warm["env"]["caches"] == dirs, "the second process must reuse the cold process's caches"
            assert list(warm["calls"]) == ["first"] and warm["calls"]["first"]["tokens"] == calls["steady"]["tokens"]
        else:
            assert row["second_process"] is None and "second_process_first_call_s" not in row


def test_tiny_end_to_end(runs):
    for batch, (report, stdout) in runs.items():
        check_report(report, batch, second=batch == 3)
        tail = stdout.strip().splitlines()
        start = max(i for i, line in enumerate(tail) if line.startswith("| method |"))
        table = [line for line in tail[start:] if line.startswith("| ")]
        assert len(table) == 1 + len(RUN[batch].split(","))  # header + one line per row, printed last
        assert any(line.startswith("| runner_plain_graphs | ") and "skipped" in line for line in table)
    spec_k4 = next(r for r in runs[3][0]["rows"] if r["method"] == "spec_k4")
    spec_rounds = spec_k4["cold_process"]["calls"]["steady"]
    assert spec_rounds["num_rounds"] < NEW_TOKENS and spec_rounds["acceptance_rate"] > 0  # drafts were accepted


def test_check_report_can_fail(runs):
    report = runs[3][0]
    check_report(copy.deepcopy(report), 3, second=True)
    def bump(tokens, i):
        tokens[i] = (tokens[i] + 1) % 256

    assert [r["method"] for r in report["rows"]][:2] == ["hf_compiled", "spec_k4"]
    for doctor in (lambda r: bump(r["rows"][1]["cold_process"]["calls"]["steady"]["tokens"][1], 4),
                   lambda r: bump(r["rows"][1]["cold_process"]["calls"]["new_length"]["tokens"][2], 9),
                   lambda r: bump(r["rows"][1]["second_process"]["calls"]["first"]["tokens"][0], 0),
                   lambda r: bump(r["rows"][0]["cold_process"]["calls"]["first"]["tokens"][2], 3),
                   lambda r: r["rows"][1].__setitem__("steady_call_s", 0.0),
                   lambda r: r["rows"].pop(1),
                   lambda r: r["rows"][1]["second_process"]["env"]["caches"].__setitem__("TRITON_CACHE_DIR", "/x")):
        bad = copy.deepcopy(report)
        doctor(bad)
        with pytest.raises(AssertionError):
            check_report(bad, 3, second=True)


def test_deadline_skips_every_row(tmp_path):
    report, stdout = finish(launch(tmp_path / "none.json", METHODS, "--batch-sizes", "1,3", "--deadline-s", "0"),
                            tmp_path / "none.json")
    assert len(report["rows"]) == 2 * len(METHODS.split(","))
    for row in report["rows"]:
        assert row["skipped"] and "first_call_s" not in row
        assert "deadline" in row["skipped"] or row["method"] == "runner_plain_graphs"
    assert stdout.count(" | skipped |") == len(report["rows"])


def test_paths_are_taken_from_the_callers_directory(tmp_path, monkeypatch):
    """The children run in the repository: --pair and --prompts must mean what they meant where the caller was."""
    from benchmarks import cold_start
    monkeypatch.chdir(tmp_path)
    args = cold_start.parse_args(["--shapes", "pair", "--pair", "runs/pair", "--prompts", "data/h.jsonl.gz"])
    assert args.pair == str(tmp_path / "runs" / "pair") and args.prompts == str(tmp_path / "data" / "h.jsonl.gz")
    assert cold_start.parse_args(["--shapes", "tiny"]).pair is None
