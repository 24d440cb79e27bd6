#!/usr/bin/env python
"""Cold start: what the first generate() of a fresh process costs, as a user meets it (issue 30).

One fresh Python process per (method, batch size), the public API only, model load not timed. Each such "cold"
process gets new, empty compile caches (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, HF_SPECDEC_CACHE,
CUDA_CACHE_PATH) under a scratch directory; then a second fresh process reuses those directories (warm caches)
and makes the first call again. Every call is timed with time.perf_counter() between torch.cuda.synchronize().

Methods (--methods, in the order run; rows not started within --deadline-s are listed as skipped):
  hf_compiled          plain HF generate(), cache_implementation="static" + compile_config (transformers'
                       auto-compile; on CPU transformers does not compile: the row says so)
  runner_plain         SpecConfig(num_speculative_tokens=0): plain decoding on hf_specdec's runner, no draft
  runner_plain_graphs  SpecConfig(num_speculative_tokens=0, compile=False): CUDA graphs, no compile (CUDA only)
  spec_default         SpecConfig() with the draft
  spec_k4              SpecConfig(num_speculative_tokens=4, adaptive=False) with the draft
  spec_head            SpecConfig() with a draft head (pair: DIR/head, evals/train_draft_head.py; else random)

Shapes (--shapes):
  8b    8B-shaped Llama target, 1B-shaped draft (benchmarks/tp_cost.py), random weights, bf16, built on the GPU;
        random prompts of --prompt-len tokens (default 256), --batch-sizes (default 1,32), --max-new-tokens 128,
        eos_token_id=None (every row runs the full length). Cold process: first call, the same call again
        (steady), a call with prompts of prompt length + --length-delta (new length); warm process: first call.
        ms_per_token = steady call seconds / new tokens per row, i.e. per decoding step of the whole batch.
  pair  the project's trained pair (--pair DIR: DIR/target with its tokenizer, DIR/draft), HumanEval prompts
        at their own lengths, left-padded, in dataset order, batched consecutively: the whole job per
        --jobs "b:prompts" (default 1:12,32:128), 256 new tokens, the tokenizer's EOS. job_s is the job's wall
        time in the fresh process (first call and tokenization included); the warm process runs the job again.
  tiny  CPU smoke: tiny random Llama pair (fp32) built in the process, short prompts with left padding.

    python benchmarks/cold_start.py --shapes 8b --out $OUT/cold_8b.json
    python benchmarks/cold_start.py --shapes pair --pair runs/pair --out $OUT/cold_pair.json
    python benchmarks/cold_start.py --shapes tiny --batch-sizes 1,3 --out /tmp/cold_tiny.json   # CPU smoke
    python benchmarks/cold_start.py --report a.json b.json     # the table of runs made in parts

Rows run batch sizes outer, methods inner, each cold process followed by its warm one; rows --deadline-s cuts are
listed as skipped (run the rest with --methods / --batch-sizes, merge with --report). Generated tokens are hashed
(whole for tiny or --record-tokens); same_tokens_as_hf_compiled compares them with hf_compiled's. The JSON holds
every row (calls, spec_metrics.warmup_seconds, fast_path, the environment); cold_start_report.py's table is last.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # the checkout's hf_specdec and benchmarks.*, in the driver and in every child
from benchmarks.cold_start_report import mark_agreement, progress, summarize, table, write_json  # noqa: E402

METHODS = ("hf_compiled", "runner_plain", "runner_plain_graphs", "spec_default", "spec_k4", "spec_head")
SPEC_CONFIGS = {"runner_plain": dict(num_speculative_tokens=0),
                "runner_plain_graphs": dict(num_speculative_tokens=0, compile=False),
                "spec_default": {},
                "spec_k4": dict(num_speculative_tokens=4, adaptive=False), "spec_head": {}}
CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "HF_SPECDEC_CACHE", "CUDA_CACHE_PATH")
DEFAULTS = {"8b": dict(prompt_len=256, max_new_tokens=128), "tiny": dict(prompt_len=12, max_new_tokens=16),
            "pair": dict(prompt_len=None, max_new_tokens=256)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", choices=("8b", "pair", "tiny"), default="8b")
    p.add_argument("--methods", default="hf_compiled,spec_default,runner_plain,spec_k4,runner_plain_graphs")
    p.add_argument("--batch-sizes", default="1,32", help="8b / tiny")
    p.add_argument("--jobs", default="1:12,32:128", help="pair: batch:prompts of each job")
    p.add_argument("--pair", help="pair: DIR with target/ (model + tokenizer) and draft/")
    p.add_argument("--prompts", help="pair: HumanEval.jsonl(.gz) (default: benchmarks.common.find_humaneval)")
    p.add_argument("--prompt-len", type=int, help="8b / tiny prompt tokens (default 256 / 12)")
    p.add_argument("--length-delta", type=int, default=37, help="the new-length call's prompts are this much longer")
    p.add_argument("--until-compiled-s", type=float, default=150.0,
                   help="cold process, compiling in the background: call again until compiled (at most this long)")
    p.add_argument("--max-new-tokens", type=int, help="default 128 (8b), 256 (pair), 16 (tiny)")
    p.add_argument("--no-second-process", action="store_true", help="skip the warm-cache processes")
    p.add_argument("--deadline-s", type=float, default=540.0, help="no process starts after this many seconds")
    p.add_argument("--budget-s", type=float, default=590.0, help="a child still running at this time is killed")
    p.add_argument("--child-timeout-s", type=float, default=480.0)
    p.add_argument("--record-tokens", action="store_true", help="keep every call's token ids (default: tiny only)")
    p.add_argument("--scratch", help="where the cache directories go (default: a new temp dir, removed after)")
    p.add_argument("--keep-scratch", action="store_true")
    p.add_argument("--out", default="cold_start.json")
    p.add_argument("--report", nargs="+", metavar="JSON", help="print the table of these files and exit")
    p.add_argument("--child", metavar="SPEC_JSON", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for key, value in DEFAULTS[args.shapes].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("pair", "prompts"):  # the children run in the repository: paths as the caller meant them
        if getattr(args, key):
            setattr(args, key, os.path.abspath(getattr(args, key)))
    return args


# --------------------------------------------------------------------------- child process
def child_main(spec_path):
    with open(spec_path) as fh:
        spec = json.load(fh)
    res = {"role": spec["role"], "method": spec["method"], "batch_size": spec["batch"], "calls": {}}
    save = lambda: write_json(spec["result"], res)  # noqa: E731  (after every call: a killed child keeps its rows)
    import torch
    import transformers

    import hf_specdec
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    res["env"] = {"device": str(device), "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "hf_specdec": os.path.dirname(hf_specdec.__file__), "cuda": torch.version.cuda,
                  "caches": {v: os.environ.get(v) for v in CACHE_VARS}}
    start = time.perf_counter()
    tok, target, draft, dtype = load_models(spec, device)
    res["load_s"] = time.perf_counter() - start
    res["dtype"] = str(dtype)
    save()
    kw = dict(do_sample=False, return_dict_in_generate=True, max_new_tokens=spec["max_new_tokens"])
    method = spec["method"]
    if method == "hf_compiled":
        from transformers import CompileConfig
        kw.update(cache_implementation="static", compile_config=CompileConfig())
    else:
        kw["spec_config"] = hf_specdec.SpecConfig(**SPEC_CONFIGS[method])
        if method.startswith("spec"):
            kw["assistant_model"] = draft
    if tok is None:
        kw.update(pad_token_id=0, eos_token_id=None)
    else:
        kw.update(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)

    def call(name, ids, mask):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = target.generate(input_ids=ids, attention_mask=mask, **kw)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        new = out.sequences[:, ids.shape[1]:].cpu()
        m = getattr(out, "spec_metrics", None)
        entry = {"s": seconds, "t0": t0, "batch": ids.shape[0], "prompt_len": ids.shape[1], "steps": new.shape[1],
                 "sha": hashlib.sha256(str(new.tolist()).encode()).hexdigest()[:16],
                 "warmup_seconds": getattr(m, "warmup_seconds", None), "fast_path": getattr(m, "fast_path", None),
                 "acceptance_rate": getattr(m, "acceptance_rate", None), "num_rounds": getattr(m, "num_rounds", None)}
        if tok is not None:
            from benchmarks.common import valid_new_tokens
            entry["new_tokens"] = sum(len(valid_new_tokens(r, 0, kw["eos_token_id"], kw["pad_token_id"])) for r in new)
        else:
            entry["new_tokens"] = new.numel()
        if spec["record_tokens"]:
            entry["tokens"] = new.tolist()
        res["calls"][name] = entry
        if method == "hf_compiled" and "compiled" not in res:
            res["compiled"] = hasattr(target, "_compiled_call")
            if not res["compiled"]:
                res["note"] = "transformers did not compile (it auto-compiles on accelerators only): static cache, " \
                    "eager"
        save()
        return entry

    if spec["shapes"] == "pair":
        run_job(spec, res, tok, device, call, cuda, torch)
    else:
        P, b = spec["prompt_len"], spec["batch"]
        first = call("first", *prompts(torch, target, b, P, spec["shapes"], device))
        if spec["role"] == "cold":
            call("steady", *prompts(torch, target, b, P, spec["shapes"], device))
            last = call("new_length", *prompts(torch, target, b, P + spec["length_delta"], spec["shapes"], device))
            until_compiled(spec, res, first, last, lambda name: call(name, *prompts(torch, target, b, P,
                                                                                    spec["shapes"], device)))
    res["done"] = True
    save()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the teardown (CUDA context, compile workers): it is no part of a measurement


def until_compiled(spec, res, first, last, call):
    """Compiled in the background (fast_path "graphs (compiling in the background)"): the same call again until
    the compiled code is in use (at most --until-compiled-s after the first call began), then once more.
    ``compiled_after_s``: from the first call's start to the start of the first call on compiled code."""
    waited = 0
    while "background" in (last.get("fast_path") or ""):
        if time.perf_counter() - first["t0"] > spec["until_compiled_s"]:
            res["compiled_after_s"] = None
            return
        time.sleep(1.0)
        waited += 1
        last = call(f"waiting_{waited}")
    if waited:
        res["compiled_after_s"] = last["t0"] - first["t0"]
        res["switch_call_s"], res["switch_warmup_s"] = last["s"], last["warmup_seconds"]
        res["compiled_steady_call_s"] = call("compiled_steady")["s"]


def load_models(spec, device):
    """(tokenizer or None, enabled target, draft or None, dtype): spec_head's draft is a draft head."""
    tok, target, draft, dtype = _load_models(spec, device, wants_draft=spec["method"] in ("spec_default", "spec_k4"))
    if spec["method"] == "spec_head":
        import hf_specdec
        draft = (hf_specdec.load_draft_head(os.path.join(spec["pair"], "head"), target=target)
                 if spec["shapes"] == "pair" else hf_specdec.DraftHead.for_target(target))
    return tok, target, draft, dtype


def _load_models(spec, device, wants_draft):
    import copy

    import torch

    import hf_specdec
    if spec["shapes"] == "pair":
        from benchmarks.common import load_draft
        from transformers import AutoModelForCausalLM, AutoTokenizer
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        path = os.path.join(spec["pair"], "target")
        tok = AutoTokenizer.from_pretrained(path, padding_side="left")
        target = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        draft = load_draft(os.path.join(spec["pair"], "draft"), target, device, dtype) if wants_draft else None
        return tok, hf_specdec.enable(target), draft, dtype
    from benchmarks.tp_cost import SIZES, TINY, build, config
    if spec["shapes"] == "8b":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        target = build(config(SIZES["target"], 128256), False, device, dtype, None)
        draft = build(config(SIZES["draft"], 128256), False, device, dtype, None) if wants_draft else None
        return None, hf_specdec.enable(target), draft, dtype
    torch.manual_seed(0)  # tiny: the draft a perturbed copy of the target, so that some drafts are accepted
    dtype = torch.float32
    target = build(config(TINY["target"], 256), False, device, dtype, None)
    with torch.no_grad():
        target.lm_head.weight.mul_(8)  # decisive logits: no near-ties between the paths
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.3 * p.std())
    return None, hf_specdec.enable(target), draft if wants_draft else None, dtype


def prompts(torch, target, b, length, shapes, device):
    """Random prompt ids (seeded by batch and length); tiny: rows left-padded by different amounts."""
    gen = torch.Generator().manual_seed(1000 * b + length)
    ids = torch.randint(3, target.config.vocab_size, (b, length), generator=gen)
    mask = torch.ones_like(ids)
    if shapes == "tiny":
        for r in range(b):
            pad = (r * 5) % max(1, length // 2)
            ids[r, :pad], mask[r, :pad] = 0, 0
    return ids.to(device), mask.to(device)


def run_job(spec, res, tok, device, call, cuda, torch):
    """The whole job: n prompts in dataset order, consecutive batches of b, each left-padded to its longest."""
    from benchmarks.common import find_humaneval, read_jsonl
    path = find_humaneval(spec["prompts"])
    if path is None:
        raise SystemExit("no HumanEval prompts found: pass --prompts PATH (HumanEval.jsonl.gz)")
    texts = read_jsonl(path, "prompt", spec["n_prompts"])
    b = spec["batch"]
    res.update(prompts_file=path, n_prompts=len(texts))
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(0, len(texts), b):
        enc = tok(texts[i:i + b], return_tensors="pt", padding=True).to(device)
        call(f"call_{i // b}", enc["input_ids"], enc["attention_mask"])
    if cuda:
        torch.cuda.synchronize()
    res["job_s"] = time.perf_counter() - t0


# --------------------------------------------------------------------------- driver
def int_list(text):
    return [int(x) for x in text.split(",") if x.strip()]


def plan(args):
    """(method, batch, prompts of the job or None) in the order run: batch sizes outer, methods inner."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; known: {', '.join(METHODS)}")
    if args.shapes == "pair":
        if not args.pair:
            raise SystemExit("--shapes pair needs --pair DIR")
        sizes = [tuple(int(x) for x in job.split(":")) for job in args.jobs.split(",") if job.strip()]
    else:
        sizes = [(b, None) for b in int_list(args.batch_sizes)]
    return [(m, b, n) for b, n in sizes for m in methods]


def run_child(args, row, role, dirs, t_start):
    """One fresh process; its result (partial if it died), with the error and the last lines of stderr."""
    tag = f"{row['method']}_b{row['batch_size']}_{role}"
    spec = {"role": role, "method": row["method"], "batch": row["batch_size"], "n_prompts": row.get("n_prompts"),
            "shapes": args.shapes, "pair": args.pair, "prompts": args.prompts, "prompt_len": args.prompt_len,
            "length_delta": args.length_delta, "max_new_tokens": args.max_new_tokens,
            "until_compiled_s": args.until_compiled_s,
            "record_tokens": args.record_tokens or args.shapes == "tiny",
            "result": os.path.join(dirs["root"], f"{tag}.result.json")}
    spec_path = os.path.join(dirs["root"], f"{tag}.spec.json")
    write_json(spec_path, spec)
    env = dict(os.environ, **{v: dirs[v] for v in CACHE_VARS})
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    timeout = max(1.0, min(args.child_timeout_s, args.budget_s - (time.perf_counter() - t_start)))
    err_path = os.path.join(dirs["root"], f"{tag}.stderr")
    start = time.perf_counter()
    with open(os.path.join(dirs["root"], f"{tag}.stdout"), "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", spec_path], cwd=REPO, env=env,
                                stdout=out, stderr=err, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        try:  # the child's own process group: what it left (compile workers) or, timed out, the child itself
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    res = {}
    if os.path.exists(spec["result"]):
        with open(spec["result"]) as fh:
            res = json.load(fh)
    res["process_s"] = time.perf_counter() - start
    if rc != 0 or not res.get("done"):
        with open(err_path, errors="replace") as fh:
            tail = fh.read().splitlines()[-15:]
        res["error"] = (f"killed after {timeout:.0f} s (--child-timeout-s / --budget-s)" if rc is None
                        else f"exit status {rc}") + ": " + " | ".join(tail)[-1500:]
    return res


def driver(args):
    import torch  # only to know whether CUDA is here; the children do the work
    t_start = time.perf_counter()
    cuda = torch.cuda.is_available()
    if args.scratch and os.path.isdir(args.scratch) and os.listdir(args.scratch):
        raise SystemExit(f"--scratch {args.scratch} is not empty: cold processes need empty cache directories")
    scratch = args.scratch or tempfile.mkdtemp(prefix="cold_start_")
    report = {"shapes": args.shapes, "args": vars(args), "scratch": scratch, "env": None, "rows": []}
    for method, b, n in plan(args):
        row = {"method": method, "batch_size": b}
        if n is not None:
            row["n_prompts"] = n
        report["rows"].append(row)
        elapsed = time.perf_counter() - t_start
        if method == "runner_plain_graphs" and not cuda:
            row["skipped"] = ("needs CUDA: without CUDA graphs SpecConfig(compile=False) is runner_plain as it runs "
                              "on CPU")
        elif elapsed > args.deadline_s:
            row["skipped"] = f"not started: {elapsed:.0f} s > --deadline-s {args.deadline_s:g}"
        if "skipped" in row:
            print(f"[cold_start {elapsed:6.1f}s] {method:<19} b={b:<3} SKIPPED {row['skipped']}", flush=True)
            write_json(args.out, report)
            continue
        dirs = {"root": os.path.join(scratch, f"{method}_b{b}")}
        dirs.update({v: os.path.join(dirs["root"], v.lower()) for v in CACHE_VARS})
        for v in CACHE_VARS:
            os.makedirs(dirs[v])  # new and empty: fails if the directory exists
        cold, warm = run_child(args, row, "cold", dirs, t_start), None
        report["env"] = report["env"] or cold.get("env")
        if not args.no_second_process:
            elapsed = time.perf_counter() - t_start
            if "error" in cold:
                row["second_process_skipped"] = "the cold process failed"
            elif elapsed > args.deadline_s:
                row["second_process_skipped"] = f"not started: {elapsed:.0f} s > --deadline-s {args.deadline_s:g}"
            else:
                warm = run_child(args, row, "warm", dirs, t_start)
        summarize(row, cold, warm)
        mark_agreement(report)
        print(f"[cold_start {time.perf_counter() - t_start:6.1f}s] {method:<19} b={b:<3} " + progress(row), flush=True)
        write_json(args.out, report)  # a run cut short still leaves its rows
    report["total_s"] = time.perf_counter() - t_start
    write_json(args.out, report)
    if not (args.scratch or args.keep_scratch):
        shutil.rmtree(scratch, ignore_errors=True)
    print(table([report]), flush=True)
    return report


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return child_main(args.child)
    if args.report:
        reports = []
        for path in args.report:
            with open(path) as fh:
                reports.append(json.load(fh))
        print(table(reports))
        return None
    return driver(args)


if __name__ == "__main__":
    main()
