"""evals/train_draft_head.py on a tiny pair (CPU): the trained head agrees with the target more than an untrained
one, loads back for its target only, and drafts inside generate() without changing the greedy output.

Training is bounded by --max-steps (the budget is only a ceiling), so the result does not depend on how busy the
machine is."""

import json
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAD_STEPS = 40


def run(script, *args):
    res = subprocess.run([sys.executable, os.path.join(REPO, "evals", script), *map(str, args)],
                         capture_output=True, text=True, timeout=600)
    return res


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return tiny_pair


@pytest.fixture(scope="module")
def head_dir(pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_head") / "head"
    res = run("train_draft_head.py", "--pair", pair, "--out", out, "--max-steps", HEAD_STEPS, "--time-budget-s", 600,
              "--eval-windows", 8, "--eval-prompts", 16, "--prompt-len", 32, "--log-every-s", 100)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def test_trained_head_agrees_more_than_untrained(head_dir):
    s = json.load(open(head_dir / "summary.json"))
    assert s["steps"] == HEAD_STEPS and s["tokens_seen"] > 0 and s["head_params"] > 0
    assert s["same_tokens_as_pair"], "the head was not trained on the pair's token stream"
    trained, untrained = s["heldout"]["trained"], s["heldout"]["untrained"]
    assert trained["top1"] > untrained["top1"] + 0.05, s["heldout"]
    assert 0 <= trained["accepted_len_k4"] <= 4 and len(trained["step_acceptance"]) == 4
    assert s["last"]["loss"] < s["first"]["loss"]


def test_generate_with_trained_head_equals_target_greedy(pair, head_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_specdec

    tok = AutoTokenizer.from_pretrained(pair / "tokenizer")
    target = hf_specdec.enable(AutoModelForCausalLM.from_pretrained(pair / "target").eval())
    head = hf_specdec.load_draft_head(head_dir, target=target)
    rows = [json.loads(line)["prompt"] for line in open(pair / "heldout_prompts.jsonl")][:2]
    spec = hf_specdec.SpecConfig(num_speculative_tokens=3, block_size=4, adaptive=False)
    for text in rows:
        ids = tok(text, return_tensors="pt", truncation=True, max_length=48)["input_ids"]
        expected = target.generate(input_ids=ids, do_sample=False, max_new_tokens=12)
        out = target.generate(input_ids=ids, assistant_model=head, spec_config=spec, do_sample=False,
                              max_new_tokens=12, return_dict_in_generate=True)
        assert torch.equal(out.sequences, expected)
        rate = out.spec_metrics.acceptance_rate
        assert 0.0 <= rate <= 1.0 and out.spec_metrics.num_draft_tokens > 0


def test_head_refuses_another_target(pair, head_dir):
    from transformers import AutoModelForCausalLM

    import hf_specdec

    draft = AutoModelForCausalLM.from_pretrained(pair / "draft")
    with pytest.raises(ValueError, match="trained for"):
        hf_specdec.load_draft_head(head_dir, target=draft)


def test_bad_pair_dir_is_named(tmp_path):
    res = run("train_draft_head.py", "--pair", tmp_path / "nope", "--out", tmp_path / "h")
    assert res.returncode != 0 and "nope" in res.stderr and "build_pair.py" in res.stderr


def test_bad_ttt_steps_are_named(pair, tmp_path):
    res = run("train_draft_head.py", "--pair", pair, "--out", tmp_path / "h", "--ttt-steps", 5)
    assert res.returncode != 0 and "--ttt-steps 5" in res.stderr and "1 to 4" in res.stderr


def test_kept_vocab_head_trains_and_proposes_only_its_tokens(pair, tmp_path):
    """--kept-vocab N: the head's own output layer over the N most frequent training tokens; its drafts stay in
    that set, it beats an untrained head, and greedy output is still the target's."""
    from transformers import AutoModelForCausalLM

    import hf_specdec

    out = tmp_path / "kept"
    res = run("train_draft_head.py", "--pair", pair, "--out", out, "--max-steps", HEAD_STEPS, "--time-budget-s", 600,
              "--kept-vocab", 48, "--eval-windows", 8, "--eval-prompts", 16, "--prompt-len", 32, "--log-every-s", 100)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    s = json.load(open(out / "summary.json"))
    assert s["heldout"]["trained"]["top1"] > s["heldout"]["untrained"]["top1"] + 0.05, s["heldout"]
    target = hf_specdec.enable(AutoModelForCausalLM.from_pretrained(pair / "target").eval())
    head = hf_specdec.load_draft_head(out, target=target)
    kept = set(head.lm_head.token_ids.tolist())
    assert 48 <= len(kept) <= 51  # the 48 most frequent, and the special ids
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])
    expected = target.generate(input_ids=ids, do_sample=False, max_new_tokens=12)
    got = target.generate(input_ids=ids, assistant_model=head, do_sample=False, max_new_tokens=12,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, block_size=4, adaptive=False))
    assert torch.equal(got, expected)
    logits = head(ids[:, 1:], torch.arange(7)[None], torch.randn(1, 7, target.config.hidden_size)).logits
    assert set(logits.argmax(-1).flatten().tolist()) <= kept


def test_narrow_head_trains_with_unrolled_steps(pair, tmp_path):
    """--hidden-size: a head at half the target's width (an output layer of its own over every token, ``up`` back to
    the target's width for the next step and the feature loss), trained with two unrolled steps: it beats an
    untrained one, loads back at its width, and greedy output is still the target's."""
    from transformers import AutoModelForCausalLM

    import hf_specdec

    out = tmp_path / "narrow"
    res = run("train_draft_head.py", "--pair", pair, "--out", out, "--max-steps", HEAD_STEPS, "--time-budget-s", 600,
              "--hidden-size", 64, "--ttt-steps", 2, "--eval-windows", 8, "--eval-prompts", 16, "--prompt-len", 32,
              "--log-every-s", 100)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    s = json.load(open(out / "summary.json"))
    # slower to start than a full-width head (40 steps: 0.04-0.05 against 0.003 untrained, chance level)
    assert s["heldout"]["trained"]["top1"] > max(0.02, 5 * s["heldout"]["untrained"]["top1"]), s["heldout"]
    assert s["last"]["loss"] < s["first"]["loss"]
    target = hf_specdec.enable(AutoModelForCausalLM.from_pretrained(pair / "target").eval())
    head = hf_specdec.load_draft_head(out, target=target)
    assert head.config.hidden_size == 64 == target.config.hidden_size // 2
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])
    expected = target.generate(input_ids=ids, do_sample=False, max_new_tokens=12)
    got = target.generate(input_ids=ids, assistant_model=head, do_sample=False, max_new_tokens=12,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, block_size=4, adaptive=False))
    assert torch.equal(got, expected)
