"""evals/distill_draft.py end to end on CPU: a tiny random Gemma 3 target with its own tokenizer,
a few distillation steps, the saved draft loaded back, greedy output identical, figures present."""
import os
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "evals"))

import distill_draft  # noqa: E402
from build_pair import train_tokenizer, wrap_tokenizer  # noqa: E402
from distill_model import parse_layers, pick_layers  # noqa: E402

SOURCE = os.path.join(REPO, "hf_specdec")  # local text: this package's own source


def tiny_target_dir(path):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    texts = []
    for root, _, files in os.walk(SOURCE):
        texts += [open(os.path.join(root, f)).read() for f in sorted(files) if f.endswith(".py")]
    tok = wrap_tokenizer(train_tokenizer(texts, 384), model_max_length=10**6)
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                        "sliding_attention"], sliding_window=16, max_position_embeddings=512,
                           pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                           initializer_range=0.2, tie_word_embeddings=False)
    model = Gemma3ForCausalLM(cfg)
    with torch.no_grad():  # a random tied model just repeats its last token; an untied head does not
        model.lm_head.weight.normal_(0.0, 0.5)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return tok


def test_layer_choice():
    assert pick_layers(18, 4) == [0, 1, 2, 3]
    assert parse_layers("17, 0,6", 18) == [0, 6, 17]
    with pytest.raises(SystemExit, match="--layers 5"):
        pick_layers(4, 5)
    with pytest.raises(SystemExit, match=r"\[0, 18\)"):
        parse_layers("0,18", 18)


def test_distill_tiny_gemma_end_to_end(tmp_path):
    from transformers import AutoModelForCausalLM

    from hf_specdec.reduced_vocab import reduced_head
    from hf_specdec.reduced_vocab_io import load_reduced_draft

    tok = tiny_target_dir(tmp_path / "target")
    out = tmp_path / "out"
    s = distill_draft.main([
        "--target", str(tmp_path / "target"), "--out", str(out), "--source-dir", SOURCE,
        "--max-bytes", "3e5", "--heldout-frac", "0.2",
        "--num-kept", "96", "--layer-indices", "0,3", "--seq-len", "64", "--batch-size", "4", "--max-steps", "12",
        "--lr", "3e-3", "--warmup-steps", "2", "--count-windows", "16", "--heldout-windows", "2",
        "--eval-prompts", "3", "--eval-prompt-tokens", "24", "--eval-new-tokens", "8", "--eval-batch", "3",
        "--k", "3", "--cost-batches", "1,2", "--cost-context", "16", "--device", "cpu"])
    assert (out / "summary.json").exists() and (out / "draft/model.safetensors").exists()
    assert len((out / "heldout_prompts.jsonl").read_text().splitlines()) == 3  # run_eval.py --data
    assert s["layers"] == [0, 3] and s["kept"]["num_kept"] == 96
    assert s["train"]["steps"] == 12 and s["train"]["last_loss"] < s["train"]["first_loss"]
    target = AutoModelForCausalLM.from_pretrained(tmp_path / "target")
    draft = load_reduced_draft(out / "draft", target=target)
    ids = reduced_head(draft).token_ids.tolist()
    assert len(ids) == 96 and {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id} <= set(ids)
    e = s["eval"]
    assert e["greedy"]["identical_rows"] == e["greedy"]["rows"] == 3  # fp32 CPU: token for token
    for mode in ("greedy", "sample"):
        assert e[mode]["draft_tokens"] > 0 and 0.0 <= e[mode]["acceptance_rate"] <= 1.0
    h = e["heldout"]
    assert 0.0 < h["target_mass_on_kept"] < 1.0
    assert 0.0 <= h["expected_sampled_acceptance"] <= h["target_mass_on_kept"] + 1e-6
    c = e["cost"]
    assert c["bytes_per_step"]["draft"] < c["bytes_per_step"]["target"]
    assert c["batch1"]["draft"] > 0 and c["batch2"]["target"] > 0


def test_draft_with_every_layer_is_the_target_on_the_kept_tokens(tmp_path):
    """The layer copy, embedding, norm and head rows are the target's: with all layers kept, the draft's logits
    equal the target's at the kept ids (and the fill elsewhere)."""
    from transformers import AutoModelForCausalLM

    from distill_model import draft_from_target
    from hf_specdec.reduced_vocab import fill_value

    tiny_target_dir(tmp_path / "target")
    target = AutoModelForCausalLM.from_pretrained(tmp_path / "target").eval()
    kept = torch.arange(0, target.config.vocab_size, 3)
    ids = torch.randint(3, target.config.vocab_size, (2, 40))
    with torch.no_grad():
        want = target(ids).logits
        full = draft_from_target(target, kept, [0, 1, 2, 3]).eval()(ids).logits
        part = draft_from_target(target, kept, [0, 3]).eval()(ids).logits
    torch.testing.assert_close(full[..., kept], want[..., kept], rtol=1e-5, atol=1e-5)
    assert bool((full[..., 1::3] == fill_value(full.dtype)).all())
    assert not torch.allclose(part[..., kept], want[..., kept], atol=1e-3)  # two layers are not four


def test_teacher_and_draft_keep_a_target_output_bias(monkeypatch):
    """A Phi-style target (its output layer has a bias): the teacher logits training reads, and those of a draft
    with every layer, are the target's at the kept ids (fp32); a dropped bias misses by about 1."""
    import types

    import distill_model as dm
    from reduced_models import make_phi

    target = make_phi(seed=3, vocab=80).requires_grad_(False)
    kept = torch.arange(0, 80, 3)
    ids = torch.randint(3, 80, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = target(ids).logits[..., kept]
        draft = dm.draft_from_target(target, kept, [0, 1]).eval()
        torch.testing.assert_close(draft(ids).logits[..., kept], want, rtol=1e-5, atol=1e-5)
    seen, loss = [], dm.distill_loss
    monkeypatch.setattr(dm, "distill_loss", lambda student, teacher: seen.append(teacher) or loss(student, teacher))
    args = types.SimpleNamespace(lr=1e-3, seed=0, train_seconds=60.0, max_steps=1, warmup_steps=1, batch_size=1,
                                 log_every_s=60.0)
    assert dm.train(draft, target, kept, ids, args, torch.device("cpu"), None, print)["steps"] == 1
    torch.testing.assert_close(seen[0], want, rtol=1e-6, atol=1e-6)


def test_summary_prints_runner_figures_and_ideal_speedup():
    """The GPU-only lines (runner stage costs, ideal speedup) format without a GPU."""
    stages = {"target_step": 1.0, "draft_step": 0.2, "round": 2.0}
    mode = {"k": 4, "rows": 8, "acceptance_rate": 0.5, "mean_acceptance_length": 2.0, "fast_path": "graphs"}
    s = {"device": "GPU", "target": "t", "target_layers": 18, "num_kept": 32768, "vocab_size": 262144,
         "layers": [0, 1, 2, 3],
         "eval": {"heldout": {"greedy_agreement": 0.5}, "greedy": dict(mode, identical_rows=8), "sample": mode,
                  "cost": {"bytes_per_step": {"draft": 1, "target": 4},
                           "batch1": {"draft": 0.5, "target": 2.0, "runner_draft_step": 0.2,
                                      "runner_target_step": 1.0, "runner_stages": stages}}}}
    text = "\n".join(distill_draft.summary_lines(s))
    assert "runner graphs draft 0.200 / target 1.000 (0.200)" in text
    assert "greedy 0.97x" in text  # E = 1.9375 for alpha 0.5, k 4; 1.9375 * 1 / 2
