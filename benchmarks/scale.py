"""Real model sizes against the memory-bandwidth floor on one GPU (issue 31): what each step costs, how far it is
from reading the weights once at the copy bandwidth, how HF's compiled decoding compares, and what speculative
decoding would gain (a projection from the measured costs).

Random weights (nothing downloaded) in Llama-3.1-8B's shapes for the target and Llama-3.2-1B's for the draft
(benchmarks/tp_cost.py SIZES, vocabulary 128256), bf16 on the GPU. In one process:

1. copy bandwidth: one bf16 tensor of --copy-gb GB copied into another (device to device), median of 10 after
   warm-up; GB/s counts the bytes read and written.
2. bytes a step reads: every parameter once except the input embedding table, of which one row per token is read
   (the LM head in full). floor_ms = bytes / copy bandwidth (also "target_with_kv": plus the K/V of the context).
3. per batch size (--batches): generate() at k = 0 (no draft), then at k = 1, 4 and 8 with the draft, each
   SpecConfig(compile=True, cuda_graphs=True, adaptive=False) (compile=True waits for the
   compiled code), --prompt random tokens, --new-tokens new ones, eos off; after each call
   ``hf_specdec.runner.stage_timing.time_stages`` replays the pieces as CUDA graphs between CUDA events (median
   ms): target_step (1 token a row, from the k = 0 call), plain_round (the k = 0 round: forward, sampling,
   commit), draft_step, draft_first_step (2 tokens), round (propose + verify at k = 4), and the verify forward at
   2, 5 and 9 tokens a row (from the k = 1, 4, 8 calls). plain_step_wall: a second k = 0 call's
   decode_seconds / rounds (host included).
4. HF's own compiled plain decoding at the same batch sizes: generate(cache_implementation="static",
   compile_config=CompileConfig()) as benchmarks/cold_start.py's hf_compiled (a first call compiles; the
   second is timed): hf_step = median wall ms between consecutive steps (a stopping criterion that syncs and
   reads the clock at every step; HF synchronises every step anyway).
5. kernels: torch.profiler over replays of time_stages' captured target_step, draft_step and (at k = 4)
   verify_forward graphs (or, where kernels inside graphs are not visible, one run of the same stage outside its
   graph: "source" says which), divided by the layer count; the top kernels of the target step and the verify by time.
6. projection (labelled so): speedup over HF's step and over our k = 0 round for acceptance rate a in
   {0.6, 0.7, 0.8, 0.9} and k in 1..8, with E = (1 - a^(k+1)) / (1 - a) tokens a round and
   round_cost(k) = k * draft_step + (draft_first_step - draft_step) + verify(k+1) + (round - forwards) at k = 4,
   verify(k+1) interpolated linearly from 2, 5, 9 tokens: vs_hf = E * hf_step / round_cost(k),
   vs_ours = E * plain_round / round_cost(k) (benchmarks/scale_report.py); the best k per a.

    python benchmarks/scale.py --out $OUT/scale_8b.json                      # H100 / H200, about 6-8 minutes
    python benchmarks/scale.py --batches 1 --skip-hf --out $OUT/scale_b1.json  # a quicker part
    python benchmarks/scale.py --shapes tiny --out /tmp/scale_tiny.json      # CPU smoke (no graphs, no compile)
    python benchmarks/scale.py --report $OUT/scale_8b.json                   # markdown tables (stdout)
    python benchmarks/scale.py --batches "" --long-prompts 2048,8192 --out $OUT/long.json  # 7. below

7. with --long-prompts: time to first token at b = 1 for each length (until a streamer gets the first generated
   token of a generate(max_new_tokens=4) call), ours (SpecConfig() with the draft; and k = 0, the target alone)
   against HF's generate (median of --long-repeats calls), and the peak memory of a b = 32 call with
   --long-batch-prompt tokens a row (scale_long_prompts.py).

--shapes tiny runs on the CPU (fp32, the runner without graphs, no CUDA events): the same code paths with a
perf_counter timer and CPU ops counted in place of kernels; its numbers mean nothing. The JSON is rewritten after
every batch size.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from collections import defaultdict

import torch
from transformers import StoppingCriteria

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hf_specdec  # noqa: E402
from benchmarks.cold_start_report import write_json  # noqa: E402
from benchmarks.common import sync, weight_bytes  # noqa: E402
from benchmarks.scale_head import build_head, head_costs  # noqa: E402
from benchmarks.scale_long_prompts import long_prompts, random_prompt  # noqa: E402
from benchmarks.scale_report import ROUND_K, batch_ratios, derive, report  # noqa: E402
from benchmarks.tp_cost import SIZES, TINY, build, config  # noqa: E402
from hf_specdec.runner import bucket_for, runner_for  # noqa: E402
from hf_specdec.runner.stage_timing import median_ms, time_stages  # noqa: E402

VERIFY_TOKENS = (2, 5, 9)
T0 = time.perf_counter()


def log(text: str) -> None:
    print(f"[scale {time.perf_counter() - T0:6.1f}s] {text}", flush=True)


def copy_bandwidth(device: torch.device, dtype: torch.dtype, gigabytes: float, repeats: int = 10) -> dict:
    """Device-to-device copy of a ``gigabytes`` tensor into another: GB/s of bytes read + written."""
    elem = torch.empty((), dtype=dtype).element_size()
    src = torch.ones(int(gigabytes * 1e9) // elem, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), repeats, device)
    nbytes = src.numel() * elem
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"bytes": nbytes, "ms": ms, "repeats": repeats, "gb_per_s": 2 * nbytes / (ms / 1e3) / 1e9}


def step_bytes(model) -> dict:
    """Bytes one forward reads at least: every parameter, the input embedding only as the rows it gathers
    (a tied table is read whole by the LM head anyway)."""
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and out.weight is emb
    total = weight_bytes(model)
    fixed = total if tied else total - emb.numel() * emb.element_size()
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    row = emb.shape[1] * emb.element_size()
    return {"layers": cfg.num_hidden_layers, "param_bytes": total, "fixed_bytes": fixed, "embedding_row_bytes": row,
            "per_step_bytes_1tok": fixed + row,
            "kv_bytes_per_token": cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * emb.element_size()}


def floors_ms(models: dict, batch: int, context: int, gb_per_s: float) -> dict:
    """Weight-read floors of the steps at ``batch`` rows: bytes / copy bandwidth, in ms."""
    def ms(name, tokens, kv_tokens=0):
        m = models[name]
        return (m["fixed_bytes"] + tokens * m["embedding_row_bytes"] + kv_tokens * m["kv_bytes_per_token"]) \
            / (gb_per_s * 1e9) * 1e3
    return {"target": ms("target", batch), "target_5": ms("target", 5 * batch),
            "target_with_kv": ms("target", batch, batch * context), "draft": ms("draft", batch),
            "draft_2": ms("draft", 2 * batch)}


def timed_stages(runner, batch: int, repeats: int) -> tuple[dict, dict]:
    """(ms per piece, {name: (what was timed, its stage run outside a graph)}) of time_stages at ``batch``'s
    bucket."""
    pieces: dict = {}
    costs = time_stages(runner, bucket_for(batch), repeats, pieces_out=pieces)
    return costs, pieces


def _profile(fn, replays: int, activity) -> list:
    with torch.no_grad():
        fn()
        with torch.profiler.profile(activities=[activity]) as prof:
            for _ in range(replays):
                fn()
            if activity == torch.profiler.ProfilerActivity.CUDA:
                torch.cuda.synchronize()
    return list(prof.events())


def kernel_summary(piece, layers: int, device: torch.device, replays: int = 5, top: int = 15) -> dict:
    """Kernels of one call of ``piece`` (a graph replay; its stage outside the graph if the graph's kernels are
    invisible),
    grouped by name: count and device us per call, the top ``top`` by time. CPU: top-level CPU ops instead."""
    if device.type == "cuda":
        timed, stage = piece
        kinds = [("graph replay", timed)] + ([("stage outside its graph (kernels inside graphs not visible)", stage)]
                                             if stage is not timed else [])
        for source, fn in kinds:
            events = [e for e in _profile(fn, replays, torch.profiler.ProfilerActivity.CUDA)
                      if e.device_type == torch.autograd.DeviceType.CUDA]
            if events:
                break
        time_of = lambda e: e.device_time  # noqa: E731
    else:
        source = "cpu: top-level CPU ops (no CUDA: not kernels)"
        events = [e for e in _profile(piece[0], replays, torch.profiler.ProfilerActivity.CPU) if e.cpu_parent is None]
        time_of = lambda e: e.cpu_time_total  # noqa: E731
    is_copy = lambda e: e.name.startswith(("Memcpy", "Memset"))  # noqa: E731  (device activity, not kernels)
    copies, events = sum(map(is_copy, events)), [e for e in events if not is_copy(e)]
    count, us = defaultdict(int), defaultdict(float)
    for e in events:
        count[e.name[:90]] += 1
        us[e.name[:90]] += time_of(e)
    per_step = len(events) / replays
    ranked = sorted(us, key=lambda n: -us[n])[:top]
    return {"source": source, "per_step": per_step, "per_layer": per_step / layers,
            "memcpy_memset_per_step": copies / replays, "busy_us": sum(us.values()) / replays,
            "top": [[n, count[n] / replays, us[n] / replays] for n in ranked]}


def runner_call(target, draft, k: int, batch: int, args, device: torch.device):
    """One greedy generate() on the runner at fixed k (k = 0: plain decoding, no draft): its spec_metrics and a
    digest of its tokens (two runs of the same code and weights, e.g. ``HF_SPECDEC_PDL`` on and off, must agree)."""
    cuda = device.type == "cuda"
    spec = hf_specdec.SpecConfig(num_speculative_tokens=k, adaptive=False, cuda_graphs=True if cuda else None,
                                 compile=True if cuda else None)
    out = target.generate(**random_prompt(target.config.vocab_size, batch, args.prompt, device),
                          max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
                          assistant_model=draft if k else None, spec_config=spec, return_dict_in_generate=True)
    return out.spec_metrics, hashlib.sha256(out.sequences.cpu().numpy().tobytes()).hexdigest()[:16]


def runner_costs(target, draft, batch: int, args, device: torch.device) -> dict:
    """Our steps at ``batch`` rows (ms), the k = 0 wall step, and the kernels of a target and a draft step."""
    row = {"batch": batch, "fast_path": {}, "call_s": {}, "verify": {}, "kernels": {}, "tokens_sha256": {}}
    for k in sorted({0, ROUND_K} | {t - 1 for t in VERIFY_TOKENS}):
        start = time.perf_counter()
        metrics, row["tokens_sha256"][str(k)] = runner_call(target, draft, k, batch, args, device)
        row["fast_path"][str(k)], row["call_s"][str(k)] = metrics.fast_path, round(time.perf_counter() - start, 2)
        runner = runner_for(target, draft if k else None)
        costs, pieces = timed_stages(runner, batch, args.repeats)
        if k + 1 in VERIFY_TOKENS:
            row["verify"][str(k + 1)] = costs["verify_forward"]
        if k == 0:
            row["target_step"], row["plain_round"] = costs["target_step"], costs["round"]
            row["kernels"]["target"] = kernel_summary(pieces["target_step"], target.config.num_hidden_layers, device)
            steady, _ = runner_call(target, None, 0, batch, args, device)  # the same call again: no capture in it
            row["plain_step_wall"] = steady.decode_seconds * 1e3 / max(steady.num_rounds, 1)
        if k == ROUND_K:
            row.update({name: costs[name] for name in ("draft_step", "draft_first_step", "propose",
                                                       "verify_and_commit", "round")})
            row["kernels"]["draft"] = kernel_summary(pieces["draft_step"], draft.config.num_hidden_layers, device)
            # the verify of k + 1 tokens a row: where b = 32's round grows past b = 1's (its attention, its matmuls)
            row["kernels"]["verify"] = kernel_summary(pieces["verify_forward"], target.config.num_hidden_layers, device)
        log(f"b={batch} k={k}: {metrics.fast_path}, call {row['call_s'][str(k)]} s; "
            + " ".join(f"{n} {v:.3f}" for n, v in costs.items()) + " (ms)")
    row["all_compiled"] = all(path == "graphs+compile" for path in row["fast_path"].values())
    return row


class StepClock(StoppingCriteria):
    """A stopping criterion that stops nothing: the wall clock at every decoding step, the device synchronised."""

    def __init__(self, device: torch.device):
        self.device, self.stamps = device, []

    def __call__(self, input_ids, scores, **kwargs):
        sync(self.device)
        self.stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def step_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(self.stamps, self.stamps[1:])]


def hf_plain_step(target, batch: int, args, device: torch.device) -> dict:
    """HF's compiled plain decoding (static cache + compile_config, as cold_start's hf_compiled): the first call
    compiles, the second is timed step by step."""
    from transformers import CompileConfig, StoppingCriteriaList

    kw = dict(random_prompt(target.config.vocab_size, batch, args.prompt, device), max_new_tokens=args.new_tokens,
              do_sample=False, eos_token_id=None, pad_token_id=0, cache_implementation="static",
              compile_config=CompileConfig())
    start = time.perf_counter()
    target.generate(**kw)
    sync(device)
    first = time.perf_counter() - start
    clock = StepClock(device)
    target.generate(**kw, stopping_criteria=StoppingCriteriaList([clock]))
    steps = clock.step_ms()
    out = {"hf_step": statistics.median(steps), "hf_steps_timed": len(steps), "hf_first_call_s": round(first, 2),
           "hf_compiled": hasattr(target, "_compiled_call")}
    if not out["hf_compiled"]:
        out["hf_note"] = "transformers did not compile (it auto-compiles on accelerators only): static cache, eager"
    log(f"b={batch} HF compiled plain step {out['hf_step']:.3f} ms (first call {first:.1f} s, "
        f"compiled {out['hf_compiled']})")
    return out


def measure_batch(target, draft, batch: int, res: dict, args, device: torch.device, head=None) -> dict:
    row = runner_costs(target, draft, batch, args, device)
    if not args.skip_hf:
        row.update(hf_plain_step(target, batch, args, device))
    row["floor_ms"] = floors_ms(res["models"], batch, args.prompt + args.new_tokens, res["copy"]["gb_per_s"])
    derive(row)
    if head is not None:
        row["head"] = head_costs(target, head, row, lambda t, h, k, b, a: runner_call(t, h, k, b, a, device), args)
        log(f"b={batch} head step {row['head']['head_step']:.3f} ms = "
            f"{row['head']['head_step_vs_target_step']:.3f} of the target step")
    return row


def print_summary(row: dict) -> None:
    s, kt = row["floor_share"], row["kernels"]
    log(f"b={row['batch']}: floor shares " + " ".join(f"{n} {v:.2f}" for n, v in s.items()))
    for name, k in kt.items():
        log(f"b={row['batch']}: {name} step {k['per_step']:.0f} kernels, {k['per_layer']:.1f} per layer "
            f"[{k['source']}]")
    for piece in ("target", "verify"):
        if piece in kt:
            log(f"b={row['batch']}: {piece} ({kt[piece]['busy_us']:.0f} us busy), top kernels")
            for name, count, us in kt[piece]["top"][:10]:
                print(f"    {us:9.1f} us {count:6.1f}x  {name}")
    if row["projection"]["overhead_ms"] < 0:
        log(f"b={row['batch']}: the round measured less than its forwards (noise): the projection is unreliable")
    for a, entry in row["projection"]["by_alpha"].items():
        best = entry["best"]
        log(f"b={row['batch']}: projection a={a}: " + ", ".join(
            f"best {basis} k={b['k']} x{b['speedup']:.2f}" for basis, b in best.items()))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", choices=("8b", "tiny"), default="8b")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt", type=int, help="prompt tokens (default 512; tiny 24)")
    ap.add_argument("--new-tokens", type=int, help="new tokens per call (default 32; tiny 8)")
    ap.add_argument("--repeats", type=int, default=30, help="timed replays per piece (median)")
    ap.add_argument("--copy-gb", type=float, help="size of the copied tensor (default 2; CPU 0.05)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: CUDA for 8b where there is one, CPU for tiny")
    ap.add_argument("--skip-hf", action="store_true", help="no HF compiled baseline (saves ~40 s a batch size)")
    ap.add_argument("--head", action="store_true", help="also a random draft head's costs (scale_head.py)")
    ap.add_argument("--head-vocab", type=int, default=0, help="the head's own output layer over this many tokens "
                    "(0: the target's)")
    ap.add_argument("--draft-vocab", type=int, default=0, help="the draft's output layer over its first this many "
                    "tokens (hf_specdec.reduce_vocab; 0: the whole vocabulary)")
    ap.add_argument("--long-prompts", default="", help="prompt lengths for time to first token, e.g. 2048,8192")
    ap.add_argument("--long-batch-prompt", type=int, default=4096, help="tokens a row of the b = 32 memory check")
    ap.add_argument("--long-repeats", type=int, default=3, help="timed calls per time to first token (median)")
    ap.add_argument("--out", help="JSON of the results")
    ap.add_argument("--report", nargs="+", metavar="JSON", help="print the markdown tables of these files and exit")
    args = ap.parse_args(argv)
    tiny = args.shapes == "tiny"
    args.prompt = args.prompt or (24 if tiny else 512)
    args.new_tokens = args.new_tokens or (8 if tiny else 32)
    return args


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.report:
        print(report([json.load(open(p)) for p in args.report]))
        return None
    cuda = torch.cuda.is_available() and (args.device == "cuda" or (args.device == "auto" and args.shapes == "8b"))
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    sizes, vocab = (TINY, 256) if args.shapes == "tiny" else (SIZES, 128256)
    import transformers
    res = {"gpu": torch.cuda.get_device_name(device) if cuda else "cpu", "device": device.type,
           "dtype": str(dtype).removeprefix("torch."), "shapes": args.shapes, "torch": torch.__version__,
           "transformers": transformers.__version__, "prompt": args.prompt, "new_tokens": args.new_tokens,
           "round_k": ROUND_K, "verify_tokens": list(VERIFY_TOKENS), "repeats": args.repeats, "rows": []}
    res["copy"] = copy_bandwidth(device, dtype, args.copy_gb or (2.0 if cuda else 0.05))
    log(f"{res['gpu']}: device-to-device copy {res['copy']['gb_per_s']:.1f} GB/s (read + write)")
    torch.manual_seed(0)
    target = hf_specdec.enable(build(config(sizes["target"], vocab), False, device, dtype, None))
    draft = build(config(sizes["draft"], vocab), False, device, dtype, None)
    if args.draft_vocab:
        hf_specdec.reduce_vocab(draft, range(min(args.draft_vocab, vocab)))
    res["draft_vocab"] = args.draft_vocab or vocab
    res["models"] = {name: step_bytes(m) for name, m in (("target", target), ("draft", draft))}
    for name, m in res["models"].items():
        log(f"{name}: {m['per_step_bytes_1tok'] / 1e9:.3f} GB a step, floor "
            f"{m['per_step_bytes_1tok'] / (res['copy']['gb_per_s'] * 1e9) * 1e3:.3f} ms at b = 1")
    head = build_head(target, args.head_vocab) if args.head else None
    for batch in [int(b) for b in args.batches.split(",") if b.strip()]:
        row = measure_batch(target, draft, batch, res, args, device, head)
        res["rows"].append(row)
        res["batch_ratios"] = batch_ratios(res["rows"])
        print_summary(row)
        if args.out:
            write_json(args.out, res)  # a run cut short keeps its batch sizes
    if args.long_prompts:
        res["long_prompts"] = long_prompts(target, draft, args, device, log)
    res["total_s"] = time.perf_counter() - T0
    if args.out:
        write_json(args.out, res)
    print(report([res]), flush=True)
    return res


if __name__ == "__main__":
    main()
