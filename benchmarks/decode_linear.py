"""Decode-shaped linear layers: the Triton kernel (``kernels/decode_linear_triton.py``) against cuBLAS (``F.linear``).

For each weight of the 8B and 1B Llama shapes (q/k/v and gate/up fused, as the runner compiles them) and one
row (a decode step at b = 1; more rows run ``F.linear`` itself), both are timed inside one CUDA graph of
``--calls`` launches, rotating over enough weight copies that no launch finds its weight in L2 (as in a model,
where every layer has its own). Prints us per call, the read rate (weight bytes / time) and cuBLAS /
Triton. ``--sweep`` tries every configuration and keeps the best; else the table's own (``gemv_config``; where it
has none, the "Triton" column is cuBLAS again, through ``decode_linear_triton``'s fallback). ``--pdl off,on``
times the kernel launched without and with programmatic dependent launch (``kernels/pdl.py``: consecutive
launches overlap, as a layer's kernels do in the model); ``--sweep-pdl on`` sweeps only with it on.

    python benchmarks/decode_linear.py --out decode_linear.json [--sweep] [--pdl off,on]

A sweep's JSON is a table the runner reads (``HF_SPECDEC_GEMV_TABLE=FILE``, ``kernels/decode_linear_triton.py``):

    python benchmarks/decode_linear.py --shapes narrow.qkv,narrow.fc --sweep --pdl off --sweep-pdl off --out gemv.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

from hf_specdec.kernels import decode_linear_triton as dl  # noqa: E402
from hf_specdec.kernels.pdl import ENV as PDL_ENV  # noqa: E402

SHAPES = {  # name: (out features N, in features K)
    "8b.qkv": (6144, 4096), "8b.o": (4096, 4096), "8b.gate_up": (28672, 4096), "8b.down": (4096, 14336),
    "8b.lm_head": (128256, 4096),
    "1b.qkv": (3072, 2048), "1b.o": (2048, 2048), "1b.gate_up": (16384, 2048), "1b.down": (2048, 8192),
    "1b.lm_head": (128256, 2048), "1b.lm_head_32k": (32768, 2048),
    # the project's pair (evals/build_pair.py): its 453M target's layer (a draft head's), the head's fc, the
    # shared 16k-token output layer; its 29M draft model
    "pair.qkv": (2560, 1536), "pair.o": (1536, 1536), "pair.gate_up": (8192, 1536), "pair.down": (1536, 4096),
    "pair.fc": (1536, 3072), "pair.lm_head": (16384, 1536),
    "pair_draft.qkv": (1024, 512), "pair_draft.o": (512, 512), "pair_draft.gate_up": (3072, 512),
    "pair_draft.down": (512, 1536), "pair_draft.lm_head": (16384, 512),
    # a narrow head of the pair (DraftHead.for_target(target, hidden_size=512)): q/k/v (also `up`, 1536 x 512),
    # gate/up, down, fc; its o_proj and output layer are the draft model's shapes above
    "narrow.qkv": (1536, 512), "narrow.gate_up": (2688, 512), "narrow.down": (512, 1344), "narrow.fc": (512, 3072),
}
# Every launch either table holds (block_k at or past K: the rows whole in one tile, no loop; the one-tile launches
# of the H200's table came from a sweep of block_k 256-16384, num_warps 4-16 and 1 stage, 2026-11-29).
SWEEP = {"block_n": (1, 2, 4, 8), "block_k": (128, 256, 512, 1024, 2048, 4096, 8192, 16384),
         "num_warps": (2, 4, 8, 16), "num_stages": (1, 2, 4)}
# The TMA kernel's launches (its K loop software-pipelined over num_stages).
SWEEP_TMA = {"block_n": (8, 16, 32, 64), "block_k": (128, 256), "num_warps": (4,), "num_stages": (4, 8)}
L2_CLEAR_BYTES = 256 << 20


def rotated_weights(n: int, k: int, dtype, device, total_bytes: int = L2_CLEAR_BYTES, least: int = 2) -> list:
    """Copies of an (n, k) weight, at least ``total_bytes`` in all, so that a launch never finds its weight in L2."""
    copies = max(least, -(-total_bytes // (n * k * torch.tensor([], dtype=dtype).element_size())))
    return [torch.randn(n, k, dtype=dtype, device=device) / k ** 0.5 for _ in range(copies)]


def save_shapes_so_far(result: dict, path) -> None:
    """The JSON after every shape: a run cut short keeps what it timed."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def graph_time_us(fn, weights, x, calls: int) -> float:
    """us per call of ``fn(x, weight)`` over ``calls`` launches cycling through ``weights``, replayed in a graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for w in weights:
            fn(x, w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(x, weights[i % len(weights)])
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / calls)
    return best


def configs(sweep: bool, space: dict, k: int, tma: bool):
    """The launches to time: the table's own, or every one of ``space`` but a tile wider than K's next power of two
    (it repeats the one-tile launch at that width) and a tile of over 256 weights a thread (registers spill); with
    ``tma`` (the weight one TMA can address), every launch of ``SWEEP_TMA`` too."""
    if not sweep:
        yield {}  # the table's own (gemv_config), or cuBLAS where the table has none
        return
    for values in itertools.product(*space.values()):
        cfg = dict(zip(space, values))
        per_thread = cfg["block_n"] * cfg["block_k"] // (32 * cfg["num_warps"])
        looped = cfg["block_k"] < k  # stages pipeline the loop: a one-tile launch has none, timed at 1 stage only
        if cfg["block_k"] <= triton.next_power_of_2(k) and per_thread <= 256 and (looped or cfg["num_stages"] == 1):
            yield cfg
    if tma:
        for values in itertools.product(*SWEEP_TMA.values()):
            cfg = dict(zip(SWEEP_TMA, values), tma=True)
            if cfg["block_k"] <= triton.next_power_of_2(k):
                yield cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--pdl", default="off,on", help="launch modes to time: off, on or both")
    parser.add_argument("--sweep-pdl", default="on", help="the modes in which --sweep sweeps (else the table's)")
    for knob, values in SWEEP.items():
        parser.add_argument(f"--{knob.replace('_', '-')}", default=",".join(map(str, values)),
                            help=f"--sweep's values of {knob} (block_k at or past K: one tile, no loop)")
    parser.add_argument("--no-tma", action="store_true", help="--sweep leaves the TMA kernel's launches out")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    space = {knob: tuple(int(v) for v in getattr(args, knob).split(",")) for knob in SWEEP}
    dtype, device = torch.bfloat16, torch.device("cuda")
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": str(dtype), "rows": []}
    user_pdl = os.environ.get(PDL_ENV)
    print(result["gpu"], result["torch"])
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        weights = rotated_weights(n, k, dtype, device)
        tma = not args.no_tma and dl.tma_readable(weights[0])  # else a TMA launch would run cuBLAS
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k, dtype=dtype, device=device)
            ref = F.linear(x, weights[0])
            cublas = graph_time_us(lambda a, w: F.linear(a, w), weights, x, args.calls)
            for pdl in args.pdl.split(","):
                os.environ[PDL_ENV] = "1" if pdl == "on" else "0"
                best = None
                for cfg in configs(args.sweep and pdl in args.sweep_pdl.split(","), space, k, tma):
                    dl.LAUNCH_OVERRIDE.clear()
                    dl.LAUNCH_OVERRIDE.update(cfg)
                    try:
                        err = (dl.decode_linear_triton(x, weights[0], None).float() - ref.float()).abs().max().item()
                        us = graph_time_us(lambda a, w: dl.decode_linear_triton(a, w, None), weights, x, args.calls)
                    except Exception as exc:  # noqa: BLE001  (a configuration out of resources: skip it)
                        print(f"  {name} m={m} {cfg}: {type(exc).__name__}")
                        continue
                    if best is None or us < best[0]:
                        best = (us, dl.gemv_config(n, k, device), err)
                dl.LAUNCH_OVERRIDE.clear()
                if best is None:
                    print(f"{name} m={m} pdl={pdl}: no configuration ran", flush=True)
                    continue
                gb = n * k * 2 / 1e9
                row = {"shape": name, "n": n, "k": k, "rows": m, "pdl": pdl, "cublas_us": cublas, "triton_us": best[0],
                       "config": best[1], "max_abs_err": best[2], "cublas_tbs": gb / cublas * 1e3,
                       "triton_tbs": gb / best[0] * 1e3, "cublas_over_triton": cublas / best[0]}
                result["rows"].append(row)
                print(f"{name:15s} m={m:2d} pdl={pdl:3s} cublas {cublas:8.2f} us {row['cublas_tbs']:5.2f} TB/s | triton "
                      f"{best[0]:8.2f} us {row['triton_tbs']:5.2f} TB/s | x{row['cublas_over_triton']:.2f} {best[1]}",
                      flush=True)
            if user_pdl is None:
                os.environ.pop(PDL_ENV, None)
            else:
                os.environ[PDL_ENV] = user_pdl
        del weights
        torch.cuda.empty_cache()
        save_shapes_so_far(result, args.out)


if __name__ == "__main__":
    main()
