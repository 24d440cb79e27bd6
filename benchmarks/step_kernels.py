"""What one draft step runs: a pair's draft model against its draft heads, kernel by kernel (issue 29's step cost).

For each batch size and each assistant (the pair's draft model, then every ``--head``): one greedy generate() at a
fixed k = 4 on the runner (graphs + compile, ``compile=True`` waits for the compiled code), then
``time_stages`` (median ms of the replayed draft step and first step) and ``scale.kernel_summary`` over replays of
the draft step's graph: kernels per step, device-busy microseconds, and at b = 1 the kernels by time. A step's
wall time minus its busy time is the gaps between launches.

    python benchmarks/step_kernels.py --pair runs/pair --head runs/pair/head --head slim=runs/head_slim \\
        --out $OUT/step_kernels.json      # CUDA; a few minutes, most of it compiling each assistant (cold caches)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

import hf_specdec  # noqa: E402
from benchmarks.e2e_spec import load_heads  # noqa: E402
from benchmarks.scale import kernel_summary  # noqa: E402
from hf_specdec.runner import bucket_for, runner_for  # noqa: E402
from hf_specdec.runner.stage_timing import time_stages  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", required=True, help="a pair directory (evals/build_pair.py): target/ and draft/")
    ap.add_argument("--head", action="append", default=[], metavar="[NAME=]DIR", help="a draft head; repeatable")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens (random ids)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("step_kernels.py times CUDA graphs: it needs a GPU")
    from transformers import AutoModelForCausalLM

    dev = torch.device("cuda")
    load = lambda sub: AutoModelForCausalLM.from_pretrained(  # noqa: E731
        os.path.join(args.pair, sub), dtype=torch.bfloat16).to(dev).eval()
    target = hf_specdec.enable(load("target"))
    report = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "pair": args.pair, "params": {},
              "rows": []}
    assistants = [("draft", load("draft"))] + load_heads(args.head, target, report["params"])
    for b in [int(x) for x in args.batches.split(",") if x]:
        ids = torch.randint(3, target.config.vocab_size, (b, args.prompt),
                            generator=torch.Generator().manual_seed(1)).to(dev)
        for name, assistant in assistants:
            spec = hf_specdec.SpecConfig(num_speculative_tokens=4, adaptive=False, compile=True)
            target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                            assistant_model=assistant, spec_config=spec, eos_token_id=None, pad_token_id=0)
            pieces: dict = {}
            costs = time_stages(runner_for(target, assistant), bucket_for(b), 50, pieces_out=pieces)
            kernels = kernel_summary(pieces["draft_step"], getattr(assistant.config, "num_hidden_layers", 1), dev,
                                     top=40)
            row = {"batch": b, "assistant": name, "draft_step_ms": costs["draft_step"],
                   "draft_first_step_ms": costs["draft_first_step"], "propose_ms": costs["propose"],
                   "round_ms": costs["round"], "kernels": kernels,
                   "params": sum(p.numel() for p in assistant.parameters())}
            report["rows"].append(row)
            print(f"b={b} {name:<14} step {row['draft_step_ms']:.4f} ms  kernels {kernels['per_step']:.0f}  "
                  f"busy {kernels['busy_us']:.1f} us  propose (k = 4) {row['propose_ms']:.4f} ms  round "
                  f"{row['round_ms']:.4f} ms", flush=True)
            if b == 1:
                for kname, count, us in kernels["top"]:
                    print(f"      {count:5.1f} x {us:7.2f} us  {kname[:80]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
