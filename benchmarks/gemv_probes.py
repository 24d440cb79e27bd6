"""What else a one-row matmul could do on Hopper: prefetch its weight into L2 first, or stream it persistently.

Two probes behind ``docs/kernels.md``'s "One-row matmuls" (both found nothing to take: a matmul's ramp and tail, about
4-5 us a launch, stay). For a few weight shapes (bf16, copies rotated so that no launch finds its weight in L2 by
accident), inside one CUDA graph of ``--calls`` launches, against ``F.linear`` (cuBLAS) and the runner's
``decode_linear`` (the table's GEMV or cuBLAS):

``l2-prefetch``: whether the matmul reads faster after its weight was brought into L2. Times a prefetch kernel alone
over the weight (``asm``: ``prefetch.global.L2::evict_last`` per 128-byte line, nothing waits for the data;
``load``: loads with evict_last, summed), then the prefetch followed by the matmul of the same weight:
(that - the prefetch alone) is the matmul from L2.

``stream``: a persistent GEMV. ``ctas_per_sm`` programs per SM walk their row blocks in turn (``rb = pid, pid + P,
...``), the next block's load in flight while one is summed, each block's rows whole along K in one tile;
``PREFETCH`` first asks L2 for every line of the program's rows, so the whole weight is requested at the start.

    python benchmarks/gemv_probes.py l2-prefetch --out $OUT/l2_probe.json      # CUDA; under a minute
    python benchmarks/gemv_probes.py stream --out $OUT/gemv_stream.json        # CUDA; about a minute
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
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

from benchmarks.decode_linear import SHAPES, graph_time_us, rotated_weights, save_shapes_so_far  # noqa: E402
from hf_specdec.kernels.decode_linear_triton import decode_linear_triton  # noqa: E402

DEFAULT_SHAPES = {
    "l2-prefetch": "8b.o,8b.qkv,1b.o,1b.qkv,1b.down,pair_draft.o",
    "stream": "8b.o,8b.qkv,8b.down,8b.gate_up,1b.o,1b.qkv,1b.down,1b.gate_up,pair_draft.qkv,pair_draft.o,"
              "pair_draft.gate_up,pair_draft.down,narrow.qkv,narrow.fc",
}


@triton.jit
def _prefetch_kernel(w_ptr, sink_ptr, numel, BLOCK: tl.constexpr, USE_ASM: tl.constexpr):
    """Touch every element of ``w`` (bf16) so that its lines sit in L2, evict-last; ``sink`` is never written
    (the sums are zero or random), it only keeps the loads alive."""
    pid, nprog = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(pid * BLOCK * 64, numel, nprog * BLOCK * 64):
        if USE_ASM:  # one prefetch per 128-byte line (64 bf16 elements)
            lines = w_ptr + start + tl.arange(0, BLOCK) * 64
            got = tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n mov.u32 $0, 0;", "=r,l",
                                            [lines], dtype=tl.int32, is_pure=False, pack=1)
            acc += got.to(tl.float32)
        else:
            offs = start + tl.arange(0, BLOCK * 64)
            x = tl.load(w_ptr + offs, mask=offs < numel, other=0.0, eviction_policy="evict_last")
            acc += tl.sum(tl.reshape(x.to(tl.float32), (BLOCK, 64)), axis=1)
    total = tl.sum(acc)
    tl.store(sink_ptr + pid, total, mask=total == 1234.5)


def prefetch(w: torch.Tensor, sink: torch.Tensor, programs: int, use_asm: bool) -> None:
    _prefetch_kernel[(programs,)](w, sink, w.numel(), BLOCK=64 if use_asm else 32, USE_ASM=use_asm, num_warps=4)


@triton.jit(do_not_specialize=["N", "K"])
def _gemv_stream_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PREFETCH: tl.constexpr):
    pid, nprog = tl.program_id(0), tl.num_programs(0)
    n_blocks = tl.cdiv(N, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k_in = rk < K
    if PREFETCH:  # every line of this program's rows, requested at once (out-of-range lines clamp to row 0)
        lines = tl.arange(0, BLOCK_K // 64) * 64
        for rb in range(pid, n_blocks, nprog):
            rows = rb * BLOCK_N + tl.arange(0, BLOCK_N)
            ok = (rows < N)[:, None] & (lines < K)[None, :]
            ptrs = w_ptr + tl.where(ok, rows[:, None].to(tl.int64) * stride_wn + lines[None, :], 0)
            tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n mov.u32 $0, 0;", "=r,l", [ptrs],
                                      dtype=tl.int32, is_pure=False, pack=1)
    x = tl.load(x_ptr + rk, mask=k_in, other=0.0).to(tl.float32)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :], mask=(rn < N)[:, None] & k_in[None, :],
                other=0.0, eviction_policy="evict_first")
    for rb in range(pid, n_blocks, nprog):
        rn_next = rn + nprog * BLOCK_N
        w_next = tl.load(w_ptr + rn_next[:, None].to(tl.int64) * stride_wn + rk[None, :],
                         mask=(rn_next < N)[:, None] & k_in[None, :], other=0.0, eviction_policy="evict_first")
        y = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)
        w, rn = w_next, rn_next


def gemv_stream(x: torch.Tensor, w: torch.Tensor, cfg: dict) -> torch.Tensor:
    n, k = w.shape
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    programs = min(triton.cdiv(n, cfg["block_n"]), cfg["ctas_per_sm"] * cfg["sms"])
    _gemv_stream_kernel[(programs,)](x, w, y, n, k, w.stride(0), BLOCK_N=cfg["block_n"],
                                     BLOCK_K=triton.next_power_of_2(k), PREFETCH=cfg["prefetch"],
                                     num_warps=cfg["num_warps"])
    return y


def l2_prefetch_rows(row: dict, weights: list, x: torch.Tensor, args, sink: torch.Tensor) -> None:
    for mode in ("asm", "load"):
        for p in map(int, args.programs.split(",")):
            use_asm = mode == "asm"
            alone = graph_time_us(lambda a, w: prefetch(w, sink, p, use_asm), weights, x, args.calls)

            def both(a, w, p=p, use_asm=use_asm):
                prefetch(w, sink, p, use_asm)
                return decode_linear_triton(a, w, None)

            def both_cublas(a, w, p=p, use_asm=use_asm):
                prefetch(w, sink, p, use_asm)
                return F.linear(a, w)

            row[f"prefetch:{mode}:{p}"] = alone
            row[f"prefetch+matmul:{mode}:{p}"] = graph_time_us(both, weights, x, args.calls)
            row[f"prefetch+cublas:{mode}:{p}"] = graph_time_us(both_cublas, weights, x, args.calls)


def stream_rows(row: dict, weights: list, x: torch.Tensor, args, sms: int) -> None:
    n, k = weights[0].shape
    ref = F.linear(x, weights[0]).float()
    row.update(best=None, tried=0)
    bk = triton.next_power_of_2(k)
    for bn, warps, cps, pre in itertools.product(map(int, args.block_n.split(",")),
                                                 map(int, args.num_warps.split(",")),
                                                 map(int, args.ctas_per_sm.split(",")), (False, True)):
        if bn * bk > 128 * 32 * warps:  # two tiles of over 128 weights a thread: registers spill
            continue
        cfg = dict(block_n=bn, num_warps=warps, ctas_per_sm=cps, sms=sms, prefetch=pre)
        try:
            err = (gemv_stream(x, weights[0], cfg).float() - ref).abs().max().item()
            us = graph_time_us(lambda a, w, cfg=cfg: gemv_stream(a, w, cfg), weights, x, args.calls)
        except Exception as exc:  # noqa: BLE001  (out of resources: skip)
            print(f"  {row['shape']} {cfg}: {type(exc).__name__}", flush=True)
            continue
        row["tried"] += 1
        if row["best"] is None or us < row["best"]["us"]:
            row["best"] = dict(cfg, us=us, max_abs_err=err)
        key = "best_prefetch" if pre else "best_no_prefetch"
        if row.get(key) is None or us < row[key]["us"]:
            row[key] = dict(cfg, us=us, max_abs_err=err)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probe", choices=tuple(DEFAULT_SHAPES))
    ap.add_argument("--shapes", help="names of benchmarks/decode_linear.py's SHAPES (default: the probe's)")
    ap.add_argument("--programs", default="132,264,528", help="l2-prefetch: the prefetch kernel's programs")
    ap.add_argument("--block-n", default="1,2,4,8", help="stream: rows a block")
    ap.add_argument("--num-warps", default="4,8,16", help="stream")
    ap.add_argument("--ctas-per-sm", default="1,2,3,4", help="stream: programs a SM")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--out")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    props = torch.cuda.get_device_properties(dev)
    result = {"probe": args.probe, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "l2_bytes": props.L2_cache_size, "sms": props.multi_processor_count, "rows": []}
    print(result["gpu"], "L2", result["l2_bytes"] >> 20, "MiB,", result["sms"], "SMs", flush=True)
    sink = torch.zeros(4096, dtype=torch.float32, device=dev)
    for name in (args.shapes or DEFAULT_SHAPES[args.probe]).split(","):
        n, k = SHAPES[name]
        weights = rotated_weights(n, k, dt, dev, total_bytes=512 << 20, least=4)
        x = torch.randn(1, k, dtype=dt, device=dev)
        row = {"shape": name, "n": n, "k": k, "mb": n * k * 2 / 1e6,
               "table": graph_time_us(lambda a, w: decode_linear_triton(a, w, None), weights, x, args.calls),
               "cublas": graph_time_us(lambda a, w: F.linear(a, w), weights, x, args.calls)}
        if args.probe == "l2-prefetch":
            l2_prefetch_rows(row, weights, x, args, sink)
        else:
            stream_rows(row, weights, x, args, result["sms"])
        result["rows"].append(row)
        print(json.dumps({key: (round(v, 2) if isinstance(v, float) else v) for key, v in row.items()}), flush=True)
        del weights
        torch.cuda.empty_cache()
        save_shapes_so_far(result, args.out)


if __name__ == "__main__":
    main()
