#!/usr/bin/env python
"""Train a (target, draft) pair of Llama models that share one tokenizer.

Everything comes from local text: by default the Python source files of the
installed site-packages, split into train and held-out BY FILE with a
deterministic hash of each file's path relative to its source root.

Output layout (``--out DIR``)::

    DIR/target/           LlamaForCausalLM (safetensors) + tokenizer
    DIR/draft/            LlamaForCausalLM (safetensors) + tokenizer
    DIR/tokenizer/        the shared tokenizer alone
    DIR/heldout_prompts.jsonl   {"prompt", "source"} windows from held-out files
    DIR/summary.json      configs, parameter counts, tokens seen, held-out losses, timings

Both models are trained in ONE loop on the SAME packed batches (the draft's
step follows the target's on every batch), so they see identical data; the
draft is the cheaper of the two.  The loop stops when the shared wall-clock
budget (``--time-budget-s``, counted from the start of the script and covering
tokenizer training, data preparation, training, evaluation and saving) is
spent.  The learning rate follows a warmup + cosine schedule over the elapsed
training time rather than over a step count, so the schedule ends exactly
when the budget does whatever the machine's speed.

GPU (default)::

    python evals/build_pair.py --out runs/pair            # ~4 minutes on one H100

CPU smoke / tests::

    python evals/build_pair.py --tiny --out runs/tiny_pair

Requires torch, transformers, tokenizers (not ``datasets``). Data and tokenizer: ``pair_data.py``;
models and the training loop: ``pair_training.py``; this file: settings and the run, start to end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import site
import sys
import time
from dataclasses import asdict

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # pair_data, pair_training beside this file
from pair_data import (  # noqa: E402
    BOS, EOS, PAD, encode_docs, heldout_prompt_windows, list_source_files, split_and_read, train_tokenizer,
    wrap_tokenizer,
)
from pair_training import (  # noqa: E402
    GPU_DRAFT, GPU_TARGET, TINY_DRAFT, TINY_TARGET, _size_from_str, heldout_loss, make_model, make_optimizer,
    n_params, train_pair,
)


# --------------------------------------------------------------------------- #
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--tiny", action="store_true", help="small CPU-friendly pair (tests, README demo)")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu | cuda:N")
    p.add_argument("--source-dir", action="append", default=None,
                   help="directory of .py files (repeatable); default: site.getsitepackages()")
    p.add_argument("--max-bytes", type=float, default=None,
                   help="cap on train text bytes read (default 80e6; tiny 3e6)")
    p.add_argument("--heldout-frac", type=float, default=0.03, help="share of files held out (by path hash)")
    p.add_argument("--heldout-max-bytes", type=float, default=None, help="cap on held-out bytes (default 3e6; tiny 3e5)")
    p.add_argument("--tokenizer-bytes", type=float, default=None, help="bytes of train text for the tokenizer (default 20e6; tiny 1e6)")
    p.add_argument("--vocab-size", type=int, default=None, help="default 16384; tiny 1024")
    p.add_argument("--seq-len", type=int, default=None, help="training window (default 512; tiny 128)")
    p.add_argument("--batch-size", type=int, default=None, help="windows per step (default 32; tiny 16)")
    p.add_argument("--micro-batch-size", type=int, default=None, help="gradient-accumulation micro-batch (default = batch)")
    p.add_argument("--time-budget-s", type=float, default=None, help="total wall-clock budget (default 240; tiny 60)")
    p.add_argument("--reserve-s", type=float, default=None, help="budget kept for eval+save (default 20; tiny 4)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0 = time only)")
    p.add_argument("--min-steps", type=int, default=10, help="train at least this many steps")
    p.add_argument("--target-lr", type=float, default=None, help="peak LR of the target (default 4e-4; tiny 1.5e-3)")
    p.add_argument("--draft-lr", type=float, default=None, help="peak LR of the draft (default 1.5e-3; tiny 5e-3)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=None, help="default 50; tiny 10")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--target-size", type=_size_from_str, default=None, help="hidden,layers,intermediate,heads,kv_heads")
    p.add_argument("--draft-size", type=_size_from_str, default=None, help="hidden,layers,intermediate,heads,kv_heads")
    p.add_argument("--eval-tokens", type=int, default=None, help="held-out tokens for the loss (default 262144; tiny 32768)")
    p.add_argument("--num-heldout-prompts", type=int, default=64)
    p.add_argument("--save-dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="dtype of the saved weights (default bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--compile", action="store_true", help="torch.compile the models for training (off by default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every-s", type=float, default=10.0)
    args = p.parse_args(argv)

    tiny = args.tiny
    defaults = dict(
        max_bytes=3e6 if tiny else 80e6,
        heldout_max_bytes=3e5 if tiny else 3e6,
        tokenizer_bytes=1e6 if tiny else 20e6,
        vocab_size=1024 if tiny else 16384,
        seq_len=128 if tiny else 512,
        batch_size=16 if tiny else 32,
        time_budget_s=60.0 if tiny else 240.0,
        reserve_s=4.0 if tiny else 20.0,
        target_lr=1.5e-3 if tiny else 4e-4,
        draft_lr=5e-3 if tiny else 1.5e-3,
        warmup_steps=10 if tiny else 50,
        target_size=TINY_TARGET if tiny else GPU_TARGET,
        draft_size=TINY_DRAFT if tiny else GPU_DRAFT,
        eval_tokens=32768 if tiny else 262144,
    )
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def main(argv=None):
    t_start = time.perf_counter()
    args = parse_args(argv)
    deadline_total = t_start + args.time_budget_s

    def log(msg):
        print(f"[build_pair {time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif "OMP_NUM_THREADS" not in os.environ:  # torch follows it where set (the test suite's workers ask for one
        torch.set_num_threads(max(1, os.cpu_count() or 1))  # each: every core's threads made the tiny build 4x slower)
    autocast_dtype = torch.bfloat16 if device.type == "cuda" else None
    save_dtype = getattr(torch, args.save_dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    timings = {}

    # ---- data -------------------------------------------------------------
    source_dirs = args.source_dir or [d for d in site.getsitepackages() if os.path.isdir(d)]
    log(f"device {device}; sources {source_dirs}")
    t = time.perf_counter()
    files = list_source_files(source_dirs)
    train_files, heldout_files = split_and_read(
        files, int(args.max_bytes), args.heldout_frac, int(args.heldout_max_bytes), args.seed
    )
    train_bytes = sum(len(x[1].encode("utf-8")) for x in train_files)
    heldout_bytes = sum(len(x[1].encode("utf-8")) for x in heldout_files)
    timings["read_s"] = time.perf_counter() - t
    log(f"read {len(train_files)} train files ({train_bytes/1e6:.1f} MB), {len(heldout_files)} held-out files "
        f"({heldout_bytes/1e6:.2f} MB) of {len(files)} candidates in {timings['read_s']:.1f}s")

    t = time.perf_counter()
    tok_texts, acc = [], 0
    for _rel, text in train_files:
        if acc >= args.tokenizer_bytes:
            break
        tok_texts.append(text)
        acc += len(text)
    raw_tok = train_tokenizer(tok_texts, args.vocab_size)
    vocab_size = raw_tok.get_vocab_size()
    ids = {"pad": raw_tok.token_to_id(PAD), "bos": raw_tok.token_to_id(BOS), "eos": raw_tok.token_to_id(EOS)}
    timings["tokenizer_s"] = time.perf_counter() - t
    log(f"tokenizer: byte-level BPE, vocab {vocab_size}, trained on {acc/1e6:.1f} MB in {timings['tokenizer_s']:.1f}s")

    t = time.perf_counter()
    train_ids = encode_docs(raw_tok, [x[1] for x in train_files], ids["eos"])
    heldout_ids = encode_docs(raw_tok, [x[1] for x in heldout_files], ids["eos"])
    L = args.seq_len + 1
    n_train = len(train_ids) // L
    train_windows = train_ids[: n_train * L].reshape(n_train, L)
    n_eval = min(len(heldout_ids) // L, max(1, args.eval_tokens // args.seq_len))
    eval_windows = heldout_ids[: n_eval * L].reshape(n_eval, L)
    timings["encode_s"] = time.perf_counter() - t
    log(f"encoded {len(train_ids)/1e6:.2f}M train tokens ({train_bytes/max(len(train_ids),1):.2f} bytes/token), "
        f"{len(heldout_ids)/1e6:.3f}M held-out tokens; {n_train} train windows, {n_eval} eval windows of {args.seq_len} "
        f"in {timings['encode_s']:.1f}s")
    if n_train < 1 or n_eval < 1:
        raise SystemExit("not enough tokens for one training / eval window; raise --max-bytes or lower --seq-len")

    prompts = heldout_prompt_windows(heldout_files, args.num_heldout_prompts, args.seed)
    with open(os.path.join(args.out, "heldout_prompts.jsonl"), "w") as fh:
        for row in prompts:
            fh.write(json.dumps(row) + "\n")
    with open(os.path.join(args.out, "split.json"), "w") as fh:
        json.dump({"train": [x[0] for x in train_files], "heldout": [x[0] for x in heldout_files]}, fh)

    tokenizer = wrap_tokenizer(raw_tok, model_max_length=4096)
    tokenizer.save_pretrained(os.path.join(args.out, "tokenizer"))

    # ---- models -----------------------------------------------------------
    max_pos = 4096
    target = make_model(args.target_size, vocab_size, ids, max_pos, device)
    draft = make_model(args.draft_size, vocab_size, ids, max_pos, device)
    p_target, p_draft = n_params(target), n_params(draft)
    log(f"target {asdict(args.target_size)} {p_target/1e6:.1f}M params; "
        f"draft {asdict(args.draft_size)} {p_draft/1e6:.1f}M params (ratio {p_target/p_draft:.1f}x)")
    opts = [make_optimizer(m, lr, args.weight_decay, device) for m, lr in ((target, args.target_lr), (draft, args.draft_lr))]
    train_models = [target, draft]
    if args.compile:
        train_models = [torch.compile(m) for m in train_models]

    # ---- train ------------------------------------------------------------
    deadline = deadline_total - args.reserve_s
    t = time.perf_counter()
    log(f"training both models on the same batches of {args.batch_size}x{args.seq_len} tokens "
        f"for {max(0.0, deadline - t):.0f}s")
    while True:
        try:
            steps, tokens_seen, last = train_pair(
                train_models, opts, [args.target_lr, args.draft_lr], train_windows, args, device, autocast_dtype,
                deadline, log,
            )
            break
        except torch.OutOfMemoryError:
            micro = args.micro_batch_size or args.batch_size
            if micro <= 1:
                raise
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            args.micro_batch_size = micro // 2
            log(f"out of memory: micro-batch {micro} -> {args.micro_batch_size} (gradient accumulation)")
    timings["train_s"] = time.perf_counter() - t
    log(f"trained {steps} steps, {tokens_seen/1e6:.2f}M tokens per model in {timings['train_s']:.1f}s "
        f"(epochs over train data: {tokens_seen/max(train_windows.size,1):.2f})")

    # ---- eval -------------------------------------------------------------
    t = time.perf_counter()
    eval_bs = max(1, (args.micro_batch_size or args.batch_size))
    loss_target = heldout_loss(target, eval_windows, eval_bs, device, autocast_dtype)
    loss_draft = heldout_loss(draft, eval_windows, eval_bs, device, autocast_dtype)
    timings["eval_s"] = time.perf_counter() - t
    log(f"held-out loss: target {loss_target:.4f} (ppl {math.exp(loss_target):.2f}), "
        f"draft {loss_draft:.4f} (ppl {math.exp(loss_draft):.2f}) over {eval_windows.shape[0]*args.seq_len} tokens")
    target_better = loss_target < loss_draft
    if not target_better:
        log("WARNING: the target is NOT better than the draft on held-out text; train longer (--time-budget-s)")

    # ---- save -------------------------------------------------------------
    t = time.perf_counter()
    for name, model in (("target", target), ("draft", draft)):
        path = os.path.join(args.out, name)
        model.to(save_dtype)
        model.config.use_cache = True
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    timings["save_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t_start

    summary = {
        "out": os.path.abspath(args.out),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "tiny": args.tiny,
        "sources": source_dirs,
        "train_files": len(train_files),
        "heldout_files": len(heldout_files),
        "train_bytes": train_bytes,
        "heldout_bytes": heldout_bytes,
        "train_tokens_available": int(len(train_ids)),
        "heldout_tokens_available": int(len(heldout_ids)),
        "bytes_per_token": train_bytes / max(len(train_ids), 1),
        "vocab_size": vocab_size,
        "special_token_ids": ids,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "micro_batch_size": args.micro_batch_size or args.batch_size,
        "steps": steps,
        "tokens_seen_per_model": tokens_seen,
        "target": {"size": asdict(args.target_size), "params": p_target, "lr": args.target_lr,
                   "heldout_loss": loss_target, "last_train_loss": last[0]},
        "draft": {"size": asdict(args.draft_size), "params": p_draft, "lr": args.draft_lr,
                  "heldout_loss": loss_draft, "last_train_loss": last[1]},
        "eval_tokens": int(eval_windows.shape[0] * args.seq_len),
        "target_better": bool(target_better),
        "save_dtype": str(save_dtype).replace("torch.", ""),
        "num_heldout_prompts": len(prompts),
        "timings": timings,
        "time_budget_s": args.time_budget_s,
        "argv": sys.argv[1:] if argv is None else list(argv),
    }
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=2)
    log(f"saved to {args.out} (total {timings['total_s']:.1f}s; budget {args.time_budget_s:.0f}s)")
    print(json.dumps({"heldout_loss_target": loss_target, "heldout_loss_draft": loss_draft,
                      "target_better": target_better}))
    return summary


if __name__ == "__main__":
    main()
