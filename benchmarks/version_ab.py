#!/usr/bin/env python
"""Two versions of hf_specdec on the same pair, process by process: a refactor's speed check.

Each process imports one version (``--variants NAME=ROOT``: ROOT holds that version's ``hf_specdec/``, e.g.
``git archive REV hf_specdec | tar -x -C /tmp/old``), loads the pair in bf16 and times ``generate()`` with
``SpecConfig(compile=True)`` (the first call waits for the compiled code) for each configuration: a fixed
k = 3, the same with ``output_scores=True``, and the default adaptive k; greedy, 128 new tokens, HumanEval
prompts at their own lengths (left-padded per batch), b = 1 and b = 32. Tokens/s = generated tokens / wall
time, median of ``--passes`` passes after a warm pass. The processes run in the order given (ABBA balances
drift). This compares hf_specdec with itself; Hugging Face's paths are measured by e2e.py.

GPU:  python benchmarks/version_ab.py --pair runs/pair --prompts HumanEval.jsonl.gz \\
          --variants old=/tmp/old new=. new=. old=/tmp/old --out $OUT/ab.json
CPU smoke (tests/test_evals.py): --device cpu --batch-sizes 1 --num-prompts 2 --max-new-tokens 8 --passes 1
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = {"k3": dict(num_speculative_tokens=3, adaptive=False),
           "k3_scores": dict(num_speculative_tokens=3, adaptive=False),
           "adaptive": {}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", required=True, help="a directory with target/ and draft/ (evals/build_pair.py)")
    p.add_argument("--prompts", required=True, help="HumanEval.jsonl(.gz)")
    p.add_argument("--variants", nargs="+", default=[], help="NAME=ROOT, one process each, in this order")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--num-prompts", type=int, default=0, help="prompts per batch size (default: 8 at b = 1, 2b else)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process: its variant's name
    return p.parse_args(argv)


def measure(a) -> dict:
    """In a child process whose ``sys.path`` starts with the variant's root."""
    import torch

    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks.*, after the variant
    import hf_specdec
    from benchmarks.common import load_pair, read_jsonl

    device = torch.device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tok, target, draft = load_pair(os.path.join(a.pair, "target"), os.path.join(a.pair, "draft"), device, dtype)
    hf_specdec.enable(target)
    texts = read_jsonl(a.prompts)
    res = {"variant": a.one, "hf_specdec": os.path.dirname(hf_specdec.__file__)}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for b in (int(x) for x in a.batch_sizes.split(",")):
        n = a.num_prompts or (8 if b == 1 else 2 * b)
        work = []
        for i in range(0, n, b):
            enc = tok(texts[i: i + b], return_tensors="pt", padding=True, truncation=True, max_length=192)
            work.append((enc.input_ids.to(device), enc.attention_mask.to(device)))
        for name, extra in CONFIGS.items():
            compile_ = {"compile": True} if device.type == "cuda" else {}
            kw = dict(max_new_tokens=a.max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, assistant_model=draft, return_dict_in_generate=True,
                      output_scores=name.endswith("scores"), spec_config=hf_specdec.SpecConfig(**compile_, **extra))
            for ids, mask in work:  # warm pass: the compiled code, captures
                out = target.generate(input_ids=ids, attention_mask=mask, **kw)
            rates = []
            for _ in range(a.passes):
                sync()
                start, tokens = time.perf_counter(), 0
                for ids, mask in work:
                    out = target.generate(input_ids=ids, attention_mask=mask, **kw)
                    new = out.sequences[:, ids.shape[1]:]
                    tokens += int(sum(min(int((row != tok.pad_token_id).sum()), a.max_new_tokens) for row in new))
                sync()
                rates.append(tokens / (time.perf_counter() - start))
            res[f"b{b}_{name}"] = {"tok_s": statistics.median(rates), "passes": rates,
                                   "fast_path": out.spec_metrics.fast_path,
                                   "mean_acceptance_length": out.spec_metrics.mean_acceptance_length}
            print(a.one, f"b{b}_{name}", f"{statistics.median(rates):.0f} tok/s", flush=True)
    return res


def main(argv=None):
    a = parse_args(argv)
    if a.one is not None:
        json.dump(measure(a), open(a.out, "w"), indent=1)
        return
    runs = []
    for i, variant in enumerate(a.variants):
        name, _, root = variant.partition("=")
        part = f"{a.out}.{i}.json"
        env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
        cmd = [sys.executable, os.path.abspath(__file__), *(argv if argv is not None else sys.argv[1:]),
               "--one", name, "--out", part]
        subprocess.run(cmd, check=True, env=env)
        runs.append(json.load(open(part)))
        os.remove(part)
    keys = sorted({k for r in runs for k, v in r.items() if isinstance(v, dict)})
    table = {k: {f"{i}:{r['variant']}": round(r[k]["tok_s"]) for i, r in enumerate(runs)} for k in keys}
    for k, row in table.items():
        print(f"{k:20s}", "  ".join(f"{n} {v}" for n, v in row.items()))
    json.dump({"configs": CONFIGS, "runs": runs, "table": table}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
