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


class LayerMatmul:
    """One matmul of a layer as the sweeps time it: its fusion, ``rows`` input rows, the norm's weight and the
    residual where it has them, weight copies rotated out of L2."""

    def __init__(self, name: str, rows: int, dtype=torch.bfloat16, device=torch.device("cuda")):
        self.n, self.k = SHAPES[name]
        self.fusion = FUSIONS[name.split(".", 1)[1]]
        self.gated = self.fusion.get("gated", False)
        self.weights = rotated_weights(self.n, self.k, dtype, device)
        self.x = torch.randn(rows, self.k, dtype=dtype, device=device)
        self.norm_weight = (1 + 0.1 * torch.randn(self.k, device=device)).to(dtype) if self.fusion.get("norm") else None
        out = self.n // 2 if self.gated else self.n
        self.residual = torch.randn(rows, out, dtype=dtype, device=device) if self.fusion.get("residual") else None

    def time_us(self, run, calls: int) -> float:
        """us a call of ``run(x, weight)`` in a graph of ``calls`` launches over the rotated weights."""
        return graph_time_us(run, self.weights, self.x, calls)

    def fastest(self, launches, run, calls: int, want: torch.Tensor):
        """(us, launch, max abs error against ``want``) of the fastest of ``launches`` (``run(x, weight, launch)``);
        None when none ran (a launch out of resources is skipped)."""
        best = None
        for launch in launches:
            try:
                err = (run(self.x, self.weights[0], launch).float() - want).abs().max().item()
                us = self.time_us(lambda a, w: run(a, w, launch), calls)
            except Exception as exc:  # noqa: BLE001
                print(f"  {launch}: {type(exc).__name__}")
                continue
            if best is None or us < best[0]:
                best = (us, launch, err)
        return best

    def record(self, result: dict, name: str, unfused_us: float, best, out, **extra) -> None:
        """Print ``best`` (``fastest``'s) against the unfused launches and add it to ``result``, written to ``out``
        after every matmul (a run cut short keeps what it timed)."""
        if best is None:
            print(f"{name} {extra}: no launch ran", flush=True)
            return
        us, launch, err = best
        row = {"shape": name, "n": self.n, "k": self.k, **extra, "fusion": self.fusion, "unfused_us": unfused_us,
               "fused_us": us, "config": launch, "max_abs_err": err, "unfused_over_fused": unfused_us / us,
               "fused_tbs": self.n * self.k * 2 / us / 1e6}
        result["rows"].append(row)
        print(f"{name:12s} {extra or ''} unfused {unfused_us:7.2f} us | fused {us:7.2f} us {row['fused_tbs']:5.2f} "
              f"TB/s | x{unfused_us / us:.2f} err {err:.3g} {launch}", flush=True)
        if out:
            with open(out, "w") as f:
                json.dump(result, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="8b.qkv,8b.o,8b.gate_up,8b.down,1b.qkv,1b.o,1b.gate_up,1b.down")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--wide", action="store_true", help="--sweep the TMA launches of WIDE_TMA")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "torch.bfloat16", "rows": []}
    print(result["gpu"], result["torch"])
    for name in args.shapes.split(","):
        mm = LayerMatmul(name, 1)
        base_us = mm.time_us(lambda a, w: unfused(a, w, mm.norm_weight, mm.residual, mm.gated), args.calls)
        want = unfused(mm.x, mm.weights[0], mm.norm_weight, mm.residual, mm.gated).float()

        def run(a, w, launch):
            dl.LAUNCH_OVERRIDE.clear()
            dl.LAUNCH_OVERRIDE.update(launch)
            return dl.decode_linear_triton(a, w, None, mm.norm_weight, 1e-5, mm.gated, mm.residual)

        space = WIDE_TMA if args.wide else SWEEP_TMA
        best = mm.fastest(launches(args.sweep, mm.k, mm.gated, dl.tma_readable(mm.weights[0]), space), run,
                          args.calls, want)
        dl.LAUNCH_OVERRIDE.clear()
        if best is not None and not best[1]:  # the table's own launch
            best = (best[0], dl.gemv_config(mm.n, mm.k, device, fused=True), best[2])
        mm.record(result, name, base_us, best, args.out)
        del mm
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
