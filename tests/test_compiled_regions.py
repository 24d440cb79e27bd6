"""Regional compilation (runner/compiled_regions.py): one compiled decoder layer serves every layer.

The paged attention stays outside the compiled regions, so nothing a layer reads of its own (its index, its
pools) becomes a guard: a model of 6 layers compiles exactly the graphs one of 2 layers does, and other token
counts (batch buckets, k) reuse them. The compiled callable gives the model's own paged logits and leaves the
user's model as it was. CPU, ``aot_eager`` (no C++ compiler needed; Inductor only changes how a graph runs).
"""
import pytest
import torch
import torch._dynamo

from cache_models import build_model
from compile_recorder import Recorder, fresh_dynamo  # noqa: F401  (an autouse fixture)
from hf_specdec.cache import PagedKVCache, paged_attention_enabled, paged_forward
from hf_specdec.runner.compiled_regions import compile_model




@torch.no_grad()
def _graphs_and_agreement(family: str, layers: int, token_counts=(1, 3, 3, 2)):
    model = build_model(family, num_hidden_layers=layers)
    recorder = Recorder()
    compiled = compile_model(model, backend=recorder)
    cache = PagedKVCache(64, 4, 4, 64, torch.device("cpu"))
    rows = cache.add_sequences(2)
    cache.reserve(rows, [24, 24])
    counts = []
    with paged_attention_enabled(model):
        for q in token_counts:
            step = cache.batch(torch.tensor(rows), torch.tensor([5, 5]), torch.tensor([q, q]), q, 2 * q)
            ids = torch.randint(3, 90, (2 * q,))
            got = paged_forward(model, ids, step, torch.arange(2 * q), call=compiled)
            want = paged_forward(model, ids, step, torch.arange(2 * q))
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            counts.append(recorder.graphs)
    return model, counts


@pytest.mark.parametrize("family", ["llama_gqa", "mistral_sliding8", "gpt2"])
def test_one_compiled_layer_serves_every_layer_and_every_token_count(family):
    _, few = _graphs_and_agreement(family, 2)
    torch._dynamo.reset()
    model, many = _graphs_and_agreement(family, 6)
    assert many == few, f"6 layers compiled {many} graphs, 2 layers {few}: a layer guards on something of its own"
    assert many[-1] == many[1], f"token counts 3 and 2 compiled again after 1 and 3 ({many})"
    assert not any(type(m).__name__ == "OptimizedModule" for m in model.modules()), "the user's model was changed"


@torch.no_grad()
@pytest.mark.parametrize("narrow", [False, True], ids=["full", "narrow"])
def test_a_one_layer_draft_head_compiles_whole(narrow):
    """A head of one layer is compiled as one frame, not as regions: its embedding lookup and the concatenation fc
    reads fall in the graph of fc and the rotary angles (regions ran them eagerly, two launches a draft step), and
    the graphs it compiles give its own logits and features."""
    import hf_specdec

    target = build_model("llama_gqa", num_hidden_layers=2)
    head = hf_specdec.DraftHead.for_target(target, **({"hidden_size": 32} if narrow else {}))
    recorder = Recorder()
    compiled = compile_model(head, backend=recorder)
    cache = PagedKVCache(64, 4, 4, 64, torch.device("cpu"))
    rows = cache.add_sequences(2)
    cache.reserve(rows, [24, 24])
    with paged_attention_enabled(head):
        for q in (1, 3):
            step = cache.batch(torch.tensor(rows), torch.tensor([5, 5]), torch.tensor([q, q]), q, 2 * q)
            ids, features = torch.randint(3, 90, (2 * q,)), torch.randn(2 * q, target.config.hidden_size)
            keep = torch.tensor([q - 1, 2 * q - 1])
            got = paged_forward(head, ids, step, keep, call=compiled, features=features)
            want = paged_forward(head, ids, step, keep, features=features)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    first = recorder.codes[0]
    assert "embedding" in first and "cat" in first and "linear" in first, first


@torch.no_grad()
def test_a_head_compiled_whole_takes_views_of_any_base_without_compiling_again():
    """The round hands a head views: its ids a column of the history, its features rows of a (rows, tokens, width)
    buffer or its own last output, each base sized by the bucket. ``paged_forward`` detaches them (the same memory,
    no base), so the compiled head compiles once per token count, not once per base layout."""
    import hf_specdec

    target = build_model("llama_gqa", num_hidden_layers=2)
    head = hf_specdec.DraftHead.for_target(target)
    recorder = Recorder()
    compiled = compile_model(head, backend=recorder)
    cache = PagedKVCache(64, 4, 4, 64, torch.device("cpu"))
    rows = cache.add_sequences(2)
    cache.reserve(rows, [24, 24])
    width = target.config.hidden_size
    step = cache.batch(torch.tensor(rows), torch.tensor([5, 5]), torch.tensor([1, 1]), 1, 2)
    counts = []
    with paged_attention_enabled(head):
        for tokens, depth in ((2, 0), (5, 3), (9, 7)):  # bases of other sizes each time, the views alike
            history = torch.randint(3, 90, (2, 40 + tokens))
            buffer = torch.randn(2, tokens, width)
            ids, features = history[:, 7 + depth], buffer[:, depth]
            got = paged_forward(head, ids, step, None, call=compiled, features=features)
            want = paged_forward(head, ids.clone(), step, None, features=features.clone())
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            counts.append(recorder.graphs)
    assert counts[0] == counts[1] == counts[2], f"graphs after each base layout: {counts}"
