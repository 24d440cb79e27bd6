"""The Gemma 3 route of docs/draft_heads.md on CPU, at tiny size: a saved pretrained target outside a pair (a tiny
random Gemma 3 with its own tokenizer), a reduced-vocabulary draft distilled from it, a draft head trained for it
(``--target/--tokenizer``, ``--kept-vocab``), then ``benchmarks/e2e.py`` with both as the GPU run uses them."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(REPO, "hf_specdec")  # local text: this package's own source

from test_evals import HUMANEVAL, needs_data  # noqa: E402


def run(*cmd):
    res = subprocess.run([sys.executable, *map(str, cmd)], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


@needs_data
def test_gemma_head_against_reduced_draft_end_to_end(tmp_path):
    from test_distill_draft import tiny_target_dir

    tiny_target_dir(tmp_path / "target")
    run(os.path.join(REPO, "evals", "distill_draft.py"), "--target", tmp_path / "target", "--out", tmp_path / "draft",
        "--source-dir", SOURCE, "--max-bytes", "3e5", "--heldout-frac", "0.2", "--num-kept", "96", "--layer-indices",
        "0,3", "--seq-len", "64", "--batch-size", "4", "--max-steps", "6", "--warmup-steps", "2", "--count-windows",
        "8", "--heldout-windows", "2", "--eval-prompts", "2", "--eval-prompt-tokens", "24", "--eval-new-tokens", "6",
        "--eval-batch", "2", "--k", "3", "--cost-batches", "1", "--cost-context", "16", "--device", "cpu")
    run(os.path.join(REPO, "evals", "train_draft_head.py"), "--target", tmp_path / "target", "--tokenizer",
        tmp_path / "target", "--out", tmp_path / "head", "--source-dir", SOURCE, "--kept-vocab", 96, "--max-steps", 6,
        "--time-budget-s", 600, "--seq-len", 64, "--batch-size", 4, "--eval-windows", 4, "--eval-prompts", 8,
        "--prompt-len", 24, "--log-every-s", 100, "--device", "cpu", "--ttt-steps", 2)
    s = json.load(open(tmp_path / "head" / "summary.json"))
    assert s["settings"]["ttt_steps"] == 2 and s["steps"] == 6 and s["pair_train_tokens_available"] is None and s["train_tokens_available"] > 0
    meta = json.load(open(tmp_path / "head" / "draft_head.json"))
    assert "Gemma3" in json.dumps(meta)  # saved for this target's class

    out = tmp_path / "e2e.json"
    run(os.path.join(REPO, "benchmarks", "e2e.py"), "--target", tmp_path / "target", "--draft",
        tmp_path / "draft" / "draft", "--head", tmp_path / "head", "--head", f"again={tmp_path / 'head'}", "--device", "cpu", "--dtype", "float32",
        "--prompts", HUMANEVAL, "--num-prompts", 2, "--min-prompts", 2, "--max-prompt-tokens", 32,
        "--max-new-tokens", 8, "--batch-sizes", 1, "--modes", "greedy,sample", "--repeats", 1, "--no-assisted",
        "--out", out)
    report = json.load(open(out))
    assert report["errors"] == []
    rows = {(r["method"], r["variant"], r["mode"]): r for r in report["results"]}
    for variant in ("head k=4", "head[again] k=4", "fast k=4"):  # the heads, and the reduced draft model
        greedy, sample = rows[("hf_specdec", variant, "greedy")], rows[("hf_specdec", variant, "sample")]
        assert greedy["identical_to_plain_eager_greedy"] == 1.0, greedy  # fp32 CPU: token for token
        assert greedy["new_tokens"] > 0 and sample["new_tokens"] > 0


def test_e2e_head_arguments(tmp_path, monkeypatch):
    sys.path.insert(0, REPO)
    from benchmarks.e2e_spec import head_label_and_path, load_heads

    assert head_label_and_path("runs/head") == ("head", "runs/head")
    assert head_label_and_path("slim=runs/head_slim") == ("head[slim]", "runs/head_slim")
    assert head_label_and_path("runs/lr=1e-3/head") == ("head", "runs/lr=1e-3/head")  # '=' inside a path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x=y").mkdir()
    assert head_label_and_path("x=y") == ("head", "x=y")  # an existing directory is a path
    try:
        load_heads(["runs/a", "runs/b"], target=None, params={})
    except SystemExit as exc:
        assert "2 heads labelled 'head'" in str(exc) and "NAME=DIR" in str(exc)
    else:
        raise AssertionError("two unnamed heads were accepted")
