"""Which execution a call gets: the runner (bucketed, with CUDA graphs and compile where they
run) or the ragged eager path, and why. A request the fast path cannot serve exactly goes
to the eager path and ``spec_metrics.fast_path`` says so: never wrong output."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .config import SpecConfig
from .runner import graphs_supported
from .runner.bucket_state import MAX_EOS_IDS
from .runner.graph_logits import GraphLogits, graph_safe_logits


@dataclass
class PathChoice:
    bucketed: bool
    graphs: bool
    compile: bool
    logits: Optional[GraphLogits]
    label: str


def choose_path(spec: SpecConfig, device: torch.device, logits_processor, generation_config, streamer,
                eos_ids: list[int]) -> PathChoice:
    on_cuda = device.type == "cuda"
    if spec.cuda_graphs and not on_cuda:
        raise ValueError(f"SpecConfig(cuda_graphs=True) needs CUDA tensors; the inputs are on {device}. "
                         "Move the models and inputs to a GPU or drop cuda_graphs=True.")
    if spec.compile and not on_cuda:
        raise ValueError(f"SpecConfig(compile=True) compiles for CUDA graphs; the inputs are on {device}. "
                         "Drop compile=True.")
    if spec.bucketed is False:
        return PathChoice(False, False, False, None, "eager: SpecConfig(bucketed=False)")
    if spec.bucketed is None and not on_cuda:
        return PathChoice(False, False, False, None, f"eager: no CUDA device (inputs on {device})")
    logits, reason = graph_safe_logits(logits_processor)
    if reason is None:
        reason = _unsupported(generation_config, streamer, eos_ids)
    if reason is not None:
        if spec.num_speculative_tokens == 0:
            raise ValueError(f"num_speculative_tokens=0 runs on the bucketed runner, which cannot serve this "
                             f"request: {reason}.")
        return PathChoice(False, False, False, None, f"eager: {reason}")
    graphs = on_cuda and spec.cuda_graphs is not False
    if graphs:
        why_not = graphs_supported(spec.generator)
        if why_not is not None:
            if spec.cuda_graphs:
                raise ValueError(f"SpecConfig(cuda_graphs=True) cannot be honoured: {why_not}.")
            graphs = False
    compile = graphs and spec.compile is not False and (spec.compile or _compile_by_default())
    label = "graphs+compile" if compile else "graphs" if graphs else "bucketed"
    return PathChoice(True, graphs, compile, logits, label)


def _unsupported(generation_config, streamer, eos_ids: list[int]) -> Optional[str]:
    if generation_config.output_scores or generation_config.output_logits:
        return "output_scores / output_logits keep per-step tensors on the host"
    if streamer is not None:
        return "a streamer needs each token on the host"
    if len(eos_ids) > MAX_EOS_IDS:
        return f"{len(eos_ids)} EOS ids (the fast path handles {MAX_EOS_IDS})"
    return None


def _compile_by_default() -> bool:
    return True
