#!/usr/bin/env python
"""Train an EAGLE-style draft head (``hf_specdec.DraftHead``) for the target of a pair built by build_pair.py.

    python evals/train_draft_head.py --pair runs/pair --out runs/pair/head --time-budget-s 120   # GPU
    python evals/train_draft_head.py --pair runs/tiny-pair --out /tmp/head --time-budget-s 20   # CPU smoke
    python evals/train_draft_head.py --target DIR --tokenizer DIR --out DIR [--tiny] [--source-dir D]

Data: the pair's own training text. With ``--pair`` the files are the ones its ``split.json`` lists (train and
held-out by file hash, as build_pair.py chose them), read from the source directories its ``summary.json``
records and tokenized with the pair's tokenizer, so the token stream is the one the target was trained on (the
summary says whether the token count matches the pair's). Without a pair the split is redone with build_pair's
settings (``pair_data.split_and_read``, build_pair's defaults, ``--tiny`` aware).

Objective (EAGLE-1). For a window t_0..t_{T-1} the frozen target (eval mode, no grad) gives features f (its
last hidden state after the final norm) and logits. Head position i reads (f_i, t_{i+1}), i = 0..T-2, and gives
g_i and logits_i; the loss is ``smooth_l1(g_i, f_{i+1}) + w * CE(logits_i, softmax(target logits_{i+1}))``.
w = 0.1 as in EAGLE: the feature loss carries most of the signal and is what later draft steps read, so it
dominates (``--ce-weight``). ``--ttt-steps S`` (EAGLE-3's training-time test): S unrolled steps, step s
reading the head's own g of step s-1 as a draft step does; the loss averages over them.
``--kept-vocab N``: the head's own output layer over the N most frequent training tokens (CE over those, the
target's logits computed for those tokens alone). ``--hidden-size h``: a narrow head (``DraftHead.for_target``),
whose ``up`` output is what the feature loss compares with f_{i+1}; it trains its logits as the target's rows over
``up(g)`` and folds them into its own output layer at the end (``DraftHead.fold_output_layer``). The loss and the
metrics below: ``head_objective.py``.

Schedule: AdamW, warmup + cosine over the elapsed share of the wall-clock budget (as pair_training.py), bf16
autocast on GPU (weights in fp32), fp32 on CPU; ``--reserve-s`` of the budget is kept for evaluation and saving.

Evaluation on held-out windows, for the trained head and for an untrained one of the same init seed:
``top1`` -- the head's argmax at position i equals the target's argmax at i+1 (first-draft acceptance proxy);
``accepted_len_k`` -- prompts of ``--prompt-len`` tokens, the head drafts k tokens greedily from its own g
(plain tensors, full recompute), the target's greedy continuation is the reference, and the number of leading
matches is averaged (expected accepted drafts per round at k).

Output: the head (``save_draft_head``: ``load_draft_head(out, target=target)``) and ``out/summary.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import site
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # build_pair, pair_data, pair_training
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # hf_specdec, not installed
import build_pair  # noqa: E402
from pair_data import encode_docs, list_source_files, split_and_read  # noqa: E402
from head_objective import evaluate, head_loss, target_outputs, teacher_layer  # noqa: E402
from pair_training import make_optimizer  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", help="a pair directory built by evals/build_pair.py (target/, tokenizer/, summary.json)")
    p.add_argument("--target", help="target model directory (instead of --pair; needs --tokenizer)")
    p.add_argument("--tokenizer", help="tokenizer directory (with --target)")
    p.add_argument("--out", required=True, help="output directory of the head and its summary.json")
    p.add_argument("--tiny", action="store_true", help="CPU-sized defaults (implied by a --tiny pair)")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu | cuda:N")
    p.add_argument("--source-dir", action="append", default=None, help="override the pair's source directories")
    p.add_argument("--time-budget-s", type=float, default=None, help="total wall-clock budget (default 120; tiny 20)")
    p.add_argument("--reserve-s", type=float, default=None, help="budget kept for eval+save (default 15; tiny 3)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0 = time only)")
    p.add_argument("--min-steps", type=int, default=5, help="train at least this many steps")
    p.add_argument("--seq-len", type=int, default=None, help="training window (default: the pair's)")
    p.add_argument("--batch-size", type=int, default=None, help="windows per step (default 32; tiny 16)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 1e-3; tiny 3e-3)")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup-steps", type=int, default=None, help="default 50; tiny 10")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--ce-weight", type=float, default=0.1, help="w of the distribution-matching loss")
    p.add_argument("--ttt-steps", type=int, default=1, help="steps of the training-time test: the head also reads "
                   "its own g, 1 to 4 (1: EAGLE-1)")
    p.add_argument("--num-layers", type=int, default=1, help="decoder layers of the head")
    p.add_argument("--intermediate-size", type=int, default=None, help="MLP size of the head (default: target's)")
    p.add_argument("--hidden-size", type=int, default=None, help="a narrow head's width, a multiple of the target's "
                   "head_dim (default: the target's; narrower: an output layer of its own, --kept-vocab or all tokens)")
    p.add_argument("--kept-vocab", type=int, default=0, help="an output layer of the head's own over the N most "
                   "frequent training tokens (0: the target's, whole vocabulary)")
    p.add_argument("--k", type=int, default=4, help="draft length of the accepted-length metric")
    p.add_argument("--eval-windows", type=int, default=None, help="held-out windows for top1 (default 128; tiny 16)")
    p.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts for accepted_len (default 256; tiny 32)")
    p.add_argument("--prompt-len", type=int, default=64, help="tokens per accepted-length prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every-s", type=float, default=10.0)
    args = p.parse_args(argv)
    if bool(args.pair) == bool(args.target):
        p.error("pass either --pair DIR (a build_pair.py output) or --target DIR --tokenizer DIR, not both/neither")
    if args.target and not args.tokenizer:
        p.error(f"--target {args.target} needs --tokenizer DIR (the tokenizer the target was trained with)")
    return args


def _fail(msg):
    raise SystemExit(f"train_draft_head: {msg}")


def _need_dir(flag, path, what, fix):
    if not os.path.isfile(os.path.join(path, what)):
        _fail(f"{flag} {path}: {os.path.join(path, what)} not found; {fix}")


def resolve_inputs(args):
    """Target and tokenizer directories, the pair's summary/split (or None) and build_pair's data settings."""
    fix = f"build one with: python evals/build_pair.py --out {args.pair}"
    summary = split = None
    if args.pair:
        if not os.path.isdir(args.pair):
            _fail(f"--pair {args.pair}: no such directory; {fix}")
        target_dir, tok_dir = os.path.join(args.pair, "target"), os.path.join(args.pair, "tokenizer")
        for sub in (target_dir, tok_dir):
            _need_dir("--pair", sub, "config.json" if sub == target_dir else "tokenizer.json", fix)
        _need_dir("--pair", args.pair, "summary.json", fix)
        summary = json.load(open(os.path.join(args.pair, "summary.json")))
        split_file = os.path.join(args.pair, "split.json")
        split = json.load(open(split_file)) if os.path.isfile(split_file) else None
        settings = build_pair.parse_args(summary.get("argv") or ["--out", args.pair] + ["--tiny"] * summary["tiny"])
        sources = summary.get("sources")
    else:
        target_dir, tok_dir = args.target, args.tokenizer
        _need_dir("--target", target_dir, "config.json", "pass a saved model directory (save_pretrained)")
        _need_dir("--tokenizer", tok_dir, "tokenizer.json", "pass a saved fast tokenizer directory")
        settings = build_pair.parse_args(["--out", "-"] + ["--tiny"] * args.tiny)
        sources = None
    sources = args.source_dir or sources or [d for d in site.getsitepackages() if os.path.isdir(d)]
    for d in sources:
        if not os.path.isdir(d):
            _fail(f"source directory {d} (from {'--source-dir' if args.source_dir else 'the pair summary'}) does "
                  "not exist; pass the directory the pair was trained on with --source-dir")
    return target_dir, tok_dir, summary, split, settings, sources


def read_texts(sources, split, settings):
    """(train texts, held-out texts): the pair's split.json files if there is one, else build_pair's split."""
    if split is None:
        train, heldout = split_and_read(list_source_files(sources), int(settings.max_bytes), settings.heldout_frac,
                                        int(settings.heldout_max_bytes), settings.seed)
        return [t for _, t in train], [t for _, t in heldout], 0
    paths = {rel: full for rel, full, _ in list_source_files(sources)}
    missing = 0

    def read(rels):
        nonlocal missing
        out = []
        for rel in rels:
            try:
                with open(paths[rel], "rb") as fh:
                    out.append(fh.read().decode("utf-8"))
            except (KeyError, OSError, UnicodeDecodeError):
                missing += 1
        return out

    train, heldout = read(split["train"]), read(split["heldout"])
    if not train or not heldout:
        _fail(f"none of the pair's split.json files were found under {sources}; pass the pair's source "
              "directories with --source-dir")
    return train, heldout, missing


def windows(ids, length, limit=None):
    n = len(ids) // length if limit is None else min(len(ids) // length, limit)
    return ids[: n * length].reshape(n, length)


def lr_at(args, step, frac):
    warm = min(1.0, (step + 1) / args.warmup_steps)
    return args.lr * warm * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def train_head(head, target, train_windows, args, device, autocast, deadline, log):
    opt = make_optimizer(head, args.lr, args.weight_decay, device)
    rng = np.random.default_rng(args.seed)
    order, pos, step, tokens = rng.permutation(len(train_windows)), 0, 0, 0
    t0 = last_log = time.perf_counter()
    span, first, last = max(deadline - t0, 1e-3), None, None
    kept = teacher_layer(target, head)  # a reduced head: the target's logits over its tokens only
    through = kept if head.up is not None else None  # a narrow head: logits through up and the target's rows
    head.train()
    while True:
        now = time.perf_counter()
        if (now >= deadline and step >= args.min_steps) or (args.max_steps and step >= args.max_steps):
            break
        frac = max(min(1.0, (now - t0) / span), step / args.max_steps if args.max_steps else 0.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(args, step, frac)
        if pos + args.batch_size > len(order):
            order, pos = rng.permutation(len(train_windows)), 0
        idx = order[pos : pos + args.batch_size]
        pos += args.batch_size
        ids = torch.from_numpy(train_windows[idx].astype(np.int64)).to(device)
        f, logits_t = target_outputs(target, ids, autocast, kept)
        loss, feat, ce = head_loss(head, ids, f, logits_t, args.ce_weight, autocast, args.ttt_steps, through)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens += ids.shape[0] * (ids.shape[1] - 1)
        last = {"loss": float(loss.detach()), "feature_loss": float(feat), "ce": float(ce)}
        first = first or last
        now = time.perf_counter()
        if now - last_log >= args.log_every_s or step == 1:
            log(f"  step {step:5d}  loss {last['loss']:.4f}  feat {last['feature_loss']:.4f}  ce {last['ce']:.3f}  "
                f"lr {opt.param_groups[0]['lr']:.2e}  {tokens / (now - t0):,.0f} tok/s")
            last_log = now
    head.eval()
    if through is not None:
        head.fold_output_layer(through)  # its own output layer: what training computed, one narrow matmul
    return {"steps": step, "tokens_seen": tokens, "first": first, "last": last, "train_s": time.perf_counter() - t0}


def set_defaults(args, summary, settings):
    tiny = args.tiny or bool(summary and summary.get("tiny"))
    defaults = dict(time_budget_s=20.0 if tiny else 120.0, reserve_s=3.0 if tiny else 15.0,
                    batch_size=16 if tiny else 32, lr=3e-3 if tiny else 1e-3, warmup_steps=10 if tiny else 50,
                    eval_windows=16 if tiny else 128, eval_prompts=32 if tiny else 256,
                    seq_len=(summary or {}).get("seq_len") or settings.seq_len)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.tiny = tiny
    if not 1 <= args.ttt_steps <= 4 or args.ttt_steps > max(1, args.seq_len - 2):
        _fail(f"--ttt-steps {args.ttt_steps}: need 1 to 4, and at most --seq-len - 2 ({args.seq_len - 2})")
    if args.k < 1 or args.prompt_len < 2 or args.seq_len < 2:
        _fail(f"--k {args.k} / --prompt-len {args.prompt_len} / --seq-len {args.seq_len}: need k >= 1 and "
              "lengths >= 2")


def main(argv=None):
    t_start = time.perf_counter()
    args = parse_args(argv)

    def log(msg):
        print(f"[train_draft_head {time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_specdec import DraftHead, save_draft_head

    target_dir, tok_dir, summary, split, settings, sources = resolve_inputs(args)
    set_defaults(args, summary, settings)
    deadline_total = t_start + args.time_budget_s
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    timings = {}
    t = time.perf_counter()
    train_texts, heldout_texts, missing = read_texts(sources, split, settings)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    backend = tok.backend_tokenizer  # with the BOS post-processor, as build_pair.py encoded
    train_ids = encode_docs(backend, train_texts, tok.eos_token_id)
    heldout_ids = encode_docs(backend, heldout_texts, tok.eos_token_id)
    train_windows = windows(train_ids, args.seq_len)
    eval_windows = windows(heldout_ids, args.seq_len, args.eval_windows)
    prompt_windows = windows(heldout_ids[len(eval_windows) * args.seq_len:], args.prompt_len, args.eval_prompts)
    if len(prompt_windows) < 1:  # few held-out tokens: overlap the top-1 windows rather than fail
        prompt_windows = windows(heldout_ids, args.prompt_len, args.eval_prompts)
    if len(train_windows) < 1 or len(eval_windows) < 1 or len(prompt_windows) < 1:
        _fail(f"not enough tokens ({len(train_ids)} train, {len(heldout_ids)} held-out) for windows of "
              f"--seq-len {args.seq_len} / --prompt-len {args.prompt_len}; lower them")
    timings["data_s"] = time.perf_counter() - t
    pair_tokens = (summary or {}).get("train_tokens_available")
    log(f"{len(train_texts)} train / {len(heldout_texts)} held-out files ({missing} missing), {len(train_ids)} train "
        f"tokens (pair: {pair_tokens}), {len(train_windows)} windows of {args.seq_len}; device {device}")

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device).eval()
    target.requires_grad_(False)
    torch.manual_seed(args.seed)
    kept = None
    if args.kept_vocab:  # the most frequent training tokens, and the tokenizer's special ones
        counts = np.bincount(np.asarray(train_ids), minlength=target.config.vocab_size)[: target.config.vocab_size]
        special = [i for i in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) if i is not None]
        kept = sorted(set(np.argsort(-counts, kind="stable")[: args.kept_vocab].tolist()) | set(special))
    head = DraftHead.for_target(target, num_layers=args.num_layers, intermediate_size=args.intermediate_size,
                                kept_ids=kept, hidden_size=args.hidden_size)
    n_params = sum(p.numel() for p in head.parameters())
    log(f"head: {args.num_layers} layer(s), {n_params / 1e6:.2f}M parameters (target's embedding/lm_head shared)")

    t = time.perf_counter()
    untrained = evaluate(head.eval(), target, eval_windows, prompt_windows, args, device, autocast)
    timings["eval_untrained_s"] = time.perf_counter() - t
    log(f"untrained head: {untrained}")

    train = train_head(head, target, train_windows, args, device, autocast, deadline_total - args.reserve_s, log)
    log(f"trained {train['steps']} steps, {train['tokens_seen'] / 1e6:.2f}M tokens in {train['train_s']:.1f}s; "
        f"last {train['last']}")
    # measured as it is saved and loaded: bf16 on a GPU (its RoPE frequencies in fp32, as load_draft_head keeps them)
    head = head.to(torch.bfloat16 if device.type == "cuda" else torch.float32).rope_in_fp32().eval()
    t = time.perf_counter()
    trained = evaluate(head, target, eval_windows, prompt_windows, args, device, autocast)
    timings["eval_trained_s"] = time.perf_counter() - t
    log(f"trained head: {trained}")

    t = time.perf_counter()
    save_draft_head(head, args.out)
    timings["save_s"] = time.perf_counter() - t
    timings["train_s"] = train.pop("train_s")
    timings["total_s"] = time.perf_counter() - t_start
    result = {
        "out": os.path.abspath(args.out), "target": os.path.abspath(target_dir), "tokenizer": os.path.abspath(tok_dir),
        "device": str(device), "torch": torch.__version__, "settings": {k: v for k, v in vars(args).items()},
        "sources": sources, "train_files": len(train_texts), "heldout_files": len(heldout_texts),
        "missing_files": missing, "train_tokens_available": int(len(train_ids)),
        "pair_train_tokens_available": pair_tokens,
        "same_tokens_as_pair": None if pair_tokens is None else int(len(train_ids)) == pair_tokens,
        "eval_tokens_top1": int(eval_windows.size - len(eval_windows)), "eval_prompts": int(len(prompt_windows)),
        "head_params": n_params, **train, "heldout": {"trained": trained, "untrained": untrained},
        "timings": timings, "argv": sys.argv[1:] if argv is None else list(argv),
    }
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump(result, fh, indent=2)
    log(f"saved to {args.out} (total {timings['total_s']:.1f}s; budget {args.time_budget_s:.0f}s)")
    return result


if __name__ == "__main__":
    main()
