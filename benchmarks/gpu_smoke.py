"""GPU smoke check of the fast path: greedy speculative output equals plain greedy generate on CUDA.

Random Llama models, fp32 (must be identical) and bf16 (reported), for the runner without CUDA
graphs, the runner with CUDA graphs, and graphs + torch.compile; batch 1, 3 and 32 with left padding
and an EOS id that rows hit at different rounds; a second identical call must capture
nothing (zero warm-up; with a fixed k: adaptive rounds may reach a bucket the first call did not), and
so must the graph paths' call again after all the other configurations ran (the runner keeps each's graphs).
Also the adaptive-k and n-gram fast paths, a sampled run per path (reported only), and on the
graph paths a seeded sampled call that captures against two later calls that replay, and three calls that
each bring a new generator with the same seed (all must agree). A copy of the target as the draft (``twin``) must
accept at least 0.95 of its drafts in fp32 and 0.8 in bf16 at k = 4 on every path that drafts: output equal to plain
generate says nothing of a draft whose forwards went wrong (its rounds are rejected, or the adaptive policy stops
drafting). One line per case;
exit status 1 if an fp32 case differs, a repeated call warms up again, a rate exceeds 1 or the twin's is low.
``--cache-rows N``
gives the caches a budget of N rows at a time, so rows start in waves as others finish.

    python benchmarks/gpu_smoke.py [--paths no_graphs,graphs,compile] [--batches 1,3,32] [--cache-rows 8]
"""
import argparse
import copy
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, not installed
import hf_specdec  # noqa: E402

PATHS = {
    "no_graphs": dict(cuda_graphs=False, adaptive=False),
    "graphs": dict(cuda_graphs=True, compile=False, adaptive=False),
    "compile": dict(cuda_graphs=True, compile=True, adaptive=False),
    "adaptive": dict(cuda_graphs=True, compile=True),  # k chosen per round: 0 and 4 captured per bucket, others lazily
    "ngram": dict(cuda_graphs=True, compile=True, method="ngram"),
}


def build(dtype):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
    target = LlamaForCausalLM(cfg).to("cuda", dtype).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8)
    draft, twin = copy.deepcopy(target), copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.3 * p.float().std().to(p.dtype))
    return hf_specdec.enable(target), draft, twin


TWIN_ACCEPTANCE = {torch.float32: 0.95, torch.bfloat16: 0.8}  # a copy of the target as its draft, at least


def prompts(batch):
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(3, 4096, (batch, 37), generator=gen).cuda()
    mask = torch.ones_like(ids)
    for b in range(1, batch):
        mask[b, : (b * 7) % 30] = 0
    return ids, mask


def seeded_runs_agree(target, draft, ids, mask, name, budget):
    """A sampled call with a seeded generator that captures its graphs emits what the same seed emits on
    later calls that only replay them; and so do calls that each bring a new generator with that seed (a
    dropped generator's graphs must not serve a new one made at its address). ``budget``: the path's cache
    budget (another budget would move the pools and drop every graph kept)."""
    def sampled(gen):
        gen.manual_seed(1234)
        spec = hf_specdec.SpecConfig(num_speculative_tokens=4, generator=gen, cache_tokens=budget, **PATHS[name])
        return target.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=32, top_k=0,
                               assistant_model=draft, spec_config=spec, pad_token_id=0)
    gen = torch.Generator("cuda")
    outs = [sampled(gen) for _ in range(3)] + [sampled(torch.Generator("cuda")) for _ in range(3)]
    return all(torch.equal(outs[0], o) for o in outs[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--paths", default="no_graphs,graphs,compile,adaptive,ngram")
    ap.add_argument("--batches", default="1,3,32")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--cache-rows", type=int, default=0,
                    help="SpecConfig.cache_tokens that hold this many rows at once (0: unlimited): rows start in waves")
    args = ap.parse_args()
    assert torch.cuda.is_available()
    failures = []  # what failed, printed at the end
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        target, draft, twin = build(dtype)
        for batch in [int(b) for b in args.batches.split(",")]:
            ids, mask = prompts(batch)
            plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=64,
                                    eos_token_id=None, pad_token_id=0)
            # an EOS id that row 0 emits at its 20th token: rows stop at different rounds
            eos = int(plain[0, ids.shape[1] + 19])
            kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=64, eos_token_id=eos,
                      pad_token_id=0)
            expected = target.generate(**kw)
            for name in args.paths.split(","):
                budget = args.cache_rows * (ids.shape[1] + 64 + 4 + 1) or None  # prompt + new + k + 1 a row
                spec = hf_specdec.SpecConfig(num_speculative_tokens=4, cache_tokens=budget, **PATHS[name])
                assist = None if name == "ngram" else draft
                times, warm = [], []
                for _ in range(2):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = target.generate(**kw, assistant_model=assist, return_dict_in_generate=True, spec_config=spec)
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
                    warm.append(out.spec_metrics.warmup_seconds)
                m = out.spec_metrics
                same = (expected == out.sequences).float().mean().item() if expected.shape == out.sequences.shape else 0.0
                sampled = target.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=32,
                                          assistant_model=assist, spec_config=spec, return_dict_in_generate=True,
                                          top_k=0)
                seeded = (seeded_runs_agree(target, assist, ids, mask, name, budget)
                          if name in ("graphs", "compile") else None)
                twin_acc = None
                if assist is not None:  # a fixed k: a twin's round costs five steps, adaptive k rightly stays at 0
                    fixed = hf_specdec.SpecConfig(num_speculative_tokens=4, cache_tokens=budget,
                                                  **{**PATHS[name], "adaptive": False})
                    twin_acc = target.generate(**kw, assistant_model=twin, return_dict_in_generate=True,
                                               spec_config=fixed).spec_metrics.acceptance_rate
                print(f"{str(dtype):15s} b={batch:3d} {name:8s} [{m.fast_path}] identical {same:.3f} "
                      f"acc {m.acceptance_rate:.2f} rounds {m.num_rounds} first {times[0]:.2f}s (warm-up {warm[0]:.2f}s) "
                      f"second {times[1]:.3f}s (warm-up {warm[1]:.2f}s) sampled-acc "
                      f"{sampled.spec_metrics.acceptance_rate:.2f} [{sampled.spec_metrics.fast_path}] "
                      f"k {m.k_histogram}" + ("" if seeded is None else f" seeded-repeat {seeded}")
                      + ("" if twin_acc is None else f" twin-acc {twin_acc:.2f}"), flush=True)
                case = f"{str(dtype)} b={batch} {name}"
                if dtype == torch.float32 and same < 1.0:
                    failures.append(f"{case}: fp32 output differs from plain generate ({same:.3f} identical)")
                if seeded is False:
                    failures.append(f"{case}: seeded sampled calls disagree")
                if any(r.spec_metrics.acceptance_rate > 1 or r.spec_metrics.match_fraction > 1 for r in (out, sampled)):
                    failures.append(f"{case}: a rate above 1 (the call's statistics lost part of its rounds)")
                if twin_acc is not None and twin_acc < TWIN_ACCEPTANCE.get(dtype, 0.8):
                    failures.append(f"{case}: a copy of the target as the draft accepted {twin_acc:.2f}")
                if name in ("graphs", "compile") and warm[1] > 0:
                    failures.append(f"{case}: the second call warmed up for {warm[1]:.2e} s")
            for name in {"graphs", "compile"} & set(args.paths.split(",")):  # back after other configurations
                budget = args.cache_rows * (ids.shape[1] + 64 + 4 + 1) or None  # the same pool: graphs kept
                spec = hf_specdec.SpecConfig(num_speculative_tokens=4, cache_tokens=budget, **PATHS[name])
                out = target.generate(**kw, assistant_model=draft, return_dict_in_generate=True, spec_config=spec)
                same = torch.equal(expected, out.sequences)
                print(f"{str(dtype):15s} b={batch:3d} {name:8s} again after the other paths: identical {same} "
                      f"warm-up {out.spec_metrics.warmup_seconds:.2f}s (kept graphs replay: 0)", flush=True)
                if out.spec_metrics.warmup_seconds > 0 or (dtype == torch.float32 and not same):
                    failures.append(f"{str(dtype)} b={batch} {name} again: warm-up "
                                    f"{out.spec_metrics.warmup_seconds:.2e} s, identical {same}")
    print("OK" if not failures else "FAILED\n" + "\n".join(failures))
    sys.exit(0 if not failures else 1)


if __name__ == "__main__":
    main()
