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

Requires torch, transformers, tokenizers (not ``datasets``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import site
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


# --------------------------------------------------------------------------- #
# Model sizes
# --------------------------------------------------------------------------- #
@dataclass
class ModelSize:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int


GPU_TARGET = ModelSize(1536, 16, 4096, 12, 4)  # ~453M params with a 16384 vocab, untied
GPU_DRAFT = ModelSize(512, 4, 1536, 8, 4)  # ~29M params with a 16384 vocab, untied
TINY_TARGET = ModelSize(128, 2, 352, 4, 2)
TINY_DRAFT = ModelSize(16, 1, 48, 1, 1)


def _size_from_str(text: str) -> ModelSize:
    """'hidden,layers,intermediate,heads,kv_heads' -> ModelSize."""
    parts = [int(p) for p in text.split(",")]
    if len(parts) != 5:
        raise argparse.ArgumentTypeError("expected hidden,layers,intermediate,heads,kv_heads")
    return ModelSize(*parts)


# --------------------------------------------------------------------------- #
# Data
# --------------------------------------------------------------------------- #
def _hash01(key: str) -> float:
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:12], 16) / float(16**12)


def list_source_files(source_dirs, min_file_bytes=256, max_file_bytes=1_000_000):
    """All .py files under the source dirs as (relpath, fullpath, size), deduplicated by relpath."""
    seen = set()
    out = []
    for root in source_dirs:
        root = os.path.abspath(root)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            for fn in sorted(filenames):
                if not fn.endswith(".py"):
                    continue
                full = os.path.join(dirpath, fn)
                try:
                    size = os.path.getsize(full)
                except OSError:
                    continue
                if size < min_file_bytes or size > max_file_bytes:
                    continue
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                if rel in seen:
                    continue
                seen.add(rel)
                out.append((rel, full, size))
    return out


def split_and_read(files, max_bytes, heldout_frac, heldout_max_bytes, seed):
    """Deterministic by-file split.  A file is held out iff hash(seed, relpath) < heldout_frac.

    Files are visited in hash order (a deterministic pseudo-random sample of the
    whole tree); reading stops when the train side holds ``max_bytes`` and the
    held-out side ``heldout_max_bytes``.  Files whose content was already seen
    (vendored copies) are skipped so that no text sits on both sides.
    """
    keyed = sorted(files, key=lambda f: hashlib.sha1(f"{seed}:order:{f[0]}".encode()).hexdigest())
    train, heldout = [], []
    train_bytes = heldout_bytes = 0
    seen_content = set()
    for rel, full, _size in keyed:
        is_heldout = _hash01(f"{seed}:split:{rel}") < heldout_frac
        if is_heldout and heldout_bytes >= heldout_max_bytes:
            continue
        if not is_heldout and train_bytes >= max_bytes:
            if heldout_bytes >= heldout_max_bytes:
                break
            continue
        try:
            with open(full, "rb") as fh:
                raw = fh.read()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        digest = hashlib.sha1(raw).digest()
        if digest in seen_content or not text.strip():
            continue
        seen_content.add(digest)
        if is_heldout:
            heldout.append((rel, text))
            heldout_bytes += len(raw)
        else:
            train.append((rel, text))
            train_bytes += len(raw)
    if not heldout and len(train) > 1:
        # tiny source trees: guarantee a held-out side (the last train file in hash order)
        heldout.append(train.pop())
    if not train or not heldout:
        raise SystemExit(f"not enough text: {len(train)} train files, {len(heldout)} held-out files")
    return train, heldout


def train_tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def wrap_tokenizer(tok, model_max_length):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",  # decoder-only batched generation pads on the left
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def encode_docs(tok, texts, eos_id):
    """[BOS] text [EOS] for every document, concatenated (sequence packing)."""
    enc = getattr(tok, "encode_batch_fast", tok.encode_batch)
    chunks = []
    step = 512
    for i in range(0, len(texts), step):
        for e in enc(texts[i : i + step]):
            ids = e.ids
            ids.append(eos_id)
            chunks.append(np.asarray(ids, dtype=np.int32))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)


def heldout_prompt_windows(heldout, n, seed, min_chars=400, max_chars=1200):
    """Windows of held-out source text, each ending on a line boundary, one per file."""
    rng = random.Random(seed)
    out = []
    for rel, text in heldout:
        if len(out) >= n:
            break
        lines = text.splitlines(keepends=True)
        if len(text) < min_chars or len(lines) < 8:
            continue
        start = rng.randrange(0, max(1, len(lines) // 2))
        buf = []
        size = 0
        for line in lines[start:]:
            if size + len(line) > max_chars and size >= min_chars:
                break
            buf.append(line)
            size += len(line)
        if size < min_chars // 2:
            continue
        out.append({"prompt": "".join(buf), "source": rel})
    return out


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
def make_model(size: ModelSize, vocab_size, ids, max_pos, device, init_std=0.02):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=size.num_attention_heads,
        num_key_value_heads=size.num_key_value_heads,
        max_position_embeddings=max_pos,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        initializer_range=init_std,
    )
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    model.generation_config.bos_token_id = ids["bos"]
    model.generation_config.eos_token_id = ids["eos"]
    model.generation_config.pad_token_id = ids["pad"]
    return model.to(device)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def make_optimizer(model, lr, weight_decay, device):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-8}
    if device.type == "cuda":
        kwargs["fused"] = True
    return torch.optim.AdamW(groups, **kwargs)


def lm_loss(model, x, y):
    logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def heldout_loss(model, windows, batch_size, device, autocast_dtype):
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch_size):
        chunk = torch.from_numpy(windows[i : i + batch_size].astype(np.int64)).to(device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = model(input_ids=chunk[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"
        )
        total += float(loss)
        count += chunk[:, 1:].numel()
    model.train()
    return total / max(count, 1)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_pair(models, opts, lrs, train_windows, args, device, autocast_dtype, deadline, log):
    """One loop, same batches for every model.  Returns (steps, tokens_seen, per-model last losses)."""
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(train_windows.shape[0])
    pos = 0
    micro = args.micro_batch_size or args.batch_size
    accum = max(1, args.batch_size // micro)
    step = 0
    tokens = 0
    t0 = time.perf_counter()
    train_seconds = max(deadline - t0, 1e-3)
    ema = [None] * len(models)
    last_log = t0
    for m in models:
        m.train()
    while True:
        now = time.perf_counter()
        if now >= deadline and step >= args.min_steps:
            break
        if args.max_steps and step >= args.max_steps:
            break
        frac = min(1.0, (now - t0) / train_seconds)
        if args.max_steps:
            frac = max(frac, step / args.max_steps)
        warm = min(1.0, (step + 1) / args.warmup_steps)
        cosine = args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))
        for opt, lr in zip(opts, lrs):
            for g in opt.param_groups:
                g["lr"] = lr * warm * cosine
        # one global batch = accum micro-batches; every model sees the same ones
        idx = []
        for _ in range(accum * micro):
            if pos >= len(order):
                order = rng.permutation(train_windows.shape[0])
                pos = 0
            idx.append(order[pos])
            pos += 1
        batch = torch.from_numpy(train_windows[np.asarray(idx)].astype(np.int64)).to(device, non_blocking=True)
        step_losses = []
        for mi, (model, opt) in enumerate(zip(models, opts)):
            acc = torch.zeros((), device=device)
            for a in range(accum):
                chunk = batch[a * micro : (a + 1) * micro]
                with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    loss = lm_loss(model, chunk[:, :-1], chunk[:, 1:])
                (loss / accum).backward()
                acc += loss.detach() / accum
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step_losses.append(acc)
        step += 1
        tokens += batch.shape[0] * (batch.shape[1] - 1)
        _sync(device)
        now = time.perf_counter()
        if now - last_log >= args.log_every_s or step == 1:
            vals = [float(v) for v in step_losses]
            for i, v in enumerate(vals):
                ema[i] = v if ema[i] is None else 0.9 * ema[i] + 0.1 * v
            log(
                f"  step {step:5d}  tokens {tokens/1e6:7.2f}M  "
                + "  ".join(f"{n} {v:.3f}" for n, v in zip(("target", "draft"), vals))
                + f"  lr_target {opts[0].param_groups[0]['lr']:.2e}  {tokens/(now-t0):,.0f} tok/s"
            )
            last_log = now
    return step, tokens, [float(v) for v in step_losses]


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
    else:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
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
