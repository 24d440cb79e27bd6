#!/usr/bin/env python
"""Device operations a decoder layer issues in the runner's uncompiled paged forwards, counted on the CPU.

Uncompiled forwards run a model's prefills and, before or without compile, its rounds: on a GPU each operation
below is a kernel launch (inside the step's CUDA graph, a few microseconds each at a decode step; a pass over the
activations at a prompt). This counts the aten operations (views and allocations left out, a custom op once) of a
paged forward through the model itself and through the runner's uncompiled copy (``runner/paged_model.py``:
rotary with the K/V write and the attention, RMSNorm and the MLP's activation in one launch each), also where the first call that
compiles shared the q/k/v and gate/up storage (``shared``: one matmul a group), per decoder layer (the difference
between 4 and 2 layers, over 2). Tiny random models, nothing downloaded; the count does not depend on
the models' size.

    python benchmarks/layer_ops.py [--out layer_ops.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.round_launches import LaunchCounter  # noqa: E402  (never watching a model: it counts everything)
from hf_specdec.cache import PagedKVCache, paged_attention_enabled, paged_forward  # noqa: E402
from hf_specdec.runner.fused_projections import shared_projections  # noqa: E402
from hf_specdec.runner.paged_model import uncompiled_copy  # noqa: E402

FAMILIES = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}


def _model(family: str, layers: int) -> transformers.PreTrainedModel:
    config_class, model_class = FAMILIES[family]
    config = config_class(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return model_class(config).eval()


@torch.no_grad()
def operations(model, call, tokens: int) -> dict:
    """Operations by name of one paged forward of ``model`` (through ``call``: a copy of it, or None for the model
    itself), two rows of ``tokens`` new tokens each after 5 cached ones."""
    cache = PagedKVCache(32, 4, 3, 64, torch.device("cpu"))
    rows = torch.tensor(cache.add_sequences(2))
    cache.reserve(rows.tolist(), [16, 16])
    step = cache.batch(rows, torch.tensor([5, 5]), torch.tensor([tokens, tokens]), tokens, 2 * tokens)
    ids = torch.randint(3, model.config.vocab_size, (2 * tokens,), generator=torch.Generator().manual_seed(1))
    with paged_attention_enabled(model):
        paged_forward(model, ids, step, None, call=call)
        counter = LaunchCounter()
        with counter:
            paged_forward(model, ids, step, None, call=call)
    return dict(counter.ops)


def count(family: str, tokens: int) -> dict:
    """Per layer: operations by name through the model and through the runner's copy."""
    out = {}
    for label in ("model", "runner copy", "shared storage"):
        per_depth = []
        for layers in (2, 4):
            model = _model(family, layers)
            copy = {"model": None, "runner copy": uncompiled_copy(model)}.get(label) if label != "shared storage" \
                else uncompiled_copy(model, shared_projections(model))
            per_depth.append(operations(model, copy, tokens))
        names = set(per_depth[0]) | set(per_depth[1])
        per_layer = {n: (per_depth[1].get(n, 0) - per_depth[0].get(n, 0)) / 2 for n in sorted(names)}
        out[label] = {n: c for n, c in per_layer.items() if c}
    return {"family": family, "tokens_per_row": tokens, "model": out["model"], "runner_copy": out["runner copy"],
            "shared_storage": out["shared storage"], "model_per_layer": sum(out["model"].values()),
            "runner_copy_per_layer": sum(out["runner copy"].values()),
            "shared_storage_per_layer": sum(out["shared storage"].values())}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = [count(family, tokens) for family in FAMILIES for tokens in (1, 5)]
    print(f"{'family':7s} {'tokens':>6s} {'model':>6s} {'copy':>5s} {'shared':>6s}  the copy's operations a layer")
    for r in rows:
        ops = ", ".join(f"{n} {c:g}" for n, c in r["runner_copy"].items())
        print(f"{r['family']:7s} {r['tokens_per_row']:6d} {r['model_per_layer']:6g} "
              f"{r['runner_copy_per_layer']:5g} {r['shared_storage_per_layer']:6g}  {ops}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "transformers": transformers.__version__, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
