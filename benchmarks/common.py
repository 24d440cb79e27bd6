"""Helpers shared by the benchmarks and evals/run_eval.py (no `datasets` needed)."""

from __future__ import annotations

import gzip
import importlib
import json
import os
import signal
import time
from contextlib import contextmanager

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HUMANEVAL_CANDIDATES = (
    os.path.join(REPO_ROOT, "shared", "datasets", "humaneval", "HumanEval.jsonl.gz"),
    os.path.join(REPO_ROOT, "benchmarks", "data", "HumanEval.jsonl.gz"),
    os.path.join(REPO_ROOT, "HumanEval.jsonl.gz"),
    "/work/shared/datasets/humaneval/HumanEval.jsonl.gz",
)


def find_humaneval(path: str | None = None) -> str | None:
    if path:
        if not os.path.exists(path):
            raise FileNotFoundError(f"prompts file not found: {path}")
        return path
    for cand in HUMANEVAL_CANDIDATES:
        if os.path.exists(cand):
            return cand
    return None


def read_jsonl(path: str, field: str = "prompt", limit: int | None = None) -> list[str]:
    """Rows' `field` from a .jsonl or .jsonl.gz file."""
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            row = json.loads(line)
            if field not in row:
                raise KeyError(f"{path}: row has no field {field!r} (fields: {sorted(row)})")
            out.append(row[field])
            if limit is not None and len(out) >= limit:
                break
    return out


def exit_on_signal(signum, frame):
    """A signal handler: the run stops as with ``sys.exit``, so its ``finally`` blocks still write what it has."""
    raise SystemExit(f"stopped by signal {signal.Signals(signum).name}")


def on_sigterm(handler):
    """Install ``handler`` for SIGTERM; the one before (None off the main thread, where none can be installed)."""
    try:
        return signal.signal(signal.SIGTERM, handler) if handler is not None else None
    except ValueError:
        return None


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Wall time with a device synchronisation on both ends."""

    def __init__(self, device):
        self.device = device
        self.seconds = 0.0

    def __enter__(self):
        sync(self.device)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.seconds = time.perf_counter() - self.start
        return False


def graphed_call_us(calls, repeats: int) -> float:
    """Microseconds a call (CUDA): ``calls`` (one zero-argument callable a layer, each on its own inputs, as a step
    reads them) run once outside a capture (JIT compiles, allocator warm-up), captured in one graph, replayed
    ``repeats`` times; the median of 5 such measurements."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / (repeats * len(calls)) * 1e6)
    return sorted(times)[2]


def valid_new_tokens(row: torch.Tensor, prompt_len: int, eos_id, pad_id) -> list[int]:
    """Generated tokens of one output row: up to and including the first EOS, trailing pads removed."""
    new = row[prompt_len:].tolist()
    eos_ids = set(eos_id if isinstance(eos_id, (list, tuple)) else ([] if eos_id is None else [eos_id]))
    for i, t in enumerate(new):
        if t in eos_ids:
            return new[: i + 1]
    while new and pad_id is not None and new[-1] == pad_id:
        new.pop()
    return new


def load_pair(target_path, draft_path, device, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_path)
    tok.padding_side = "left"
    tok.truncation_side = "left"
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=dtype).to(device).eval()
    return tok, target, load_draft(draft_path, target, device, dtype)


def load_draft(draft_path, target, device, dtype):
    """An ordinary checkpoint (``from_pretrained``) or a reduced-vocabulary draft saved by
    ``hf_specdec.save_reduced_draft`` (``reduced_vocab.json`` present: loaded onto ``target``, whose input
    embedding it shares; ``from_pretrained`` would give it a random embedding and output layer)."""
    if os.path.isfile(os.path.join(draft_path, "reduced_vocab.json")):  # hf_specdec.reduced_vocab_io.META_FILE
        from hf_specdec.reduced_vocab_io import load_reduced_draft

        return load_reduced_draft(draft_path, target=target, dtype=dtype, device=device)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(draft_path, dtype=dtype).to(device).eval()


def spec_available() -> tuple[bool, str]:
    try:
        import hf_specdec  # noqa: F401

        hf_specdec.enable  # noqa: B018
        hf_specdec.SpecConfig  # noqa: B018
        return True, ""
    except Exception as exc:  # pragma: no cover - depends on the package's progress
        return False, f"{type(exc).__name__}: {exc}"


def metrics_dict(m) -> dict:
    if m is None:
        return {}
    if hasattr(m, "to_dict"):
        d = m.to_dict()
    elif isinstance(m, dict):
        d = dict(m)
    else:
        d = {k: getattr(m, k) for k in dir(m) if not k.startswith("_") and not callable(getattr(m, k))}
    out = {}
    for k, v in d.items():
        if isinstance(v, torch.Tensor):
            v = v.tolist()
        out[k] = v
    return out


def aggregate_metrics(dicts: list[dict]) -> dict:
    """Sum counters over several generate calls and recompute the rates."""
    if not dicts:
        return {}
    agg = {}
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_rounds", "num_emitted_tokens",
                "num_row_rounds", "prefill_seconds",
                "round_seconds", "total_seconds", "warmup_seconds", "decode_seconds"):
        vals = [d.get(key) for d in dicts if d.get(key) is not None]
        if vals:
            agg[key] = sum(vals)
    if any(d.get("k_histogram") for d in dicts):  # rounds per chosen k (adaptive speculation length)
        hist: dict = {}
        for d in dicts:
            for k, n in (d.get("k_histogram") or {}).items():
                hist[int(k)] = hist.get(int(k), 0) + n
        agg["k_histogram"] = dict(sorted(hist.items()))
    costs = [d["round_costs_ms"] for d in dicts if d.get("round_costs_ms")]
    if costs:  # adaptive k: the round costs the policy used, as it saw them at the end of the last call
        agg["round_costs_ms"] = costs[-1]
    if agg.get("num_row_rounds"):
        agg["match_fraction"] = agg.get("num_drafts", 0) / agg["num_row_rounds"]
    if all(d.get("accepted_per_position") is not None for d in dicts):
        n = max(len(d["accepted_per_position"]) for d in dicts)
        counts = [0.0] * n
        for d in dicts:
            for i, x in enumerate(d["accepted_per_position"]):
                counts[i] += float(x)
        agg["accepted_per_position_counts"] = counts
    elif "num_drafts" in agg and all(d.get("acceptance_per_position") is not None for d in dicts):
        # rates per position: weight by each call's drafts
        n = max(len(d["acceptance_per_position"]) for d in dicts)
        counts = [0.0] * n
        for d in dicts:
            for i, x in enumerate(d["acceptance_per_position"]):
                counts[i] += float(x) * d.get("num_drafts", 0)
        agg["accepted_per_position_counts"] = counts
    if "accepted_per_position_counts" in agg and agg.get("num_drafts"):
        agg["acceptance_per_position"] = [c / agg["num_drafts"] for c in agg["accepted_per_position_counts"]]
        if all(d.get("draft_lengths") is not None for d in dicts):  # drafts that proposed a j-th token
            from hf_specdec.call.metrics import drafts_reaching

            lengths: dict = {}
            for d in dicts:
                for n, c in d["draft_lengths"].items():  # JSON keys are strings
                    lengths[int(n)] = lengths.get(int(n), 0) + c
            drafted = drafts_reaching(lengths, len(agg["accepted_per_position_counts"]))
            agg["acceptance_per_drafted_position"] = [c / n if n else 0.0 for c, n in
                                                      zip(agg["accepted_per_position_counts"], drafted)]
    if agg.get("num_draft_tokens"):
        agg["acceptance_rate"] = agg["num_accepted_tokens"] / agg["num_draft_tokens"]
    if agg.get("num_drafts"):
        agg["mean_acceptance_length"] = 1.0 + agg["num_accepted_tokens"] / agg["num_drafts"]
    return agg


def acceptance_length_histogram(agg: dict, k: int) -> list[float] | None:
    """Number of drafts whose accepted prefix has length 0..k (from per-position counts)."""
    counts = agg.get("accepted_per_position_counts")
    n = agg.get("num_drafts")
    if counts is None or not n:
        return None
    counts = list(counts[:k]) + [0.0] * max(0, k - len(counts))
    hist = [n - counts[0]] + [counts[i] - (counts[i + 1] if i + 1 < k else 0.0) for i in range(k)]
    return [max(0.0, h) for h in hist]


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters (tied weights counted once): what one forward reads at least."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Tokens a row commits per round when each draft token is accepted with probability alpha."""
    if alpha >= 1.0 - 1e-9:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


POLICY_MODULES = ("hf_specdec.generate", "hf_specdec.round.policy.speculation_length",
                  "hf_specdec.round.policy.round_costs")  # library internals: named here only


@contextmanager
def policy_constants(settings: list[str], flag: str = "--set"):
    """Module constants of the speculation-length policy changed (``NAME=VALUE`` each, e.g.
    GRAPH_HOLD_ROUNDS=4) inside the block, restored after: a variant measured beside the default."""
    changed = []
    try:
        for setting in settings:
            name, value = setting.split("=", 1)
            owners = [m for m in map(importlib.import_module, POLICY_MODULES) if hasattr(m, name)]
            if not owners:
                raise SystemExit(f"{flag} {setting}: no policy constant {name} in {', '.join(POLICY_MODULES)}")
            for m in owners:
                old = getattr(m, name)
                changed.append((m, name, old))
                setattr(m, name, type(old)(float(value)))
        yield
    finally:
        for m, name, old in reversed(changed):
            setattr(m, name, old)
