"""evals/build_pair.py --tiny: a pair that loads back, shares one tokenizer, and whose target is the better model."""

import json
import math
import os

import pytest
import torch

from tiny_pair import TINY_STEPS


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return tiny_pair


def test_outputs_exist(pair):
    for sub in ("target", "draft"):
        assert os.path.exists(os.path.join(pair, sub, "model.safetensors"))
        assert os.path.exists(os.path.join(pair, sub, "tokenizer.json"))
        assert os.path.exists(os.path.join(pair, sub, "config.json"))
    summary = json.load(open(os.path.join(pair, "summary.json")))
    assert summary["steps"] == TINY_STEPS
    assert summary["heldout_files"] >= 1 and summary["train_files"] >= 1
    split = json.load(open(os.path.join(pair, "split.json")))
    assert not set(split["train"]) & set(split["heldout"]), "a file is on both sides of the split"
    rows = [json.loads(line) for line in open(os.path.join(pair, "heldout_prompts.jsonl"))]
    assert rows and all(r["source"] in split["heldout"] for r in rows)


def test_load_back_and_shared_vocab(pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tt = AutoTokenizer.from_pretrained(pair / "target")
    td = AutoTokenizer.from_pretrained(pair / "draft")
    assert tt.get_vocab() == td.get_vocab()
    assert tt.bos_token == "<s>" and tt.eos_token == "</s>" and tt.pad_token == "<pad>"
    assert len({tt.bos_token_id, tt.eos_token_id, tt.pad_token_id}) == 3
    text = "def add(a, b):\n    return a + b\n"
    ids = tt(text)["input_ids"]
    assert ids[0] == tt.bos_token_id
    assert tt.decode(ids, skip_special_tokens=True) == text
    target = AutoModelForCausalLM.from_pretrained(pair / "target")
    draft = AutoModelForCausalLM.from_pretrained(pair / "draft")
    assert isinstance(target, LlamaForCausalLM) and isinstance(draft, LlamaForCausalLM)
    assert target.config.vocab_size == draft.config.vocab_size == len(tt)
    n_t = sum(p.numel() for p in target.parameters())
    n_d = sum(p.numel() for p in draft.parameters())
    assert n_t > 4 * n_d


def test_target_better_on_heldout(pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    summary = json.load(open(os.path.join(pair, "summary.json")))
    assert summary["target"]["heldout_loss"] < summary["draft"]["heldout_loss"], summary
    assert summary["target_better"]
    # independent check on the saved weights: held-out prompt windows
    tok = AutoTokenizer.from_pretrained(pair / "target")
    rows = [json.loads(line)["prompt"] for line in open(os.path.join(pair, "heldout_prompts.jsonl"))][:16]
    losses = {}
    for name in ("target", "draft"):
        model = AutoModelForCausalLM.from_pretrained(pair / name).eval()
        tot, n = 0.0, 0
        with torch.no_grad():
            for text in rows:
                ids = tok(text, return_tensors="pt", truncation=True, max_length=256)["input_ids"]
                out = model(input_ids=ids, labels=ids)
                tot += float(out.loss) * (ids.shape[1] - 1)
                n += ids.shape[1] - 1
        losses[name] = tot / n
    assert math.isfinite(losses["target"]) and losses["target"] < losses["draft"], losses
