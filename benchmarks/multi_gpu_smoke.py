"""Two-GPU smoke check: a target split by ``device_map`` and a tensor-parallel target, greedy-exact.

Random Llama (fp32, 8 layers, GQA 8:2, sharpened head so greedy has no near-ties), a draft that
is the target plus weight noise; batches 1, 4 and 16 of left-padded prompts of different lengths
with an EOS id that rows hit at different rounds.

    python benchmarks/multi_gpu_smoke.py --mode split --out $OUT/smoke_split.json
    torchrun --nproc-per-node 2 benchmarks/multi_gpu_smoke.py --mode tp --out $OUT/smoke_tp.json

split (one process): targets from ``from_pretrained(device_map="balanced")`` and a dict map (layers
0-3 on cuda:0, the rest and the head on cuda:1), drafts on cuda:0, on cuda:1 and "balanced"; the
runner without graphs (``fast_path`` says why); ``cuda_graphs=True`` must be refused with the reason.
Each output must equal the split target's own greedy ``generate()``.

tp (torchrun, 2 ranks): target ``tp_plan="auto"``, draft replicated (draft_tp=1) or split
(draft_tp=2); the runner without and with CUDA graphs (``fast_path == "graphs"``, all-reduces
captured; a second call captures nothing; a CPU dry run with gloo: without graphs only); greedy equal
to the sharded target's own ``generate()`` on both ranks; sampling identical on both ranks (different
global seeds per rank) and reproducible from rank 0's seed;
``--compile-only``: graphs + torch.compile at batch 4, reported, not required.
Exit status 1 if a required check fails.
"""
import argparse
import copy
import json
import os
import sys
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hf_specdec  # noqa: E402

K, NEW, VOCAB = 4, 48, 4096


def make_checkpoints(root: str) -> str:
    """Deterministic weights (seeded on the CPU): every rank writing its own copy gets the same files."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8)
    target.save_pretrained(os.path.join(root, "target"))
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05 * p.std())
    draft.save_pretrained(os.path.join(root, "draft"))
    return root


def load(path: str, **kw) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).eval()


def prompts(batch: int, device):
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(3, VOCAB, (batch, 37), generator=gen)
    mask = torch.ones_like(ids)
    for b in range(1, batch):
        mask[b, : (b * 7) % 30] = 0
    return ids.to(device), mask.to(device)


def case_inputs(target, batch: int, device):
    """Inputs, an EOS id that row 0 first emits at its 20th token or later (rows stop at different rounds),
    and plain greedy generate's output."""
    ids, mask = prompts(batch, device)
    free = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW,
                           eos_token_id=None, pad_token_id=0)[0, ids.shape[1]:].tolist()
    eos = next((t for j, t in enumerate(free) if j >= 19 and t not in free[:j]), None)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0)
    return kw, target.generate(**kw, do_sample=False)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def spec_call(target, draft, kw, spec_kw, **gen_kw):
    sync()
    start = time.perf_counter()
    out = target.generate(**kw, **gen_kw, assistant_model=draft, return_dict_in_generate=True,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=K, **spec_kw))
    sync()
    return out, time.perf_counter() - start


def row(name, out, expected, seconds):
    m = out.spec_metrics
    same = out.sequences.shape == expected.shape and bool((out.sequences == expected).all())
    return {"case": name, "identical": same, "fast_path": m.fast_path, "acceptance": round(m.acceptance_rate, 3),
            "rounds": m.num_rounds, "seconds": round(seconds, 3), "warmup": round(m.warmup_seconds, 2)}


def split_mode(root: str) -> tuple[list, bool]:
    half = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1}
    half.update({f"model.layers.{i}": 0 if i < 4 else 1 for i in range(8)})
    placements = [("balanced", "cuda:0"), ("dict", "cuda:1"), ("cuda:0", "cuda:1"), ("balanced", "balanced")]
    maps = {"balanced": "balanced", "dict": half, "cuda:0": "cuda:0", "cuda:1": "cuda:1"}
    rows, ok = [], True
    for t_place, d_place in placements:
        target = hf_specdec.enable(load(os.path.join(root, "target"), device_map=maps[t_place]))
        draft = load(os.path.join(root, "draft"), device_map=maps[d_place])
        spans = sorted({str(v) for v in getattr(target, "hf_device_map", {"": t_place}).values()})
        for batch in (1, 4, 16):
            kw, expected = case_inputs(target, batch, target.device)
            out, seconds = spec_call(target, draft, kw, {}, do_sample=False)
            r = row(f"target {t_place} {spans} / draft {d_place} / b={batch}", out, expected, seconds)
            sampled, _ = spec_call(target, draft, kw, {}, do_sample=True, top_k=0)
            r["sampled_acceptance"] = round(sampled.spec_metrics.acceptance_rate, 3)
            ok &= r["identical"] and r["fast_path"].startswith("bucketed")
            rows.append(r)
            print(json.dumps(r), flush=True)
        try:
            spec_call(target, draft, kw, {"cuda_graphs": True}, do_sample=False)
            refused = "not refused"
        except ValueError as exc:
            refused = str(exc)
        rows.append({"case": f"target {t_place} / draft {d_place}: cuda_graphs=True", "refused": refused})
        print(json.dumps(rows[-1]), flush=True)
        ok &= refused != "not refused"
        del target, draft
        torch.cuda.empty_cache()
    return rows, ok


def tp_mode(root: str, compile_only: bool) -> tuple[list, bool]:
    import torch.distributed as dist

    target = hf_specdec.enable(load(os.path.join(root, "target"), tp_plan="auto"))
    rank, device = dist.get_rank(), target.device
    drafts = {1: load(os.path.join(root, "draft")).to(device), 2: load(os.path.join(root, "draft"), tp_plan="auto")}
    paths = {"no_graphs": {"cuda_graphs": False}}  # a dry run with gloo on CPU: this only (the default there)
    if device.type == "cuda":
        paths["graphs"] = {"cuda_graphs": True, "compile": False}
    rows, ok = [], True

    def same_on_ranks(t: torch.Tensor) -> bool:
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, t.cpu().tolist())
        return all(e == everyone[0] for e in everyone)

    for draft_tp, draft in ({} if compile_only else drafts).items():
        for batch in (1, 4, 16):
            kw, expected = case_inputs(target, batch, device)
            for path, spec_kw in paths.items():
                spec_kw = dict(spec_kw, draft_tp=draft_tp)
                out, seconds = spec_call(target, draft, kw, spec_kw, do_sample=False)
                again, _ = spec_call(target, draft, kw, spec_kw, do_sample=False)
                r = row(f"tp=2 draft_tp={draft_tp} / b={batch} / {path}", out, expected, seconds)
                r["second_call_warmup"] = round(again.spec_metrics.warmup_seconds, 3)
                sampled = []
                for _ in range(2):  # the same seed twice: the shared generator is reseeded, graphs included
                    torch.manual_seed(100 + rank)  # ranks differ; hf_specdec shares rank 0's seed
                    sampled.append(spec_call(target, draft, kw, spec_kw, do_sample=True, top_k=0)[0])
                r["sampled_reproducible"] = bool(torch.equal(sampled[0].sequences, sampled[1].sequences))
                sampled = sampled[0]
                r["sampled_same_on_ranks"] = same_on_ranks(sampled.sequences)
                r["sampled_acceptance"] = round(sampled.spec_metrics.acceptance_rate, 3)
                r["identical_on_all_ranks"] = all(x for x in _gather(dist, r["identical"]))
                ok &= r["identical_on_all_ranks"] and r["sampled_same_on_ranks"] and r["sampled_reproducible"]
                ok &= r["fast_path"] == ("graphs" if path == "graphs" else "bucketed")
                ok &= r["second_call_warmup"] == 0.0
                rows.append(r)
                if rank == 0:
                    print(json.dumps(r), flush=True)
    if device.type == "cpu" or not compile_only:
        return rows, bool(all(_gather(dist, ok)))
    kw, expected = case_inputs(target, 4, device)
    try:  # reported only: torch.compile over DTensor shards
        out, seconds = spec_call(target, drafts[1], kw, {"cuda_graphs": True, "compile": True}, do_sample=False)
        r = row("tp=2 draft_tp=1 / b=4 / graphs+compile (reported)", out, expected, seconds)
    except Exception as exc:  # noqa: BLE001 - the report says what failed
        r = {"case": "tp=2 draft_tp=1 / b=4 / graphs+compile (reported)", "error": f"{type(exc).__name__}: {exc}"[:500]}
    rows.append(r)
    if rank == 0:
        print(json.dumps(r), flush=True)
    return rows, bool(all(_gather(dist, ok)))


def _gather(dist, value):
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["split", "tp"], required=True)
    ap.add_argument("--out", required=True, help="JSON report")
    ap.add_argument("--compile-only", action="store_true",
                    help="tp mode: only graphs + torch.compile at batch 4 (reported; exit 0 unless it crashes)")
    args = ap.parse_args()
    assert torch.cuda.device_count() >= 2 or args.mode == "tp", "split mode needs 2 GPUs"
    rank = int(os.environ.get("RANK", "0"))
    with tempfile.TemporaryDirectory() as tmp:
        root = make_checkpoints(tmp)
        rows, ok = split_mode(root) if args.mode == "split" else tp_mode(root, args.compile_only)
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (dry run)"
            json.dump({"mode": args.mode, "ok": ok, "gpus": gpu, "rows": rows}, fh, indent=1)
        print("OK" if ok else "FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
