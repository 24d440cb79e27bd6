#!/usr/bin/env python
"""Where a fresh process's warm-up goes: the pair's job (HumanEval prompts at their own lengths, in order, 256 new
tokens) with SpecConfig() (or k = 0), every graph capture, Triton JIT compile, draft catch-up and prefill timed.

cold_start.py times the job as a user meets it; this says what its warm-up is made of. Each event is printed as
``seconds since the job began  what  its seconds``; a capture names its stage, bucket and k and the time it waited
for the background compilation's lock; a JIT compile names the kernel and its signature. Empty compile caches
(a new scratch directory for Inductor, Triton, hf_specdec and CUDA), as in cold_start.py's cold processes. It wraps
internals of the runner, its graphs and Triton's JIT to time them: a measurement tool, to be kept in step with them
(its CPU test runs the hooks).

    python benchmarks/warmup_timeline.py --pair runs/pair --prompts HumanEval.jsonl.gz --batch 32 --num-prompts 128
    python benchmarks/warmup_timeline.py --pair runs/tiny_pair --batch 2 --num-prompts 4 --max-new-tokens 8  # CPU
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "HF_SPECDEC_CACHE", "CUDA_CACHE_PATH")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", required=True, help="DIR with target/ (model + tokenizer) and draft/")
    p.add_argument("--prompts", default=None, help="HumanEval.jsonl(.gz) (default: benchmarks.common.find_humaneval)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--plain", action="store_true", help="SpecConfig(num_speculative_tokens=0), no draft")
    p.add_argument("--keep-caches", action="store_true", help="use the process's compile caches as they are")
    return p.parse_args(argv)


class Timeline:
    """Events as (seconds since ``start``, what, seconds it took), from hooks on the runner, graphs and Triton."""

    def __init__(self):
        self.start, self.events = time.perf_counter(), []

    def add(self, what: str, seconds: float) -> None:
        self.events.append((time.perf_counter() - self.start, what, seconds))

    def timed(self, owner, name: str, describe) -> None:
        """Replace ``owner.name`` by a wrapper that records ``describe(self, *args)`` and the call's duration."""
        original = getattr(owner, name)

        def wrapper(obj, *args, **kwargs):
            what, began = describe(obj, *args, **kwargs), time.perf_counter()  # described as the call begins
            try:
                return original(obj, *args, **kwargs)
            finally:
                self.add(what, time.perf_counter() - began)
        setattr(owner, name, wrapper)

    def hook(self) -> None:
        from hf_specdec.runner import graphs, spec_runner

        capture, init = graphs.StageGraph._capture, graphs.StageGraph.__init__

        def timed_capture(obj, *args, **kwargs):  # the capture itself: the rest of __init__ waits for the lock
            began = time.perf_counter()
            capture(obj, *args, **kwargs)
            obj.capture_only_s = time.perf_counter() - began

        def timed_init(obj, stage, buffers, generator=None, pool=None, what="a stage"):
            began = time.perf_counter()
            init(obj, stage, buffers, generator, pool, what)
            seconds = time.perf_counter() - began
            self.add(f"capture {what} (waited {seconds - getattr(obj, 'capture_only_s', seconds):.3f} s for the "
                     "lock)", seconds)
        graphs.StageGraph._capture, graphs.StageGraph.__init__ = timed_capture, timed_init
        runner = spec_runner.SpecRunner
        self.timed(runner, "time_rounds", lambda r, ks, *a, **k: f"time_rounds {list(ks)}")
        self.timed(runner, "catch_up", lambda r: f"catch_up of {r.draft_behind} tokens a row")
        self.timed(runner, "_prefill", lambda r, rows, skip: f"prefill of {len(rows)} rows (skipping {list(skip)})")
        try:  # Triton's JIT compiles (a cache miss in memory: a disk-cache hit is counted too, and is short)
            from triton.runtime import jit

            self.timed(jit.JITFunction, "_do_compile", lambda fn, *a, **k: f"jit {fn.fn.__name__} " + next(
                (str(x)[:160] for x in a if isinstance(x, dict)), ""))
        except (ImportError, AttributeError):
            print("this Triton has no JITFunction._do_compile: JIT compiles are not listed", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.keep_caches:
        scratch = tempfile.mkdtemp(prefix="warmup_timeline_")
        for var in CACHE_VARS:
            os.environ[var] = os.path.join(scratch, var.lower())
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_specdec
    from benchmarks.common import find_humaneval, load_draft, read_jsonl

    cuda = torch.cuda.is_available()
    device, dtype = torch.device("cuda" if cuda else "cpu"), torch.bfloat16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    timeline = Timeline()
    timeline.hook()
    tok = AutoTokenizer.from_pretrained(os.path.join(args.pair, "target"), padding_side="left")
    target = AutoModelForCausalLM.from_pretrained(os.path.join(args.pair, "target"), dtype=dtype).to(device).eval()
    draft = None if args.plain else load_draft(os.path.join(args.pair, "draft"), target, device, dtype)
    hf_specdec.enable(target)
    path = find_humaneval(args.prompts)
    if path is None:
        raise SystemExit("no HumanEval prompts found: pass --prompts PATH (HumanEval.jsonl.gz)")
    texts = read_jsonl(path, "prompt", args.num_prompts)
    config = hf_specdec.SpecConfig(num_speculative_tokens=0) if args.plain else hf_specdec.SpecConfig()
    sync()
    timeline.events.clear()
    timeline.start = job_start = time.perf_counter()
    for i in range(0, len(texts), args.batch):
        enc = tok(texts[i:i + args.batch], return_tensors="pt", padding=True).to(device)
        began = time.perf_counter()
        out = target.generate(**enc, do_sample=False, max_new_tokens=args.max_new_tokens, assistant_model=draft,
                              pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, spec_config=config,
                              return_dict_in_generate=True)
        sync()
        m = out.spec_metrics
        timeline.add(f"CALL {i // args.batch}: {enc['input_ids'].shape[1]} prompt columns, warm-up "
                     f"{m.warmup_seconds:.2f} s, {m.num_rounds} rounds, k {dict(sorted(m.k_histogram.items()))}, "
                     f"acceptance {m.acceptance_rate:.3f}, {m.fast_path}", time.perf_counter() - began)
    job = time.perf_counter() - job_start
    for at, what, seconds in timeline.events:
        print(f"{at:8.3f}\t{what}\t{seconds:.3f}")
    jit = [s for _, what, s in timeline.events if what.startswith("jit ")]
    captures = [s for _, what, s in timeline.events if what.startswith("capture ")]
    print(f"job {job:.2f} s; {len(jit)} JIT compiles {sum(jit):.2f} s; {len(captures)} captures {sum(captures):.2f} s "
          "(JIT inside them included)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
