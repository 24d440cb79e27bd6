#!/usr/bin/env python
"""Per-prompt eval of plain HF generate vs hf_specdec over a local jsonl dataset.

The dataset is loaded with `datasets` from local files (HumanEval.jsonl.gz or any
jsonl with --prompt-field).  Prompts are sharded over processes with accelerate's
PartialState().split_between_processes, so the same script runs on one device or
under `accelerate launch --num_processes N evals/run_eval.py ...` (data parallel: each
process its own target and draft); results are gathered on the main process. With
--tp the launched processes instead hold one tensor-parallel target (tp_plan="auto")
and run every prompt together (--draft-tp: draft replicated or split too). The main
process shows the one progress bar and writes

    OUT/results.json   per-prompt tokens, seconds, tokens/s per method, acceptance
    OUT/eval.png       acceptance-length histogram + tokens/s per method

Each prompt is generated one at a time (batch 1) by every method, after one
warm-up generation per method.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


sys.path.insert(0, os.path.dirname(HERE))  # the repository root, for benchmarks.common
from benchmarks.common import (  # noqa: E402
    Timer, acceptance_length_histogram, aggregate_metrics, find_humaneval, metrics_dict, spec_available,
    valid_new_tokens,
)
sys.path.insert(0, HERE)
from eval_models import load_models  # noqa: E402


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
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--mode", choices=["greedy", "sample"], default="greedy")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--methods", default="plain,hf_specdec", help="comma list of plain, hf_specdec")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--tp", action="store_true",
                   help="one tensor-parallel target over the launched processes instead of one pair per process")
    p.add_argument("--draft-tp", type=int, default=1,
                   help="with --tp: 1 = the draft replicated on every process, N = split like the target")
    return p.parse_args(argv)


def load_prompts(args):
    from datasets import load_dataset

    path = args.data or find_humaneval(None)
    if path is None:
        raise SystemExit("no dataset: pass --data PATH")
    ds = load_dataset("json", data_files=path, split="train")
    if args.limit:
        ds = ds.select(range(min(args.limit, len(ds))))
    ids = ds[args.id_field] if args.id_field in ds.column_names else [str(i) for i in range(len(ds))]
    return path, [{"index": i, "id": str(ids[i]), "prompt": p} for i, p in enumerate(ds[args.prompt_field])]


def make_plot(rows, methods, k, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    spec = [r for r in rows if r.get("hf_specdec", {}).get("mean_acceptance_length") is not None]
    ax = axes[0]
    if spec:
        hist = [0.0] * (k + 1)
        have_hist = False
        for r in spec:
            h = r["hf_specdec"].get("acceptance_length_histogram")
            if h:
                have_hist = True
                for i, v in enumerate(h[: k + 1]):
                    hist[i] += v
        if have_hist:
            ax.bar(range(k + 1), hist, color="tab:blue")
            ax.set_xlabel("accepted draft tokens per round")
            ax.set_ylabel("rounds x sequences")
            ax.set_title(f"hf_specdec acceptance length (k={k})")
        else:
            ax.hist([r["hf_specdec"]["mean_acceptance_length"] for r in spec], bins=min(20, max(5, len(spec))))
            ax.set_xlabel("mean acceptance length per prompt")
            ax.set_ylabel("prompts")
            ax.set_title(f"hf_specdec mean acceptance length (k={k})")
    else:
        ax.text(0.5, 0.5, "no hf_specdec results", ha="center", va="center")
        ax.set_axis_off()
    ax = axes[1]
    data = [[r[m]["tokens_per_s"] for r in rows if m in r and r[m].get("tokens_per_s")] for m in methods]
    pos = list(range(len(methods)))
    if any(data):
        ax.boxplot([d if d else [0.0] for d in data], positions=pos, widths=0.5)
        for i, d in enumerate(data):
            ax.scatter([i] * len(d), d, s=8, alpha=0.5)
    ax.set_xticks(pos)
    ax.set_xticklabels(methods)
    ax.set_ylabel("tokens/s per prompt (batch 1)")
    ax.set_title("speed per method")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    from accelerate import PartialState
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm

    # On a machine without an accelerator, cpu=True lets torchrun / accelerate launch run gloo processes.
    state = PartialState(cpu=not torch.cuda.is_available())
    device = state.device
    dtype = torch.bfloat16 if (args.dtype == "auto" and device.type == "cuda") else (
        torch.float32 if args.dtype == "auto" else getattr(torch, args.dtype))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - {"plain", "hf_specdec"}
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}")
    if "hf_specdec" in methods:
        ok, why = spec_available()
        if not ok:
            raise SystemExit(f"hf_specdec is not available ({why}); run with --methods plain")

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
        spec = hf_specdec.SpecConfig(num_speculative_tokens=args.k, draft_tp=args.draft_tp if args.tp else None)
        return target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, spec_config=spec, **kw)

    def encode(text):
        enc = tok(text, return_tensors="pt", truncation=True, max_length=args.max_prompt_tokens)
        return enc["input_ids"].to(device), enc["attention_mask"].to(device)

    rows = []
    # --tp: every process runs every prompt (one sharded target); otherwise each runs its share
    with (contextlib.nullcontext(prompts) if args.tp else state.split_between_processes(prompts)) as shard:
        if shard:
            ids, mask = encode(shard[0]["prompt"])
            for m in methods:  # warm-up
                call(m, ids, mask)
        what = "" if args.tp or state.num_processes == 1 else f" (share of process 0 of {state.num_processes})"
        bar = tqdm(shard, desc="eval" + what, disable=not shard or not state.is_main_process, dynamic_ncols=True)
        for item in bar:
            ids, mask = encode(item["prompt"])
            row = {"index": item["index"], "id": item["id"], "prompt_tokens": int(ids.shape[1]),
                   "process": state.process_index}
            outs = {}
            for m in methods:
                torch.manual_seed(args.seed + item["index"])
                with Timer(device) as t:
                    out = call(m, ids, mask)
                new = valid_new_tokens(out.sequences[0].cpu(), ids.shape[1], tok.eos_token_id, tok.pad_token_id)
                outs[m] = new
                entry = {"new_tokens": len(new), "seconds": t.seconds,
                         "tokens_per_s": len(new) / t.seconds if t.seconds > 0 else None}
                sm = getattr(out, "spec_metrics", None)
                if sm is not None:
                    agg = aggregate_metrics([metrics_dict(sm)])
                    entry.update({"acceptance_rate": agg.get("acceptance_rate"),
                                  "mean_acceptance_length": agg.get("mean_acceptance_length"),
                                  "acceptance_length_histogram": acceptance_length_histogram(agg, args.k),
                                  "spec_metrics": metrics_dict(sm)})
                row[m] = entry
            if args.mode == "greedy" and "plain" in outs and "hf_specdec" in outs:
                row["identical_to_plain"] = outs["plain"] == outs["hf_specdec"]
            rows.append(row)
            if "hf_specdec" in row and row["hf_specdec"].get("mean_acceptance_length") is not None:
                bar.set_postfix(acc_len=f"{row['hf_specdec']['mean_acceptance_length']:.2f}")

    all_rows = rows if args.tp else gather_object(rows)
    if state.is_main_process:
        all_rows = sorted(all_rows, key=lambda r: r["index"])
        summary = {}
        for m in methods:
            vals = [r[m] for r in all_rows if m in r]
            tot_tok = sum(v["new_tokens"] for v in vals)
            tot_s = sum(v["seconds"] for v in vals)
            s = {"prompts": len(vals), "new_tokens": tot_tok, "seconds": tot_s,
                 "tokens_per_s": tot_tok / tot_s if tot_s else None,
                 "median_tokens_per_s_per_prompt": statistics.median(
                     [v["tokens_per_s"] for v in vals if v["tokens_per_s"]]) if vals else None}
            if m == "hf_specdec":
                agg = aggregate_metrics([v["spec_metrics"] for v in vals if v.get("spec_metrics")])
                s.update({"acceptance_rate": agg.get("acceptance_rate"),
                          "mean_acceptance_length": agg.get("mean_acceptance_length"),
                          "acceptance_length_histogram": acceptance_length_histogram(agg, args.k)})
            summary[m] = s
        if "plain" in summary and "hf_specdec" in summary and summary["plain"]["tokens_per_s"]:
            summary["speedup"] = summary["hf_specdec"]["tokens_per_s"] / summary["plain"]["tokens_per_s"]
        same = [r["identical_to_plain"] for r in all_rows if "identical_to_plain" in r]
        if same:
            summary["identical_to_plain_share"] = sum(same) / len(same)
        os.makedirs(args.out, exist_ok=True)
        report = {"data": os.path.abspath(data_path), "target": os.path.abspath(args.target),
                  "draft": os.path.abspath(args.draft), "num_processes": state.num_processes,
                  "parallel": "tensor" if args.tp else "data",
                  "device": str(device), "config": vars(args), "summary": summary, "rows": all_rows}
        with open(os.path.join(args.out, "results.json"), "w") as fh:
            json.dump(report, fh, indent=2, default=str)
        make_plot(all_rows, methods, args.k, os.path.join(args.out, "eval.png"))
        print(json.dumps(summary, indent=2, default=str))
    state.wait_for_everyone()


if __name__ == "__main__":
    main()
