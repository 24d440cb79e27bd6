"""What a fresh process's first prompt attentions cost, by scaled-dot-product attention backend.

A prompt read from position 0 attends through the model's own attention (``cache/attention.py``,
``_prompt_attention``). Each mode runs in a child process and times, one call at a time (synchronised), the causal
attention of prompts of several lengths at the project pair's shapes in bf16 (target: 12 query heads, 4 K/V heads,
head_dim 128; draft: 8 / 4 / 64), then lists the kernels one call launched:

    torch       torch's own choice (cuDNN's attention on Hopper with torch 2.11)
    hf_specdec  inside ``cache.attention.prompt_sdpa_backends`` (flash, memory-efficient or math: not cuDNN; at every
                length here, though the package keeps torch's choice past ``PROMPT_FLASH_MAX_TOKENS``)

``--fresh-cuda-cache`` gives each child an empty ``CUDA_CACHE_PATH`` (a machine's first process: kernels compiled at
run time are not cached yet); without it the children share one, warmed by a first unrecorded child of each mode.

    python benchmarks/sdpa_first_use.py --fresh-cuda-cache --out $OUT/sdpa_fresh.json    # CUDA; under a minute
    python benchmarks/sdpa_first_use.py --out $OUT/sdpa_warm.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODES = ("torch", "hf_specdec")
SHAPES = {"target": (12, 4, 128), "draft": (8, 4, 64)}
LENGTHS = (200, 200, 317, 64, 1000, 2048)


def child(mode: str) -> dict:
    """One mode's timings in this (fresh) process."""
    import torch
    import torch.nn.functional as F

    from hf_specdec.cache.attention import prompt_sdpa_backends

    dev = torch.device("cuda")
    torch.ones(1, device=dev)
    torch.cuda.synchronize()

    def attend(length: int, shape: tuple) -> float:
        heads, kv_heads, dim = shape
        q, k, v = (torch.randn(1, h, length, dim, device=dev, dtype=torch.bfloat16)
                   for h in (heads, kv_heads, kv_heads))
        torch.cuda.synchronize()
        start = time.perf_counter()
        if mode == "torch":
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            with prompt_sdpa_backends(dev, 0):  # its choice below any threshold
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    ms = {name: [attend(n, shape) for n in LENGTHS] for name, shape in SHAPES.items()}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        attend(LENGTHS[-1] + 1, SHAPES["target"])
    kernels = sorted({e.name[:100] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                      and "distribution" not in e.name})  # randn's kernel is not attention
    return {"mode": mode, "ms": ms, "kernels": kernels, "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "device_name": torch.cuda.get_device_name(0)}


def run_child(mode: str, cuda_cache: str) -> dict:
    env = dict(os.environ, CUDA_CACHE_PATH=cuda_cache)
    done = subprocess.run([sys.executable, __file__, "--child", mode], env=env, capture_output=True, text=True,
                          timeout=300)
    if done.returncode:
        return {"mode": mode, "error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--repeats", type=int, default=2, help="children per mode, alternating")
    p.add_argument("--fresh-cuda-cache", action="store_true", help="an empty CUDA_CACHE_PATH for every child")
    p.add_argument("--out", default="sdpa_first_use.json")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)), flush=True)
        return {}
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("sdpa_first_use.py times CUDA kernels: run it on a GPU machine.")
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"--modes: {m!r} is not one of {', '.join(MODES)}")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        shared = os.path.join(scratch, "shared")
        if not args.fresh_cuda_cache:
            for m in modes:
                run_child(m, shared)  # fills the shared CUDA cache: the rows below are a later process's
        for i in range(args.repeats):
            for m in modes:
                cache = os.path.join(scratch, f"{m}{i}") if args.fresh_cuda_cache else shared
                row = run_child(m, cache)
                rows.append(row)
                if "error" in row:
                    print(f"{m}: ERROR {row['error'][-300:]}", flush=True)
                    continue
                for name, ms in row["ms"].items():
                    cells = " ".join(f"{x:7.1f}" for x in ms)
                    print(f"{m:<11} {name:<7} ms at lengths {LENGTHS}: {cells}", flush=True)
                print(f"{m:<11} kernels: {'; '.join(row['kernels'])}", flush=True)
    report = {"lengths": LENGTHS, "shapes": SHAPES, "fresh_cuda_cache": args.fresh_cuda_cache, "rows": rows}
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    return report


if __name__ == "__main__":
    main()
