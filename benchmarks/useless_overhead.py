"""Where does a useless draft's adaptive call spend more than plain k = 0? Host timers on the round loop's
pieces (wrapped methods), calls interleaved (plain, useless, plain, ...) so that clock drift and a growing
host heap hit both alike; prints per-call milliseconds of each piece and their difference.

GPU:  PYTHONPATH=. python benchmarks/useless_overhead.py          (runs/pair, bf16; b = 1 then b = 32)
CPU smoke:  DIAG_DEV=cpu DIAG_PAIR=runs/tiny_pair DIAG_NEW=16 python benchmarks/useless_overhead.py
Env: DIAG_PROMPTS (HumanEval.jsonl(.gz), default: the known places). On the H100 (2026-11-23) the b = 32
section did not finish within 20 minutes; its cause was not found (benchmarks/strategies.py at b = 32 runs).
"""
import copy, sys, time, json, collections, functools, os
sys.path.insert(0, '.')
import torch, hf_specdec
from benchmarks.common import load_pair
from benchmarks.strategies import batches, prompt_sets
from benchmarks.e2e_spec import bucket_warmups
import hf_specdec.fast_generate as fg, hf_specdec.fast_rows as fr, hf_specdec.generate as gen
from hf_specdec.runner.spec_runner import SpecRunner
from hf_specdec.strategies.speculation_length import SpeculationLength
from hf_specdec.cache.paged_cache import PagedKVCache

T = collections.defaultdict(float); N = collections.defaultdict(int)
def wrap(owner, name, label=None):
    f = getattr(owner, name); label = label or f"{getattr(owner, '__name__', owner)}.{name}"
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: T[label] += time.perf_counter() - t; N[label] += 1
    setattr(owner, name, w)
for n in ("begin", "prefill", "load", "read", "round", "catch_up", "capture", "statistics", "store", "defer_draft", "shrink"):
    wrap(SpecRunner, n)
for n in ("choose", "observe", "end_call", "_choose"):
    wrap(SpeculationLength, n)
wrap(fr.FastRows, "_start"); wrap(fr.FastRows, "finish"); wrap(fr.FastRows, "join")
wrap(PagedKVCache, "reset"); wrap(PagedKVCache, "reserve")
wrap(gen, "run_fast"); wrap(gen, "speculative_generate")
wrap(gen, "cache_budget"); wrap(gen, "check_request"); wrap(gen, "choose_path"); wrap(gen, "_finish")

class A: prompts = os.environ.get("DIAG_PROMPTS"); max_prompt_tokens = 192
DEV = torch.device(os.environ.get("DIAG_DEV", "cuda")); PAIR = os.environ.get("DIAG_PAIR", "runs/pair"); DT = torch.bfloat16 if DEV.type == "cuda" else torch.float32
tok, target, draft = load_pair(PAIR + "/target", PAIR + "/draft", DEV, DT)
torch.manual_seed(0)
useless = type(draft)(copy.deepcopy(draft.config)).to(device=DEV, dtype=DT).eval()
hf_specdec.enable(target)
kw = dict(max_new_tokens=int(os.environ.get("DIAG_NEW", 128)), do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
          return_dict_in_generate=True)
modes = {"plain": lambda x: target.generate(input_ids=x[0], attention_mask=x[1], **kw,
                                            spec_config=hf_specdec.SpecConfig(num_speculative_tokens=0)),
         "useless": lambda x: target.generate(input_ids=x[0], attention_mask=x[1], assistant_model=useless, **kw,
                                              spec_config=hf_specdec.SpecConfig(num_speculative_tokens=4, bucketed=True if DEV.type == "cpu" else None))}
sets = prompt_sets(A, tok)
for b, n, passes in ((1, 6, 3), (32, 32, 5)) if DEV.type == "cuda" else ((1, 2, 1), (4, 4, 1)):
    work = batches(tok, sets["code"], b, n, 192, DEV)
    for m, f in modes.items():
        for x in bucket_warmups(work[0], b) + work + work:
            f(x)
    acc = {m: collections.defaultdict(float) for m in modes}
    for p in range(passes):
        for x in work:
            for m, f in modes.items():
                T.clear(); N.clear()
                (torch.cuda.synchronize() if DEV.type == "cuda" else None); t = time.perf_counter()
                out = f(x)
                (torch.cuda.synchronize() if DEV.type == "cuda" else None); wall = time.perf_counter() - t
                a = acc[m]; a["wall"] += wall; a["calls"] += 1
                sm = out.spec_metrics
                for k in ("prefill_seconds", "round_seconds", "decode_seconds", "total_seconds", "num_rounds"):
                    a[k] += getattr(sm, k)
                for k, v in T.items():
                    a[k] += v; a["n:" + k] += N[k]
                a["hist:" + json.dumps(sm.k_histogram)] += 1
    print(f"== b={b}: per call (ms), {passes} passes x {len(work)} calls, interleaved")
    keys = sorted(set(acc["plain"]) | set(acc["useless"]), key=lambda k: -abs(acc["useless"].get(k, 0) - acc["plain"].get(k, 0)))
    for k in keys:
        if k == "calls": continue
        p_, u_ = acc["plain"].get(k, 0) / acc["plain"]["calls"], acc["useless"].get(k, 0) / acc["useless"]["calls"]
        scale = 1 if (k.startswith("n:") or k.startswith("hist:") or k == "num_rounds") else 1e3
        print(f"  {k:45s} plain {p_*scale:9.3f}  useless {u_*scale:9.3f}  diff {(u_-p_)*scale:+9.3f}")
