"""Local text for distilling a draft from its target, and the choice of the draft's kept tokens.

Text comes from local Python source, split into train / held-out by file exactly as
``build_pair.py`` does (hash of the relative path; duplicate contents dropped), so no
held-out text is trained on. Documents are ``[BOS] text [EOS]`` with the target's own
tokenizer, packed and cut into fixed windows.

The kept tokens are the target's most frequent outputs on that text: tokens ranked by the
probability mass the target gives them summed over every position (the expected count of
each token in the target's sampled output), special tokens always kept.
"""
from __future__ import annotations

import json
import os
import site
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_pair import heldout_prompt_windows, list_source_files, split_and_read  # noqa: E402


def read_texts(source_dirs, max_bytes: float, heldout_frac: float, heldout_max_bytes: float, seed: int):
    """(train, heldout) lists of (relative path, text); default sources: the installed site-packages."""
    dirs = source_dirs or [d for d in site.getsitepackages() if os.path.isdir(d)]
    files = list_source_files(dirs)
    return split_and_read(files, int(max_bytes), heldout_frac, int(heldout_max_bytes), seed)


def pack_windows(tok, texts: list[str], seq_len: int, max_windows: int | None = None) -> torch.Tensor:
    """``(n, seq_len)`` token windows of the concatenated ``[BOS] text [EOS]`` documents."""
    bos, eos = tok.bos_token_id, tok.eos_token_id
    stream: list[int] = []
    limit = None if max_windows is None else max_windows * seq_len
    for start in range(0, len(texts), 256):
        for ids in tok(texts[start:start + 256], add_special_tokens=False).input_ids:
            stream.extend(([bos] if bos is not None else []) + ids + ([eos] if eos is not None else []))
        if limit is not None and len(stream) >= limit:
            break
    n = len(stream) // seq_len if limit is None else min(len(stream) // seq_len, max_windows)
    if n == 0:
        raise SystemExit(f"not enough text for one window of {seq_len} tokens ({len(stream)} tokens); "
                         "add --source-dir or lower --seq-len.")
    return torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)


def special_ids(tok, config) -> list[int]:
    """Ids the draft must always be able to propose: BOS/EOS/PAD/UNK and the tokenizer's special tokens."""
    ids = set(int(i) for i in tok.all_special_ids)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        ids.update([value] if isinstance(value, int) else (value or []))
    return sorted(i for i in ids if i is not None and i >= 0)


@torch.no_grad()
def target_token_mass(target, windows: torch.Tensor, batch_size: int, device, autocast_dtype) -> dict:
    """Per-token probability mass and argmax counts of the target's next-token distributions over ``windows``."""
    vocab = target.config.get_text_config().vocab_size
    mass = torch.zeros(vocab, dtype=torch.float64, device=device)
    top = torch.zeros(vocab, dtype=torch.float64, device=device)
    for start in range(0, windows.shape[0], batch_size):
        ids = windows[start:start + batch_size].to(device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = target(input_ids=ids).logits
        probs = torch.softmax(logits.float(), -1).view(-1, logits.shape[-1])[:, :vocab]  # padding rows dropped
        mass += probs.sum(0).double()
        top += torch.bincount(probs.argmax(-1), minlength=vocab).double()
    return {"mass": mass.cpu(), "argmax": top.cpu(), "positions": int(windows.numel())}


def choose_kept(mass: torch.Tensor, num_kept: int, always: list[int]) -> torch.Tensor:
    """The ``num_kept`` ids of largest mass, ``always`` included (they count towards ``num_kept``)."""
    vocab = mass.shape[0]
    if not len(always) <= num_kept <= vocab:
        raise SystemExit(f"--num-kept {num_kept} must lie in [{len(always)} (special tokens), {vocab} (vocabulary)].")
    score = mass.clone()
    score[torch.tensor(always, dtype=torch.long)] = float("inf")
    return torch.sort(torch.topk(score, num_kept).indices).values


def eval_prompts(tok, heldout, n: int, max_tokens: int, seed: int) -> list[str]:
    """``n`` held-out source windows as prompt texts, each cut to at most ``max_tokens`` tokens."""
    prompts = []
    for w in heldout_prompt_windows(heldout, n, seed):
        ids = tok(w["prompt"], add_special_tokens=False).input_ids[:max_tokens]
        prompts.append(tok.decode(ids))
    return prompts


def write_prompts(path, prompts: list[str]) -> None:
    """``prompts`` as jsonl rows ``{"task_id": "heldout/i", "prompt": ...}`` (``evals/run_eval.py --data``)."""
    with open(path, "w") as fh:
        for i, p in enumerate(prompts):
            fh.write(json.dumps({"task_id": f"heldout/{i}", "prompt": p}) + "\n")
