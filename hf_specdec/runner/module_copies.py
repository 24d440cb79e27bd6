"""Shallow copies of a model in which some modules run another class's forward: the runner's own paths through
the user's modules (``rotary_attention.py``, ``eager_fusions.py``), the user's model unchanged.

``copy_with(model, swap)`` copies the modules along the path to every module ``swap`` gives a class for
(``with_children``: ``copy.copy``, the same parameters, buffers and hooks' dicts, a child dict of its own) and gives
that copy the class; everything else is shared. A module with a ``forward`` of its own instance keeps it (the class's
would never run). ``plain`` says which modules may be swapped at all: no hooks (accelerate's device placement wraps
``forward`` on the instance) and no sharded or quantised weights; ``fused_projections.py`` fuses only plain linears.
"""
from __future__ import annotations

import copy
from typing import Callable, Optional

import torch
from torch import nn


def copy_with(module: nn.Module, swap: Callable[[nn.Module], Optional[type]]) -> nn.Module:
    """``module`` itself when nothing below it (or it) is swapped, else a shallow copy as above."""
    replaced = {name: copy_with(child, swap) for name, child in module.named_children()}
    replaced = {name: child for name, child in replaced.items() if child is not module._modules[name]}
    cls = None if "forward" in vars(module) else swap(module)
    if not replaced and cls is None:
        return module
    new = with_children(module, replaced)
    if cls is not None:
        new.__class__ = cls
    return new


def with_children(module: nn.Module, replaced: dict) -> nn.Module:
    """A shallow copy of ``module`` whose children named in ``replaced`` are those."""
    new = copy.copy(module)
    new._modules = dict(module._modules)
    new._modules.update(replaced)
    return new


def plain(module: nn.Module) -> bool:
    """No hooks and ordinary tensors for weights (not DTensor or quantised), so another forward computes the same."""
    return not hooked(module) and all(type(p.data) is torch.Tensor for p in module.parameters())


def hooked(module: nn.Module) -> bool:
    """Forward hooks of torch or accelerate on ``module``: its own forward must run for them."""
    return bool(module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook"))


def subclass(base: type, name: str, attributes: dict, made: dict) -> type:
    """The subclass of ``base`` with ``attributes`` (made once per base, kept in ``made``)."""
    cls = made.get(base)
    if cls is None:
        cls = made[base] = type(f"{name}{base.__name__}", (base,), attributes)
    return cls
