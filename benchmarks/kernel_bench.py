"""GPU micro-benchmark of the hf_specdec kernels: Triton vs torch reference vs the memory floor.

    python benchmarks/kernel_bench.py --out kernels.json [--quick] [--skip-check]

For each kernel and shape: check the Triton output against the torch reference (exact
ids for the samplers, exact KV writes, allclose attention), then time both with
``triton.testing.do_bench`` (median; it flushes the L2 cache before every call). The
floor is the bytes the kernel cannot avoid moving (read + write) over the device-to-device
copy bandwidth measured in the same run (a 1 GiB ``copy_``, read + write bytes counted):

* rejection sampling, random: per sequence the row of ``p`` at the emitted position, the
  noise row ``E`` and, after a rejection, the row of ``q``; greedy: the ``r_b + 1`` target
  rows up to the first mismatch (argmax needs every value of a row);
* typical acceptance: the ``r_b + 1`` visited target rows, plus ``E`` when all accepted;
* KV write: the new keys and values read once and written once;
* paged attention: every cached key and value of every sequence once, queries, output.

The rows visited depend on the acceptance outcome, so the floor is computed from the
reference's accepted counts on the very inputs that are timed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from hf_specdec.kernels import (  # noqa: E402
    draw_acceptance_noise,
    ngram_drafts_torch,
    paged_attention_reference,
    rejection_sample_reference,
    typical_accept_reference,
    write_kv_to_slots_reference,
)
from hf_specdec.kernels.ngram_lookup_triton import ngram_drafts_triton  # noqa: E402
from hf_specdec.kernels.paged_attention_triton import paged_attention_triton, write_kv_to_slots_triton  # noqa: E402
from hf_specdec.kernels.rejection_sampler_triton import rejection_sample_triton  # noqa: E402
from hf_specdec.kernels.typical_acceptance_triton import typical_accept_triton  # noqa: E402
import hf_specdec.kernels.paged_attention_triton as pa  # noqa: E402  (module constants the sweeps change)
import hf_specdec.kernels.rejection_sampler_triton as rs  # noqa: E402

DEV = "cuda"


def bench(fn, slow=False):
    return do_bench(fn, warmup=10 if slow else 25, rep=60 if slow else 100, return_mode="median")  # ms


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy, counting the read and the write."""
    n = 1 << 28
    x = torch.randn(n, device=DEV)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    del x, y
    return 2 * n * 4 / (ms * 1e-3)


# ----------------------------------------------------------------------------- sampling inputs

def sampling_inputs(B, K, V, mode, gen, ragged=False):
    counts = torch.full((B,), K, device=DEV)
    if ragged:
        counts = torch.randint(0, K + 1, (B,), device=DEV, generator=gen)
    cu = counts.cumsum(0)
    N = int(cu[-1])
    rows = torch.arange(N, device=DEV) + torch.repeat_interleave(torch.arange(B, device=DEV), counts)
    # draft and target logits close to each other: realistic acceptance rates
    zq = torch.randn(N + B, V, device=DEV, generator=gen) * 2.5
    zp = zq + 0.6 * torch.randn(N + B, V, device=DEV, generator=gen)
    target = torch.softmax(zp, -1)
    del zp
    draft_probs = torch.softmax(zq[rows], -1)
    del zq
    if mode == "random":
        e = torch.empty_like(draft_probs).exponential_(generator=gen)
        draft = (draft_probs / e).argmax(-1)  # x ~ q
        del e
    else:
        argmax = target[rows].argmax(-1)
        rnd = torch.randint(0, V, (N,), device=DEV, generator=gen)
        draft = torch.where(torch.rand(N, device=DEV, generator=gen) < 0.85, argmax, rnd)
    is_greedy = torch.full((B,), mode == "greedy", device=DEV, dtype=torch.bool)
    u, e = draw_acceptance_noise(cu, N, V, torch.device(DEV))
    return draft, cu, draft_probs, target, is_greedy, u, e


def rejection_floor_bytes(n_acc, cu, V, K, mode, N):
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    if mode == "greedy":
        rows = (n_acc + 1).sum()  # every row up to the first mismatch, in full
    else:
        rows = 2 * cu.shape[0] + (n_acc < counts).sum()  # p_r and E, plus q_r after a rejection
    scalars = N * (8 + 8 + 4 + 4) + cu.shape[0] * 8 * (K + 3)  # ids, uniforms, p(x), q(x); outputs, cu
    return int(rows) * V * 4 + scalars


def bench_rejection(B, K, V, mode, gen, rows_out, bw):
    draft, cu, dp, target, greedy, u, e = sampling_inputs(B, K, V, mode, gen)
    dp_arg = dp if mode == "random" else None
    args = (draft, cu, dp_arg, target, greedy, K, u, e)
    got = rejection_sample_triton(*args)
    want = rejection_sample_reference(*args)
    ok = torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    t_tri = bench(lambda: rejection_sample_triton(*args))
    t_ref = bench(lambda: rejection_sample_reference(*args), slow=True)
    floor_bytes = rejection_floor_bytes(want[1], cu, V, K, mode, draft.shape[0])
    rows_out.append(dict(kernel=f"rejection_{mode}", B=B, k=K, V=V, ok=ok, triton_us=t_tri * 1e3, ref_us=t_ref * 1e3,
                         floor_us=floor_bytes / bw * 1e6, mean_accepted=float(want[1].float().mean())))
    del draft, cu, dp, target, greedy, u, e, args


def bench_typical(B, K, V, gen, rows_out, bw):
    draft, cu, _, target, _, _, e = sampling_inputs(B, K, V, "greedy", gen)
    args = (draft, cu, target, K, 0.09, 0.3, e)
    got = typical_accept_triton(*args)
    want = typical_accept_reference(*args)
    ok = torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    t_tri = bench(lambda: typical_accept_triton(*args))
    t_ref = bench(lambda: typical_accept_reference(*args), slow=True)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    rows = int((want[1] + 1).sum() + (want[1] == counts).sum())
    floor_bytes = rows * V * 4
    rows_out.append(dict(kernel="typical", B=B, k=K, V=V, ok=ok, triton_us=t_tri * 1e3, ref_us=t_ref * 1e3,
                         floor_us=floor_bytes / bw * 1e6, mean_accepted=float(want[1].float().mean())))


# ----------------------------------------------------------------------------- paged cache inputs

def paged_inputs(qlens, ctx_lens, H, KVH, D, block_size, dtype, gen):
    qlens = torch.tensor(qlens)
    seq_lens = torch.tensor(ctx_lens) + qlens
    B = len(qlens)
    max_blocks = int((seq_lens.max() + block_size - 1) // block_size)
    num_blocks = B * max_blocks + 4
    bt = torch.randperm(num_blocks, device=DEV, generator=gen)[: B * max_blocks].view(B, max_blocks).int()
    kc = torch.randn(num_blocks, block_size, KVH, D, device=DEV, generator=gen).to(dtype)
    vc = torch.randn(num_blocks, block_size, KVH, D, device=DEV, generator=gen).to(dtype)
    T = int(qlens.sum())
    q = torch.randn(T, H, D, device=DEV, generator=gen).to(dtype)
    qsl = torch.cat([torch.zeros(1, dtype=torch.long), qlens.cumsum(0)]).int().to(DEV)
    return q, kc, vc, bt, seq_lens.int().to(DEV), qsl, int(qlens.max())


def bench_attention(name, qlens, ctx_lens, gen, rows_out, bw, H=32, KVH=8, D=128, block_size=16,
                    dtype=torch.bfloat16):
    args = paged_inputs(qlens, ctx_lens, H, KVH, D, block_size, dtype, gen)
    scale = D ** -0.5
    got = paged_attention_triton(*args, scale)
    want = paged_attention_reference(*args, scale)
    err = float((got.float() - want.float()).abs().max())
    ok = err < 2e-2
    t_tri = bench(lambda: paged_attention_triton(*args, scale))
    t_ref = bench(lambda: paged_attention_reference(*args, scale), slow=True)
    elt = torch.finfo(dtype).bits // 8
    kv_bytes = int(args[4].sum()) * KVH * D * 2 * elt
    floor_bytes = kv_bytes + 2 * args[0].numel() * elt
    rows_out.append(dict(kernel=f"attention_{name}", B=len(qlens), qlen=max(qlens), ctx=max(ctx_lens), ok=ok,
                         max_err=err, triton_us=t_tri * 1e3, ref_us=t_ref * 1e3, floor_us=floor_bytes / bw * 1e6))


def bench_kv_write(T, gen, rows_out, bw, KVH=8, D=128, block_size=16, dtype=torch.bfloat16):
    num_blocks = max(64, 4 * T // block_size)
    key = torch.randn(T, KVH, D, device=DEV, generator=gen).to(dtype)
    value = torch.randn(T, KVH, D, device=DEV, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, device=DEV, generator=gen)[:T]
    kc = torch.randn(num_blocks, block_size, KVH, D, device=DEV, generator=gen).to(dtype)
    vc = torch.randn_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    write_kv_to_slots_triton(key, value, kc, vc, slots)
    write_kv_to_slots_reference(key, value, kc2, vc2, slots)
    ok = torch.equal(kc, kc2) and torch.equal(vc, vc2)
    t_tri = bench(lambda: write_kv_to_slots_triton(key, value, kc, vc, slots))
    t_ref = bench(lambda: write_kv_to_slots_reference(key, value, kc2, vc2, slots))
    floor_bytes = 2 * 2 * key.numel() * key.element_size() + T * 8
    rows_out.append(dict(kernel="kv_write", T=T, ok=ok, triton_us=t_tri * 1e3, ref_us=t_ref * 1e3,
                         floor_us=floor_bytes / bw * 1e6))


# ----------------------------------------------------------------------------- compiled-mode checks

def check_correctness(gen) -> list[str]:
    """Small shapes the CPU tests cover in interpret mode, here on compiled kernels."""
    failures = []
    # attention: fp32 (IEEE dots), head_dim 16/64/80/128, GQA 1/3/4, block 4/16, window, softcap, bf16/fp16
    cases = [
        ([1, 2, 5, 150], [17, 9, 30, 20], 4, 4, 16, 4, torch.float32, None, None),
        ([1, 5, 3], [40, 12, 0], 6, 2, 80, 16, torch.float32, 8, None),
        ([1, 9, 64], [100, 33, 5], 16, 4, 128, 16, torch.float32, None, 30.0),
        ([1, 5, 33], [20, 7, 4], 8, 2, 64, 16, torch.bfloat16, 16, 20.0),
        ([1, 5, 300], [200, 7, 4], 32, 8, 128, 16, torch.float16, None, None),
        ([2, 2], [1000, 3], 12, 4, 64, 4, torch.bfloat16, None, None),
        ([1], [3000], 32, 8, 128, 16, torch.bfloat16, None, None),  # split-KV decode (when enabled)
        ([1, 5], [2000, 1500], 8, 2, 64, 16, torch.float32, 700, 30.0),  # split-KV verify (when enabled)
        ([5] * 40, list(range(100, 500, 10)), 12, 4, 128, 16, torch.bfloat16, None, None),  # wide grid: 128-key tiles
        ([1] * 40, list(range(90, 490, 10)), 8, 4, 64, 16, torch.float16, 200, 30.0),  # wide decode, window, softcap
    ]

    default_splits = pa.MAX_KV_SPLITS
    for max_splits in sorted({default_splits, 16}):  # the default, and split-KV forced on
        pa.MAX_KV_SPLITS = max_splits
        for qlens, ctx, H, KVH, D, bs, dtype, window, softcap in cases:
            args = paged_inputs(qlens, ctx, H, KVH, D, bs, dtype, gen)
            got = paged_attention_triton(*args, D ** -0.5, window, softcap)
            want = paged_attention_reference(*args, D ** -0.5, window, softcap)
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            err = float((got.float() - want.float()).abs().max())
            if not err <= tol:
                failures.append(f"attention {qlens} {H}/{KVH} D{D} bs{bs} {dtype} w{window} cap{softcap} "
                                f"splits<={max_splits}: err {err}")
    pa.MAX_KV_SPLITS = default_splits
    # KV write, including a float32 -> bfloat16 cast (round to nearest even on the GPU)
    for in_dtype, cache_dtype in [(torch.float32, torch.bfloat16), (torch.float16, torch.float16),
                                  (torch.float32, torch.float32)]:
        T, KVH, D, bs = 37, 3, 80, 16
        key = torch.randn(T, KVH, D, device=DEV, generator=gen).to(in_dtype)
        value = torch.randn(T, KVH, D, device=DEV, generator=gen).to(in_dtype)
        slots = torch.randperm(8 * bs, device=DEV, generator=gen)[:T]
        kc = torch.randn(8, bs, KVH, D, device=DEV, generator=gen).to(cache_dtype)
        vc = torch.randn_like(kc)
        kc2, vc2 = kc.clone(), vc.clone()
        write_kv_to_slots_triton(key, value, kc, vc, slots)
        write_kv_to_slots_reference(key, value, kc2, vc2, slots)
        if not (torch.equal(kc, kc2) and torch.equal(vc, vc2)):
            failures.append(f"kv write {in_dtype}->{cache_dtype}")
    # prompt lookup: rows of few token values (matches everywhere) and many, ragged pads, rows past one start block
    for B, W, values, k, lo, hi in [(4, 40, 3, 4, 1, 3), (16, 700, 5, 8, 2, 4), (3, 3000, 50, 6, 1, 5)]:
        tokens = torch.randint(0, values, (B, W), device=DEV, generator=gen)
        pads = torch.randint(0, W // 2, (B,), device=DEV, generator=gen)
        length = W - pads - torch.randint(0, W // 4, (B,), device=DEV, generator=gen)
        want, want_counts = ngram_drafts_torch(tokens, pads, length, k, lo, hi)
        got, counts = ngram_drafts_triton(tokens, pads, length, k, lo, hi)
        keep = torch.arange(k, device=DEV)[None, :] < want_counts[:, None]
        if not (torch.equal(counts, want_counts) and torch.equal(got[keep], want[keep])):
            failures.append(f"ngram B{B} W{W} values{values} k{k} n{lo}..{hi}")
    # samplers: tiny vocab (several sequences per program), odd vocab, ragged, mixed greedy/random, no q
    for V, B, K in [(5, 300, 3), (1000, 40, 4), (32001, 8, 8)]:
        for has_q in (True, False):
            draft, cu, dp, target, _, u, e = sampling_inputs(B, K, V, "random", gen, ragged=True)
            greedy = torch.rand(B, device=DEV, generator=gen) < 0.5
            args = (draft, cu, dp if has_q else None, target, greedy, K, u, e)
            got, want = rejection_sample_triton(*args), rejection_sample_reference(*args)
            if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
                failures.append(f"rejection V{V} B{B} K{K} q{has_q}")
        targs = (draft, cu, target, K, 0.09, 0.3, e)
        got, want = typical_accept_triton(*targs), typical_accept_reference(*targs)
        if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
            failures.append(f"typical V{V} B{B} K{K}")
    return failures


def sweep_launch_configs(gen, bw) -> list[dict]:
    """Time the samplers at the headline shapes over (BLOCK_V, num_warps) launch configurations."""
    out = []
    K, V = 8, 128256
    for B, mode in [(256, "greedy"), (256, "random"), (32, "random"), (256, "typical")]:
        data = sampling_inputs(B, K, V, "random" if mode == "random" else "greedy", gen)
        draft, cu, dp, target, greedy, u, e = data
        if mode == "typical":
            fn = lambda: typical_accept_triton(draft, cu, target, K, 0.09, 0.3, e)  # noqa: E731
            ref = typical_accept_reference(draft, cu, target, K, 0.09, 0.3, e)
        else:
            args = (draft, cu, dp if mode == "random" else None, target, greedy, K, u, e)
            fn = lambda: rejection_sample_triton(*args)  # noqa: E731
            ref = rejection_sample_reference(*args)
        line = []
        for block_v in (2048, 4096, 8192, 16384):
            for num_warps in (4, 8, 16):
                rs.LAUNCH_OVERRIDE.clear()
                rs.LAUNCH_OVERRIDE.update(block_v=block_v, num_warps=num_warps)
                got = fn()
                ok = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
                us = bench(fn) * 1e3
                out.append(dict(mode=mode, B=B, k=K, V=V, block_v=block_v, num_warps=num_warps, ok=ok, us=us))
                line.append(f"{block_v}/{num_warps}:{us:.0f}{'' if ok else '!'}")
        rs.LAUNCH_OVERRIDE.clear()
        print(f"sweep {mode:<8} B={B:<4}", " ".join(line), flush=True)
        del data, draft, cu, dp, target, greedy, u, e
        torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="kernels.json")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="also sweep the samplers' launch configurations")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device=DEV).manual_seed(0)
    torch.manual_seed(0)

    report = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    if not args.skip_check:
        failures = check_correctness(gen)
        report["check_failures"] = failures
        print("compiled-mode checks:", "all passed" if not failures else failures, flush=True)
    bw = copy_bandwidth()
    report["copy_bandwidth_GBps"] = bw / 1e9
    print(f"{report['device']}: device-to-device copy {bw / 1e9:.0f} GB/s (read + write)", flush=True)

    if args.sweep:
        report["sweep"] = sweep_launch_configs(gen, bw)
    rows: list[dict] = []
    report["rows"] = rows
    out_path = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)

    def emit():  # print the newest row, rewrite the JSON (a run cut short keeps what it measured)
        print(_fmt(rows[-1]), flush=True)
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)

    batches = [1, 32, 256]
    ks = [4, 8] if not args.quick else [8]
    vocabs = [32000, 128256]
    for V in vocabs:
        for K in ks:
            for B in batches:
                for mode in ("greedy", "random"):
                    bench_rejection(B, K, V, mode, gen, rows, bw)
                    emit()
                bench_typical(B, K, V, gen, rows, bw)
                emit()
                torch.cuda.empty_cache()
    for B in batches:
        for K in ks:
            bench_kv_write(B * (K + 1), gen, rows, bw)
            emit()
    ctx = 1024
    for B in batches:
        bench_attention("decode", [1] * B, [ctx] * B, gen, rows, bw)
        emit()
        for K in ks:
            bench_attention(f"verify_k{K}", [K + 1] * B, [ctx] * B, gen, rows, bw)
            emit()
        torch.cuda.empty_cache()
    bench_attention("prefill512+decode", [512] + [1] * 31, [0] + [ctx] * 31, gen, rows, bw)
    emit()

    # The small-batch paths (split vocabulary / split KV) against the one-program-per-sequence kernels.
    rs.LAUNCH_OVERRIDE["no_split"] = True
    for B in (1, 32):
        for mode in ("greedy", "random"):
            bench_rejection(B, 8, 128256, mode, gen, rows, bw)
            rows[-1]["kernel"] += "_nosplit"
            emit()
    rs.LAUNCH_OVERRIDE.clear()
    default_splits = pa.MAX_KV_SPLITS
    pa.MAX_KV_SPLITS = 1 if default_splits > 1 else 16  # the variant that is not the default
    tag = "nosplit" if default_splits > 1 else "splitkv"
    for B in (1, 32):
        bench_attention(f"decode_{tag}", [1] * B, [ctx] * B, gen, rows, bw)
        emit()
        bench_attention(f"verify_k8_{tag}", [9] * B, [ctx] * B, gen, rows, bw)
        emit()
    pa.MAX_KV_SPLITS = default_splits
    print()
    print(table(rows))


def _fmt(r):
    shape = " ".join(f"{k}={r[k]}" for k in ("B", "T", "k", "V", "qlen", "ctx") if k in r)
    return (f"{r['kernel']:<22} {shape:<28} ok={r['ok']!s:<5} triton {r['triton_us']:9.1f} us  "
            f"ref {r['ref_us']:10.1f} us  x{r['ref_us'] / r['triton_us']:7.1f}  floor {r['floor_us']:8.1f} us  "
            f"/floor {r['triton_us'] / r['floor_us']:6.2f}")


def table(rows):
    head = "| kernel | shape | ok | triton us | torch ref us | speedup | floor us | triton/floor |\n|---|---|---|---|---|---|---|---|"
    lines = [head]
    for r in rows:
        shape = " ".join(f"{k}={r[k]}" for k in ("B", "T", "k", "V", "qlen", "ctx") if k in r)
        lines.append(f"| {r['kernel']} | {shape} | {r['ok']} | {r['triton_us']:.1f} | {r['ref_us']:.1f} | "
                     f"{r['ref_us'] / r['triton_us']:.1f}x | {r['floor_us']:.1f} | {r['triton_us'] / r['floor_us']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
