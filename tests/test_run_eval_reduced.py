"""evals/run_eval.py with a reduced-vocabulary draft directory (``save_reduced_draft``, embedding taken from the
target): loaded onto the target, batches of 2 and 1, greedy outputs identical to plain greedy for hf_specdec
and for Hugging Face's own assisted generation, acceptance per position, JSON and PNG (CPU, tiny Gemma 3)."""
import json
import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "evals"))

import run_eval  # noqa: E402
from reduced_models import reduced_copy  # noqa: E402
from test_distill_draft import tiny_target_dir  # noqa: E402

PROMPTS = ["def add(a, b):\n", "import os\nimport sys\n\n", "class Cache:\n    def __init__(self):\n",
           "for i in range(10):\n"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from hf_specdec.reduced_vocab_io import is_reduced_draft, save_reduced_draft

    root = tmp_path_factory.mktemp("reduced_eval")
    tok = tiny_target_dir(root / "target")
    target = AutoModelForCausalLM.from_pretrained(root / "target").eval()
    special = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    kept = torch.tensor(sorted(special | set(range(0, target.config.vocab_size, 2))))
    draft = reduced_copy(target, kept, noise=0.05)
    save_reduced_draft(draft, root / "draft", target=target, tokenizer=tok)
    assert is_reduced_draft(root / "draft") and not is_reduced_draft(root / "target")
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"t/{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return root, data


def _run(pair, out, *extra):
    root, data = pair
    run_eval.main(["--target", str(root / "target"), "--draft", str(root / "draft"), "--data", str(data),
                   "--max-new-tokens", "10", "--k", "3", "--fixed-k", "--out", str(out), *extra])
    return json.load(open(out / "results.json"))


def test_reduced_draft_batched(pair, tmp_path):
    report = _run(pair, tmp_path, "--batch-size", "2", "--limit", "3")
    assert [r["index"] for r in report["rows"]] == [0, 1, 2]
    assert [c["indices"] for c in report["calls"]] == [[0, 1], [2]]
    s = report["summary"]
    assert s["hf_specdec"]["identical_to_plain"] == s["hf_specdec"]["rows_compared"] == 3  # fp32: token for token
    assert s["identical_to_plain_share"] == 1.0
    assert s["hf_specdec"]["calls"] == s["plain"]["calls"] == 2
    spec = s["hf_specdec"]
    per_pos = spec["acceptance_per_position"]
    assert len(per_pos) == 3 and all(0.0 <= a <= 1.0 for a in per_pos) and per_pos == sorted(per_pos, reverse=True)
    assert spec["mean_acceptance_length"] == pytest.approx(1.0 + sum(per_pos))
    assert list(spec["k_histogram"]) == ["3"]  # --fixed-k (JSON keys are strings)
    assert sum(spec["acceptance_length_histogram"]) > 0
    assert (tmp_path / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reduced_draft_with_hf_assisted(pair, tmp_path):
    """Hugging Face's assisted generation takes the reduced draft as it is (same vocabulary size; the draft's
    probability is 0 outside its kept tokens) and, greedy, gives the target's own output."""
    report = _run(pair, tmp_path, "--limit", "2", "--methods", "plain,hf_compiled,hf_specdec,hf_assisted")
    s = report["summary"]
    for method in ("hf_compiled", "hf_specdec", "hf_assisted"):
        assert "errors" not in s[method], s[method]
        assert s[method]["identical_to_plain"] == s[method]["rows_compared"] == 2
    assert s["speedup_vs_hf_assisted"] > 0 and s["speedup_vs_hf_compiled"] > 0
    assert report["rows"][0]["hf_specdec"]["mean_acceptance_length"] >= 1.0  # batch 1: per-row acceptance


def test_hf_assisted_needs_batch_one(pair, tmp_path):
    with pytest.raises(SystemExit, match="batch_size = 1"):
        _run(pair, tmp_path, "--batch-size", "2", "--methods", "plain,hf_assisted")
