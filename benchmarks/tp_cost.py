"""Per-step costs of an 8B-shaped target and a 1B-shaped draft on one GPU and tensor-parallel over two.

Random weights (nothing downloaded), bf16, Llama shapes: target hidden 4096, 32 layers, 32 heads,
8 KV heads, intermediate 14336, vocabulary 128256; draft hidden 2048, 16 layers, 32 heads, 8 KV
heads, intermediate 8192. For each batch size one greedy generate() on the fast path (CUDA graphs,
no compile) sets up the runner's bucket, then ``hf_specdec.runner.stage_timing.time_stages``
replays each piece as a CUDA graph between CUDA events (median ms): ``draft_step`` (1 token a
row), ``draft_first_step`` (2), ``verify_forward`` (k+1 tokens a row), ``target_step`` (1: plain
decoding), ``propose``, ``verify_and_commit`` and ``round``. Under torchrun every rank replays in
lockstep (the all-reduces are inside the graphs); rank 0's times are written.

    python benchmarks/tp_cost.py --out $OUT/cost_tp1.json                       # both models on one GPU
    torchrun --nproc-per-node 2 benchmarks/tp_cost.py --out $OUT/cost_tp2.json  # target TP=2, draft TP=1 and 2
    python benchmarks/tp_cost.py --report $OUT/cost_tp1.json $OUT/cost_tp2.json  # markdown table (stdout)

The report's speedups follow docs/end_to_end.md: with E = (1 - a^(k+1)) / (1 - a) tokens per round at
acceptance rate a, ``ideal_forwards = E * target_step / (k * draft_step + (draft_first_step -
draft_step) + verify_forward)`` (model forwards only) and ``ideal = E * target_step / round``
(the measured round: forwards plus sampling, acceptance and commit), both against plain decoding
on the same placement; ``vs 1 GPU`` divides the one-GPU target step by the placement's round.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hf_specdec  # noqa: E402
from benchmarks.tp_cost_report import report  # noqa: E402
from hf_specdec.runner import bucket_for, runner_for  # noqa: E402  (library internals: imported here only)
from hf_specdec.runner.stage_timing import time_stages  # noqa: E402

SIZES = {"target": (4096, 32, 14336, 32, 8), "draft": (2048, 16, 8192, 32, 8)}
TINY = {"target": (64, 2, 128, 4, 2), "draft": (32, 1, 64, 4, 2)}  # a CPU dry run of the script


def config(size, vocab: int) -> LlamaConfig:
    hidden, layers, inter, heads, kv = size
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                       num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                       tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def build(cfg: LlamaConfig, tp: bool, device: torch.device, dtype: torch.dtype, scratch: str):
    """Random weights. Tensor-parallel: ``from_pretrained(tp_plan="auto")`` of a checkpoint without tensors
    (transformers initialises every missing weight, on each rank its own shard)."""
    if tp:
        from safetensors.torch import save_file

        path = tempfile.mkdtemp(dir=scratch)
        cfg.save_pretrained(path)
        save_file({}, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return LlamaForCausalLM.from_pretrained(path, tp_plan="auto", dtype=dtype).eval()
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)


def measure(target, draft, batch: int, args, device) -> dict:
    """One generate() at ``batch`` rows (prompt ``args.prompt`` tokens, one round), then the stage costs."""
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(3, target.config.vocab_size, (batch, args.prompt), generator=gen).to(device)
    on_gpu = device.type == "cuda"
    spec = hf_specdec.SpecConfig(num_speculative_tokens=args.k, cuda_graphs=True if on_gpu else None,
                                 compile=False if on_gpu else None)
    start = time.perf_counter()
    out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False,
                          eos_token_id=None, pad_token_id=0, assistant_model=draft, spec_config=spec,
                          return_dict_in_generate=True)
    entry = {"batch": batch, "fast_path": out.spec_metrics.fast_path, "setup_s": round(time.perf_counter() - start, 2)}
    if not on_gpu:
        entry["note"] = "stage costs need CUDA events"
        return entry
    stages = time_stages(runner_for(target, draft), bucket_for(batch), args.repeats)
    entry.update({name: round(ms, 4) for name, ms in stages.items()})
    return entry


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="JSON written by rank 0")
    ap.add_argument("--report", nargs="+", metavar="JSON", help="print the markdown table of these files and exit")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens (the context the steps attend to)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--draft-tp", default="1,2", help="under torchrun: draft placements to time")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU dry run of the script)")
    args = ap.parse_args()
    if args.report:
        print(report([json.load(open(p)) for p in args.report], args.k))
        return
    world = int(os.environ.get("WORLD_SIZE", "1"))
    sizes, vocab = (TINY, 256) if args.tiny else (SIZES, 128256)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else \
        torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        target = hf_specdec.enable(build(config(sizes["target"], vocab), world > 1, device, dtype, scratch))
        rank = torch.distributed.get_rank() if world > 1 else 0
        log = print if rank == 0 else (lambda *a, **k: None)
        log(f"target built in {time.perf_counter() - start:.1f}s on {target.device}", flush=True)
        for draft_tp in ([int(t) for t in args.draft_tp.split(",")] if world > 1 else [1]):
            draft = build(config(sizes["draft"], vocab), draft_tp > 1, device, dtype, scratch)
            for batch in [int(b) for b in args.batches.split(",")]:
                entry = dict(target_tp=world, draft_tp=draft_tp, k=args.k, prompt=args.prompt,
                             **measure(target, draft, batch, args, device))
                rows.append(entry)
                log(json.dumps(entry), flush=True)
            del draft
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if rank == 0 and args.out:
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump({"gpu": gpu, "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
