#!/usr/bin/env python
"""Device operations a speculative round issues outside the models' own forwards, counted on the CPU.

On a GPU every one of them is a kernel launch inside the round's CUDA graph (a few microseconds each, as much
as a small model's decoder layer): the round's bookkeeping (inputs and positions of each forward, the paged
metadata, the drafts' history writes, acceptance, the commit). This counts the aten operations (views and
allocations left out; a custom op counts once, as its one launch) that run at depth zero of the models' forward
hooks, over a ``generate()`` call with a fixed k, divided by its rounds. Tiny random Llama models (nothing
downloaded, a second on a CPU); the count does not depend on the models' size.

    python benchmarks/round_launches.py [--k 4] [--batch 1] [--out round_launches.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hf_specdec  # noqa: E402

# No kernel of their own: views, metadata and allocations.
_FREE = {"view", "_unsafe_view", "reshape", "expand", "t", "transpose", "permute", "slice", "select", "unsqueeze",
         "squeeze", "split_with_sizes", "alias", "as_strided", "detach", "_reshape_alias", "split", "chunk", "unbind",
         "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty", "scalar_tensor", "_local_scalar_dense"}


class LaunchCounter(TorchDispatchMode):
    """Counts operations by name while no model forward is running (``depth`` is kept by forward hooks)."""

    def __init__(self):
        super().__init__()
        self.depth, self.ops = 0, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.depth and name not in _FREE:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    def watch(self, model) -> None:
        def enter(*_):
            self.depth += 1

        def leave(*_):
            self.depth -= 1
        for module in (model.get_decoder(), model.get_output_embeddings()):
            module.register_forward_pre_hook(enter)
            module.register_forward_hook(leave)


def tiny(seed: int) -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def count(k: int, batch: int, do_sample: bool, method: str, new_tokens: int) -> dict:
    target = hf_specdec.enable(tiny(0))
    draft = target if method == "draft" else None  # the target as its own draft: every draft accepted
    counter = LaunchCounter()
    counter.watch(target)
    ids = torch.randint(3, 256, (batch, 9), generator=torch.Generator().manual_seed(1))
    spec = hf_specdec.SpecConfig(num_speculative_tokens=k, adaptive=False, method=method)
    target.generation_config.eos_token_id = None  # every row runs to max_new_tokens (no processor added for it)
    kw = dict(spec_config=spec, do_sample=do_sample, max_new_tokens=new_tokens, return_dict_in_generate=True,
              pad_token_id=0)
    if draft is not None:
        kw["assistant_model"] = draft
    target.generate(ids, **dict(kw, max_new_tokens=8))  # runner and buckets made
    with counter:
        out = target.generate(ids, **kw)
    rounds = out.spec_metrics.num_rounds
    return {"method": method, "k": k, "batch": batch, "do_sample": do_sample, "rounds": rounds,
            "ops_per_round": sum(counter.ops.values()) / rounds,
            "ops": {name: n / rounds for name, n in counter.ops.most_common()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = [count(args.k, args.batch, False, "draft", args.new_tokens),
            count(args.k, args.batch, True, "draft", args.new_tokens),
            count(args.k, args.batch, False, "ngram", args.new_tokens),
            count(0, args.batch, False, "draft", args.new_tokens)]
    print(f"{'method':8s} {'k':>2s} {'b':>3s} {'sampled':>7s} {'ops a round':>11s}  most frequent")
    for r in rows:
        top = ", ".join(f"{n} {c:.1f}" for n, c in list(r["ops"].items())[:5])
        print(f"{r['method']:8s} {r['k']:2d} {r['batch']:3d} {str(r['do_sample']):>7s} {r['ops_per_round']:11.1f}  {top}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "transformers": transformers.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
