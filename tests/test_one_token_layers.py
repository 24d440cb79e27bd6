"""Decoder layers of the runner's copies at one token (runner/one_token_layers.py): the norms, SiLU·up and the
residual adds inside four ``decode_linear`` calls a layer, where q/k/v and gate/up share one tensor each.

On the CPU the fused calls run their references, the model's own operations: a copy's logits equal the same copy's
without the one-token layers bit for bit (fp32), for Llama, Mistral (sliding window), Qwen2 and Qwen3 (q/k norms);
steps of several tokens, layers without shared storage and hooked layers keep the model's forward; greedy
speculative output through generate() equals the target's own with the layers in the draft's and target's steps.
"""
import dataclasses
import functools

import pytest
import torch

from cache_models import build_model
from hf_specdec.cache import PagedKVCache, paged_attention_enabled, paged_forward
from hf_specdec.runner import one_token_layers, paged_model
from hf_specdec.runner.fused_projections import shared_projections
from hf_specdec.runner.paged_model import uncompiled_copy
from test_runner_copies import _qwen3


@pytest.fixture
def fused_calls(monkeypatch):
    """The keyword sets of the layers' ``decode_linear`` calls."""
    calls, real = [], one_token_layers.decode_linear
    monkeypatch.setattr(one_token_layers, "decode_linear", lambda *a, **kw: calls.append(sorted(kw)) or real(*a, **kw))
    return calls


@torch.no_grad()
def _steps(model, call, rows=1, tokens=(7, 1, 1, 3, 1), seed=0):
    """Logits of a prompt from position 0, then decode and verify steps of ``rows`` rows on that cache."""
    gen = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(48, 4, 4, 64, torch.device("cpu"))
    ids_of_rows = torch.tensor(cache.add_sequences(rows))
    cache.reserve(ids_of_rows.tolist(), [40] * rows)
    out, lens = [], torch.zeros(rows, dtype=torch.long)
    with paged_attention_enabled(model):
        for q in tokens:
            step = cache.batch(ids_of_rows, lens, torch.full((rows,), q), q, rows * q)
            if q == 7:  # a prompt read from position 0
                step = dataclasses.replace(step, fresh=tuple((7 * r, 7 * r + 7) for r in range(rows)))
            out.append(paged_forward(model, torch.randint(3, 90, (rows * q,), generator=gen), step, None, call=call))
            lens = lens + q
    return out


def _model(family):
    return _qwen3() if family == "qwen3" else build_model(family)


@pytest.mark.parametrize("family", ["llama_gqa", "mistral_sliding8", "qwen2_sliding", "qwen3"])
def test_one_token_steps_run_four_fused_matmuls_a_layer(family, fused_calls):
    model = _model(family)
    shared = shared_projections(model)
    copy = uncompiled_copy(model, shared, one_token=True)
    assert all(type(layer).__name__.startswith("OneToken") for layer in copy.model.layers)
    assert not any(type(layer).__name__.startswith("OneToken") for layer in model.model.layers)  # the user's
    got = _steps(model, copy)
    layers = model.config.num_hidden_layers
    assert fused_calls == [["eps", "norm_weight"], ["residual"], ["eps", "gated", "norm_weight"], ["residual"]] * (
        3 * layers)  # the three one-token steps, each layer
    plain = uncompiled_copy(model, shared)  # the runner's: the same copy with the model's own layers (no JIT
    assert not any(type(layer).__name__.startswith("OneToken") for layer in plain.model.layers)  # in a first call)
    for step, (g, w) in enumerate(zip(got, _steps(model, plain))):
        assert torch.equal(g, w), (family, step, (g - w).abs().max())


def test_other_steps_and_layers_keep_the_models_forward(fused_calls, monkeypatch):
    model = build_model("llama_gqa")
    _steps(model, uncompiled_copy(model, shared_projections(model), one_token=True), rows=2)  # 2 tokens a step
    _steps(model, uncompiled_copy(model, one_token=True))  # no shared storage: the layers fall back
    assert fused_calls == []
    assert one_token_layers.one_token_class(build_model("gpt2").transformer.h[0]) is None
    monkeypatch.setattr(one_token_layers, "decode_fusions_run", lambda weight: False)  # e.g. a non-Hopper GPU
    copy = uncompiled_copy(model, shared_projections(model), one_token=True)
    assert not any(layer.fuses_one_token for layer in copy.model.layers)


@pytest.mark.parametrize("where", ["hook", "forward", "later hook", "layer hook"])
def test_a_hooked_or_overridden_child_keeps_its_layer_on_the_models_forward(where, fused_calls):
    """Every layer keeps the one class (repeated blocks for regional compilation); the last one, whose MLP has a hook
    or a forward of its own (or gets a hook after the copy was made), or which has a hook itself, runs the model's
    forward, and so its hook."""
    model = build_model("llama_gqa")
    mlp, seen = model.model.layers[-1].mlp, []
    if where == "hook":
        mlp.register_forward_hook(lambda *a: seen.append(1))
    elif where == "layer hook":
        model.model.layers[-1].register_forward_hook(lambda *a: seen.append(1))
    elif where == "forward":
        mlp.forward = lambda x, mlp=mlp: seen.append(1) or type(mlp).forward(mlp, x)
    copy = uncompiled_copy(model, shared_projections(model), one_token=True)
    if where == "later hook":
        mlp.register_forward_hook(lambda *a: seen.append(1))
    assert len({type(layer) for layer in copy.model.layers}) == 1
    assert [layer.fuses_one_token for layer in copy.model.layers] == [True, where == "later hook"]
    _steps(model, copy)
    layers = model.config.num_hidden_layers
    assert len(fused_calls) == 4 * 3 * (layers - 1) and len(seen) == 5  # the hook at all 5 steps


def test_fusions_run_where_they_pay(monkeypatch):
    from types import SimpleNamespace

    from hf_specdec.kernels import decode_fusions_run, decode_linear_triton

    assert decode_fusions_run(torch.empty(2, 2))  # CPU: the references, the model's own operations
    gpu = lambda dtype: SimpleNamespace(is_cuda=True, dtype=dtype, device=torch.device("cuda"))  # noqa: E731
    monkeypatch.setattr(decode_linear_triton, "measured_gpu", lambda device: "H200")
    assert decode_fusions_run(gpu(torch.bfloat16)) and not decode_fusions_run(gpu(torch.float32))
    monkeypatch.setattr(decode_linear_triton, "measured_gpu", lambda device: None)  # not a Hopper GPU
    assert not decode_fusions_run(gpu(torch.bfloat16))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("k", [0, 1, 3])
def test_greedy_output_with_one_token_layers_is_the_targets(family, k, fused_calls, monkeypatch):
    """Shared q/k/v and gate/up storage on the CPU (as the first call that compiles makes it on a GPU) and the
    one-token layers in the uncompiled copy (on a GPU the compiled copy's): at b = 1 the target's plain steps (k = 0)
    and the draft's steps after its first run the one-token layers; at k = 1 no step
    is of one token (the verify reads 2, the draft's one step the last round's 2)."""
    import hf_specdec
    from hf_specdec.runner import spec_runner
    from models import left_padded_prompts, make_draft, make_model

    monkeypatch.setattr(spec_runner, "shared_projections", lambda model, share=True: shared_projections(model))
    monkeypatch.setattr(paged_model, "uncompiled_copy", functools.partial(paged_model.uncompiled_copy, one_token=True))
    target = hf_specdec.enable(make_model(family, seed=1))
    draft = make_draft(target, "mix")
    ids, mask = left_padded_prompts(1, seed=4)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0)
    want = target.generate(**kw)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=k, adaptive=False)
    assert torch.equal(target.generate(**kw, assistant_model=draft, spec_config=spec), want)
    assert len(fused_calls) >= 4 * target.config.num_hidden_layers or (k == 1 and not fused_calls)


def test_the_compiled_copy_runs_the_one_token_layers(monkeypatch):
    """``compile_model`` traces the one-token layers (the fused calls one opaque op each, the attention a break):
    the compiled copy's one-token steps run the fused op four times a layer, its logits the uncompiled copy's."""
    from hf_specdec.kernels import ops
    from hf_specdec.runner.compiled_regions import compile_model

    model = build_model("qwen2_sliding")
    want = _steps(model, uncompiled_copy(model, shared_projections(model), one_token=True))
    calls, real = [], ops.decode_linear_reference
    monkeypatch.setattr(ops, "decode_linear_reference", lambda *a: calls.append(len(a)) or real(*a))
    torch._dynamo.reset()
    got = _steps(model, compile_model(model, backend="eager"))
    assert calls == [7] * (4 * 3 * model.config.num_hidden_layers)  # the fused op's 7 arguments, each call
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
