#!/usr/bin/env python
"""End-to-end benchmark: plain HF generate, HF assisted generation, hf_specdec.

One run, the same prompts and the same max_new_tokens for every method:

  plain_eager     HF generate, dynamic cache, eager                              (every batch size)
  plain_compiled  HF generate, cache_implementation="static" -> auto torch.compile (every batch size)
  hf_assisted     HF assisted generation, batch 1 only: the draft's default settings and
                  constant num_assistant_tokens (--assisted-sweep)
  hf_specdec      "fast k=K":  SpecConfig(k), the default: runner + CUDA graphs + compile on CUDA
                  (on CPU the same runner without CUDA graphs)
  runner_plain    "k=0": SpecConfig(num_speculative_tokens=0), no draft: plain decoding on the same runner
  (--head DIR)    "head k=K": the same with a draft head (hf_specdec.load_draft_head) as the assistant;
                  --head NAME=DIR (repeatable): "head[NAME] k=K" rows, one per head

for greedy and sampling (temperature 1, top_k 0, top_p 1).  For each batch size b the prompts
are the first n_b of the pool (n_b = max(b, --min-prompts) rounded up to a multiple of b), all
left-padded to ONE length.  Each row: warm-up calls (not timed; plain_compiled a pass over every batch, where a
later batch can still recompile; rows on the runner also warm up every smaller bucket their rows shrink into, then
pass over every batch again, up to --warm-passes times, while a pass still captured), then --repeats timed passes;
tokens/s = generated tokens (up to and including EOS) / wall time, median over passes.
Rows run in the order the final summary needs them (plain_compiled; fast and k=0; plain_eager;
hf_assisted); rows not started within --deadline-s are skipped; a SIGTERM (`timeout`, a job's limit) or Ctrl-C
stops the run, and the rows already run still get their tables, summary and JSON ("stopped" says when).
hf_specdec rows and stage costs: e2e_spec.py; divergent greedy rows: divergence.py; derived figures,
tables, summary and JSON: e2e_report.py.  docs/end_to_end.md.

GPU:  python benchmarks/e2e.py --target runs/pair/target --draft runs/pair/draft --out $OUT/e2e.json
CPU smoke: python benchmarks/e2e.py --build-tiny --batch-sizes 1,2 --max-new-tokens 16 --num-prompts 4 \\
           --repeats 1 --out /tmp/e2e.json
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import statistics
import sys
import time
import traceback

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the repository root, for benchmarks.*
from benchmarks.common import (  # noqa: E402
    REPO_ROOT, Timer, exit_on_signal, find_humaneval, load_pair, metrics_dict, on_sigterm, pick_device, pick_dtype,
    read_jsonl, spec_available, valid_new_tokens,
)
from benchmarks.divergence import add_to_results as add_divergences  # noqa: E402
from benchmarks.e2e_report import finish_report, new_report, write_json  # noqa: E402
from benchmarks.e2e_spec import load_heads, run_spec, spec_fields  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="target model dir (save_pretrained)")
    p.add_argument("--draft", help="draft model dir")
    p.add_argument("--head", action="append", default=None, metavar="[NAME=]DIR",
                   help="a draft head for the target (save_draft_head dir): adds hf_specdec \"head k=K\" rows "
                   "beside the draft model's; repeat for several heads, named ones give \"head[NAME] k=K\" rows")
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
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--modes", default="greedy,sample")
    p.add_argument("--k", default="4", help="num_speculative_tokens for hf_specdec, comma list for a sweep")
    p.add_argument("--assisted-sweep", default="4", help="constant num_assistant_tokens values ('' = none)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--warm-passes", type=int, default=3, help="extra warm-up passes over every batch while the "
                   "last one still captured or compiled (the adaptive k reaching a new (bucket, k) late)")
    p.add_argument("--no-compile", action="store_true", help="skip the static-cache + torch.compile baseline")
    p.add_argument("--force-compile", action="store_true",
                   help="auto-compile even on CPU (transformers compiles only on accelerators by default)")
    p.add_argument("--no-assisted", action="store_true")
    p.add_argument("--no-spec", action="store_true", help="skip hf_specdec and runner_plain")
    p.add_argument("--compile-wait", action="store_true", help="hf_specdec rows with SpecConfig(compile=True): their "
                   "first (warm-up) call waits for the compiled code, so the timed calls run it (steady state)")
    p.add_argument("--lazy-k-capture", action="store_true", help="hf_specdec rows without "
                   "SpecConfig(capture_every_k=True): a k the adaptive policy first picks in a timed call is captured there")
    p.add_argument("--stage-repeats", type=int, default=50, help="replays per piece in time_stages (CUDA only)")
    p.add_argument("--deadline-s", type=float, default=520.0,
                   help="rows not started this many seconds after the start are skipped (0 = no deadline)")
    p.add_argument("--ignore-eos", action="store_true", help="min_new_tokens = max_new_tokens for every method")
    p.add_argument("--no-divergence", action="store_true",
                   help="skip the analysis of greedy rows that differ from plain eager greedy (divergence.py)")
    p.add_argument("--tie-ulps", type=float, default=1.0,
                   help="a divergence is a near-tie when the two tokens' logits lie within this many ulps")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, fp32 on cpu) | float32 | bfloat16 | float16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="e2e.json")
    return p.parse_args(argv)


def int_list(text):
    return [int(x) for x in text.split(",") if x.strip()]


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


def spec_metrics_of(out):
    return metrics_dict(getattr(out, "spec_metrics", None))


def count_tokens(results, tok, prompt_len):
    """Generated tokens of every row of these outputs, and the rows themselves."""
    rows = [valid_new_tokens(row.cpu(), prompt_len, tok.eos_token_id, tok.pad_token_id)
            for res in results for row in res.sequences]
    return sum(len(r) for r in rows), rows


def timed_method(call, batches, warmup_batches, args, device, tok, prompt_len):
    """Warm-up calls (not timed), then --repeats timed passes over all batches."""
    torch.manual_seed(args.seed)
    with Timer(device) as warm:
        warm_metrics = [spec_metrics_of(call(x)) for x in warmup_batches]
        for _ in range(args.warm_passes):  # adaptive k meets new (bucket, k) pairs late: warm until none is captured
            if not sum(m.get("warmup_seconds", 0.0) for m in warm_metrics[-len(batches):] if m):
                break
            warm_metrics += [spec_metrics_of(call(x)) for x in batches]
    times, tokens, outputs, timed_metrics = [], [], None, []
    for r in range(args.repeats):
        torch.manual_seed(args.seed + 1 + r)
        with Timer(device) as t:
            results = [call(x) for x in batches]
        n, rows = count_tokens(results, tok, prompt_len)
        times.append(t.seconds)
        tokens.append(n)
        outputs = outputs if outputs is not None else rows
        timed_metrics += [spec_metrics_of(res) for res in results]
    return {
        "warmup_calls": len(warmup_batches),
        "warmup_call_seconds": warm.seconds,
        "seconds_all": times,
        "seconds_median": statistics.median(times),
        "new_tokens": tokens[0],
        "new_tokens_all": tokens,
        "tokens_per_s": statistics.median(n / t for n, t in zip(tokens, times)),
        "outputs": outputs,
    }, [m for m in warm_metrics if m], [m for m in timed_metrics if m]


# --------------------------------------------------------------------------- #
class Bench:
    """The loaded pair, the prompts, and the rows run so far."""

    def __init__(self, args, device, tok, target, draft, ids, mask, report, t_start):
        self.args, self.device, self.tok, self.target, self.draft = args, device, tok, target, draft
        self.ids, self.mask, self.P = ids, mask, ids.shape[1]
        self.report, self.results, self.errors = report, report["results"], report["errors"]
        self.batch_sizes, self.ks = int_list(args.batch_sizes), int_list(args.k)
        self.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        self.t_start, self.notes = t_start, set()

    def batches_for(self, b):
        n = max(b, self.args.min_prompts)
        n = ((n + b - 1) // b) * b
        n = min(n, (self.ids.shape[0] // b) * b)
        if n < b:
            return None
        return [(self.ids[i : i + b], self.mask[i : i + b]) for i in range(0, n, b)]

    def configs(self):
        """(b, mode, batches) for every batch size the pool can fill, and every mode."""
        for b in self.batch_sizes:
            batches = self.batches_for(b)
            for mode in self.modes if batches else ():
                yield b, mode, batches

    def note(self, text):
        """Print a note once."""
        if text not in self.notes:
            self.notes.add(text)
            print(f"[e2e] note: {text}", flush=True)

    def elapsed(self):
        return time.perf_counter() - self.t_start

    def run(self, method, variant, b, mode, call, batches, warmup_batches=None, extra=None, k=None):
        entry = {"method": method, "variant": variant, "batch_size": b, "mode": mode, "num_prompts": len(batches) * b}
        entry.update(extra or {})
        deadline = self.args.deadline_s
        if deadline and self.elapsed() > deadline:
            entry["skipped"] = f"not started: {self.elapsed():.0f} s > --deadline-s {deadline:g}"
            return self.record(entry)
        try:
            timed, warm_m, timed_m = timed_method(call, batches, warmup_batches or batches[:1], self.args,
                                                  self.device, self.tok, self.P)
            entry.update(timed)
            if k is not None:
                entry.update(spec_fields(warm_m, timed_m, self.args.repeats, k))
        except Exception as exc:  # record and go on: the numbers are what they are
            self.fail(entry, exc)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return self.record(entry)

    def fail(self, entry, exc):
        entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["traceback"] = traceback.format_exc()[-3000:]
        self.errors.append({key: entry.get(key) for key in ("method", "variant", "batch_size", "mode", "error")})

    def record(self, entry):
        self.results.append(entry)
        if entry.get("tokens_per_s"):
            status = f"{entry['tokens_per_s']:9.1f} tok/s"
        else:
            status = f"SKIPPED {entry['skipped']}" if entry.get("skipped") else f"ERROR {entry.get('error', '')[:120]}"
        if "fast_path" in entry:
            status += (f"  [{entry['fast_path']}] warm-up {entry['warmup_seconds']:.1f} s, timed calls' warm-up "
                       f"{entry['timed_warmup_seconds']:.2f} s, {entry['num_rounds']:.0f} rounds / pass")
        print(f"[e2e {self.elapsed():6.1f}s] {entry['method']:<15} {entry['variant']:<16} b={entry['batch_size']:<3} "
              f"{entry['mode']:<6} {status}", flush=True)
        write_json(self.args.out, self.report)  # a run cut short still leaves its rows
        return entry

    def gen_kwargs(self, mode):
        return gen_kwargs(mode, self.args, self.tok)

    def generate(self, x, kw, **extra):
        return self.target.generate(input_ids=x[0], attention_mask=x[1], **kw, **extra)


# --------------------------------------------------------------------------- #
def run_plain(bench, compiled):
    from transformers import CompileConfig

    for b, mode, batches in bench.configs():
        kw = gen_kwargs(mode, bench.args, bench.tok)
        if not compiled:
            bench.run("plain_eager", "dynamic_cache", b, mode, lambda x, kw=kw: bench.generate(x, kw), batches)
            continue
        cc = CompileConfig()
        if bench.args.force_compile:
            cc._compile_all_devices = True
        kw.update(cache_implementation="static", compile_config=cc)
        entry = bench.run("plain_compiled", "static_cache+compile", b, mode,
                          lambda x, kw=kw: bench.generate(x, kw), batches, warmup_batches=batches)
        entry["compiled"] = hasattr(bench.target, "_compiled_call")
        if not entry["compiled"]:
            entry["note"] = ("transformers did not compile the forward (it auto-compiles only on "
                             "accelerators; use --force-compile on CPU): static cache, eager")


def run_assisted(bench):
    """Batch 1: the draft's default settings, then each constant of --assisted-sweep (sampling: the best one)."""
    args, draft = bench.args, bench.draft
    batches = bench.batches_for(1)
    saved = copy.deepcopy(draft.generation_config)
    variants = [("default", {})] + [
        (f"const_{n}", {"num_assistant_tokens": n, "num_assistant_tokens_schedule": "constant",
                        "assistant_confidence_threshold": 0.0}) for n in int_list(args.assisted_sweep)]
    greedy_best = None
    for mode in bench.modes:
        for name, settings in variants:
            if mode != "greedy" and greedy_best is not None and name not in ("default", greedy_best):
                continue  # sampling: default settings and the best constant from the greedy sweep
            draft.generation_config = copy.deepcopy(saved)
            for key, val in settings.items():
                setattr(draft.generation_config, key, val)
            kw = gen_kwargs(mode, args, bench.tok)
            eff = {key: getattr(draft.generation_config, key, None) for key in
                   ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
            bench.run("hf_assisted", name, 1, mode, lambda x, kw=kw: bench.generate(x, kw, assistant_model=draft),
                      batches, extra={"assistant_settings": eff})
        if mode == "greedy":
            cands = [r for r in bench.results if r["method"] == "hf_assisted" and r["mode"] == "greedy"
                     and r["variant"] != "default" and r.get("tokens_per_s")]
            if cands:
                greedy_best = max(cands, key=lambda r: r["tokens_per_s"])["variant"]
    draft.generation_config = saved


# --------------------------------------------------------------------------- #
def load(args):
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
    return device, dtype, tok, target, draft


def main(argv=None):
    t_start = time.perf_counter()
    args = parse_args(argv)
    device, dtype, tok, target, draft = load(args)
    pool, sources, ids, mask, prompt_paths = build_prompt_pool(args, tok)
    report = new_report(args, device, dtype, target, draft, pool, sources, ids.shape[1], prompt_paths)
    bench = Bench(args, device, tok, target, draft, ids.to(device), mask.to(device), report, t_start)
    bench.heads = load_heads(args.head or [], target, report["params"])
    print(f"[e2e] {report['env']['device_name']} ({device}) {report['env']['dtype']}; target "
          f"{report['params']['target']/1e6:.1f}M, draft {report['params']['draft']/1e6:.1f}M params; "
          f"{len(pool)} prompts padded to {bench.P} tokens; max_new_tokens {args.max_new_tokens}", flush=True)
    for b in bench.batch_sizes:
        if bench.batches_for(b) is None:
            bench.errors.append({"batch_size": b, "error": f"pool of {len(pool)} prompts is smaller than the batch"})

    previous = on_sigterm(exit_on_signal)  # `timeout` or a job's limit: the rows so far still get their summary
    stop = None
    try:
        run_rows(bench, args, report)
    except (SystemExit, KeyboardInterrupt) as exc:
        stop = exc
        report["stopped"] = f"{str(exc) or type(exc).__name__} after {bench.elapsed():.0f} s: later rows not run"
        print(f"[e2e] {report['stopped']}", flush=True)
    report["total_seconds"] = bench.elapsed()
    on_sigterm(signal.SIG_IGN)  # a second signal does not cut the report short
    try:
        finish_report(report)
    finally:
        on_sigterm(previous)
    if stop is not None:
        raise stop
    return report


def run_rows(bench, args, report):
    """The rows the summary needs first, so that --deadline-s (or a stop) cuts the least useful ones; then the
    divergence check of the greedy rows."""
    if not args.no_compile:
        run_plain(bench, compiled=True)
    ok, why = spec_available()
    report["hf_specdec"] = "skipped (--no-spec)" if args.no_spec else "ok" if ok else f"unavailable: {why}"
    if ok and not args.no_spec:
        run_spec(bench)
    elif not ok:
        print(f"[e2e] hf_specdec not available: {why}", flush=True)
    run_plain(bench, compiled=False)
    if not args.no_assisted and 1 in bench.batch_sizes:
        run_assisted(bench)
    if not args.no_divergence:
        add_divergences(bench, args.tie_ulps)


if __name__ == "__main__":
    main()
