"""Logits through the paged KV cache equal Hugging Face's own forward (fp32, atol 1e-4).

Every family runs one scenario on a cache with 4-token blocks and a shuffled free list
(block tables are non-contiguous): a ragged prefill (1, 7 and 33 tokens), single-token
decode steps, a ragged multi-token step (k+1, 2 and 1 tokens in one packed forward),
and a rollback (extend by k+1, cut back, feed different tokens) checked against HF's
DynamicCache built on the kept prefix, with a new prompt prefilled in the same packed
forward on the blocks the rollback released.
"""
import pytest
import torch

import hf_specdec.cache.attention as paged_attn_module
from cache_models import CONFIGS, VOCAB, PagedRunner, build_model, hf_logits, hf_logits_with_cache, shuffled_cache
from hf_specdec.cache import paged_attention_enabled

ATOL = 1e-4
K = 3  # draft length: a scoring step feeds k+1 tokens


def _close(got, want, what):
    err = (got - want).abs().max().item()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert err <= ATOL, f"{what}: max |paged - HF| = {err:.3e} > {ATOL}"


def _rand_tokens(gen, n):
    return torch.randint(0, VOCAB, (n,), generator=gen).tolist()


def _is_contiguous(blocks):
    return all(b - a == 1 for a, b in zip(blocks, blocks[1:]))


@pytest.mark.parametrize("family", list(CONFIGS))
def test_paged_logits_match_hf(family):
    model = build_model(family)
    gen = torch.Generator().manual_seed(1234)
    runner = PagedRunner(model, shuffled_cache())
    alloc = runner.cache.allocator

    with paged_attention_enabled(model):
        # 1. Ragged prefill of very different prompt lengths, logits of every position.
        rows = runner.add(3)
        prompts = [_rand_tokens(gen, n) for n in (1, 7, 33)]
        out = runner.step(rows, prompts)
        for r, p, o in zip(rows, prompts, out):
            _close(o, hf_logits(model, p), f"{family} prefill len {len(p)}")
        assert not _is_contiguous(alloc.blocks(rows[2])), alloc.blocks(rows[2])
        assert len(alloc.blocks(rows[2])) == 9

        # 2. Single-token decode steps.
        for step in range(2):
            new = [_rand_tokens(gen, 1) for _ in rows]
            out = runner.step(rows, new)
            for r, o in zip(rows, out):
                _close(o, hf_logits(model, runner.tokens[r])[-1:], f"{family} decode {step} row {r}")

        # 3. Ragged multi-token step: k+1, 2 and 1 tokens in one packed forward.
        for qlens in ((K + 1, 2, 1), (1, K + 1, 2)):
            new = [_rand_tokens(gen, q) for q in qlens]
            out = runner.step(rows, new)
            for r, q, o in zip(rows, qlens, out):
                _close(o, hf_logits(model, runner.tokens[r])[-q:], f"{family} ragged step {qlens} row {r}")

        # 4. Rollback then continue: score k+1 tokens, keep fewer, feed different tokens.
        before = {r: len(runner.tokens[r]) for r in rows}
        runner.step(rows, [_rand_tokens(gen, K + 1) for _ in rows], commit=False)
        runner.cache.set_lengths(rows, [before[r] + K + 1 for r in rows])  # as if all were accepted ...
        held = {r: len(alloc.blocks(r)) for r in rows}
        kept = [before[rows[0]] + 1, before[rows[1]] + K, before[rows[2]]]  # ... then cut back
        runner.rollback(rows, kept)
        for r, n in zip(rows, kept):
            assert alloc.length(r) == n and len(alloc.blocks(r)) == -(-n // alloc.block_size)
        assert any(len(alloc.blocks(r)) < held[r] for r in rows), "no rollback crossed a block boundary"

        # A new prompt in the same packed forward takes the blocks the rollback released.
        free_before = list(alloc._free)
        (new_row,) = runner.add(1)
        cont_rows = rows + [new_row]
        new = [_rand_tokens(gen, q) for q in (K, 1, 2, 10)]
        out = runner.step(cont_rows, new)
        reused = set(alloc.blocks(new_row)) & set(free_before[-3:])
        assert reused, "the new sequence did not reuse released blocks"
        for r, n, t, o in zip(rows, kept, new, out):
            prefix = runner.tokens[r][:n]
            _close(o, hf_logits_with_cache(model, prefix, t), f"{family} after rollback row {r}")
        _close(out[3], hf_logits(model, new[3]), f"{family} prefill on released blocks")

        # 5. A finished sequence is freed; the others decode on.
        runner.cache.free([rows[1]])
        live = [rows[0], rows[2], new_row]
        out = runner.step(live, [_rand_tokens(gen, 1) for _ in live])
        for r, o in zip(live, out):
            _close(o, hf_logits(model, runner.tokens[r])[-1:], f"{family} decode after free row {r}")


def _run_prefill(model, lengths, seed=7):
    gen = torch.Generator().manual_seed(seed)
    prompts = [_rand_tokens(gen, n) for n in lengths]
    runner = PagedRunner(model, shuffled_cache())
    with paged_attention_enabled(model):
        out = runner.step(runner.add(len(prompts)), prompts)
    return prompts, out


# family -> the attention keyword the layer must pass, and the value(s) it has per layer
_LAYER_ARGS = {
    "mistral_sliding8": ("sliding_window", [8, 8]),
    "qwen2_sliding": ("sliding_window", [None, 8]),
    "gemma2_softcap_sliding": ("softcap", [2.0, 2.0]),
}


@pytest.mark.parametrize("family", list(_LAYER_ARGS))
def test_window_and_softcap_reach_attention_and_matter(family, monkeypatch):
    """The layer's sliding window / soft-cap reach the paged kernel, and dropping them breaks equality.

    (This proves the scenario test above would fail if they were ignored: prompts are
    longer than the window, and the soft-cap is small enough to change the scores.)"""
    name, per_layer = _LAYER_ARGS[family]
    model = build_model(family)
    seen = []
    real = paged_attn_module.paged_attention

    def spy(*args):
        seen.append(dict(sliding_window=args[8], softcap=args[9]))
        return real(*args)

    monkeypatch.setattr(paged_attn_module, "paged_attention", spy)
    prompts, out = _run_prefill(model, (5, 30))
    assert [s[name] for s in seen] == per_layer
    if family == "gemma2_softcap_sliding":
        assert [s["sliding_window"] for s in seen] == [8, None]  # Gemma2 alternates sliding / full layers
    for p, o in zip(prompts, out):
        _close(o, hf_logits(model, p), f"{family} with {name}")

    def dropped(*args):
        args = list(args)
        args[8 if name == "sliding_window" else 9] = None
        return real(*args)

    monkeypatch.setattr(paged_attn_module, "paged_attention", dropped)
    prompts, out = _run_prefill(model, (5, 30))
    err = (out[1] - hf_logits(model, prompts[1])).abs().max().item()
    assert err > 100 * ATOL, f"dropping {name} changed the logits by only {err:.2e}: the test is not sensitive"


def test_gemma2_softcap_changes_hf_logits():
    """The Gemma2 config's soft-cap is active in HF's own forward (so the comparison exercises it)."""
    tokens = list(range(20))
    capped = hf_logits(build_model("gemma2_softcap_sliding"), tokens)
    uncapped = hf_logits(build_model("gemma2_softcap_sliding", attn_logit_softcapping=None), tokens)
    assert (capped - uncapped).abs().max().item() > 100 * ATOL
