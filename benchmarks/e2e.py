#!/usr/bin/env python
"""End-to-end benchmark: plain HF generate vs HF assisted generation vs hf_specdec.

One run, the same prompts and the same max_new_tokens for every method:

  plain_eager      HF generate, dynamic cache, eager                         (every batch size)
  plain_compiled   HF generate, cache_implementation="static" -> auto torch.compile (every batch size)
  assisted         HF assisted generation (assistant_model=), batch 1 only: the draft's default
                   settings and a constant num_assistant_tokens sweep
  hf_specdec       hf_specdec.enable(target); generate(spec_config=SpecConfig(k)) (every batch size)

for greedy and sampling (temperature 1, top_k 0, top_p 1).  For each batch size b
the prompts are the first n_b of the pool (n_b = max(b, --min-prompts) rounded up
to a multiple of b), all left-padded to ONE length so that every batch has the
same shape.  Throughput = generated tokens (up to and including EOS) / wall time,
median over --repeats after one warm-up pass; times are taken between
torch.cuda.synchronize() calls.

The ideal speedup of speculation, from the measured acceptance rate alpha and the
measured costs of the model forwards at that batch size (eager, dynamic cache,
prompt in the cache):

    E = (1 - alpha^(k+1)) / (1 - alpha)                  tokens per round
    ideal = E / (k * c_draft_step + c_target_verify(k+1)) * c_target_step

efficiency = measured speedup over plain_eager / ideal.

GPU:  python benchmarks/e2e.py --target runs/pair/target --draft runs/pair/draft --out e2e.json
CPU smoke: python benchmarks/e2e.py --build-tiny --batch-sizes 1,2 --max-new-tokens 16 --num-prompts 4 --repeats 1
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
import traceback

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository root, for benchmarks.common
from benchmarks.common import (  # noqa: E402
    REPO_ROOT, Timer, acceptance_length_histogram, aggregate_metrics, expected_tokens_per_round, find_humaneval,
    load_pair, metrics_dict, pick_device, pick_dtype, read_jsonl, spec_available, sync, valid_new_tokens,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="target model dir (save_pretrained)")
    p.add_argument("--draft", help="draft model dir")
    p.add_argument("--build-tiny", action="store_true", help="build (or reuse) a tiny CPU pair and use it")
    p.add_argument("--tiny-dir", default=os.path.join(REPO_ROOT, "runs", "tiny_pair"))
    p.add_argument("--prompts", default=None, help="HumanEval.jsonl(.gz) or any jsonl (default: search known places)")
    p.add_argument("--prompt-field", default="prompt")
    p.add_argument("--heldout-prompts", default=None,
                   help="jsonl of held-out source windows (default: <target>/../heldout_prompts.jsonl)")
    p.add_argument("--heldout-share", type=float, default=0.5, help="share of the pool taken from held-out windows")
    p.add_argument("--num-prompts", type=int, default=32, help="prompt pool size")
    p.add_argument("--min-prompts", type=int, default=4, help="prompts used at least per batch size")
    p.add_argument("--max-prompt-tokens", type=int, default=256, help="prompts keep their last N tokens")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--modes", default="greedy,sample")
    p.add_argument("--k", default="4", help="num_speculative_tokens for hf_specdec, comma list for a sweep")
    p.add_argument("--assisted-sweep", default="3,5,8", help="constant num_assistant_tokens values ('' = none)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-compile", action="store_true", help="skip the static-cache + torch.compile baseline")
    p.add_argument("--force-compile", action="store_true",
                   help="auto-compile even on CPU (transformers compiles only on accelerators by default)")
    p.add_argument("--no-assisted", action="store_true")
    p.add_argument("--no-spec", action="store_true")
    p.add_argument("--ignore-eos", action="store_true", help="min_new_tokens = max_new_tokens for every method")
    p.add_argument("--primitive-iters", type=int, default=20)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, fp32 on cpu) | float32 | bfloat16 | float16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="e2e.json")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- #
def build_prompt_pool(args, tok):
    he_path = find_humaneval(args.prompts)
    heldout_path = args.heldout_prompts
    if heldout_path is None and args.target:
        cand = os.path.join(os.path.dirname(os.path.abspath(args.target)), "heldout_prompts.jsonl")
        heldout_path = cand if os.path.exists(cand) else None
    n_ho = int(round(args.num_prompts * args.heldout_share)) if heldout_path else 0
    heldout = read_jsonl(heldout_path, "prompt", n_ho) if n_ho else []
    n_he = args.num_prompts - len(heldout)
    he = read_jsonl(he_path, args.prompt_field, n_he) if (he_path and n_he > 0) else []
    # interleave so that every prefix of the pool mixes both sources
    pool, sources = [], []
    for i in range(max(len(he), len(heldout))):
        if i < len(he):
            pool.append(he[i]); sources.append("humaneval")  # noqa: E702
        if i < len(heldout):
            pool.append(heldout[i]); sources.append("heldout")  # noqa: E702
    if not pool:
        raise SystemExit("no prompts: pass --prompts PATH (HumanEval.jsonl.gz) and/or --heldout-prompts")
    enc = tok(pool, return_tensors="pt", padding="longest", truncation=True, max_length=args.max_prompt_tokens)
    return pool, sources, enc["input_ids"], enc["attention_mask"], {"humaneval": he_path, "heldout": heldout_path}


def gen_kwargs(mode, args, tok):
    kw = dict(max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
              return_dict_in_generate=True)
    if args.ignore_eos:
        kw["min_new_tokens"] = args.max_new_tokens
    if mode == "greedy":
        kw.update(do_sample=False)
    else:
        kw.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    return kw


def timed_method(name, call, batches, args, device, tok, prompt_len, record_outputs=True):
    """Warm-up on the first batch, then --repeats timed passes over all batches."""
    torch.manual_seed(args.seed)
    warm_t = time.perf_counter()
    call(batches[0])
    sync(device)
    warm_s = time.perf_counter() - warm_t
    times, tokens, outs, metrics = [], None, None, []
    for r in range(args.repeats):
        torch.manual_seed(args.seed + 1 + r)
        total_tokens = 0
        rows = []
        call_metrics = []
        with Timer(device) as t:
            results = [call(b) for b in batches]
        for res in results:
            seqs = res.sequences
            for row in seqs:
                new = valid_new_tokens(row.cpu(), prompt_len, tok.eos_token_id, tok.pad_token_id)
                total_tokens += len(new)
                rows.append(new)
            m = getattr(res, "spec_metrics", None)
            if m is not None:
                call_metrics.append(metrics_dict(m))
        times.append(t.seconds)
        if r == 0:
            tokens, outs, metrics = total_tokens, rows, call_metrics
    med = statistics.median(times)
    return {
        "warmup_seconds": warm_s,
        "seconds_all": times,
        "seconds_median": med,
        "new_tokens": tokens,
        "tokens_per_s": tokens / med if med > 0 else float("nan"),
        "outputs": outs if record_outputs else None,
        "call_metrics": metrics,
    }


@torch.no_grad()
def measure_primitives(target, draft, ids, mask, ks, iters, device):
    """Median seconds of eager forwards with the prompt in a DynamicCache."""
    from transformers import DynamicCache

    res = {}
    b, P = ids.shape

    def cost(model, q):
        cache = DynamicCache()
        model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        x = ids[:, -q:].contiguous() if q <= P else ids[:, -1:].repeat(1, q)
        am = torch.cat([mask, torch.ones(b, q, dtype=mask.dtype, device=mask.device)], dim=1)
        ts = []
        for i in range(iters + 3):
            with Timer(device) as t:
                model(input_ids=x, attention_mask=am, past_key_values=cache, use_cache=True)
            cache.crop(-q)
            if i >= 3:
                ts.append(t.seconds)
        return statistics.median(ts)

    res["c_target_step"] = cost(target, 1)
    res["c_draft_step"] = cost(draft, 1)
    for k in ks:
        res[f"c_target_verify_k{k}"] = cost(target, k + 1)
    return res


def identical_share(a, b):
    if not a or not b or len(a) != len(b):
        return None
    return sum(1 for x, y in zip(a, b) if x == y) / len(a)


# --------------------------------------------------------------------------- #
def main(argv=None):
    t_start = time.perf_counter()
    args = parse_args(argv)
    if args.build_tiny:
        sys.path.insert(0, os.path.join(REPO_ROOT, "evals"))
        import build_pair

        if not os.path.exists(os.path.join(args.tiny_dir, "summary.json")):
            build_pair.main(["--tiny", "--out", args.tiny_dir])
        args.target = args.target or os.path.join(args.tiny_dir, "target")
        args.draft = args.draft or os.path.join(args.tiny_dir, "draft")
    if not args.target or not args.draft:
        raise SystemExit("pass --target and --draft (or --build-tiny)")

    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    tok, target, draft = load_pair(args.target, args.draft, device, dtype)
    pool, sources, all_ids, all_mask, prompt_paths = build_prompt_pool(args, tok)
    all_ids, all_mask = all_ids.to(device), all_mask.to(device)
    P = all_ids.shape[1]
    batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    ks = [int(x) for x in args.k.split(",") if x.strip()]
    sweep = [int(x) for x in args.assisted_sweep.split(",") if x.strip()]
    n_target = sum(p.numel() for p in target.parameters())
    n_draft = sum(p.numel() for p in draft.parameters())
    print(f"[e2e] device {device} dtype {dtype}; target {n_target/1e6:.1f}M, draft {n_draft/1e6:.1f}M params; "
          f"{len(pool)} prompts padded to {P} tokens; max_new_tokens {args.max_new_tokens}", flush=True)

    def batches_for(b):
        n = max(b, args.min_prompts)
        n = ((n + b - 1) // b) * b
        n = min(n, (len(pool) // b) * b)
        if n < b:
            return None
        return [(all_ids[i : i + b], all_mask[i : i + b]) for i in range(0, n, b)]

    results, errors = [], []

    def record(entry):
        results.append(entry)
        print(f"[e2e {time.perf_counter()-t_start:6.1f}s] {entry['method']:<15} {entry.get('variant',''):<16} "
              f"b={entry['batch_size']:<3} {entry['mode']:<6} "
              + (f"{entry['tokens_per_s']:9.1f} tok/s" if entry.get("tokens_per_s") else f"ERROR {entry.get('error','')[:120]}"),
              flush=True)

    def run(method, variant, b, mode, call, batches, extra=None):
        entry = {"method": method, "variant": variant, "batch_size": b, "mode": mode, "num_prompts": len(batches) * b}
        if extra:
            entry.update(extra)
        try:
            entry.update(timed_method(method, call, batches, args, device, tok, P))
        except Exception as exc:  # record and go on: the numbers are what they are
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-3000:]
            errors.append({"method": method, "variant": variant, "batch_size": b, "mode": mode, "error": entry["error"]})
        if device.type == "cuda":
            torch.cuda.empty_cache()
        record(entry)
        return entry

    # ---- (a) plain HF generate, eager and static cache + compile ----------
    for b in batch_sizes:
        batches = batches_for(b)
        if batches is None:
            errors.append({"batch_size": b, "error": f"pool of {len(pool)} prompts is smaller than the batch"})
            continue
        for mode in modes:
            kw = gen_kwargs(mode, args, tok)
            run("plain_eager", "dynamic_cache", b, mode,
                lambda x, kw=kw: target.generate(input_ids=x[0], attention_mask=x[1], **kw), batches)
    if not args.no_compile:
        from transformers import CompileConfig

        for b in batch_sizes:
            batches = batches_for(b)
            if batches is None:
                continue
            for mode in modes:
                kw = gen_kwargs(mode, args, tok)
                kw["cache_implementation"] = "static"
                cc = CompileConfig()
                if args.force_compile:
                    cc._compile_all_devices = True
                kw["compile_config"] = cc
                entry = run("plain_compiled", "static_cache+compile", b, mode,
                            lambda x, kw=kw: target.generate(input_ids=x[0], attention_mask=x[1], **kw), batches)
                entry["compiled"] = hasattr(target, "_compiled_call")
                if not entry["compiled"]:
                    entry["note"] = ("transformers did not compile the forward (it auto-compiles only on "
                                     "accelerators; use --force-compile on CPU): static cache, eager")

    # ---- (b) HF assisted generation, batch 1 -------------------------------
    if not args.no_assisted and 1 in batch_sizes:
        batches = batches_for(1)
        saved = copy.deepcopy(draft.generation_config)
        variants = [("default", {})] + [
            (f"const_{n}", {"num_assistant_tokens": n, "num_assistant_tokens_schedule": "constant",
                            "assistant_confidence_threshold": 0.0}) for n in sweep]
        greedy_best = None
        for mode in modes:
            for name, settings in variants:
                if mode != "greedy" and name != "default" and greedy_best is not None and name != greedy_best:
                    continue  # sampling: default settings and the best constant from the greedy sweep
                draft.generation_config = copy.deepcopy(saved)
                for key, val in settings.items():
                    setattr(draft.generation_config, key, val)
                kw = gen_kwargs(mode, args, tok)
                eff = {key: getattr(draft.generation_config, key, None) for key in
                       ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
                run("hf_assisted", name, 1, mode,
                    lambda x, kw=kw: target.generate(input_ids=x[0], attention_mask=x[1], assistant_model=draft, **kw),
                    batches, extra={"assistant_settings": eff})
            if mode == "greedy":
                cands = [r for r in results if r["method"] == "hf_assisted" and r["mode"] == "greedy"
                         and r["variant"] != "default" and r.get("tokens_per_s")]
                if cands:
                    greedy_best = max(cands, key=lambda r: r["tokens_per_s"])["variant"]
        draft.generation_config = saved

    # ---- primitive costs for the ideal speedup ------------------------------
    primitives = {}
    for b in batch_sizes:
        batches = batches_for(b)
        if batches is None:
            continue
        try:
            primitives[b] = measure_primitives(target, draft, batches[0][0], batches[0][1], ks,
                                               args.primitive_iters, device)
        except Exception as exc:
            errors.append({"method": "primitives", "batch_size": b, "error": f"{type(exc).__name__}: {exc}"})

    # ---- (c) hf_specdec -------------------------------------------------------
    ok, why = spec_available()
    spec_status = "ok" if ok else f"unavailable: {why}"
    if args.no_spec:
        spec_status = "skipped (--no-spec)"
    elif ok:
        import hf_specdec

        hf_specdec.enable(target)
        for b in batch_sizes:
            batches = batches_for(b)
            if batches is None:
                continue
            for mode in modes:
                for k in ks:
                    kw = gen_kwargs(mode, args, tok)
                    sc = hf_specdec.SpecConfig(num_speculative_tokens=k)
                    entry = run("hf_specdec", f"k={k}", b, mode,
                                lambda x, kw=kw, sc=sc: target.generate(
                                    input_ids=x[0], attention_mask=x[1], assistant_model=draft, spec_config=sc, **kw),
                                batches, extra={"k": k})
                    agg = aggregate_metrics(entry.get("call_metrics") or [])
                    entry["spec_metrics"] = agg
                    entry["acceptance_rate"] = agg.get("acceptance_rate")
                    entry["mean_acceptance_length"] = agg.get("mean_acceptance_length")
                    entry["acceptance_length_histogram"] = acceptance_length_histogram(agg, k)
    else:
        print(f"[e2e] hf_specdec not available: {why}", flush=True)

    # ---- derived numbers -------------------------------------------------------
    def find(method, b, mode, variant=None):
        for r in results:
            if r["method"] == method and r["batch_size"] == b and r["mode"] == mode and r.get("tokens_per_s") \
                    and (variant is None or r["variant"] == variant):
                return r
        return None

    for r in results:
        if not r.get("tokens_per_s"):
            continue
        b, mode = r["batch_size"], r["mode"]
        eager = find("plain_eager", b, mode)
        comp = find("plain_compiled", b, mode)
        if eager and r is not eager:
            r["speedup_vs_plain_eager"] = r["tokens_per_s"] / eager["tokens_per_s"]
        if comp and r is not comp:
            r["speedup_vs_plain_compiled"] = r["tokens_per_s"] / comp["tokens_per_s"]
        if b == 1 and r["method"] != "hf_assisted":
            asd = find("hf_assisted", 1, mode, "default")
            assisted = [x for x in results if x["method"] == "hf_assisted" and x["mode"] == mode and x.get("tokens_per_s")]
            if asd:
                r["speedup_vs_assisted_default"] = r["tokens_per_s"] / asd["tokens_per_s"]
            if assisted:
                best = max(assisted, key=lambda x: x["tokens_per_s"])
                r["speedup_vs_assisted_best"] = r["tokens_per_s"] / best["tokens_per_s"]
                r["assisted_best_variant"] = best["variant"]
        eager_greedy = find("plain_eager", b, "greedy")
        if mode == "greedy" and eager_greedy and r is not eager_greedy:
            r["identical_to_plain_eager_greedy"] = identical_share(r.get("outputs"), eager_greedy.get("outputs"))
        if r["method"] == "hf_specdec" and r.get("acceptance_rate") is not None and b in primitives:
            k = r["k"]
            pr = primitives[b]
            alpha = r["acceptance_rate"]
            e_tok = expected_tokens_per_round(alpha, k)
            round_cost = k * pr["c_draft_step"] + pr[f"c_target_verify_k{k}"]
            ideal = e_tok / round_cost * pr["c_target_step"]
            r["expected_tokens_per_round"] = e_tok
            r["ideal_speedup"] = ideal
            if r.get("speedup_vs_plain_eager"):
                r["efficiency_vs_ideal"] = r["speedup_vs_plain_eager"] / ideal

    # ---- table -------------------------------------------------------------
    hdr = (f"{'method':<15}{'variant':<22}{'b':>4} {'mode':<7}{'tok/s':>10}{'x eager':>9}{'x compl':>9}"
           f"{'x asst':>8}{'x asst*':>8}{'acc':>7}{'len':>6}{'same':>6}{'ideal':>7}{'eff':>6}")
    print("\n" + hdr + "\n" + "-" * len(hdr))

    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) and v is not None else "-"

    for r in results:
        print(f"{r['method']:<15}{r['variant']:<22}{r['batch_size']:>4} {r['mode']:<7}"
              f"{f(r.get('tokens_per_s'), '10.1f'):>10}{f(r.get('speedup_vs_plain_eager'), '9.2f'):>9}"
              f"{f(r.get('speedup_vs_plain_compiled'), '9.2f'):>9}{f(r.get('speedup_vs_assisted_default'), '8.2f'):>8}"
              f"{f(r.get('speedup_vs_assisted_best'), '8.2f'):>8}{f(r.get('acceptance_rate'), '7.3f'):>7}"
              f"{f(r.get('mean_acceptance_length'), '6.2f'):>6}{f(r.get('identical_to_plain_eager_greedy'), '6.2f'):>6}"
              f"{f(r.get('ideal_speedup'), '7.2f'):>7}{f(r.get('efficiency_vs_ideal'), '6.2f'):>6}"
              + (f"  ERROR: {r['error'][:80]}" if r.get("error") else ""))
    print("(x asst = over HF assisted default settings, x asst* = over HF assisted best variant; same = share of "
          "greedy outputs identical to plain eager greedy; eff = speedup over eager / ideal)")

    # ---- JSON ----------------------------------------------------------------
    import transformers

    for r in results:
        r.pop("outputs", None)
    pair_summary = None
    sp = os.path.join(os.path.dirname(os.path.abspath(args.target)), "summary.json")
    if os.path.exists(sp):
        with open(sp) as fh:
            s = json.load(fh)
        pair_summary = {k: s.get(k) for k in ("target", "draft", "vocab_size", "tokens_seen_per_model", "target_better")}
    report = {
        "env": {"device": str(device),
                "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
                "torch": torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version(), "dtype": str(dtype).replace("torch.", "")},
        "config": {k: v for k, v in vars(args).items()},
        "target": os.path.abspath(args.target), "draft": os.path.abspath(args.draft),
        "params": {"target": n_target, "draft": n_draft},
        "pair_summary": pair_summary,
        "prompts": {"paths": prompt_paths, "pool": len(pool), "padded_len": P,
                    "sources": {s: sources.count(s) for s in set(sources)}},
        "hf_specdec": spec_status,
        "primitives_seconds": {str(b): v for b, v in primitives.items()},
        "results": results,
        "errors": errors,
        "total_seconds": time.perf_counter() - t_start,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=2, default=str)
    print(f"[e2e] wrote {args.out} in {report['total_seconds']:.1f}s total; {len(errors)} errors", flush=True)
    return report


if __name__ == "__main__":
    main()
