"""Gemma 3 270M from PyPI's GGUF packages (the optional ``gemma`` extra): the local safetensors copy
loads back identical, and greedy speculative output equals the target's own greedy output on real
prompts longer than Gemma 3's 512-token sliding window, at batch 1 and 4, on the runner (no CUDA
graphs on CPU). Select with ``-k gemma``; skipped without ``pip install -e ".[gemma]"`` (CI does not install it).

The copy is built under pytest's tmp dir, or reused from HF_SPECDEC_GEMMA_DIR (e.g. runs/gemma3-270m,
built by ``evals/gemma_checkpoint.py``); either way it is compared with the GGUF-loaded model.
"""
import os
import sys

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "evals"))

import gemma_checkpoint as gemma  # noqa: E402

MISSING = gemma.gemma_missing()
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"gemma extra not installed (missing {MISSING}): pip install -e '.[gemma]'")
MAX_NEW = 10  # not a multiple of k + 1 = 5


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Build the copy (or reuse HF_SPECDEC_GEMMA_DIR's) and compare it with the GGUF-loaded model."""
    out = os.environ.get("HF_SPECDEC_GEMMA_DIR") or tmp_path_factory.mktemp("gemma3-270m")
    return gemma.build_checkpoint(out, verify=True)


def test_gemma_copy_reloads_identical(built):
    """GGUF -> safetensors -> from_pretrained gives the same tensors, tied embedding, token ids and logits."""
    assert built["same_tensors"]
    assert built["tied"] == [True, True]
    assert built["same_token_ids"]
    assert built["max_logit_diff"] <= 1e-5
    config = open(os.path.join(built["out"], "config.json")).read()
    assert "quantization_config" not in config and "gguf" not in config


@pytest.fixture(scope="module")
def target(built):
    model, tok, _ = gemma.load_copy(built["out"])
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.sliding_window == 512
    return model, tok


@pytest.mark.parametrize("batch", [1, 4])
def test_gemma_greedy_exact_long_prompts(target, batch):
    model, tok = target
    assert max(gemma.BATCH_LENGTHS[batch]) > model.config.sliding_window
    rows = gemma.check_greedy(model, tok, batches=(batch,), max_new_tokens=MAX_NEW)
    assert len(rows) == 2  # {copy, tiny}
    for r in rows:
        assert r["identical"], r
        assert r["fast_path"] == "bucketed" or r["fast_path"].startswith("graphs"), r
        assert r["logit_diff"] is not None, r  # output_logits came back, one per generated position
        if r["draft"] == "copy":
            assert r["acceptance"] == 1.0, r  # a copy of the target accepts every greedy draft
