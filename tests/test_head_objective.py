"""evals/head_objective.py: a reduced head's loss reads the target's logits over its kept tokens only, and equals
the loss over full-vocabulary logits restricted to those tokens (order, soft-capping and gradients included)."""
import contextlib
import os
import sys

import pytest
import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "evals"))

import hf_specdec  # noqa: E402
from head_objective import head_loss, positions, target_outputs, teacher_layer, unrolled_steps  # noqa: E402


def tiny_gemma():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                           layer_types=["sliding_attention", "full_attention"], sliding_window=8,
                           final_logit_softcapping=3.0, tie_word_embeddings=False, pad_token_id=0)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 1.0)  # logits past the soft-cap: a missing or doubled cap shows
    return model.requires_grad_(False)


def reference_loss(head, ids, f, full_logits, ce_weight):
    """The loss as computed before: the head's full-vocabulary logits and the target's, indexed by kept ids."""
    n, t = ids.shape
    out = head(ids[:, 1:], positions(n, t - 1, ids.device), f[:, :-1])
    kept = slice(None) if head.lm_head is None else head.lm_head.token_ids
    p = torch.softmax(full_logits[:, 1:, kept], dim=-1)
    ce = -(p * torch.log_softmax(out.logits.float()[..., kept], dim=-1)).sum(-1).mean()
    return F.smooth_l1_loss(out.hidden.float(), f[:, 1:]) + ce_weight * ce


@pytest.mark.parametrize("kept", [None, [5, 40, 2, 77, 13, 60, 61, 9]])  # given unsorted: the head sorts them
def test_loss_over_kept_logits_equals_the_full_vocabulary_one(kept):
    target = tiny_gemma()
    head = hf_specdec.DraftHead.for_target(target, kept_ids=None if kept is None else torch.tensor(kept))
    ids = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(1))
    ctx = contextlib.nullcontext
    layer = teacher_layer(target, head)
    assert (layer is None) == (kept is None)
    f, logits = target_outputs(target, ids, ctx, layer)
    f_full, full = target_outputs(target, ids, ctx)
    assert logits.shape[-1] == (96 if kept is None else len(kept))
    if kept is not None:
        assert torch.allclose(logits, full[..., head.lm_head.token_ids], atol=1e-6)
        assert full.abs().max() <= 3.0 + 1e-5  # soft-capped
    loss, _, _ = head_loss(head, ids, f, logits, 0.7, ctx)
    grads = torch.autograd.grad(loss, list(head.parameters()))
    ref = reference_loss(head, ids, f_full, full, 0.7)
    ref_grads = torch.autograd.grad(ref, list(head.parameters()))
    assert torch.allclose(loss, ref, atol=1e-6)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-6)


def test_a_target_output_bias_is_in_the_teacher_and_the_head(tmp_path):
    """A Phi-style target (its output layer has a bias): the teacher's kept logits are the target's at the kept
    ids (fp32), and the head's own output layer starts from the kept bias entries and keeps them through save /
    load."""
    from reduced_models import make_phi

    target = make_phi(seed=4, vocab=96).requires_grad_(False)
    head = hf_specdec.DraftHead.for_target(target, kept_ids=torch.tensor([5, 40, 2, 77, 13, 60, 61, 9]))
    kept = head.lm_head.token_ids
    ids = torch.randint(1, 96, (2, 10), generator=torch.Generator().manual_seed(4))
    _, logits = target_outputs(target, ids, contextlib.nullcontext, teacher_layer(target, head))
    with torch.no_grad():
        torch.testing.assert_close(logits, target(ids).logits[..., kept], rtol=1e-6, atol=1e-6)
    assert torch.equal(head.lm_head.bias, target.lm_head.bias[kept])
    hf_specdec.save_draft_head(head, tmp_path / "head")
    loaded = hf_specdec.load_draft_head(tmp_path / "head", target=target)
    assert torch.equal(loaded.lm_head.bias, head.lm_head.bias)


def sequential_step(head, ids, f, s, i):
    """Draft step s + 1 of a round at position i, the way inference reads it (full recompute, no cache): the
    target's features up to position i - s, then each step's own g, the window's true tokens throughout."""
    tokens, p = ids[:, 1:], i - s
    feats = f[:, : p + 1]
    for r in range(s + 1):
        n = p + r + 1
        out = head(tokens[:, :n], positions(ids.shape[0], n, ids.device), feats)
        feats = torch.cat([feats, out.hidden[:, -1:]], dim=1)
    return out.hidden[:, -1]


@pytest.mark.parametrize("kept", [None, [5, 40, 2, 77, 13, 60, 61, 9]])
def test_unrolled_steps_read_what_inference_reads(kept):
    """Each unrolled step at each position equals inference's draft step there: a wrong mask (a step seeing the
    target's features past its round's start, or another step's keys) or a feature shifted by one fails."""
    target = tiny_gemma()
    head = hf_specdec.DraftHead.for_target(target, kept_ids=None if kept is None else torch.tensor(kept))
    ids = torch.randint(1, 96, (2, 10), generator=torch.Generator().manual_seed(2))
    f, _ = target_outputs(target, ids, contextlib.nullcontext)
    steps = list(unrolled_steps(head, ids, f, 3, contextlib.nullcontext))
    assert [s for s, _, _ in steps] == [0, 1, 2]
    for s, g, logits in steps:
        assert logits.shape[-1] == (96 if kept is None else len(kept))
        for i in range(s, ids.shape[1] - 1):
            assert torch.allclose(g[:, i], sequential_step(head, ids, f, s, i), atol=1e-5), (s, i)


def test_unrolled_loss_trains_and_one_step_is_the_plain_loss():
    target = tiny_gemma()
    head = hf_specdec.DraftHead.for_target(target, kept_ids=torch.arange(0, 96, 3))
    ids = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(3))
    ctx = contextlib.nullcontext
    f, logits = target_outputs(target, ids, ctx, teacher_layer(target, head))
    one, _, _ = head_loss(head, ids, f, logits, 0.1, ctx)
    assert torch.allclose(one, reference_loss_kept(head, ids, f, logits, 0.1), atol=1e-6)
    three, feat, ce = head_loss(head, ids, f, logits, 0.1, ctx, steps=3)
    assert torch.isfinite(three) and not torch.allclose(three, one)
    grads = torch.autograd.grad(three, [head.fc.weight])
    assert grads[0].abs().sum() > 0


def reference_loss_kept(head, ids, f, kept_logits, ce_weight):
    n, t = ids.shape
    out = head(ids[:, 1:], positions(n, t - 1, ids.device), f[:, :-1])
    p = torch.softmax(kept_logits[:, 1:], dim=-1)
    ce = -(p * torch.log_softmax(out.logits.float()[..., head.lm_head.token_ids], dim=-1)).sum(-1).mean()
    return F.smooth_l1_loss(out.hidden.float(), f[:, 1:]) + ce_weight * ce


def test_evaluation_in_chunks_counts_what_one_batch_does():
    """Evaluation computes full-vocabulary logits a few windows at a time: the figures do not depend on it."""
    import types

    import numpy as np

    from head_objective import greedy_continuation, top1_agreement, windows_per_chunk

    target = tiny_gemma()
    head = hf_specdec.DraftHead.for_target(target, kept_ids=torch.arange(0, 96, 2))
    windows = np.random.default_rng(0).integers(1, 96, (7, 10))
    ctx = contextlib.nullcontext
    whole = top1_agreement(head, target, windows, 7, "cpu", ctx)
    assert whole == top1_agreement(head, target, windows, 2, "cpu", ctx) == top1_agreement(head, target, windows, 1,
                                                                                          "cpu", ctx)
    prompts = torch.from_numpy(windows[:, :6])
    seq = prompts
    for _ in range(3):  # the reference: the whole sequence's logits, argmax at the last position
        seq = torch.cat([seq, target(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(greedy_continuation(target, prompts, 3, ctx), seq[:, 6:])

    def fake(vocab):
        return types.SimpleNamespace(config=types.SimpleNamespace(get_text_config=lambda: types.SimpleNamespace(
            vocab_size=vocab)))
    assert windows_per_chunk(fake(262144), 512, 32) == 1
    assert windows_per_chunk(fake(16384), 512, 32) == 16
    assert windows_per_chunk(fake(16384), 512, 8) == 8
    assert windows_per_chunk(fake(262144), 4096, 32) == 1  # never 0
