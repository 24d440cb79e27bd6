#!/usr/bin/env python
"""A decode or verify step's attention on the GPU: one launch (rotary + K/V write + paged attention,
``kernels.rotary_paged_attention``) against the two it replaces (``rotary_write_kv`` then ``paged_attention``, with
its split-KV combine), as the runner's Llama-family layers call them.

For each shape (heads, kv heads, head_dim of an 8B- and a 1B-shaped Llama; rows; tokens a row; context): a check
(the fused output against the two-kernel output, bf16, and the caches after both: every new slot equal) and the
time of one call, from a CUDA graph of ``--layers`` calls (each on its own layer's cache, as a step reads them),
replayed ``--repeats`` times (median of 5 measurements). Block tables are ``--table-tokens`` wide (default 8192:
with graphs the runner's are as wide as the model's positions, and the width sets the split count at small batch;
results before 2026-11-29's ``...-attention-launch-sweep.json`` had tables as wide as the context, 4 splits at
b = 1). No Hugging Face path exists for this piece, so the ratio is ours against ours.

    python benchmarks/attention_fusion.py [--out attention_fusion.json] [--layers 32] [--context 512] [--table-tokens N]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, not installed
import hf_specdec.kernels.paged_attention_triton as pa  # noqa: E402
from benchmarks.common import graphed_call_us  # noqa: E402
from hf_specdec.kernels import paged_attention, rotary_paged_attention, rotary_write_kv, slots_of  # noqa: E402

SHAPES = {"8b": (32, 8, 128), "1b": (32, 8, 64)}  # heads, kv heads, head_dim
# With graphs the runner's block tables are as wide as the model's positions, so a small batch splits its keys
# over as many programs as fill the GPU (16 at b = 1); a table only as wide as the context splits less.
TABLE_TOKENS = 8192


def step_inputs(rows, q, context, H, KVH, D, layers, block_size=16, dtype=torch.bfloat16, seed=0, table_tokens=0):
    """Pre-rotary q/k/v (views of one fused projection), angles, ``layers`` caches and the step's metadata. Each
    row's blocks are scattered over the pool; its block table is ``table_tokens`` tokens wide where that is more
    than it needs (the entries past its blocks unused, as the runner's are): the width sets the split count."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    seq = context + q
    per_row = (seq + block_size - 1) // block_size + 1
    num_blocks = rows * per_row + 1
    used = torch.randperm(num_blocks - 1, device="cuda", generator=gen)[: rows * per_row].view(rows, per_row)
    tables = torch.zeros(rows, max(per_row, -(-table_tokens // block_size)), dtype=torch.int32, device="cuda")
    tables[:, :per_row] = used.int()
    caches = [[torch.randn(num_blocks, block_size, KVH, D, device="cuda", dtype=dtype, generator=gen)
               for _ in range(2)] for _ in range(layers)]
    T = rows * q
    qkv = torch.randn(T, (H + 2 * KVH) * D, device="cuda", dtype=dtype, generator=gen)
    query, key, value = (qkv[:, a * D:b * D].view(T, b - a, D) for a, b in ((0, H), (H, H + KVH),
                                                                            (H + KVH, H + 2 * KVH)))
    positions = context + torch.arange(q, device="cuda").repeat(rows)
    emb = positions[:, None].float() * (1.0 / 500000 ** (torch.arange(0, D, 2, device="cuda").float() / D))
    emb = torch.cat([emb, emb], dim=-1)
    slots = slots_of(tables, torch.arange(rows, device="cuda").repeat_interleave(q), positions, block_size)
    meta = dict(block_tables=tables, seq_lens=torch.full((rows,), seq, device="cuda", dtype=torch.int32),
                query_start_loc=(torch.arange(rows + 1, device="cuda") * q).int(), slot_mapping=slots,
                max_query_len=q)
    return (query, key, value, emb.cos().to(dtype), emb.sin().to(dtype)), caches, meta


FUSED_OVERRIDE: dict = {}  # launch knobs of the fused calls only (--override)


def fused(inputs, cache, meta, scale):
    saved, pa.LAUNCH_OVERRIDE = pa.LAUNCH_OVERRIDE, FUSED_OVERRIDE
    try:
        return _fused(inputs, cache, meta, scale)
    finally:
        pa.LAUNCH_OVERRIDE = saved


def _fused(inputs, cache, meta, scale):
    return rotary_paged_attention(*inputs, *cache, meta["block_tables"], meta["seq_lens"], meta["query_start_loc"],
                                  meta["slot_mapping"], meta["max_query_len"], scale)


def two_kernels(inputs, cache, meta, scale):
    q, _ = rotary_write_kv(*inputs, *cache, meta["slot_mapping"], False)
    return paged_attention(q, *cache, meta["block_tables"], meta["seq_lens"], meta["query_start_loc"],
                           meta["max_query_len"], scale)


def graphed_us(fn, inputs, caches, meta, scale, repeats) -> float:
    """Microseconds a call, from a graph of one call per layer replayed ``repeats`` times (median of 5)."""
    return graphed_call_us([functools.partial(fn, inputs, cache, meta, scale) for cache in caches], repeats)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="attention_fusion.json")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--table-tokens", type=int, default=TABLE_TOKENS,
                    help="block-table width in tokens (0: what the context needs)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--tokens", default="1,5")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--override", action="append", default=[],
                    help="JSON launch knobs (paged_attention_triton.LAUNCH_OVERRIDE) for the fused calls; repeat to "
                         "compare several, each on every shape")
    args = ap.parse_args(argv)
    rows_out = []
    overrides = [json.loads(o) for o in args.override] or [{}]
    for name, (H, KVH, D), rows, q, override in ((n, SHAPES[n], int(b), int(t), o) for n in args.shapes.split(",")
                                                 for b in args.batches.split(",") for t in args.tokens.split(",")
                                                 for o in overrides):
        FUSED_OVERRIDE.clear()
        FUSED_OVERRIDE.update(override)
        inputs, caches, meta = step_inputs(rows, q, args.context, H, KVH, D, args.layers,
                                           table_tokens=args.table_tokens)
        scale = D ** -0.5
        twin = [c.clone() for c in caches[0]]
        row = dict(shape=name, rows=rows, tokens=q, context=args.context, table_tokens=args.table_tokens,
                   override=override)
        try:  # a knob the GPU cannot serve (shared memory) costs its row only
            got, want = fused(inputs, caches[0], meta, scale), two_kernels(inputs, twin, meta, scale)
            row.update(max_abs_diff=float((got.float() - want.float()).abs().max()),
                       caches_equal=all(torch.equal(a, b) for a, b in zip(caches[0], twin)),
                       fused_us=graphed_us(fused, inputs, caches, meta, scale, args.repeats),
                       two_kernels_us=graphed_us(two_kernels, inputs, caches, meta, scale, args.repeats))
        except Exception as e:  # noqa: BLE001 - reported in the row and the log
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows_out.append(row)
            print(f"{name} b={rows:<3} q={q}  {row['error']}  {override}", flush=True)
            continue
        row["saved_us"] = row["two_kernels_us"] - row["fused_us"]
        rows_out.append(row)
        print(f"{name} b={rows:<3} q={q}  fused {row['fused_us']:6.2f} us  two kernels "
              f"{row['two_kernels_us']:6.2f} us  saved {row['saved_us']:5.2f} us  max|diff| "
              f"{row['max_abs_diff']:.2e}  caches equal {row['caches_equal']}  {override or ''}", flush=True)
        with open(args.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows_out), f,
                      indent=1)
    return rows_out


if __name__ == "__main__":
    main()
