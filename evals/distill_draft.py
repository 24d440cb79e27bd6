#!/usr/bin/env python
"""Distil a reduced-vocabulary draft from a target (Gemma 3 270M) on local text, save it, measure it.

    python evals/distill_draft.py --target runs/gemma3-270m --out runs/gemma-draft            # GPU, ~7 min
    python evals/distill_draft.py --target runs/gemma3-270m --out runs/gemma-draft --eval-only --compile

Steps: read local Python source (train / held-out split by file, as build_pair.py); count the
target's own next-token probability mass over training windows and keep the ``--num-kept`` most
frequent tokens (special tokens always); build a draft of ``--layers`` of the target's layers with
the target's embedding and a reduced head (``evals/distill_model.py``); distil it on the target's
logits over the kept tokens for ``--max-minutes`` (bf16 autocast on GPU); save it as safetensors
(``hf_specdec.reduced_vocab_io``; the embedding is the target's and is not stored); load it back
and measure held-out acceptance and the cost per step of both models (``evals/distill_eval.py``).

Output: ``OUT/draft/`` (load with ``load_reduced_draft(OUT/draft, target=target)``),
``OUT/summary.json``, ``OUT/heldout_prompts.jsonl`` (the held-out prompts, for ``evals/run_eval.py --data``);
a short summary is printed last. Nothing is downloaded (HF_HUB_OFFLINE=1).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import sys
import time
from pathlib import Path

import torch

EVALS = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [EVALS, os.path.dirname(EVALS)]  # these evals, and this checkout's hf_specdec over an installed one
import distill_data as data  # noqa: E402
import distill_eval as ev  # noqa: E402
import distill_model as dm  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="directory of the target model and tokenizer (from_pretrained)")
    p.add_argument("--out", required=True, help="output directory (OUT/draft, OUT/summary.json)")
    p.add_argument("--num-kept", type=int, default=32768, help="kept output tokens (special tokens included)")
    p.add_argument("--layers", type=int, default=4, help="the draft keeps the target's first N layers")
    p.add_argument("--layer-indices", default=None, help="which target layers, e.g. 0,1,2,17 (overrides --layers)")
    p.add_argument("--max-minutes", type=float, default=5.0, help="training wall-clock budget")
    p.add_argument("--total-minutes", type=float, default=None,
                   help="whole-run budget: training is cut short to leave --eval-reserve-s for evaluation")
    p.add_argument("--eval-reserve-s", type=float, default=150.0)
    p.add_argument("--max-steps", type=int, default=0, help="train exactly this many steps instead (0: time only)")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=16, help="windows per training step")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--source-dir", action="append", default=None, help="repeatable; default: site-packages")
    p.add_argument("--max-bytes", type=float, default=20e6, help="train text bytes read")
    p.add_argument("--heldout-frac", type=float, default=0.03)
    p.add_argument("--heldout-max-bytes", type=float, default=3e6)
    p.add_argument("--count-windows", type=int, default=512, help="training windows the token counts come from")
    p.add_argument("--count-batch", type=int, default=4, help="windows per counting / held-out forward")
    p.add_argument("--heldout-windows", type=int, default=16, help="held-out windows for the per-token metrics")
    p.add_argument("--eval-prompts", type=int, default=32)
    p.add_argument("--eval-prompt-tokens", type=int, default=256)
    p.add_argument("--eval-new-tokens", type=int, default=96)
    p.add_argument("--eval-batch", type=int, default=8)
    p.add_argument("--k", type=int, default=4, help="draft tokens per round in the acceptance runs")
    p.add_argument("--cost-batches", default="1,8", help="batch sizes of the per-step cost")
    p.add_argument("--cost-context", type=int, default=256, help="tokens in the cache when a step is timed")
    p.add_argument("--compile", action="store_true", help="GPU: evaluate on the compiled runner (slow warm-up)")
    p.add_argument("--eval-only", action="store_true", help="load OUT/draft instead of building and training")
    p.add_argument("--no-eval", action="store_true", help="stop after saving the draft")
    p.add_argument("--save-dtype", default=None, choices=["float32", "bfloat16"],
                   help="default bfloat16 on cuda, float32 on cpu")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu | cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every-s", type=float, default=15.0)
    return p.parse_args(argv)


def load_target(path: str, device: torch.device):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tok.padding_side = "left"
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).to(device)
    if device.type == "cuda":
        target = target.to(torch.bfloat16)  # teacher and evaluated target: as served
    for p in target.parameters():
        p.requires_grad_(False)
    return target.eval(), tok


def build_and_train(args, target, tok, train_windows, device, autocast_dtype, log) -> tuple[object, dict]:
    from hf_specdec.reduced_vocab_io import save_reduced_draft

    info = {}
    t = time.perf_counter()
    counts = data.target_token_mass(target, train_windows[: args.count_windows], args.count_batch, device,
                                    autocast_dtype)
    always = data.special_ids(tok, target.config.get_text_config())
    kept = data.choose_kept(counts["mass"], args.num_kept, always)
    share = float(counts["mass"][kept].sum() / counts["mass"].sum())
    info["kept"] = {"num_kept": len(kept), "special_ids": always, "count_positions": counts["positions"],
                    "target_mass_on_kept_train": share, "count_seconds": time.perf_counter() - t}
    log(f"kept {len(kept)} tokens: {share:.4f} of the target's mass on {counts['positions']} training positions")
    num_layers = target.config.get_text_config().num_hidden_layers
    layers = (dm.parse_layers(args.layer_indices, num_layers) if args.layer_indices
              else dm.pick_layers(num_layers, args.layers))
    draft = dm.draft_from_target(target, kept, layers)
    info["layers"] = layers
    info["init_heldout"] = None
    if not args.no_eval:
        info["init_heldout"] = ev.token_metrics(target, draft, args.heldout, kept, args.count_batch, device,
                                                autocast_dtype)
        log(f"before training: {fmt(info['init_heldout'])}")
    args.train_seconds = args.max_minutes * 60.0
    if args.total_minutes is not None:
        left = args.total_minutes * 60.0 - (time.perf_counter() - args.start) - args.eval_reserve_s
        args.train_seconds = max(10.0, min(args.train_seconds, left))
    log(f"training for {args.train_seconds:.0f}s" if not args.max_steps else f"training {args.max_steps} steps")
    info["train"] = dm.train(draft, target, kept, train_windows, args, device, autocast_dtype, log)
    log(f"trained {info['train']['steps']} steps in {info['train']['seconds']:.0f}s, loss "
        f"{info['train']['first_loss']} -> {info['train']['last_loss']}")
    save_dtype = getattr(torch, args.save_dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    save_reduced_draft(draft, Path(args.out) / "draft", target=target, tokenizer=tok, dtype=save_dtype)
    return draft, info


def fmt(metrics: dict) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))


def evaluate(args, target, draft, tok, heldout_texts, device, autocast_dtype, log) -> dict:
    import hf_specdec

    hf_specdec.enable(target)
    kept = draft.get_output_embeddings().token_ids
    res = {"heldout": ev.token_metrics(target, draft, args.heldout, kept, args.count_batch, device, autocast_dtype)}
    log(f"held-out tokens: {fmt(res['heldout'])}")
    prompts = data.eval_prompts(tok, heldout_texts, args.eval_prompts, args.eval_prompt_tokens, args.seed)
    data.write_prompts(Path(args.out) / "heldout_prompts.jsonl", prompts)  # for evals/run_eval.py --data
    spec_kwargs = {"compile": args.compile} if device.type == "cuda" else {}
    res["prompts"] = len(prompts)
    for mode in ("greedy", "sample"):
        torch.manual_seed(args.seed)
        res[mode] = ev.spec_acceptance(target, draft, tok, prompts, mode, args.k, args.eval_batch,
                                       args.eval_new_tokens, spec_kwargs)
        log(f"{mode}: acceptance {res[mode]['acceptance_rate']:.3f}, mean length "
            f"{res[mode]['mean_acceptance_length']:.2f}, path {res[mode]['fast_path']}")
    res["cost"] = {"bytes_per_step": {"target": ev.read_bytes(target), "draft": ev.read_bytes(draft)}}
    for b in [int(x) for x in args.cost_batches.split(",")]:
        row = {name: ev.eager_step_ms(m, b, args.cost_context) for name, m in (("target", target), ("draft", draft))}
        if device.type == "cuda":
            try:
                stages = ev.runner_stage_ms(target, draft, tok, prompts, b, args.k, spec_kwargs)
                row["runner_target_step"], row["runner_draft_step"] = stages["target_step"], stages["draft_step"]
                row["runner_stages"] = stages
            except Exception as err:  # the cost table must not lose the acceptance figures
                row["runner_error"] = f"{type(err).__name__}: {err}"
        res["cost"][f"batch{b}"] = row
        log(f"cost b={b}: {row}")
    return res


def summary_lines(s: dict) -> list[str]:
    lines = [f"device {s['device']}; target {s['target']}; draft layers {s.get('layers')} of "
             f"{s['target_layers']}, kept {s['num_kept']} of {s['vocab_size']} tokens"]
    if s.get("train"):
        t = s["train"]
        lines.append(f"train: {t['steps']} steps, {t['tokens']} tokens, {t['seconds']:.0f}s, "
                     f"KL {t['first_loss']} -> {t['last_loss']}")
    e = s.get("eval")
    if e:
        if s.get("init_heldout"):
            lines.append(f"held-out, untrained draft: {fmt(s['init_heldout'])}")
        lines.append(f"held-out, distilled draft: {fmt(e['heldout'])}")
        for mode in ("greedy", "sample"):
            m = e[mode]
            same = f", identical rows {m['identical_rows']}/{m['rows']}" if "identical_rows" in m else ""
            lines.append(f"{mode} k={m['k']} on {m['rows']} prompts: acceptance {m['acceptance_rate']:.3f}, "
                         f"mean length {m['mean_acceptance_length']:.2f}{same} ({m['fast_path']})")
        c = e["cost"]
        ratio = c["bytes_per_step"]["draft"] / c["bytes_per_step"]["target"]
        lines.append(f"weights read per step: draft {c['bytes_per_step']['draft'] / 1e6:.1f} MB, target "
                     f"{c['bytes_per_step']['target'] / 1e6:.1f} MB ({ratio:.3f})")
        for key, row in c.items():
            if key.startswith("batch"):
                text = f"ms per step at {key}: eager draft {row['draft']:.3f} / target {row['target']:.3f} " \
                       f"({row['draft'] / row['target']:.3f})"
                if "runner_draft_step" in row:
                    d, t = row["runner_draft_step"], row["runner_target_step"]
                    text += f"; runner graphs draft {d:.3f} / target {t:.3f} ({d / t:.3f})"
                lines.append(text + (f"; runner error {row['runner_error']}" if "runner_error" in row else ""))
                if "runner_stages" in row:
                    lines.append(f"  ideal speedup over plain runner decoding at {key}: " + ", ".join(
                        f"{mode} {ideal_speedup(e[mode]['acceptance_rate'], e[mode]['k'], row['runner_stages']):.2f}x"
                        for mode in ("greedy", "sample")))
    return lines


def ideal_speedup(alpha: float, k: int, stages: dict) -> float:
    """E * target_step / (propose + verify_and_commit), E = (1 - alpha^(k+1)) / (1 - alpha): docs/end_to_end.md's
    ``ideal`` (a round costing exactly its measured pieces; plain decoding one target step per token)."""
    expected = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return expected * stages["target_step"] / stages["round"]


def main(argv=None) -> dict:
    args = parse_args(argv)
    start = args.start = time.perf_counter()

    def log(msg):
        print(f"[distill {time.perf_counter() - start:6.1f}s] {msg}", flush=True)

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    autocast_dtype = torch.bfloat16 if device.type == "cuda" else None
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target, tok = load_target(args.target, device)
    cfg = target.config.get_text_config()
    train_texts, heldout_texts = data.read_texts(args.source_dir, args.max_bytes, args.heldout_frac,
                                                 args.heldout_max_bytes, args.seed)
    args.heldout = data.pack_windows(tok, [t for _, t in heldout_texts], args.seq_len, args.heldout_windows)
    log(f"device {device}; {len(train_texts)} train / {len(heldout_texts)} held-out files")
    s = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "target": args.target,
         "target_layers": cfg.num_hidden_layers, "vocab_size": cfg.vocab_size, "num_kept": args.num_kept,
         "args": {k: v for k, v in vars(args).items() if k not in ("heldout", "start")}}
    if args.eval_only:
        from hf_specdec.reduced_vocab_io import load_reduced_draft

        draft = load_reduced_draft(out / "draft", target=target)
        s["num_kept"] = draft.get_output_embeddings().num_kept
    else:
        train_windows = data.pack_windows(tok, [t for _, t in train_texts], args.seq_len)
        log(f"{train_windows.shape[0]} training windows of {args.seq_len} tokens")
        draft, info = build_and_train(args, target, tok, train_windows, device, autocast_dtype, log)
        s.update(info)
        s["num_kept"] = info["kept"]["num_kept"]
        from hf_specdec.reduced_vocab_io import load_reduced_draft

        draft = load_reduced_draft(out / "draft", target=target)  # measure what was saved
    if not args.no_eval:
        s["eval"] = evaluate(args, target, draft, tok, heldout_texts, device, autocast_dtype, log)
    s["seconds"] = time.perf_counter() - start
    (out / "summary.json").write_text(json.dumps(s, indent=2, default=str) + "\n")
    print("\n".join(["== distill summary =="] + summary_lines(s)), flush=True)
    return s


if __name__ == "__main__":
    main()
