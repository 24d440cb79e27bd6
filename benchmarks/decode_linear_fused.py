"""A decode step's layer at b = 1, its pointwise work fused into the matmuls (``kernels.decode_linear``): each
fused launch against the launches it replaces.

For each matmul of the 8B and 1B Llama shapes, as the runner's one-token layer runs it
(``runner/one_token_layers.py``), one row, inside one CUDA graph of ``--calls`` launches rotating over enough
weight copies that none is found in L2:

    qkv      RMSNorm + q/k/v matmul         -> one GEMV with the norm in its prologue
    o        o_proj matmul + residual add   -> one GEMV with the add in its epilogue
    gate_up  RMSNorm + gate/up + SiLU·up    -> one GEMV, the norm before and SiLU·up after
    down     down_proj matmul + residual    -> one GEMV with the add in its epilogue

"unfused" is the norm and SiLU·up kernels (``kernels.rms_norm``, ``kernels.silu_mul``, as fast as Inductor's:
docs/kernels.md), the matmul as the runner runs it alone (cuBLAS, or the table's GEMV where it won) and a torch
add. The fused launch is swept over ``SWEEP`` (``--sweep``) or the table's (``gemv_config(..., fused=True)``).
Prints us per call and unfused / fused.

    python benchmarks/decode_linear_fused.py --sweep [--wide] --out decode_linear_fused.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

from benchmarks.decode_linear import SHAPES, graph_time_us, rotated_weights  # noqa: E402
from hf_specdec.kernels import decode_linear_triton as dl, rms_norm, silu_mul  # noqa: E402

FUSIONS = {"qkv": dict(norm=True), "o": dict(residual=True), "gate_up": dict(norm=True, gated=True),
           "down": dict(residual=True)}
SWEEP = {"block_n": (1, 2, 4, 8), "block_k": (512, 1024, "K"), "num_warps": (4, 8)}  # "K": the row in one tile
SWEEP_TMA = {"block_n": (8, 16, 32), "block_k": (128, 256), "num_stages": (4,)}
WIDE_TMA = {"block_n": (4, 8, 16, 32), "block_k": (64, 128, 256, 512), "num_stages": (3, 4, 6, 8)}  # --wide


def launches(sweep: bool, k: int, gated: bool, tma: bool, tma_space: dict = SWEEP_TMA):
    """The table's launch, or every launch of ``SWEEP`` of at most 128 weights a thread (a gated tile holds twice
    ``block_n`` rows) and, for a weight TMA can address, of ``tma_space`` (4 warps)."""
    if not sweep:
        yield {}
        return
    for block_n, block_k, warps in itertools.product(*SWEEP.values()):
        block_k = triton.next_power_of_2(k) if block_k == "K" else block_k
        if block_n * block_k * (1 + gated) // (32 * warps) <= 128:
            yield dict(block_n=block_n, block_k=block_k, num_warps=warps, num_stages=1)
    for block_n, block_k, stages in itertools.product(*tma_space.values()) if tma else ():
        if block_n * block_k * 2 * (1 + gated) * stages <= 200 << 10:  # the stages' tiles fit in shared memory
            yield dict(tma=True, block_n=block_n, block_k=block_k, num_warps=4, num_stages=stages)


def unfused(x, w, norm_weight, residual, gated):
    """What the layer runs without the fusion: the norm, the matmul alone, SiLU·up, the add."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, 1e-5)
    y = dl.decode_linear_triton(x, w, None)
    if gated:
        y = silu_mul(*y.chunk(2, dim=-1))
    return y if residual is None else residual + y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="8b.qkv,8b.o,8b.gate_up,8b.down,1b.qkv,1b.o,1b.gate_up,1b.down")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--wide", action="store_true", help="--sweep the TMA launches of WIDE_TMA")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dtype, device = torch.bfloat16, torch.device("cuda")
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": str(dtype), "rows": []}
    print(result["gpu"], result["torch"])
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        fusion = FUSIONS[name.split(".", 1)[1]]
        gated = fusion.get("gated", False)
        weights = rotated_weights(n, k, dtype, device)
        x = torch.randn(1, k, dtype=dtype, device=device)
        nw = (1 + 0.1 * torch.randn(k, device=device)).to(dtype) if fusion.get("norm") else None
        res = torch.randn(1, n // 2 if gated else n, dtype=dtype, device=device) if fusion.get("residual") else None
        base_us = graph_time_us(lambda a, w: unfused(a, w, nw, res, gated), weights, x, args.calls)
        want = unfused(x, weights[0], nw, res, gated).float()
        best = None
        for cfg in launches(args.sweep, k, gated, dl.tma_readable(weights[0]), WIDE_TMA if args.wide else SWEEP_TMA):
            dl.LAUNCH_OVERRIDE.clear()
            dl.LAUNCH_OVERRIDE.update(cfg)
            try:
                fused = lambda a, w: dl.decode_linear_triton(a, w, None, nw, 1e-5, gated, res)  # noqa: E731
                err = (fused(x, weights[0]).float() - want).abs().max().item()
                us = graph_time_us(fused, weights, x, args.calls)
            except Exception as exc:  # noqa: BLE001  (a configuration out of resources: skip it)
                print(f"  {name} {cfg}: {type(exc).__name__}")
                continue
            if best is None or us < best[0]:
                best = (us, dl.gemv_config(n, k, device, fused=True), err)
        dl.LAUNCH_OVERRIDE.clear()
        if best is None:
            print(f"{name}: no configuration ran", flush=True)
            continue
        row = {"shape": name, "n": n, "k": k, "fusion": fusion, "unfused_us": base_us, "fused_us": best[0],
               "config": best[1], "max_abs_err": best[2], "unfused_over_fused": base_us / best[0],
               "fused_tbs": n * k * 2 / best[0] / 1e6}
        result["rows"].append(row)
        print(f"{name:12s} unfused {base_us:7.2f} us | fused {best[0]:7.2f} us {row['fused_tbs']:5.2f} TB/s | "
              f"x{row['unfused_over_fused']:.2f} err {best[2]:.3g} {best[1]}", flush=True)
        del weights
        torch.cuda.empty_cache()
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
