"""The paged attention's launch, swept: split counts, key tiles and warps for a round's shapes.

A round calls the paged attention once per layer per forward with one token a row (draft steps, plain decoding) or
k+1 (the verify). For each model shape (the project's pair, 8B/1B), batch size, query length and context, this
times ``kernels.paged_attention_triton`` inside a CUDA graph (one call after another over rotating caches, so the
keys come from memory as in a model step, not from L2) under each launch in the sweep
(``paged_attention_triton.LAUNCH_OVERRIDE``: programs per SM that the split count aims for, the fewest key tiles a
split takes, the key tile, warps), checks each output against the default launch's, and prints per case the default
and the best launch, then the launches by their total over all cases.

The split count depends on the block table's capacity, not on the context: ``--table-tokens`` must be what the
runner's tables hold (a power-of-two multiple of 8 blocks covering the longest row's prompt, new tokens and
drafts), or the default launch here is not the one the model runs. A launch that wins here is then to be timed
inside the model (``benchmarks/profile_round.py``, the code before and after, one machine): a sweep with tables
just wider than the context (2026-11-28, H100) favoured one-tile splits by 30-40% at batch 1, and in the model
those same splits left the round unchanged.

    python benchmarks/attention_sweep.py --out $OUT/attention_sweep.json      # CUDA; a few minutes (JIT compiles)
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

import hf_specdec.kernels.paged_attention_triton as pa  # noqa: E402

SHAPES = {"pair": (12, 4, 128), "pair_draft": (8, 4, 64), "8b": (32, 8, 128), "1b": (32, 8, 64)}  # heads, kv, dim
BLOCK = 16


def case_inputs(heads, kv_heads, dim, batch, q, ctx, table_tokens, copies, device):
    """Packed queries and ``copies`` caches (each row's blocks laid out at random) for one case."""
    width = max(table_tokens, ctx + q + BLOCK - 1) // BLOCK
    gen = torch.Generator(device="cpu").manual_seed(0)
    blocks = batch * width + 1
    caches = [(torch.randn(blocks, BLOCK, kv_heads, dim, generator=gen).to(device, torch.bfloat16),
               torch.randn(blocks, BLOCK, kv_heads, dim, generator=gen).to(device, torch.bfloat16))
              for _ in range(copies)]
    tables = torch.randperm(blocks - 1, generator=gen)[: batch * width].view(batch, width).to(device, torch.int32) + 1
    query = torch.randn(batch * q, heads, dim, generator=gen).to(device, torch.bfloat16)
    seq_lens = torch.full((batch,), ctx + q, dtype=torch.int32, device=device)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=device) * q
    return query, caches, tables, seq_lens, qsl


def time_case(inputs, q, dim, reps=20):
    """Median microseconds a call, the calls over every cache copy captured in one graph; and the first output."""
    query, caches, tables, seq_lens, qsl = inputs
    call = lambda kc, vc: pa.paged_attention_triton(query, kc, vc, tables, seq_lens, qsl, q, dim ** -0.5)  # noqa: E731
    first = call(*caches[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for kc, vc in caches:
            call(kc, vc)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for kc, vc in caches:
            call(kc, vc)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(caches))
    return sorted(times)[len(times) // 2], first


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--queries", default="1,5")
    ap.add_argument("--contexts", default="200,450")
    ap.add_argument("--table-tokens", type=int, default=1024, help="the block tables' capacity (the split count "
                    "reads it): the runner's for the calls in question")
    ap.add_argument("--programs-per-sm", default="2,4,8,16")
    ap.add_argument("--min-tiles", default="1,2,4")
    ap.add_argument("--block-n", default="32,64")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="2")
    ap.add_argument("--wide", default="0", help="0,1: the wide-grid rule off (splits as the knobs say) / on (a grid "
                    "of a quarter of the split's target programs runs unsplit, with the swept tile and warps: "
                    "--block-n 128 --warps 8 is the default launch's). The baseline is the default launch")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    device = torch.device("cuda")
    launches = [dict(programs_per_sm=p, min_tiles=t, block_n=n, num_warps=w, num_stages=st, wide_tiles=bool(wd))
                for p, t, n, w, st, wd in itertools.product(ints(args.programs_per_sm), ints(args.min_tiles),
                                                            ints(args.block_n), ints(args.warps), ints(args.stages),
                                                            ints(args.wide))]
    report = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "cases": []}
    totals: dict = {}
    for name, batch, q, ctx in itertools.product(args.shapes.split(","), ints(args.batches), ints(args.queries),
                                                 ints(args.contexts)):
        heads, kv_heads, dim = SHAPES[name]
        kv_bytes = batch * kv_heads * ctx * dim * 2 * 2
        copies = max(4, min(16, (200 << 20) // kv_bytes))
        inputs = case_inputs(heads, kv_heads, dim, batch, q, ctx, args.table_tokens, copies, device)
        pa.LAUNCH_OVERRIDE.clear()
        base_us, want = time_case(inputs, q, dim)
        rows = []
        for launch in launches:
            pa.LAUNCH_OVERRIDE.clear()
            pa.LAUNCH_OVERRIDE.update(launch)
            us, got = time_case(inputs, q, dim)
            ok = torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)
            rows.append(dict(launch, us=us, ok=ok))
            key = tuple(sorted(launch.items()))
            totals[key] = totals.get(key, 0.0) + (us if ok else float("inf"))
        pa.LAUNCH_OVERRIDE.clear()
        best = min((r for r in rows if r["ok"]), key=lambda r: r["us"])
        floor_us = kv_bytes / 4.0e6  # at 4 TB/s
        report["cases"].append(dict(shape=name, batch=batch, q=q, ctx=ctx, default_us=base_us, best=best, rows=rows,
                                    floor_us_at_4tbps=floor_us))
        print(f"{name:<10} b={batch:<3} q={q} ctx={ctx:<4} default {base_us:7.2f} us  best {best['us']:7.2f} us "
              f"{ {k: v for k, v in best.items() if k not in ('us', 'ok')} }  floor@4TB/s {floor_us:5.2f} us"
              f"{'' if all(r['ok'] for r in rows) else '  MISMATCH in ' + str(sum(not r['ok'] for r in rows))}",
              flush=True)
    ranked = sorted(totals.items(), key=lambda kv: kv[1])
    report["totals"] = [dict(dict(k), total_us=v) for k, v in ranked]
    print("launches by total over all cases (us):")
    for k, v in ranked[:12]:
        print(f"  {v:9.1f}  {dict(k)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
