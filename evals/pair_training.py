"""Models and training loop of evals/build_pair.py: two Llama models trained on the same batches.

The learning rate follows warmup + cosine over the elapsed share of the wall-clock budget (or
of --max-steps), so the schedule ends when the budget does whatever the machine's speed.
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


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
