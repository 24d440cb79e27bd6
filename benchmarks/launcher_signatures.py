#!/usr/bin/env python
"""Record the argument kinds of the Triton launchers hf_specdec's kernels use, for ``triton_launchers.py``.

On a GPU whose Triton builds a launcher per kernel signature (Triton 3.6 and earlier), runs the pair's first
calls as users make them (a draft model at each batch size, draft heads, n-gram drafts, plain k = 0) with
Triton's ``make_launcher`` wrapped, and prints the signatures it was asked for. ``--write`` merges them into
``hf_specdec/kernels/launcher_signatures.py`` (what ``hf_specdec.enable`` builds ahead); run it again after
adding or changing a kernel's arguments. A GPU tool: on the CPU there is nothing to launch.

    python benchmarks/launcher_signatures.py --pair runs/pair --prompts HumanEval.jsonl.gz --write
"""
from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_FILE = os.path.join(REPO, "hf_specdec", "kernels", "launcher_signatures.py")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", required=True, help="DIR with target/ (model + tokenizer) and draft/")
    p.add_argument("--prompts", default=None, help="HumanEval.jsonl(.gz) (default: benchmarks.common.find_humaneval)")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--write", action="store_true", help=f"merge into {os.path.relpath(TARGET_FILE, REPO)}")
    return p.parse_args(argv)


def signature_of(signature: dict, tensordesc_meta) -> tuple:
    """(argument kinds, per host tensor descriptor whether it was lowered to TMA, or None): all that Triton's
    launcher source depends on (``triton_launchers.launcher_builder`` rebuilds it from this)."""
    kinds = tuple(signature.values())
    return kinds, (None if not tensordesc_meta else tuple(m is not None for m in tensordesc_meta))


def format_signatures(signatures) -> str:
    """The module ``launcher_signatures.py``, its entries sorted and unique."""
    with open(TARGET_FILE) as fh:
        doc = fh.read().split("SIGNATURES =")[0]
    body = "".join(f"    {s!r},\n" for s in sorted(set(signatures), key=repr))
    return f"{doc}SIGNATURES = (\n{body})\n"


def recorded() -> list:
    from hf_specdec.kernels.launcher_signatures import SIGNATURES
    return list(SIGNATURES)


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, REPO)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_specdec
    from benchmarks.common import find_humaneval, load_draft, read_jsonl
    if not torch.cuda.is_available():
        raise SystemExit("launcher_signatures.py needs a CUDA GPU: it records what Triton launches there")
    from triton.backends.nvidia import driver as nvidia_driver
    if not hasattr(nvidia_driver, "make_launcher"):
        raise SystemExit("this Triton launches every kernel through one generic launcher: nothing to record")
    seen = []
    original = nvidia_driver.make_launcher

    def make_launcher(constants, signature, tensordesc_meta):
        seen.append(signature_of(signature, tensordesc_meta))
        return original(constants, signature, tensordesc_meta)

    nvidia_driver.make_launcher = make_launcher
    dev, dtype = torch.device("cuda"), torch.bfloat16
    path = os.path.join(args.pair, "target")
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    target = hf_specdec.enable(AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(dev).eval())
    drafts = {"draft model": load_draft(os.path.join(args.pair, "draft"), target, dev, dtype),
              "head": hf_specdec.DraftHead.for_target(target).to(dev, dtype),
              "narrow head": hf_specdec.DraftHead.for_target(target, hidden_size=512).to(dev, dtype)}
    prompts = read_jsonl(find_humaneval(args.prompts))
    kw = dict(max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id)
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        enc = tok(prompts[:b], return_tensors="pt", padding=True).to(dev)
        calls = [(name, dict(assistant_model=d, spec_config=hf_specdec.SpecConfig())) for name, d in drafts.items()]
        calls += [("n-gram", dict(spec_config=hf_specdec.SpecConfig(method="ngram"))),
                  ("k = 0", dict(spec_config=hf_specdec.SpecConfig(num_speculative_tokens=0)))]
        for name, extra in calls:
            for mode in (dict(do_sample=False), dict(do_sample=True, temperature=0.7)):
                before = len(set(seen))
                target.generate(**enc, **kw, **extra, **mode)
                how = "sample" if mode["do_sample"] else "greedy"
                print(f"b={b} {name} {how}: {len(set(seen)) - before} new signatures",
                      flush=True)
    new = sorted(set(seen) - set(recorded()), key=repr)
    print(f"{len(set(seen))} signatures launched, {len(new)} not yet recorded")
    for s in new:
        print("  ", s)
    if args.write:
        text = format_signatures(recorded() + list(set(seen)))  # before opening: "w" empties the file it reads
        with open(TARGET_FILE, "w") as fh:
            fh.write(text)
        print(f"wrote {TARGET_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
