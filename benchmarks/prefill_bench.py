#!/usr/bin/env python
"""Prefill on the runner: fixed shapes replayed as CUDA graphs (``runner/prefill.py``) against the runner's
unpadded ragged prefill without graphs, interleaved call by call, on random models of the project pair's sizes.

Each call generates one token (prefill and the first token only; two with ``--draft``: the draft model reads a
prompt only for a row that runs on past its first token); ``spec_metrics.prefill_seconds`` is
timed with the device synchronised. Prompts are random ids of HumanEval-like lengths (60..300 tokens),
the same set for both rows; every shape is warmed up first (a new shape's capture is warm-up, not
prefill). Prints the median prefill per call and the ratio, per batch size.

    python benchmarks/prefill_bench.py [--batch-sizes 1,32] [--calls 12] [--dtype bfloat16] [--draft]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hf_specdec  # noqa: E402
import hf_specdec.runner.prefill as prefill  # noqa: E402


def model(hidden, layers, inter, heads, kv, dtype, device):
    cfg = LlamaConfig(vocab_size=16384, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048)
    return LlamaForCausalLM(cfg).to(device, dtype).eval()


def prompts(batch: int, calls: int, device, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(calls):
        lens = torch.randint(60, 301, (batch,), generator=gen)
        ids = torch.randint(3, 16384, (batch, int(lens.max())), generator=gen)
        mask = (torch.arange(ids.shape[1])[None] >= ids.shape[1] - lens[:, None]).long()
        out.append((ids.to(device), mask.to(device)))
    return out


def call(target, draft, ids, mask, fixed: bool) -> tuple[float, torch.Tensor]:
    saved = prefill.PREFILL_MAX_TOKENS
    prefill.PREFILL_MAX_TOKENS = saved if fixed else 0  # 0: no prefill fits: the ragged one, no graphs
    try:
        out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2 if draft else 1,
                              do_sample=False,
                              assistant_model=draft, return_dict_in_generate=True, pad_token_id=0,
                              spec_config=hf_specdec.SpecConfig(num_speculative_tokens=4 if draft else 0,
                                                                adaptive=False, sync_stage_timing=True))
    finally:
        prefill.PREFILL_MAX_TOKENS = saved
    return out.spec_metrics.prefill_seconds, out.sequences


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-sizes", default="1,32")
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--draft", action="store_true", help="also the 29M draft's prefill (k = 4)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke of this script (the runner without graphs)")
    args = ap.parse_args()
    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    torch.manual_seed(0)
    sizes = ((1536, 16, 4096, 12, 4), (512, 4, 1536, 8, 4)) if device.type == "cuda" else ((64, 2, 128, 4, 2),) * 2
    target = hf_specdec.enable(model(*sizes[0], dtype, device))
    draft = model(*sizes[1], dtype, device) if args.draft else None
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        sets = prompts(batch, args.calls, device, seed=batch)
        for ids, mask in sets:  # warm-up: every shape captured, both paths compiled and tuned
            for fixed in (True, False):
                call(target, draft, ids, mask, fixed)
        times = {True: [], False: []}
        same = 0
        for ids, mask in sets:
            outs = {}
            for fixed in (True, False):
                seconds, outs[fixed] = call(target, draft, ids, mask, fixed)
                times[fixed].append(seconds)
            same += int(torch.equal(outs[True], outs[False]))
        f, e = statistics.median(times[True]) * 1e3, statistics.median(times[False]) * 1e3
        print(f"b={batch:3d} {args.dtype} draft={bool(draft)}: prefill per call, median of {args.calls}: "
              f"fixed+graphs {f:.2f} ms, ragged {e:.2f} ms ({e / f:.2f}x); first token equal in "
              f"{same}/{len(sets)} calls", flush=True)


if __name__ == "__main__":
    main()
