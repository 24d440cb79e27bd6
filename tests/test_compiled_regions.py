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
