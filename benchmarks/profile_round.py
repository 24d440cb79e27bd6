"""Where a fast-path round's time goes on the GPU: per-piece costs and the kernels inside the graphs.

Random weights with the shapes of the project's model pair (453M target, 29M draft), so
the per-round costs are those of the real pair; acceptance is not. For each batch size:
one generate() on the runner (graphs + compile unless --no-compile), then
``time_stages`` (draft step, verify forward, propose, verify+commit, plain target step),
then a torch.profiler trace of replayed round graphs, summarised by kernel.

    python benchmarks/profile_round.py --batches 1,32 [--no-compile] [--context 384]
"""
import argparse
import json
import os
import sys
import time
from collections import defaultdict

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

import hf_specdec
from hf_specdec.kernels import paged_attention_triton
from hf_specdec.runner import bucket_for, runner_for
from hf_specdec.runner.stage_timing import time_stages


def model(hidden, layers, inter, heads, kv):
    cfg = LlamaConfig(vocab_size=16384, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048)
    return LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()


def kernel_table(pieces: dict, rounds=20, top=14, names=("propose", "verify_and_commit")):
    """Kernel time per round inside the graphs time_stages captured (``names``), by kernel name."""
    graphs = [pieces[name][0] for name in names if name in pieces]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            for g in graphs:
                g()
        torch.cuda.synchronize()
    per_kernel = defaultdict(float)
    count = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name[:70]] += e.device_time / rounds
            count[e.name[:70]] += 1
    total = sum(per_kernel.values())
    print(f"  {' + '.join(names)}: kernels per round: {sum(count.values()) // rounds}, GPU busy {total / 1000:.3f} ms")
    for name, us in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {us:8.1f} us  {count[name] // rounds:4d}x  {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--context", type=int, default=384, help="prompt tokens")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--top", type=int, default=14, help="kernels listed per batch size")
    ap.add_argument("--split-graphs", action="store_true", help="also a table for each graph (propose, verify)")
    ap.add_argument("--kv-splits", type=int, default=None, help="paged attention's MAX_KV_SPLITS (A/B runs)")
    ap.add_argument("--attention-launch", default=None, help="JSON for paged_attention_triton.LAUNCH_OVERRIDE "
                    "(A/B runs), e.g. '{\"verify\": {\"block_n\": 64, \"num_warps\": 8, \"max_splits\": 1}}'")
    args = ap.parse_args()
    if args.attention_launch:
        paged_attention_triton.LAUNCH_OVERRIDE.update(json.loads(args.attention_launch))
        print(f"LAUNCH_OVERRIDE = {paged_attention_triton.LAUNCH_OVERRIDE}")
    if args.kv_splits is not None:
        paged_attention_triton.MAX_KV_SPLITS = args.kv_splits
        print(f"MAX_KV_SPLITS = {args.kv_splits}")
    torch.manual_seed(0)
    target = hf_specdec.enable(model(1536, 16, 4096, 12, 4))
    draft = model(512, 4, 1536, 8, 4)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=args.k, compile=not args.no_compile)
    for b in [int(x) for x in args.batches.split(",")]:
        ids = torch.randint(3, 16384, (b, args.context), device="cuda")
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=32,
                  eos_token_id=None, pad_token_id=0, assistant_model=draft, spec_config=spec,
                  return_dict_in_generate=True)
        t0 = time.perf_counter()
        m = target.generate(**kw).spec_metrics
        print(f"b={b}: first call {time.perf_counter() - t0:.1f}s (warm-up {m.warmup_seconds:.1f}s) [{m.fast_path}]")
        m = target.generate(**kw).spec_metrics
        print(f"b={b}: second call: {m.decode_seconds * 1000 / max(m.num_rounds, 1):.3f} ms/round over "
              f"{m.num_rounds} rounds, prefill {m.prefill_seconds * 1000:.1f} ms, warm-up {m.warmup_seconds:.2f}s")
        runner = runner_for(target, draft)
        bucket = bucket_for(b)
        pieces = {}
        costs = time_stages(runner, bucket, pieces_out=pieces)
        print("  " + "  ".join(f"{k} {v:.3f}" for k, v in costs.items()) + "  (ms)")
        forwards = args.k * costs["draft_step"] + costs["draft_first_step"] - costs["draft_step"] + costs["verify_forward"]
        print(f"  forwards {forwards:.3f} ms of a {costs['round']:.3f} ms round: outside {1 - forwards / costs['round']:.1%};"
              f" propose / (k x draft_step) = {costs['propose'] / (args.k * costs['draft_step']):.2f}")
        kernel_table(pieces, top=args.top)
        if args.split_graphs:
            for name in ("propose", "verify_and_commit"):
                kernel_table(pieces, top=args.top, names=(name,))


if __name__ == "__main__":
    main()
