#!/usr/bin/env python
"""Strategies benchmark: the n-gram proposer, adaptive k, and a useless draft, in one run.

Rows per batch size (greedy, the same prompts and max_new_tokens within a prompt set):

  prompt set "code" (HumanEval prompts):
    hf_compiled     HF generate, static cache + torch.compile            (the reference)
    runner_plain    SpecConfig(num_speculative_tokens=0): plain decoding on our runner
    fixed k=1..K    SpecConfig(k, adaptive=False) with the project's draft
    adaptive        SpecConfig(K) (adaptive k is the default)
    useless fixed   an unrelated random draft of the same vocabulary, k=4, adaptive=False
    useless adaptive  the same draft, SpecConfig(4): must run >= 0.97x runner_plain
  prompt set "edit" (input-grounded: each HumanEval prompt, then a request to repeat it, then its
  first line again, so the continuation copies the prompt):
    hf_compiled, runner_plain as above
    hf_prompt_lookup  HF's own prompt lookup (batch 1 only: HF refuses more)
    ngram k=K       SpecConfig(method="ngram", k, adaptive=False)
    ngram adaptive  SpecConfig(method="ngram", k)

The rows of one prompt set at one batch size are measured together: each warms up (every batch, and
the first one's rows once per smaller bucket, so that timed calls capture and compile nothing, prefill
shapes included; the runner keeps every
configuration's graphs), twice over the rows (one row's warm-up can undo another's), then each of --passes passes times every row
in turn over all batches, the rows in a shuffled order per pass (seeded; a row's places: ``pass_positions``),
with a garbage collection before each call outside its time. tokens/s = generated tokens / time of
the row's fastest pass (every pass's time and the chosen pass's per-call times are kept).
Ratios: vs hf_compiled and vs runner_plain of the same prompt set; adaptive vs the best fixed k,
also pass by pass (the passes of one index ran side by side: "paired").
--adaptive-set NAME=VALUE adds an adaptive row with one policy constant changed.
Output: JSON (every row with spec_metrics: k histogram, match fraction) and a PNG of tokens/s vs k
with the adaptive rows marked.

GPU:  PYTHONPATH=. python benchmarks/strategies.py --target runs/pair/target --draft runs/pair/draft \\
          --prompts .devshim/he/HumanEval.jsonl.gz --compile-wait --out $OUT/strategies.json
      (without --compile-wait the passes may time the first minute, while the models compile in the background:
      slower rounds, and Hugging Face's compiled row can fail beside that compilation, docs/end_to_end.md)
CPU smoke: python benchmarks/strategies.py --target runs/tiny_pair/target --draft runs/tiny_pair/draft \\
          --batch-sizes 1,2 --num-prompts 2 --max-new-tokens 12 --k-max 3 --out /tmp/s.json
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import (  # noqa: E402
    Timer, aggregate_metrics, find_humaneval, load_pair, pick_device, pick_dtype, policy_constants, read_jsonl,
)
from benchmarks.e2e_spec import bucket_warmups  # noqa: E402
from benchmarks.strategies_report import plot, summarise  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", default=None, help="HumanEval.jsonl(.gz) (default: search known places)")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--num-prompts", type=int, default=8, help="prompts per batch size at least (rounded to b)")
    p.add_argument("--max-prompt-tokens", type=int, default=192)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--ngram-k", type=int, default=8)
    p.add_argument("--sections", default="code,edit")
    p.add_argument("--no-compile", action="store_true", help="our runner without torch.compile")
    p.add_argument("--compile-wait", action="store_true",
                   help="our rows with SpecConfig(compile=True): the first call (a warm-up) waits for the compiled "
                        "models, so no timed pass runs beside the background compilation")
    p.add_argument("--passes", type=int, default=3,
                   help="timed passes; each pass times every row of a group in turn; the fastest is reported")
    p.add_argument("--adaptive-set", action="append", default=[], metavar="NAME=VALUE",
                   help="also time adaptive k with this policy constant changed (repeatable)")
    p.add_argument("--deadline-s", type=float, default=1e9, help="rows not started by then are skipped")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--out", required=True)
    p.add_argument("--plot", default=None, help="PNG path (default: next to --out)")
    return p.parse_args(argv)


def prompt_sets(args, tok):
    path = find_humaneval(args.prompts)
    if path is None:
        raise SystemExit("no HumanEval prompts: pass --prompts PATH")
    code = read_jsonl(path, "prompt", 64)
    tail = args.max_prompt_tokens // 2  # each copy keeps its last tokens so the edit prompt fits
    short = [tok.decode(tok(c)["input_ids"][-tail:], skip_special_tokens=True) for c in code]
    edit = [f"{c}\n\n# The same code again, unchanged:\n{c.lstrip().splitlines()[0]}\n" for c in short]
    return {"code": code, "edit": edit}


def batches(tok, texts, b, n, max_len, device):
    n = max(n, b)
    n = -(-n // b) * b
    texts = (texts * (-(-n // len(texts))))[:n]
    enc = tok(texts, return_tensors="pt", padding="longest", truncation=True, max_length=max_len)
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    return [(ids[i:i + b], mask[i:i + b]) for i in range(0, n, b)]


def _policy_view(m: dict) -> str:
    """Runner rows: time per round outside the rounds (host work: policy, bookkeeping; plus the prefill's device
    time, which the prefill's own timer does not wait for: host_timeline.py splits a call exactly); adaptive
    rows also the k chosen per round and the round costs (ms) of the largest bucket."""
    out = ""
    if m.get("num_rounds") and m.get("decode_seconds") is not None:
        out = f"  outside rounds {1e3 * (m['decode_seconds'] - m['round_seconds']) / m['num_rounds']:.3f} ms/round"
    if m.get("round_costs_ms"):
        costs = m["round_costs_ms"]
        bucket = max(costs, key=int)
        out += (f"  k {m.get('k_histogram')}  ms per round at b={bucket}: "
                + " ".join(f"{c:.2f}" for c in costs[bucket].values()))
    return out


class Runner:
    """Rows are added per group (one prompt set at one batch size), then measured together: every row
    warms up, then each pass times every row in turn. Drift over a run (clocks, host state) then falls
    on all rows alike instead of on the rows that run late; a garbage collection runs before each timed
    call, outside its time, so that no row pays one its neighbours triggered."""

    def __init__(self, args, device, tok, target, draft, useless):
        self.args, self.device, self.tok = args, device, tok
        self.target, self.draft, self.useless = target, draft, useless
        self.rows, self.group, self.start = [], [], time.perf_counter()
        self.variant_memories: dict = {}  # --adaptive-set: each setting's own policy memories

    def kw(self):
        return dict(max_new_tokens=self.args.max_new_tokens, do_sample=False, pad_token_id=self.tok.pad_token_id,
                    eos_token_id=self.tok.eos_token_id, return_dict_in_generate=True)

    def _late(self) -> bool:
        return time.perf_counter() - self.start > self.args.deadline_s

    def row(self, section, b, name, call, work, warm, **extra):
        self.group.append(({"section": section, "batch_size": b, "row": name, **extra}, call, work, warm))

    def measure(self):
        """Warm every row of the group, then the interleaved passes; a row that fails is reported alone."""
        group, self.group, live = self.group, [], []
        for entry, call, work, warm in group:
            if self._late():
                print(f"[skip] {entry['section']} b={entry['batch_size']} {entry['row']}: deadline", flush=True)
            else:
                live.append((entry, call, work, warm, []))
        # Two warm-up sweeps: a row's warm-up can undo another's (HF's compiled forward and ours recompile once
        # after each other; a larger cache pool drops the graphs kept), which a first pass then paid for.
        for _ in range(2):
            self._each(live, _warm)
        for p in range(self.args.passes):
            if p and self._late():
                break
            order = random.Random(p).sample(live, len(live))  # rows timed later in a pass ran slower (H200, b = 32)
            self._each(order, self._timed_pass, timed=True, live=live)
        for entry, _, work, _, passes in live:
            self._report(entry, passes, work)

    def _each(self, rows: list, fn, timed: bool = False, live: list = None) -> None:
        """``fn(call, work if timed else warm)`` for each of ``rows`` in turn (a timed result joins the row's passes,
        its place in the pass ``pass_positions``); a row that fails is reported and leaves ``live`` (default:
        ``rows``), the others go on."""
        live = rows if live is None else live
        for place, row in enumerate(list(rows)):
            entry, call, work, warm, passes = row
            try:
                result = fn(call, work if timed else warm)
            except Exception as exc:  # a failing row is reported, the run goes on
                live.remove(row)
                self._report(entry, error=exc)
                continue
            if timed:
                passes.append(result)
                entry.setdefault("pass_positions", []).append(place)

    def _timed_pass(self, call, work):
        outs, call_seconds = [], []
        for x in work:
            gc.collect()
            with Timer(self.device) as t:
                outs.append(call(x))
            call_seconds.append(t.seconds)
        return sum(call_seconds), outs, [round(c, 4) for c in call_seconds]

    def _report(self, entry, passes=None, work=None, error=None):
        if error is not None:
            entry["error"] = f"{type(error).__name__}: {error}"
        else:
            seconds, outs, call_seconds = min(passes, key=lambda p: p[0])
            prompt_len = work[0][0].shape[1]
            tokens, metrics = 0, []
            for out in outs:
                new = out.sequences[:, prompt_len:]
                tokens += int((new != self.tok.pad_token_id).sum())
                m = getattr(out, "spec_metrics", None)
                if m is not None:
                    metrics.append(m.to_dict())
            ordered = sorted(p[0] for p in passes)
            if any(getattr(o, "spec_metrics", None) is not None for o in passes[0][1]):
                entry["pass_metrics"] = [_pass_view([o.spec_metrics.to_dict() for o in p[1]]) for p in passes]
            entry.update(seconds=seconds, median_seconds=ordered[len(ordered) // 2],
                         pass_seconds=[round(p[0], 4) for p in passes], call_seconds=call_seconds,
                         tokens=tokens, tokens_per_s=tokens / seconds,
                         sequences=[o.sequences[:, prompt_len:].tolist() for o in outs])
            if metrics:
                entry["spec_metrics"] = {**aggregate_metrics(metrics),
                                         "fast_path": sorted({m["fast_path"] for m in metrics})}
        self.rows.append(entry)
        print(f"[row] {entry['section']:4s} b={entry['batch_size']:3d} {entry['row']:18s} "
              + (f"{entry['tokens_per_s']:9.1f} tok/s" if "tokens_per_s" in entry else entry.get("error", ""))
              + (f"  passes {entry['pass_seconds']}" if "pass_seconds" in entry else "")
              + _policy_view(entry.get("spec_metrics", {})), flush=True)
        for i, view in enumerate(entry.get("pass_metrics", []) if entry.get("adaptive") else []):
            print(f"    pass {i}: {view}", flush=True)


def run(args, r: Runner, sets):
    import hf_specdec
    from transformers import CompileConfig, GenerationMixin

    hf_specdec.enable(r.target)

    def hf(x, **kw):  # Hugging Face's own generate, whatever enable() wrapped
        return GenerationMixin.generate(r.target, input_ids=x[0], attention_mask=x[1], **r.kw(), **kw)

    def ours(x, draft=None, **spec):
        base = dict(compile=False if args.no_compile else True if args.compile_wait else None)
        return r.target.generate(input_ids=x[0], attention_mask=x[1], assistant_model=draft, **r.kw(),
                                 spec_config=hf_specdec.SpecConfig(**base, **spec))

    compiled = dict(cache_implementation="static", compile_config=CompileConfig())
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        for section in args.sections.split(","):
            work = batches(r.tok, sets[section], b, args.num_prompts, args.max_prompt_tokens, r.device)
            warm = bucket_warmups(work[0], b) + work[1:]  # every prompt once too: its prefill shape captured
            r.row(section, b, "hf_compiled", lambda x: hf(x, **compiled), work, work[:1])
            r.row(section, b, "runner_plain", lambda x: ours(x, num_speculative_tokens=0), work, warm)
            if section == "edit":
                if b == 1:
                    r.row(section, b, "hf_prompt_lookup", lambda x: hf(x, prompt_lookup_num_tokens=args.ngram_k),
                          work, work[:1], k=args.ngram_k)
                for adaptive in (False, True):
                    r.row(section, b, f"ngram {'adaptive' if adaptive else 'fixed'}",
                          lambda x, a=adaptive: ours(x, num_speculative_tokens=args.ngram_k, method="ngram",
                                                     adaptive=a), work, warm, k=args.ngram_k, adaptive=adaptive)
                r.measure()
                continue
            for k in range(1, args.k_max + 1):
                r.row(section, b, f"fixed k={k}", lambda x, k=k: ours(x, r.draft, num_speculative_tokens=k,
                                                                      adaptive=False), work, warm, k=k)
            r.row(section, b, "adaptive", lambda x: ours(x, r.draft, num_speculative_tokens=args.k_max), work, warm,
                  k=args.k_max, adaptive=True)
            for setting in args.adaptive_set:
                r.row(section, b, f"adaptive {setting}",
                      lambda x, s=setting: with_setting(s, r, ours, x, r.draft, num_speculative_tokens=args.k_max),
                      work, warm, k=args.k_max, adaptive=True, setting=setting)
            for adaptive in (False, True):
                r.row(section, b, f"useless {'adaptive' if adaptive else 'fixed'}",
                      lambda x, a=adaptive: ours(x, r.useless, num_speculative_tokens=4, adaptive=a), work, warm,
                      k=4, adaptive=adaptive)
            r.measure()


def _pass_view(metrics: list[dict]) -> dict:
    """One pass of a row, as the policy and the host saw it (a pass slower than the others says why)."""
    m = aggregate_metrics(metrics)
    costs = m.get("round_costs_ms")  # bucket -> k -> ms; the largest bucket's
    return {"k": m.get("k_histogram"), "rounds": m.get("num_rounds"), "round_s": round(m.get("round_seconds", 0), 4),
            "decode_s": round(m.get("decode_seconds", 0), 4), "prefill_s": round(m.get("prefill_seconds", 0), 4),
            "warmup_s": round(m.get("warmup_seconds", 0), 4), "costs_ms": costs[max(costs)] if costs else None}


def _warm(call, warm) -> None:
    for x in warm:
        call(x)


def with_setting(setting: str, r: Runner, fn, *args, **kwargs):
    """``fn`` called with one policy constant changed (``--adaptive-set``) and the policy's own memory across
    calls (round costs included): the default row would otherwise learn from its decisions."""
    from hf_specdec.runner import runner_for

    slots = runner_for(r.target, r.draft).slots
    default, slots.memories = slots.memories, r.variant_memories.setdefault(setting, {})
    try:
        with policy_constants([setting], "--adaptive-set"):
            return fn(*args, **kwargs)
    finally:
        slots.memories = default


def main(argv=None):
    args = parse_args(argv)
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    tok, target, draft = load_pair(args.target, args.draft, device, dtype)
    torch.manual_seed(0)
    useless = type(draft)(copy.deepcopy(draft.config)).to(device=device, dtype=dtype).eval()  # random weights
    r = Runner(args, device, tok, target, draft, useless)
    run(args, r, prompt_sets(args, tok))
    report = {"args": vars(args), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "rows": r.rows, "summary": summarise(r.rows)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps(report["summary"], indent=1))
    plot(r.rows, args.plot or os.path.splitext(args.out)[0] + ".png")


if __name__ == "__main__":
    main()
