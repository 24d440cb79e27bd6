"""A probe: a decoder layer after its attention at b = 1 in one launch (``layer_tail_kernel.py``: o_proj + residual,
RMSNorm + gate/up + SiLU·up, down_proj + residual, joined by grid barriers) against the three GEMV launches the
one-token layers run (``decode_linear_triton``, the table's launches); and what a grid barrier costs against a
kernel boundary inside a CUDA graph (``--sync-probe``). The result (docs/real_sizes.md): no gain, so the runner keeps
the three launches.

For each shape, one row, inside one CUDA graph of ``--calls`` layer tails rotating over enough weight copies that no
launch finds its weights in L2 (as in a model, where every layer has its own): us per layer tail for

    three   the three fused GEMV launches (the table's: TMA, one-tile or cuBLAS per weight)
    split   the kernel's three phases as three launches, no barrier
    one     the one launch, the default knobs; with --sweep, the best of a coordinate search over the knobs

and checks that one launch gives the split launches' output bit for bit, how far it is from the three launches'
(another summation order: a few bf16 units), and that every barrier counter is back at zero. ``--sync-probe``: one
launch of ``--rounds`` grid barriers (a program per SM, nothing else to do) against as many launches of a kernel that
stores a word a program, each in a graph: us a barrier, us a launch.

    python benchmarks/layer_tail.py --shapes 1b,8b --sweep --sync-probe --out $OUT/layer_tail.json   # H100 / H200
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

from benchmarks.decode_linear import graph_time_us as decode_linear_graph_time_us  # noqa: E402
from benchmarks.decode_linear import save_shapes_so_far  # noqa: E402
from benchmarks.layer_tail_kernel import (  # noqa: E402
    DEFAULT, _barriers_kernel, _store_kernel, layer_tail_one, layer_tail_three)

SHAPES = {  # name: (hidden H, attention width K_attn, MLP width I)
    "8b": (4096, 4096, 14336), "1b": (2048, 2048, 8192),
    "pair": (1536, 1536, 4096),  # the project's target (a full-width draft head's layer)
    "pair_draft": (512, 512, 1536), "narrow": (512, 512, 1344),  # its 29M draft model; a narrow head (h = 512)
}
L2_CLEAR_BYTES = 256 << 20
SPACE = {"block_n": (2, 4, 8, 16), "block_k": (256, 512, 1024, 2048), "num_stages": (1, 2, 3, 4)}  # per phase
GLOBAL = {"num_warps": (4, 8), "prefetch_cols": (0, 512, 2048), "programs_per_sm": (1, 2, 4, 8)}


def layer_weights(H, K_attn, I, device, dtype=torch.bfloat16) -> list:
    """Copies of a layer tail's weights (o, norm, eps, gate/up, down), 256 MB in all at least."""
    per_copy = 2 * (H * K_attn + 2 * I * H + H * I)
    copies = max(2, -(-L2_CLEAR_BYTES // per_copy))

    def w(n, k):
        return torch.randn(n, k, dtype=dtype, device=device) / k ** 0.5

    return [(w(H, K_attn), 1 + 0.1 * torch.randn(H, dtype=dtype, device=device), 1e-5, w(2 * I, H), w(H, I))
            for _ in range(copies)]


def graph_time_us(fn, copies: int, calls: int) -> float:
    """us per call of ``fn(i)`` over ``calls`` calls cycling through ``copies``, replayed in a CUDA graph
    (``decode_linear.graph_time_us``)."""
    return decode_linear_graph_time_us(lambda _, i: fn(i), list(range(copies)), None, calls)


def fits(cfg: dict, H, K_attn, I) -> bool:
    """No tile wider than its K's next power of two, at most 256 weights a thread (a gated tile holds 2 x block_n
    rows), the stages' tiles in shared memory."""
    for phase, (k, rows) in enumerate(((K_attn, 1), (H, 2), (I, 1))):
        bn, bk, st = cfg["block_n"][phase], cfg["block_k"][phase], cfg["num_stages"][phase]
        if bk > triton.next_power_of_2(k) or bn * rows * bk // (32 * cfg["num_warps"]) > 256:
            return False
        if bn * rows * bk * 2 * st > 200 << 10:
            return False
    return True


def time_config(cfg: dict, x, h, weights, counters, calls) -> float:
    return graph_time_us(lambda i: layer_tail_one(x, h, *weights[i], counters[i], cfg), len(weights), calls)


def sync_probe(device, rounds: int) -> dict:
    """us a grid barrier (one launch of ``rounds``) and us a launch boundary (``rounds`` launches), graphed."""
    programs = torch.cuda.get_device_properties(device).multi_processor_count
    counter = torch.zeros(2, dtype=torch.int32, device=device)
    buf = torch.zeros(programs, dtype=torch.int32, device=device)
    with_barriers = graph_time_us(lambda i: _barriers_kernel[(programs,)](counter, buf, ROUNDS=rounds), 1, 8)
    without = graph_time_us(lambda i: _barriers_kernel[(programs,)](counter, buf, ROUNDS=0), 1, 8)
    launches = graph_time_us(lambda i: [_store_kernel[(programs,)](buf, r) for r in range(rounds)], 1, 8)
    return {"programs": programs, "rounds": rounds, "us_a_barrier": (with_barriers - without) / rounds,
            "us_a_launch": launches / rounds, "us_the_launch_without_barriers": without,
            "counter_zero": int(counter.abs().sum()) == 0}


def search(base: dict, x, h, weights, counters, calls, H, K_attn, I, budget_s: float) -> tuple[dict, float, int]:
    """Coordinate search from ``base``: the global knobs, then each knob of each phase in turn, keeping what was
    faster; passes over them all until ``budget_s`` is spent or a pass changes nothing."""
    best, best_us, tried, t0 = dict(base), time_config(base, x, h, weights, counters, calls), 1, time.time()
    knobs = [(name, None, values) for name, values in GLOBAL.items()]
    knobs += [(name, phase, values) for name, values in SPACE.items() for phase in range(3)]
    changed = True
    while changed and time.time() - t0 < budget_s:
        changed = False
        for name, phase, values in knobs:
            for value in values:
                cfg = dict(best)
                if phase is None:
                    cfg[name] = value
                else:
                    cfg[name] = tuple(value if p == phase else v for p, v in enumerate(best[name]))
                if cfg == best or not fits(cfg, H, K_attn, I) or time.time() - t0 > budget_s:
                    continue
                us = time_config(cfg, x, h, weights, counters, calls)
                tried += 1
                if us < best_us:
                    best, best_us, changed = cfg, us, True
    return best, best_us, tried


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1b,8b,pair,pair_draft,narrow")
    ap.add_argument("--calls", type=int, default=24, help="layer tails a graph")
    ap.add_argument("--sweep", action="store_true", help="search the one launch's knobs (until --budget-s)")
    ap.add_argument("--budget-s", type=float, default=90.0, help="search time a shape at most")
    ap.add_argument("--sync-probe", action="store_true", help="also a grid barrier against a launch boundary")
    ap.add_argument("--rounds", type=int, default=32, help="barriers (launches) a graph call of the sync probe")
    ap.add_argument("--out")
    args = ap.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    result = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "triton": triton.__version__,
              "calls": args.calls, "shapes": {}}
    if args.sync_probe:
        result["sync"] = sync_probe(device, args.rounds)
        print(f"sync: {result['sync']}", flush=True)
        save_shapes_so_far(result, args.out)
    for name in filter(None, args.shapes.split(",")):
        H, K_attn, I = SHAPES[name]
        weights = layer_weights(H, K_attn, I, device)
        counters = [torch.zeros(2, dtype=torch.int32, device=device) for _ in weights]
        x = torch.randn(1, 1, K_attn, dtype=torch.bfloat16, device=device)
        h = 3 * torch.randn(1, 1, H, dtype=torch.bfloat16, device=device)
        base = dict(DEFAULT)
        row = {"H": H, "K_attn": K_attn, "I": I, "copies": len(weights), "default": base}
        row["three_us"] = graph_time_us(lambda i: layer_tail_three(x, h, *weights[i]), len(weights), args.calls)
        row["split_us"] = time_config(dict(base, phases="split"), x, h, weights, counters, args.calls)
        row["one_us"] = time_config(base, x, h, weights, counters, args.calls)
        best, best_us = base, row["one_us"]
        if args.sweep:
            best, best_us, row["tried"] = search(base, x, h, weights, counters, args.calls, H, K_attn, I,
                                                 args.budget_s)
        row["best"], row["best_us"] = best, best_us
        row["best_split_us"] = time_config(dict(best, phases="split"), x, h, weights, counters, args.calls)
        # Checks: one launch == its phases split, bit for bit; against the three launches; counters back at zero.
        one = layer_tail_one(x, h, *weights[0], counters[0], best)
        split = layer_tail_one(x, h, *weights[0], counters[0], dict(best, phases="split"))
        three = layer_tail_three(x, h, *weights[0])
        torch.cuda.synchronize()
        row["one_equals_split"] = bool(torch.equal(one, split))
        row["one_vs_three_max_abs"] = float((one.float() - three.float()).abs().max())
        row["one_vs_three_max_rel_ulp"] = float(((one.float() - three.float()).abs()
                                                 / three.float().abs().clamp_min(1e-3) / 2 ** -8).max())
        row["counters_zero"] = bool(all(int(c.abs().sum()) == 0 for c in counters))
        row["three_over_best"] = row["three_us"] / best_us
        result["shapes"][name] = row
        print(f"{name}: three {row['three_us']:.2f} us, split {row['split_us']:.2f}, one {row['one_us']:.2f}, "
              f"best {best_us:.2f} ({row['three_over_best']:.2f}x; split {row['best_split_us']:.2f}) {best}; "
              f"one==split {row['one_equals_split']}, vs three {row['one_vs_three_max_abs']:.3g}, "
              f"counters zero {row['counters_zero']}", flush=True)
        save_shapes_so_far(result, args.out)
        del weights, counters
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
