"""Model loading for evals/run_eval.py: one pair per process (data parallel), or one tensor-parallel
target shared by all launched processes (``--tp``), with the draft replicated or itself split. A draft
directory saved by ``hf_specdec.save_reduced_draft`` is loaded onto the target (``benchmarks.common.load_draft``)."""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from benchmarks.common import load_pair  # noqa: E402


def load_models(target_path: str, draft_path: str, device: torch.device, dtype: torch.dtype, tp: bool,
                draft_tp: int):
    """(tokenizer, target, draft). ``tp``: the target is loaded with ``tp_plan="auto"`` over every process of
    the launch; ``draft_tp`` 1 puts a whole draft on each process's device, > 1 loads it with ``tp_plan`` too."""
    if not tp:
        return load_pair(target_path, draft_path, device, dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        raise SystemExit("--tp shards the target over the launched processes: start it with "
                         "`accelerate launch --num_processes N` or `torchrun --nproc-per-node N` (N >= 2).")
    from hf_specdec.reduced_vocab_io import is_reduced_draft

    if is_reduced_draft(draft_path):
        raise SystemExit(f"{draft_path} is a reduced-vocabulary draft: it takes its input embedding from the target, "
                         "which --tp splits over the processes; run it without --tp (one pair per process).")
    if draft_tp not in (1, world):
        raise SystemExit(f"--draft-tp must be 1 (replicated) or {world} (the launch's processes); got {draft_tp}.")
    tok = AutoTokenizer.from_pretrained(target_path)
    tok.padding_side = "left"
    tok.truncation_side = "left"
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=dtype, tp_plan="auto").eval()
    if draft_tp > 1:
        draft = AutoModelForCausalLM.from_pretrained(draft_path, dtype=dtype, tp_plan="auto").eval()
    else:
        draft = AutoModelForCausalLM.from_pretrained(draft_path, dtype=dtype).to(device).eval()
    return tok, target, draft
