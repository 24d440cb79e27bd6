#!/usr/bin/env python
"""A gated MLP's ``silu(gate) * up`` on the GPU: Inductor's compiled kernel (what the runner's compiled layers run,
over the two halves of the fused gate/up matmul's output) against ``kernels.silu_mul`` (what its uncompiled copy
runs). In the runner's compiled regions only the token count is dynamic (the widths come from the weights), as in
the "rows dynamic" column; the "dynamic" column compiles every dimension symbolic.

For each width (an 8B- and a 1B-shaped MLP) and row count (a decode step at b = 1 and 32, a 5-token verify at
b = 32): the outputs compared, then the time of one call from a CUDA graph of ``--layers`` calls, each on its own
input (so that the inputs are not in L2), replayed ``--repeats`` times (median of 5 measurements), against the
floor of its bytes at the device-to-device copy rate measured in the same run. No Hugging Face path exists for
this piece, so the ratio is ours against Inductor's.

    python benchmarks/silu_mul_bench.py --out $OUT/silu_mul.json      # CUDA, about a minute
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, not installed
from benchmarks.common import graphed_call_us  # noqa: E402
from benchmarks.scale import copy_bandwidth  # noqa: E402
from hf_specdec.kernels import silu_mul  # noqa: E402

WIDTHS = {"8b": 14336, "1b": 8192}  # intermediate size


def halves(gate_up: torch.Tensor):
    n = gate_up.shape[-1] // 2
    return gate_up[..., :n], gate_up[..., n:]


def inductor_fn(dynamic: bool):
    def fn(gate_up):
        gate, up = halves(gate_up)
        return F.silu(gate) * up

    return torch.compile(fn, dynamic=dynamic)


def ours(gate_up):
    return silu_mul(*halves(gate_up))


def graphed_us(fn, inputs, repeats: int, mark_rows: bool = False) -> float:
    """Microseconds a call, from a graph of one call per input replayed ``repeats`` times (median of 5)."""
    if mark_rows:
        for x in inputs:
            torch._dynamo.mark_dynamic(x, 0)
    return graphed_call_us([functools.partial(fn, x) for x in inputs], repeats)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="silu_mul.json")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--rows", default="1,32,160")
    ap.add_argument("--widths", default=",".join(WIDTHS))
    args = ap.parse_args(argv)
    bandwidth = copy_bandwidth(torch.device("cuda"), torch.bfloat16, 2.0)["gb_per_s"]
    print(f"copy {bandwidth:.0f} GB/s", flush=True)
    rows_out = []
    for name in args.widths.split(","):
        n = WIDTHS[name]
        for rows in (int(r) for r in args.rows.split(",")):
            gen = torch.Generator(device="cuda").manual_seed(rows)
            inputs = [torch.randn(rows, 2 * n, device="cuda", dtype=torch.bfloat16, generator=gen)
                      for _ in range(args.layers)]
            torch._dynamo.reset()
            dynamic, rows_only = inductor_fn(True), inductor_fn(False)
            want = dynamic(inputs[0])
            row = dict(width=name, n=n, rows=rows, max_abs_diff=float((ours(inputs[0]).float() - want.float()).abs()
                                                                      .max()),
                       floor_us=3 * rows * n * 2 / bandwidth / 1e3,
                       inductor_dynamic_us=graphed_us(dynamic, inputs, args.repeats),
                       inductor_rows_dynamic_us=graphed_us(rows_only, [x.clone() for x in inputs], args.repeats,
                                                           mark_rows=True),
                       ours_us=graphed_us(ours, inputs, args.repeats))
            rows_out.append(row)
            print(f"{name} rows={rows:<4} floor {row['floor_us']:6.2f} us  inductor (dynamic) "
                  f"{row['inductor_dynamic_us']:6.2f}  inductor (rows dynamic) {row['inductor_rows_dynamic_us']:6.2f}"
                  f"  ours {row['ours_us']:6.2f}  max|diff| {row['max_abs_diff']:.2e}", flush=True)
            with open(args.out, "w") as f:
                json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, copy_gb_per_s=bandwidth,
                               rows=rows_out), f, indent=1)
    return rows_out


if __name__ == "__main__":
    main()
