"""Where a model's inputs go and where its last hidden states come out, when accelerate splits it.

A model loaded with ``device_map`` ("auto", "balanced", a dict) runs each block on its own
device; accelerate's hooks move activations at block boundaries. hf_specdec hands a paged
forward two kinds of tensors: the inputs (token ids, positions), read by the embedding, and
``logits_to_keep``, which the model uses to index the *last* hidden states before its output
layer. Those come out of the base model's last module (its final norm), which may sit on
another GPU than the embedding: indexing them with rows on the first device fails
("indices should be either on cpu or on the same device"). Everything else (paged-attention
metadata) follows each layer's own device (``PagedBatch.on``).

accelerate's hook on the whole model sends every tensor argument of its forward to the first
device, ``logits_to_keep`` too (and so undoes the placement above): ``kwargs_left_in_place``
names it among the hook's ``skip_keys`` for the length of one forward.

A module whose weights accelerate offloads (to "cpu" or "disk") keeps them on "meta" and runs
on its hook's ``execution_device``; that device is the one that counts.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterator, Optional

import torch
from torch import nn


def same_device(a: torch.device, b: torch.device) -> bool:
    """The same device, ``cuda`` without an index meaning the current one."""
    if a.type != b.type:
        return False
    current = torch.cuda.current_device() if a.type == "cuda" else 0
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


def _as_device(device) -> torch.device:
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def _hooks(module: nn.Module) -> list:
    """accelerate's hooks on ``module`` itself (a SequentialHook's parts), [] without one."""
    hook = getattr(module, "_hf_hook", None)
    return list(getattr(hook, "hooks", None) or ([hook] if hook is not None else []))


def _hook_device(module: nn.Module) -> Optional[torch.device]:
    """The execution device of accelerate's hook on ``module`` (None without one)."""
    for h in _hooks(module):
        device = getattr(h, "execution_device", None)
        if device is not None:
            return _as_device(device)
    return None


def execution_device(model: nn.Module, name: str) -> Optional[torch.device]:
    """Where submodule ``name`` of ``model`` runs: its own or its nearest ancestor's accelerate hook,
    else its first non-meta parameter (None when neither says)."""
    parts = name.split(".") if name else []
    for i in range(len(parts), -1, -1):
        device = _hook_device(model.get_submodule(".".join(parts[:i])))
        if device is not None:
            return device
    param = next(model.get_submodule(name).parameters(), None)
    return param.device if param is not None and param.device.type != "meta" else None


def is_split(model: nn.Module) -> bool:
    """True when accelerate placed the model's modules on more than one device."""
    device_map = getattr(model, "hf_device_map", None) or {}
    return len({str(d) for d in device_map.values()}) > 1


def _embedding_name(model: nn.Module) -> str:
    """The embedding's module name ("" for one the model reads but does not own: a draft head's, its target's)."""
    embedding = model.get_input_embeddings()
    return next((n for n, m in model.named_modules() if m is embedding), "")


def _last_hidden_name(model: nn.Module) -> str:
    """The base model's last module holding parameters (its final norm), in registration order."""
    prefix = getattr(model, "base_model_prefix", "")
    base_name = prefix if prefix and hasattr(model, prefix) else ""
    base = model.get_submodule(base_name)
    last = base_name
    for name, module in base.named_modules(prefix=base_name):
        if next(module.parameters(recurse=False), None) is not None:
            last = name
    return last


class _Placement:
    def __init__(self, model: nn.Module):
        fallback = model.get_input_embeddings().weight.device
        self.inputs = execution_device(model, _embedding_name(model)) or fallback
        self.hidden = self.inputs
        if is_split(model):
            self.hidden = execution_device(model, _last_hidden_name(model)) or self.inputs


_placements: "weakref.WeakKeyDictionary[nn.Module, _Placement]" = weakref.WeakKeyDictionary()


def _placement(model: nn.Module) -> _Placement:
    key = (id(getattr(model, "hf_device_map", None)), model.get_input_embeddings().weight.device)
    cached = _placements.get(model)
    if cached is None or cached.key != key:
        cached = _placements[model] = _Placement(model)
        cached.key = key
    return cached


def input_device(model: nn.Module) -> torch.device:
    """The device the model's embedding reads token ids on."""
    return _placement(model).inputs


def model_devices(model: nn.Module) -> set[torch.device]:
    """Every device the model computes on (one, unless a ``device_map`` split it)."""
    if not is_split(model):
        return {input_device(model)}
    devices = {execution_device(model, name) for name in model.hf_device_map}
    return {d for d in devices if d is not None}


def hidden_states_device(model: nn.Module) -> torch.device:
    """The device of the base model's last hidden states: where ``logits_to_keep`` must be."""
    return _placement(model).hidden


@contextlib.contextmanager
def kwargs_left_in_place(model: nn.Module, *names: str) -> Iterator[None]:
    """The forward keyword arguments ``names`` pass accelerate's hook on ``model`` where they are
    (its ``skip_keys``); the hook is as it was afterwards. No hook: nothing to do."""
    hooks = [h for h in _hooks(model) if hasattr(h, "skip_keys")]
    saved = [h.skip_keys for h in hooks]
    try:
        for h in hooks:
            kept = [] if h.skip_keys is None else [h.skip_keys] if isinstance(h.skip_keys, str) else list(h.skip_keys)
            h.skip_keys = kept + [n for n in names if n not in kept]
        yield
    finally:
        for h, keys in zip(hooks, saved):
            h.skip_keys = keys
