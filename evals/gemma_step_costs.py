#!/usr/bin/env python
"""Step costs of Gemma 3 270M and its reduced-vocabulary draft, both with random weights of the real config.

    python evals/gemma_step_costs.py --out gemma_costs.json                  # GPU: fp32 + bf16, batch 1 and 8
    python evals/gemma_step_costs.py --tiny --device cpu --num-kept 1024 --out /tmp/c.json   # seconds: a check

Costs do not depend on the weights, so no checkpoint travels: the target is built from
``evals/configs/gemma3-270m.json`` (the real model's config.json: 18 layers, hidden 640, vocabulary
262,144, sliding window 512) with random weights, the draft from it as ``evals/distill_draft.py`` builds
one (the target's first ``--layers`` layers, its embedding, a reduced head of ``--num-kept`` rows), so
both have the shapes of the distilled pair. Acceptance does depend on the weights: it is measured on
the real pair on the CPU (``docs/gemma.md``). Per dtype and batch size, milliseconds of:

- ``eager``: Hugging Face forwards with its own cache after a ``--context``-token prefill (the cache
  grows by the step's tokens per repeat): target step (1 token per row), draft step (1 token),
  target verify (k+1 tokens per row). Any device.
- ``runner`` (CUDA only): hf_specdec's own round pieces as captured CUDA graphs
  (``hf_specdec.runner.stage_timing.time_stages`` after one greedy call): ``target_step``,
  ``draft_step``, ``draft_first_step``, ``verify_forward`` (k+1 tokens), ``propose``,
  ``verify_and_commit`` and ``round``; ``--compile`` adds torch.compile (slow warm-up).

Output: JSON on stdout and in ``--out``; also the weight bytes each model reads per step.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import statistics
import sys
import time

import torch

EVALS = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [EVALS, os.path.dirname(EVALS)]  # these evals, and this checkout's hf_specdec
from distill_eval import read_bytes  # noqa: E402
from distill_model import draft_from_target, pick_layers  # noqa: E402
from hf_specdec.call.request import cache_keyword  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, query_pre_attn_scalar=32, vocab_size=4096, sliding_window=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(EVALS, "configs", "gemma3-270m.json"),
                   help="the target's config.json (default: Gemma 3 270M's)")
    p.add_argument("--tiny", action="store_true", help="shrink the config to a 4-layer, 4096-token model (checks)")
    p.add_argument("--layers", type=int, default=4, help="the draft keeps the target's first N layers")
    p.add_argument("--num-kept", type=int, default=16384, help="the draft's output rows")
    p.add_argument("--k", type=int, default=4, help="draft tokens per round (verify scores k+1 per row)")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--context", type=int, default=256, help="tokens in the cache when a step is timed")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--compile", action="store_true", help="CUDA: the runner's models compiled too")
    p.add_argument("--no-runner", action="store_true", help="CUDA: eager timings only")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu | cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON file")
    return p.parse_args(argv)


def build_pair(args, device: torch.device, dtype: torch.dtype):
    """(target, draft): random weights of the config, the draft built from the target as distill_draft does."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(args.config)
    if args.tiny:
        for name, value in TINY.items():
            setattr(config, name, value)
    torch.manual_seed(args.seed)
    target = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device).eval()
    vocab = config.vocab_size
    if not 0 < args.num_kept <= vocab:
        raise SystemExit(f"--num-kept {args.num_kept} must lie in (0, {vocab}] (the config's vocabulary).")
    # which rows are kept does not change a step's cost: the first ones (special ids 0-3 among them)
    kept = torch.arange(args.num_kept)
    draft = draft_from_target(target, kept, pick_layers(config.num_hidden_layers, args.layers)).eval()
    return target.to(dtype), draft.to(dtype)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def forward_ms(model, batch: int, context: int, tokens: int, repeats: int) -> float:
    """Median ms of a forward of ``tokens`` tokens per row on Hugging Face's cache after a ``context`` prefill."""
    device = model.get_input_embeddings().weight.device
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (batch, context + tokens), generator=gen).to(device)
    key = cache_keyword(model)  # `cache` (`past_key_values` warns from transformers 5.24) or the older name
    past = getattr(model(input_ids=ids[:, :context], use_cache=True), key)
    step, times = ids[:, context:], []
    for i in range(repeats + 3):
        _sync(device)
        t = time.perf_counter()
        past = getattr(model(input_ids=step, use_cache=True, **{key: past}), key)
        _sync(device)
        if i >= 3:
            times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def runner_ms(target, draft, batch: int, args) -> dict:
    """hf_specdec's round pieces as CUDA graphs at ``batch`` rows, after one greedy call on random prompts."""
    import hf_specdec
    from hf_specdec.runner import bucket_for, runner_for
    from hf_specdec.runner.stage_timing import time_stages

    hf_specdec.enable(target)
    device = target.get_input_embeddings().weight.device
    vocab = target.config.get_text_config().vocab_size
    ids = torch.randint(4, vocab, (batch, args.context), generator=torch.Generator().manual_seed(1)).to(device)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=args.k, adaptive=False, compile=args.compile)
    target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), assistant_model=draft, do_sample=False,
                    max_new_tokens=16, spec_config=spec)
    return time_stages(runner_for(target, draft), bucket_for(batch), repeats=max(args.repeats, 20))


def measure(args) -> dict:
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    batches = [int(b) for b in args.batches.split(",")]
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "threads": torch.get_num_threads(), "config": os.path.abspath(args.config), "tiny": args.tiny,
              "draft_layers": args.layers, "num_kept": args.num_kept, "k": args.k, "context": args.context,
              "weights": "random (costs do not depend on them)", "results": []}
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        target, draft = build_pair(args, device, dtype)
        report.setdefault("bytes_per_step", {})[name] = {"target": read_bytes(target), "draft": read_bytes(draft)}
        for b in batches:
            row = {"dtype": name, "batch": b, "eager": {
                "target_step": forward_ms(target, b, args.context, 1, args.repeats),
                "draft_step": forward_ms(draft, b, args.context, 1, args.repeats),
                "target_verify": forward_ms(target, b, args.context, args.k + 1, args.repeats)}}
            row["eager"]["draft_over_target"] = row["eager"]["draft_step"] / row["eager"]["target_step"]
            if device.type == "cuda" and not args.no_runner:
                try:
                    stages = runner_ms(target, draft, b, args)
                    stages["draft_over_target"] = stages["draft_step"] / stages["target_step"]
                    row["runner"] = stages
                except Exception as err:  # keep the eager figures
                    row["runner_error"] = f"{type(err).__name__}: {err}"
            report["results"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        del target, draft
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return report


def main(argv=None) -> dict:
    args = parse_args(argv)
    report = measure(args)
    text = json.dumps(report, indent=2)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(text)
    return report


if __name__ == "__main__":
    main()
