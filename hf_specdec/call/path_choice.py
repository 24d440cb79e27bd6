"""How a call's rounds execute on the runner: with CUDA graphs (and compiled models) where they run, else
the same rounds without graphs, and why. ``spec_metrics.fast_path`` names the choice:
"graphs+compile", "graphs", "bucketed" (no graphs: CPU) or "bucketed: <why graphs do not run>"."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..cache import model_devices
from ..round.logits.graph_logits import graph_safe_logits
from ..round.logits.host_logits import HostLogits
from ..runner import graphs_supported
from .config import SpecConfig
from .tensor_parallel import tp_size


@dataclass
class PathChoice:
    graphs: bool
    compile: bool
    logits: object  # GraphLogits, or HostLogits (Hugging Face's own processors, graphs off)
    label: str


def choose_path(spec: SpecConfig, device: torch.device, logits_processor, batch_size: int,
                models: tuple = ()) -> PathChoice:
    """``models``: the target (and draft); a model on other GPUs than the inputs runs without graphs."""
    on_cuda = device.type == "cuda"
    if spec.cuda_graphs and not on_cuda:
        raise ValueError(f"SpecConfig(cuda_graphs=True) needs CUDA tensors; the inputs are on {device}. "
                         "Move the models and inputs to a GPU or drop cuda_graphs=True.")
    if spec.compile and not on_cuda:
        raise ValueError(f"SpecConfig(compile=True) compiles for CUDA graphs; the inputs are on {device}. "
                         "Drop compile=True.")
    _refuse_stepwise_state(logits_processor)
    logits, why_not = graph_safe_logits(logits_processor)
    if logits is None:
        logits = HostLogits(logits_processor, batch_size)
    graphs = on_cuda and spec.cuda_graphs is not False
    if graphs:
        why_not = why_not or graphs_supported(spec.generator) or spread_over_devices(models, device)
        if why_not is not None:
            if spec.cuda_graphs or spec.compile:
                raise ValueError(f"SpecConfig(cuda_graphs/compile=True) cannot be honoured: {why_not}.")
            graphs = False
    compile = graphs and spec.compile is not False and (spec.compile or _compile_by_default(models))
    label = "graphs+compile" if compile else "graphs" if graphs else "bucketed" + (f": {why_not}" if why_not else "")
    return PathChoice(graphs, compile, logits, label)


# processors that keep state from one generation step to the next (their own KV cache, a step counter): a round
# calls the processor list for many positions per step, some of them rejected, so their state would be wrong
_STEPWISE_STATE = ("UnbatchedClassifierFreeGuidanceLogitsProcessor",)


def _refuse_stepwise_state(processors) -> None:
    for p in processors or ():
        if type(p).__name__ in _STEPWISE_STATE:
            raise ValueError(f"{type(p).__name__} (from guidance_scale=) keeps state from one generation step to the "
                             "next, and a speculative round processes many positions per step, some of them "
                             "rejected: its output would not be plain generate()'s. Drop spec_config for this call "
                             "(or drop guidance_scale).")


def spread_over_devices(models: tuple, device: torch.device) -> Optional[str]:
    """Why a round cannot be one CUDA graph: a graph records one GPU's stream, so every model must compute
    on the inputs' device only (a ``device_map`` split or a draft on another GPU runs without graphs)."""
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        return (f"the inputs are on {device} but the current CUDA device is {torch.cuda.current_device()} (graphs "
                f"capture the current device's stream): call torch.cuda.set_device({device.index}) first")
    for name, model in zip(("target", "draft"), models):
        devices = model_devices(model) if model is not None else {device}
        if devices != {device}:
            where = ", ".join(sorted(str(d) for d in devices))
            return f"CUDA graphs capture one GPU; the {name} runs on {where}, the inputs on {device}"
    return None


def _compile_by_default(models: tuple) -> bool:
    """On, except for tensor-parallel models: torch.compile over DTensor shards is not verified yet
    (SpecConfig(compile=True) still asks for it; docs/parallel.md)."""
    return all(tp_size(m) == 1 for m in models)
