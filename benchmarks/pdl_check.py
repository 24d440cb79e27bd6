"""Programmatic dependent launch, ours and Inductor's: do the logits stay bit-identical, and what does a call cost?

Four modes, each in a fresh process with Inductor's on-device autotuning off (``TORCHINDUCTOR_DETERMINISTIC=1``,
else two processes may pick different reduction configurations and round differently):

    off       HF_SPECDEC_PDL=0                                   every kernel launches as usual
    ours      HF_SPECDEC_PDL=1                                   our layer kernels (kernels/pdl.py)
    inductor  TORCHINDUCTOR_ENABLE_PDL=1                         Inductor's kernels only
    both      HF_SPECDEC_PDL=1 TORCHINDUCTOR_ENABLE_PDL=1

Each process runs greedy calls (graphs + compile) of an 8B-shaped target of ``--layers`` layers, at k = 0 and
with a 1B-shaped draft at k = 4, at b = 1 and 32, with ``output_logits=True``; then the same calls again
(steady: nothing captured or compiled) for their wall time. Prints, per mode, whether each call's logits equal
the ``off`` mode's bit for bit, and the steady calls' seconds. On 2026-11-27 (H100, 4 target layers, a first
version of this probe) switching ours on and off beside Inductor's left every logit as it was, while switching
Inductor's changed them at b = 32.

    python benchmarks/pdl_check.py --out $OUT/pdl_check.json      # Hopper GPU, about 10 minutes cold
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

MODES = {"off": {"HF_SPECDEC_PDL": "0"}, "ours": {"HF_SPECDEC_PDL": "1"},
         "inductor": {"HF_SPECDEC_PDL": "0", "TORCHINDUCTOR_ENABLE_PDL": "1"},
         "both": {"HF_SPECDEC_PDL": "1", "TORCHINDUCTOR_ENABLE_PDL": "1"}}
CALLS = [(32, 0), (32, 4), (1, 0), (1, 4)]  # (batch, k)


def worker(layers: int, new_tokens: int) -> dict:
    """This process's mode (from its environment): each call's logits digest and its steady wall time."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
    import hf_specdec

    def llama(hidden, inter, n_layers):
        cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=n_layers,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096)
        return LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()

    torch.manual_seed(0)
    target = hf_specdec.enable(llama(4096, 14336, layers))
    draft = llama(2048, 8192, 2)
    out = {}
    for batch, k in CALLS:
        ids = torch.randint(3, 32000, (batch, 200), generator=torch.Generator().manual_seed(7 + batch)).cuda()
        spec = hf_specdec.SpecConfig(num_speculative_tokens=k, adaptive=False, cuda_graphs=True, compile=True)
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                  eos_token_id=None, pad_token_id=0, assistant_model=draft if k else None, spec_config=spec,
                  return_dict_in_generate=True, output_logits=True)
        first = target.generate(**kw)
        torch.cuda.synchronize()
        start = time.perf_counter()
        steady = target.generate(**kw)
        torch.cuda.synchronize()
        logits = torch.stack(first.logits, 1).float().cpu().numpy()
        out[f"b{batch}_k{k}"] = {
            "fast_path": first.spec_metrics.fast_path, "steady_s": time.perf_counter() - start,
            "logits_sha256": hashlib.sha256(logits.tobytes()).hexdigest()[:16],
            "repeat_equal": bool(torch.equal(torch.stack(first.logits, 1), torch.stack(steady.logits, 1)))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4, help="target layers (8B-shaped)")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--timeout", type=int, default=240, help="seconds per mode's process (compiles included)")
    ap.add_argument("--out")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.layers, args.new_tokens)), flush=True)
        return
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; choose from {','.join(MODES)}")
    modes = ["off"] + [m for m in modes if m != "off"]  # the baseline first, always
    results = {}
    for mode in modes:
        env = {k: v for k, v in os.environ.items() if k not in ("HF_SPECDEC_PDL", "TORCHINDUCTOR_ENABLE_PDL")}
        env.update(MODES[mode], TORCHINDUCTOR_DETERMINISTIC="1", HF_SPECDEC_CACHE=f"/tmp/hf_specdec_pdl_check_{mode}")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--layers", str(args.layers),
               "--new-tokens", str(args.new_tokens)]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            results[mode] = json.loads(lines[-1][7:]) if lines else {"error": done.stderr[-2000:]}
        except subprocess.TimeoutExpired:
            results[mode] = {"error": f"timed out after {args.timeout} s"}
        off = results["off"]
        for call, row in results[mode].items() if "error" not in results[mode] else []:
            base = off.get(call, {}).get("logits_sha256") if "error" not in off else None
            row["logits_equal_off"] = None if base is None else row["logits_sha256"] == base
            verdict = {None: "no baseline", True: "= off", False: "!= off"}[row["logits_equal_off"]]
            print(f"{mode:9s} {call:7s} {row['fast_path']:15s} steady {row['steady_s']:.3f} s  logits {verdict}  "
                  f"repeat {'equal' if row['repeat_equal'] else 'DIFFERS'}", flush=True)
        if "error" in results[mode]:
            print(f"{mode}: {results[mode]['error'][-500:]}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"layers": args.layers, "new_tokens": args.new_tokens, "modes": results}, f, indent=1)


if __name__ == "__main__":
    main()
