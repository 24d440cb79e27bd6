"""The runner's copies of Llama-family models: rotary and K/V write in one op, with the paged attention past a
prompt (runner/rotary_attention.py, both copies), RMSNorm and the MLP's SiLU·up in one op each (runner/eager_fusions.py, the uncompiled copy of
runner/paged_model.py).

The copies' attention modules of Llama, Mistral, Qwen2 and Qwen3 hand their keys over before the rotary; a step's
logits through a copy equal the model's own paged logits bit for bit in fp32 (prompts from position 0, decode
and verify steps, sliding windows, GQA, Qwen3's q/k norms), the caches hold the same keys and values, the user's
modules are untouched, other families and hooked modules keep their own forward, and a call without the runner's
batch runs the model's own attention; generate() runs the fused ops and sees a module replaced between calls.
"""
import dataclasses

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from cache_models import build_model
from hf_specdec.cache import PagedKVCache, paged_attention_enabled, paged_forward
from hf_specdec.runner.module_copies import copy_with
from hf_specdec.runner.paged_model import uncompiled_copy
from hf_specdec.runner.rotary_attention import rotary_class


def rotary_attention_copy(model):
    """The compiled copy's attention swap alone (``compiled_regions.compiled_copy`` without the fused storage)."""
    return copy_with(model, rotary_class)


def _qwen3():
    cfg = Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, max_position_embeddings=128, use_sliding_window=True,
                      sliding_window=6, max_window_layers=1)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval()


def _model(family):
    return _qwen3() if family == "qwen3" else build_model(family)


def _attention_classes(model):
    return [type(m).__name__ for m in model.modules() if type(m).__name__.endswith("Attention")]


def _norm_classes(model):
    return [type(m).__name__ for m in model.modules() if type(m).__name__.endswith(("RMSNorm", "MLP"))]


@torch.no_grad()
def _steps(model, call, seed=0):
    """Logits of a prompt (two rows from position 0), then verify and decode steps on that cache; and the cache."""
    gen = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(48, 4, 4, 64, torch.device("cpu"))
    rows = torch.tensor(cache.add_sequences(2))
    cache.reserve(rows.tolist(), [40, 40])
    out, lens = [], torch.tensor([0, 0])
    with paged_attention_enabled(model):
        for q in (7, 3, 1, 1, 4):
            step = cache.batch(rows, lens, torch.tensor([q, q]), q, 2 * q)
            if q == 7:  # a prompt read from position 0: the model's own attention over each row's span
                step = dataclasses.replace(step, fresh=((0, 7), (7, 14)))
            ids = torch.randint(3, 90, (2 * q,), generator=gen)
            out.append(paged_forward(model, ids, step, None, call=call))
            lens = lens + q
    return out, cache


@pytest.mark.parametrize("family", ["llama_gqa", "mistral_sliding8", "qwen2_sliding", "qwen3"])
@pytest.mark.parametrize("which", ["compiled", "uncompiled"])
def test_the_copy_computes_the_models_own_paged_logits(family, which, monkeypatch):
    import hf_specdec.cache.attention as attention

    fused_calls = []
    for name in ("rotary_write_kv", "rotary_paged_attention"):
        monkeypatch.setattr(attention, name, lambda *a, op=getattr(attention, name), name=name: (
            fused_calls.append((name, a[0].shape)) or op(*a)))
    model = _model(family)
    before = _attention_classes(model), _norm_classes(model)
    copy = rotary_attention_copy(model) if which == "compiled" else uncompiled_copy(model)
    assert all(name.startswith("Rotary") for name in _attention_classes(copy)), _attention_classes(copy)
    norms = _norm_classes(copy)  # the compiled copy leaves norms and MLPs to Inductor, which fuses them
    assert len(norms) >= 3 * model.config.num_hidden_layers + 1
    assert all(name.startswith("Fused") == (which == "uncompiled") for name in norms), norms
    assert (_attention_classes(model), _norm_classes(model)) == before  # the user's modules are untouched
    got, got_cache = _steps(model, copy)
    layers = model.config.num_hidden_layers
    heads, dim = model.config.num_attention_heads, copy.model.layers[0].self_attn.head_dim
    # every step in every layer: the prompt's rotary and write, then the model's attention (but in a layer whose
    # window is shorter than the prompt); later steps' rotary, write and paged attention in one op
    windows = [getattr(layer.self_attn, "sliding_window", None) for layer in copy.model.layers]
    assert fused_calls == [("rotary_write_kv" if q == 7 and (w is None or w >= 7) else "rotary_paged_attention",
                            (2 * q, heads, dim)) for q in (7, 3, 1, 1, 4) for w in windows]
    want, want_cache = _steps(model, None)
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), (family, step, (g - w).abs().max())
    for layer in want_cache.key_pools:
        assert torch.equal(got_cache.key_pools[layer], want_cache.key_pools[layer])
        assert torch.equal(got_cache.value_pools[layer], want_cache.value_pools[layer])


def test_other_families_and_hooked_modules_keep_their_forward():
    gpt2 = build_model("gpt2")
    assert rotary_attention_copy(gpt2) is gpt2 and uncompiled_copy(gpt2) is gpt2
    llama = build_model("llama_gqa")
    llama.model.layers[0].self_attn.register_forward_hook(lambda *a: None)
    names = _attention_classes(rotary_attention_copy(llama))
    assert names[0] == "LlamaAttention" and all(n == "RotaryLlamaAttention" for n in names[1:]), names


@torch.no_grad()
def test_a_call_without_the_paged_batch_runs_the_models_own_attention():
    model = build_model("llama_gqa")
    copy = rotary_attention_copy(model)
    ids = torch.randint(3, 90, (2, 9))
    torch.testing.assert_close(copy(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)


@torch.no_grad()
def test_generate_runs_the_fused_step_and_sees_a_replaced_module(monkeypatch):
    """Through ``generate()`` without compile (the CPU path, and GPU calls before or without compile) the runner's
    copy rotates and writes K/V in one op in every layer (and attends in the same op past the prompt), its output stays the target's greedy one, and a module
    replaced between calls (new weights) is in the next call's copy."""
    import hf_specdec
    import hf_specdec.cache.attention as attention
    from models import left_padded_prompts, make_draft, make_model

    import hf_specdec.runner.eager_fusions as eager_fusions

    calls, norms, mlps = [], [], []
    norm, act = eager_fusions.rms_norm, eager_fusions.silu_mul
    for name in ("rotary_write_kv", "rotary_paged_attention"):
        monkeypatch.setattr(attention, name, lambda *a, op=getattr(attention, name), name=name: (
            calls.append(name) or op(*a)))
    monkeypatch.setattr(eager_fusions, "rms_norm", lambda *a: norms.append(1) or norm(*a))
    monkeypatch.setattr(eager_fusions, "silu_mul", lambda *a: mlps.append(1) or act(*a))
    target = hf_specdec.enable(make_model("llama", seed=0))
    draft = make_draft(target, "mix")
    ids, mask = left_padded_prompts(3, seed=2)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=0)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=3, adaptive=False)
    before = target.generate(**kw)
    assert torch.equal(target.generate(**kw, assistant_model=draft, spec_config=spec), before)
    assert len(calls) >= 2 * target.config.num_hidden_layers  # prefill and rounds, every layer
    assert calls.count("rotary_paged_attention") >= target.config.num_hidden_layers  # the rounds'
    assert len(norms) >= 2 * (2 * target.config.num_hidden_layers + 1)
    assert len(mlps) >= 2 * target.config.num_hidden_layers
    old = target.model.layers[1].self_attn
    new = type(old)(target.config, 1).eval()  # fresh random weights
    target.model.layers[1].self_attn = new
    want = target.generate(**kw)
    assert not torch.equal(want, before)  # a stale copy would still give ``before``
    assert torch.equal(target.generate(**kw, assistant_model=draft, spec_config=spec), want)


@pytest.mark.parametrize("family", ["llama_gqa", "qwen2_sliding", "qwen3"])
def test_shared_projection_storage_makes_one_matmul_per_group(family):
    """Where the first call that compiles made q/k/v and gate/up views of one tensor each (fused_projections.py),
    the uncompiled copy runs each group as one matmul: the same logits (fp32, to rounding), two matmuls fewer a
    layer; after a module of a group is replaced, the groups made again give the model's new logits."""
    from hf_specdec.runner.fused_projections import shared_projections

    model = _model(family)
    want, _ = _steps(model, None)
    shared = shared_projections(model)  # the parameters become views of the fused tensors (same values)
    copy = uncompiled_copy(model, shared)
    attention = [m for m in copy.modules() if type(m).__name__.startswith("Rotary")]
    mlps = [m for m in copy.modules() if type(m).__name__.startswith("Fused") and type(m).__name__.endswith("MLP")]
    assert attention and all(m.fused_qkv is not None for m in attention)
    assert mlps and all(m.fused_gate_up is not None for m in mlps)
    got, _ = _steps(model, copy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    matmuls = _matmuls(model, uncompiled_copy(model)), _matmuls(model, copy)
    assert matmuls[1] == matmuls[0] - 3 * model.config.num_hidden_layers, matmuls  # q/k/v: 3 -> 1, gate/up: 2 -> 1
    attn = model.model.layers[0].self_attn
    attn.k_proj = torch.nn.Linear(attn.k_proj.in_features, attn.k_proj.out_features, bias=attn.k_proj.bias is not None)
    want_now, _ = _steps(model, None)
    assert not torch.equal(want_now[-1], want[-1])  # the replaced module changes the logits
    got_now, _ = _steps(model, uncompiled_copy(model, shared_projections(model)))  # the groups made again
    for g, w in zip(got_now, want_now):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def _matmuls(model, call) -> int:
    """Matmuls of one decode step (benchmarks/layer_ops.py counts the step's operations)."""
    from benchmarks.layer_ops import operations

    ops = operations(model, call, 1)
    return ops.get("mm", 0) + ops.get("addmm", 0)
