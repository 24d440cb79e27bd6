"""One rank of tests/test_tensor_parallel.py: run under ``torchrun --nproc-per-node 2`` (gloo on CPU).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/tp_worker.py CKPT_DIR OUT_DIR

Loads the target (and the draft) with ``tp_plan="auto"`` and as ordinary models, runs the cases
below on both paths and writes ``OUT_DIR/rank{r}.json``; the test compares the ranks' files.
"""
import faulthandler
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_specdec  # noqa: E402
from models import left_padded_prompts  # noqa: E402

VOCAB = 128


def load(path, tp):
    kw = {"tp_plan": "auto"} if tp else {}
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).eval()


def generate(target, draft, ids, mask, new, **kw):
    spec = kw.pop("spec", {})
    out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, eos_token_id=None, pad_token_id=0,
                          assistant_model=draft, spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, **spec),
                          return_dict_in_generate=True, **kw)
    return out.sequences.tolist(), out.spec_metrics


def error_of(fn) -> str:
    try:
        fn()
    except Exception as exc:  # the message is what the test checks
        return f"{type(exc).__name__}: {exc}"
    return ""


def main(ckpt, out_dir):
    target = hf_specdec.enable(load(os.path.join(ckpt, "target"), tp=True))
    rank = dist.get_rank()
    plain_target = hf_specdec.enable(load(os.path.join(ckpt, "target"), tp=False))
    drafts = {"replicated": load(os.path.join(ckpt, "draft"), tp=False),
              "tp": load(os.path.join(ckpt, "draft"), tp=True)}
    copy = load(os.path.join(ckpt, "target"), tp=False)  # accepts (nearly) every sampled draft
    res = {"rank": rank, "q_proj_local": list(target.model.layers[0].self_attn.q_proj.weight.to_local().shape),
           "greedy": {}, "sample": {}}
    for batch in (1, 4):
        ids, mask = left_padded_prompts(batch, seed=batch, vocab=VOCAB)
        plain = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                eos_token_id=None, pad_token_id=0).tolist()
        for name, draft in drafts.items():
            seqs, m = generate(target, draft, ids, mask, 12, do_sample=False)
            res["greedy"][f"b{batch}/{name}"] = {"same": seqs == plain, "fast_path": m.fast_path}
        torch.manual_seed(1000 + rank)  # different global seeds: hf_specdec shares rank 0's
        seqs, _ = generate(target, drafts["replicated"], ids, mask, 12, do_sample=True, top_k=0)
        res["sample"][f"b{batch}/shared"] = seqs
        # the same generator seed on a plain (unsharded) target gives the same draws
        spec = lambda: {"generator": torch.Generator().manual_seed(7)}  # noqa: E731
        tp_seqs, _ = generate(target, drafts["replicated"], ids, mask, 12, do_sample=True, top_k=0, spec=spec())
        ref_seqs, _ = generate(plain_target, drafts["replicated"], ids, mask, 12, do_sample=True, top_k=0,
                               spec=spec())
        res["sample"][f"b{batch}/seeded"] = {"same_as_unsharded": tp_seqs == ref_seqs}
    runners = target.__dict__["_hf_specdec_runners"]
    res["pool_kv_heads"] = {
        f"{name}/{cache}": sorted({p.shape[-2] for p in runners[id(d)].caches[cache].key_pools.values()})
        for name, d in drafts.items() for cache in ("target", "draft")}
    ids, mask = left_padded_prompts(4, seed=9, vocab=VOCAB)
    # one round only (max_new_tokens=2): the ranks run the same collectives even though they diverge
    rank_gen = torch.Generator().manual_seed(rank)
    res["diverged"] = error_of(lambda: generate(target, copy, ids, mask, 2, do_sample=True, top_k=0,
                                                spec={"generator": rank_gen}))
    res["draft_tp_errors"] = {
        "want2_got1": error_of(lambda: generate(target, drafts["replicated"], ids, mask, 4, spec={"draft_tp": 2})),
        "want1_got2": error_of(lambda: generate(target, drafts["tp"], ids, mask, 4, spec={"draft_tp": 1})),
        "tp_draft_plain_target": error_of(lambda: generate(plain_target, drafts["tp"], ids, mask, 4)),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(res, fh)


if __name__ == "__main__":
    faulthandler.enable()  # a crash in native code prints every thread's Python stack (CI shows stderr)
    try:
        main(sys.argv[1], sys.argv[2])
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    if dist.is_initialized():  # gloo's teardown may abort a rank (evals/run_eval.py says more): leave without it
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
