#!/usr/bin/env python
"""Per-prompt eval of plain HF generate (eager, and compiled) vs hf_specdec and HF's assisted generation over a
local jsonl dataset.

The dataset is loaded with `datasets` from local files (HumanEval.jsonl.gz or any
jsonl with --prompt-field).  Prompts are sharded over processes with accelerate's
PartialState().split_between_processes, so the same script runs on one device or
under `accelerate launch --num_processes N evals/run_eval.py ...` (data parallel: each
process its own target and draft); results are gathered on the main process. With
--tp the launched processes instead hold one tensor-parallel target (tp_plan="auto")
and run every prompt together (--draft-tp: draft replicated or split too). The main
process shows the one progress bar and writes

    OUT/results.json   per prompt: new tokens, identical-to-plain per method; per generate() call:
                       seconds, tokens/s, spec_metrics; the summary (evals/eval_summary.py)
    OUT/eval.png       acceptance-length histogram, acceptance per position, tokens/s per method

--draft is a checkpoint directory or a reduced-vocabulary draft saved by
hf_specdec.save_reduced_draft (loaded onto the target: benchmarks.common.load_draft).
Prompts go --batch-size at a time (left-padded) through every method, after one warm-up
call per method. hf_compiled is HF generate with a static cache, which transformers compiles on an
accelerator (on a CPU it stays eager). hf_assisted is Hugging Face's own assisted generation with the same draft
and a constant --k draft tokens per round (batch 1 only, as transformers allows); a call
that raises is recorded (summary[method]["errors"]) and the method is not run again.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


sys.path.insert(0, os.path.dirname(HERE))  # the repository root, for benchmarks.common
from benchmarks.common import Timer, find_humaneval, metrics_dict, spec_available, valid_new_tokens  # noqa: E402
sys.path.insert(0, HERE)
from eval_models import load_models  # noqa: E402
from eval_plot import make_plot  # noqa: E402
from eval_summary import summarise  # noqa: E402

METHODS = ("plain", "hf_compiled", "hf_specdec", "hf_assisted")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--data", default=None, help="jsonl / jsonl.gz (default: HumanEval.jsonl.gz from known places)")
    p.add_argument("--prompt-field", default="prompt")
    p.add_argument("--id-field", default="task_id", help="row id field (row index when absent)")
    p.add_argument("--limit", type=int, default=None, help="first N rows only")
    p.add_argument("--max-prompt-tokens", type=int, default=512, help="prompts keep their last N tokens")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens (hf_assisted: num_assistant_tokens)")
    p.add_argument("--fixed-k", action="store_true", help="SpecConfig(adaptive=False): k draft tokens every round")
    p.add_argument("--batch-size", type=int, default=1, help="prompts per generate() call (left-padded)")
    p.add_argument("--mode", choices=["greedy", "sample"], default="greedy")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--methods", default="plain,hf_specdec", help="comma list of plain, hf_compiled, hf_specdec, hf_assisted")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--tp", action="store_true",
                   help="one tensor-parallel target over the launched processes instead of one pair per process")
    p.add_argument("--draft-tp", type=int, default=1,
                   help="with --tp: 1 = the draft replicated on every process, N = split like the target")
    return p.parse_args(argv)


def load_prompts(args):
    """(path, rows) from a local jsonl(.gz), through `datasets` where it is installed (the GPU machine has
    none: there the rows are read line by line, the same rows in the same order)."""
    path = args.data or find_humaneval(None)
    if path is None:
        raise SystemExit("no dataset: pass --data PATH")
    try:
        from datasets import load_dataset
    except ImportError as err:
        print(f"datasets is not importable ({err}); reading {path} line by line", file=sys.stderr)
        rows = read_jsonl_rows(path, args.limit)
    else:
        ds = load_dataset("json", data_files=path, split="train")
        if args.limit:
            ds = ds.select(range(min(args.limit, len(ds))))
        rows = ds.to_list()
    return path, [{"index": i, "id": str(r.get(args.id_field, i)), "prompt": r[args.prompt_field]}
                  for i, r in enumerate(rows)]


def read_jsonl_rows(path: str, limit) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return rows[:limit] if limit else rows


def check_methods(args) -> list[str]:
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}; choose from {', '.join(METHODS)}")
    if args.batch_size < 1:
        raise SystemExit(f"--batch-size must be >= 1, got {args.batch_size}")
    if "hf_assisted" in methods and (args.batch_size > 1 or args.tp):
        raise SystemExit("hf_assisted runs at --batch-size 1 without --tp only (transformers: 'assisted generate "
                         "is only supported for batch_size = 1').")
    if {"hf_specdec", "hf_assisted"} & set(methods):
        ok, why = spec_available()
        if not ok:
            raise SystemExit(f"hf_specdec is not available ({why}); run with --methods plain")
    return methods


def run_batch(call, methods, batch, encode, tok, args, state, disabled) -> tuple[list[dict], dict]:
    """Every method on one batch of prompts: (one row per prompt, the call record)."""
    ids, mask = encode([item["prompt"] for item in batch])
    rows = [{"index": item["index"], "id": item["id"], "prompt_tokens": int(mask[i].sum()),
             "process": state.process_index} for i, item in enumerate(batch)]
    record, outs = {"indices": [item["index"] for item in batch], "process": state.process_index}, {}
    for m in methods:
        if m in disabled:
            continue
        torch.manual_seed(args.seed + batch[0]["index"])
        try:
            with Timer(ids.device) as t:
                out = call(m, ids, mask)
        except Exception as err:  # recorded; the method is not run again
            record[m] = {"error": f"{type(err).__name__}: {err}"}
            disabled.add(m)
            continue
        seqs = out.sequences.cpu()
        outs[m] = [valid_new_tokens(seqs[i], ids.shape[1], tok.eos_token_id, tok.pad_token_id)
                   for i in range(len(batch))]
        tokens = sum(len(n) for n in outs[m])
        entry = {"seconds": t.seconds, "new_tokens": tokens, "tokens_per_s": tokens / t.seconds if t.seconds else None}
        sm = getattr(out, "spec_metrics", None)
        if sm is not None:
            entry.update(acceptance_rate=sm.acceptance_rate, mean_acceptance_length=sm.mean_acceptance_length,
                         spec_metrics=metrics_dict(sm))
        record[m] = entry
        for row, new in zip(rows, outs[m]):  # a row's seconds and tokens/s are its call's
            row[m] = {"new_tokens": len(new), "seconds": t.seconds, "tokens_per_s": entry["tokens_per_s"]}
            if len(batch) == 1 and sm is not None:
                row[m].update(acceptance_rate=sm.acceptance_rate, mean_acceptance_length=sm.mean_acceptance_length)
    if args.mode == "greedy" and "plain" in outs:
        for i, row in enumerate(rows):
            row["identical"] = {m: outs[m][i] == outs["plain"][i] for m in outs if m != "plain"}
            if "hf_specdec" in outs:
                row["identical_to_plain"] = row["identical"]["hf_specdec"]
    return rows, record


def main(argv=None):
    args = parse_args(argv)
    from accelerate import PartialState
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm
    from transformers import CompileConfig

    # On a machine without an accelerator, cpu=True lets torchrun / accelerate launch run gloo processes.
    state = PartialState(cpu=not torch.cuda.is_available())
    device = state.device
    dtype = torch.bfloat16 if (args.dtype == "auto" and device.type == "cuda") else (
        torch.float32 if args.dtype == "auto" else getattr(torch, args.dtype))
    methods = check_methods(args)

    data_path, prompts = load_prompts(args)
    tok, target, draft = load_models(args.target, args.draft, device, dtype, args.tp, args.draft_tp)
    if "hf_specdec" in methods:
        import hf_specdec

        hf_specdec.enable(target)

    kw = dict(max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
              return_dict_in_generate=True)
    if args.mode == "greedy":
        kw["do_sample"] = False
    else:
        kw.update(do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0)

    def call(method, ids, mask):
        if method == "plain":
            return target.generate(input_ids=ids, attention_mask=mask, **kw)
        if method == "hf_compiled":  # static cache: transformers compiles the forward on an accelerator
            return target.generate(input_ids=ids, attention_mask=mask, **kw, cache_implementation="static",
                                   compile_config=CompileConfig())
        if method == "hf_assisted":  # no spec_config: transformers' own assisted generation
            return target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, **kw,
                                   num_assistant_tokens=args.k, num_assistant_tokens_schedule="constant",
                                   assistant_confidence_threshold=0.0)
        return target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, spec_config=spec_config(),
                               **kw)

    def spec_config():
        return hf_specdec.SpecConfig(num_speculative_tokens=args.k, adaptive=False if args.fixed_k else None,
                                     draft_tp=args.draft_tp if args.tp else None)

    def encode(texts):
        enc = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=args.max_prompt_tokens)
        return enc["input_ids"].to(device), enc["attention_mask"].to(device)

    rows, calls, disabled = [], [], set()
    # --tp: every process runs every prompt (one sharded target); otherwise each runs its share
    with (contextlib.nullcontext(prompts) if args.tp else state.split_between_processes(prompts)) as shard:
        batches = [shard[i:i + args.batch_size] for i in range(0, len(shard), args.batch_size)]
        if batches and "hf_specdec" in methods:  # compiled code and the graphs of every batch bucket, now
            longest = max(encode([item["prompt"]])[0].shape[1] for item in shard)
            hf_specdec.warmup(target, draft, spec_config(), batch_size=args.batch_size, prompt_length=longest,
                              verbose=state.is_main_process, **kw)
        if batches:  # warm-up: one call per method
            run_batch(call, methods, batches[0], encode, tok, args, state, set())
        what = "" if args.tp or state.num_processes == 1 else f" (share of process 0 of {state.num_processes})"
        bar = tqdm(total=len(shard), desc="eval" + what, disable=not shard or not state.is_main_process,
                   dynamic_ncols=True)
        for batch in batches:
            batch_rows, record = run_batch(call, methods, batch, encode, tok, args, state, disabled)
            rows += batch_rows
            calls.append(record)
            bar.update(len(batch))
            if record.get("hf_specdec", {}).get("mean_acceptance_length") is not None:
                bar.set_postfix(acc_len=f"{record['hf_specdec']['mean_acceptance_length']:.2f}")
        bar.close()

    all_rows, all_calls = (rows, calls) if args.tp else (gather_object(rows), gather_object(calls))
    if state.is_main_process:
        all_rows = sorted(all_rows, key=lambda r: r["index"])
        all_calls = sorted(all_calls, key=lambda c: c["indices"][0])
        summary = summarise(all_rows, all_calls, methods, args.k)
        os.makedirs(args.out, exist_ok=True)
        report = {"data": os.path.abspath(data_path), "target": os.path.abspath(args.target),
                  "draft": os.path.abspath(args.draft), "num_processes": state.num_processes,
                  "parallel": "tensor" if args.tp else "data", "device": str(device), "dtype": str(dtype),
                  "config": vars(args), "summary": summary, "rows": all_rows, "calls": all_calls}
        with open(os.path.join(args.out, "results.json"), "w") as fh:
            json.dump(report, fh, indent=2, default=str)
        make_plot(summary, all_calls, methods, args.k, args.batch_size, os.path.join(args.out, "eval.png"))
        print(json.dumps(summary, indent=2, default=str))
    state.wait_for_everyone()
    if state.num_processes > 1:
        # Every result is written. Tearing down gloo (destroy_process_group, or the interpreter's own finalisation)
        # aborted rank 1 now and then in CI, torch 2.13 ("terminate called without an active exception"), and the
        # launcher then failed the whole run: past the barrier nothing is left to do, so leave without destructors.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
