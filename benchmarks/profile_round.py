"""Where a speculative round's time goes on the GPU: stage times (synchronised) and a host profile.

Random weights with the shapes of the project's model pair (453M target, 29M draft), so
the per-round costs are those of the real pair; acceptance is not. Run on a GPU:
    python -P benchmarks/profile_round.py --batch 1
"""
import argparse
import cProfile
import io
import pstats
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_specdec


def model(hidden, layers, inter, heads, kv):
    cfg = LlamaConfig(vocab_size=16384, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048)
    return LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    torch.manual_seed(0)
    target = hf_specdec.enable(model(1536, 16, 4096, 12, 4))
    draft = model(512, 4, 1536, 8, 4)
    ids = torch.randint(3, 16384, (args.batch, 200), device="cuda")
    kw = dict(input_ids=ids, do_sample=False, max_new_tokens=args.max_new_tokens, eos_token_id=None, pad_token_id=0,
              assistant_model=draft, return_dict_in_generate=True)
    for sync in (False, True):
        spec = hf_specdec.SpecConfig(num_speculative_tokens=args.k, sync_stage_timing=sync)
        target.generate(**kw, spec_config=spec)  # warm-up (Triton JIT)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = target.generate(**kw, spec_config=spec)
        torch.cuda.synchronize()
        m = out.spec_metrics
        wall = time.perf_counter() - t0
        print(f"sync={sync}: {wall * 1e3:.1f} ms, {m.num_rounds} rounds, {wall / m.num_rounds * 1e3:.2f} ms/round; "
              f"per round: propose {m.propose_seconds / m.num_rounds * 1e3:.2f} score "
              f"{m.score_seconds / m.num_rounds * 1e3:.2f} verify {m.verify_seconds / m.num_rounds * 1e3:.2f} ms",
              flush=True)
    spec = hf_specdec.SpecConfig(num_speculative_tokens=args.k)
    prof = cProfile.Profile()
    prof.enable()
    target.generate(**kw, spec_config=spec)
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue())


if __name__ == "__main__":
    main()
