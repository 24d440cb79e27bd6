"""Fused q/k/v and gate/up projections in the compiled layers, without a second copy of the weights.

At b = 1 a decode step reads every weight once, and small matmuls read slowly: on an H200 an 8B-shaped
layer's k and v projections (4096 x 1024) ran at 1.6 TB/s with split-K reductions, against 3.9 TB/s for the
large gate/up ones. One matmul over the concatenated ``[q; k; v]`` (and ``[gate; up]``) weight reads them at
the large-matmul rate, in one launch instead of three (two). Measured on an H100 (``benchmarks/scale.py``,
8B/1B shapes, both versions in one run): target step 6.89 -> 6.43 ms, 1B draft step 1.70 -> 1.49 ms at b = 1;
kernels per layer 21.7 -> 15.7 and 18.4 -> 15.4.

How, without changing what the user's model computes or how much memory it holds:

- **Storage.** At the first call that compiles (CUDA, ``compile`` not False), each group's weights (and
  biases) are copied once into one tensor and the user's parameters become views of its rows
  (``param.data = fused[a:b]``): the same values, the same Parameter objects, no extra memory. ``state_dict``,
  ``torch.save``, ``save_pretrained`` and in-place loads see ordinary tensors. (``safetensors.torch.save_model``
  refuses views of a storage that none of them covers; ``save_pretrained`` and
  ``safetensors.torch.save_file(model.state_dict())`` save such a model.)
- **A copy of the module path.** ``shared_projections(model).module_copy(model)``: a shallow structural
  copy in which each fused projection is a ``FusedSliceLinear`` computing ``linear(x, fused)[..., a:b]``
  (parameters, other modules and the config shared). The user's model keeps its ``nn.Linear`` modules: its
  own forward (and Hugging Face's compiled path on it) is unchanged. Only the runner's compiled regions run
  the copy. On CUDA in inference, the copy's projections (fused or not: ``DecodeLinear``) call
  ``kernels.decode_linear``, which runs a GEMV for one row where it beat cuBLAS (8B shapes, H100: target
  step 6.41 -> 6.30 ms, 1B draft step 1.54 -> 1.47 ms at b = 1) and ``F.linear`` otherwise.
- **One matmul.** The three slices of a group read the same input and the same fused weight (one buffer,
  deduplicated by Dynamo), so their three matmuls are identical; ``SharedMatmulCSE``, a post-grad pass
  given to Inductor (``inductor_passes.py``), keeps one. Without the pass they would be computed three times.

``SharedProjections.repair`` restores the sharing when the parameters got new storage (``model.to(dtype)``,
``load_state_dict(assign=True)``): the fused tensors then receive the parameters' current values in place,
so compiled code and graphs keep reading valid addresses.
"""
from __future__ import annotations

import copy
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import decode_linear  # also registers torch.ops.hf_specdec.decode_linear
from .module_copies import plain, with_children

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_FUSED_ATTRIBUTE = dict(zip(GROUPS, ("fused_qkv", "fused_gate_up")))  # where the uncompiled copy keeps a group


def fused_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """A fused group's one matmul, through ``kernels.decode_linear`` where the compiled copy's projections use it."""
    return (decode_linear if uses_decode_linear(weight) else F.linear)(x, weight, bias)


class FusedSliceLinear(nn.Linear):
    """One projection of a fused group: its rows ``[start, stop)`` of ``linear(x, fused_weight, fused_bias)``."""

    fused_start: int
    fused_stop: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linear = decode_linear if uses_decode_linear(self.fused_weight) else F.linear
        return linear(x, self.fused_weight, self.fused_bias)[..., self.fused_start:self.fused_stop]


class DecodeLinear(nn.Linear):
    """A linear layer of the compiled copy through ``kernels.decode_linear`` (a GEMV where it beats cuBLAS)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linear = decode_linear if uses_decode_linear(self.weight) else F.linear
        return linear(x, self.weight, self.bias)


def fused_group(module: nn.Module, names: tuple[str, ...]) -> Optional[tuple]:
    """``(weight, bias, sizes)`` of the one matmul a runner copy's ``module`` computes for its projections ``names``
    (one of ``GROUPS``): the uncompiled copy's ``fused_qkv`` / ``fused_gate_up``, or ``FusedSliceLinear`` children
    covering one fused tensor in order (the compiled copy's); None where they are not fused. Read at each forward:
    ``repair`` may have given the copies new fused tensors."""
    own = getattr(module, _FUSED_ATTRIBUTE[names], None)
    if own is not None:
        return own
    linears = [getattr(module, name, None) for name in names]
    if not all(isinstance(linear, FusedSliceLinear) for linear in linears):
        return None
    weight, bias, start = linears[0].fused_weight, linears[0].fused_bias, 0
    for linear in linears:
        if linear.fused_weight is not weight or linear.fused_start != start:
            return None
        start = linear.fused_stop
    return (weight, bias, tuple(linear.fused_stop - linear.fused_start for linear in linears)) \
        if start == weight.shape[0] else None


def uses_decode_linear(weight: torch.Tensor) -> bool:
    """Whether the copy's projections call ``kernels.decode_linear``: on CUDA, in inference (the op has no
    autograd formula, and under autocast its output dtype would not be the one its fake implementation
    promises). Device, grad mode and autocast are global guards of the compiled layer, the same for every layer."""
    return weight.is_cuda and not torch.is_grad_enabled() and not torch.is_autocast_enabled(weight.device.type)


def _decode_copy(linear: nn.Linear) -> nn.Linear:
    """``linear`` as a ``DecodeLinear`` sharing its parameters (a plain, unhooked one; else itself)."""
    if type(linear) is not nn.Linear or not _plain([linear]):
        return linear
    new = copy.copy(linear)
    new.__class__ = DecodeLinear
    return new


class _Group:
    """One fused group: the user's linear modules, their copies and the fused tensors."""

    def __init__(self, parent: nn.Module, names: tuple[str, ...]):
        self.parent, self.names = weakref.ref(parent), names
        self.linears = [getattr(parent, name) for name in names]
        self.weight, self.bias = _fused_storage(self.linears)
        self.copies = {}
        start = 0
        for name, linear in zip(names, self.linears):
            stop = start + linear.out_features
            fused = copy.copy(linear)
            fused._buffers = dict(linear._buffers)  # its own buffer dict: the user's module gets none
            fused.register_buffer("fused_weight", self.weight, persistent=False)
            fused.register_buffer("fused_bias", self.bias, persistent=False)
            fused.fused_start, fused.fused_stop = start, stop
            fused.__class__ = FusedSliceLinear
            self.copies[name] = fused
            start = stop
        self._share()

    def attached(self) -> bool:
        """The user's modules are still the parent's children (none was replaced, e.g. by an adapter layer)."""
        parent = self.parent()
        return parent is not None and all(getattr(parent, name, None) is linear
                                          for name, linear in zip(self.names, self.linears))

    def _pairs(self):
        """(parameter, the rows of the fused tensor it is a view of) for every weight and bias of the group."""
        start = 0
        for linear in self.linears:
            stop = start + linear.out_features
            yield linear.weight, self.weight[start:stop]
            if self.bias is not None:
                yield linear.bias, self.bias[start:stop]
            start = stop

    def _share(self) -> None:
        for param, rows in self._pairs():
            param.data = rows

    def intact(self) -> bool:
        return all(param.device == rows.device and param.dtype == rows.dtype and param.data_ptr() == rows.data_ptr()
                   for param, rows in self._pairs())

    def repair(self) -> None:
        """Copy the parameters' current values into the fused tensors (in place when device and dtype still
        match, else new fused tensors) and make the parameters views again."""
        first = self.linears[0].weight
        if first.device != self.weight.device or first.dtype != self.weight.dtype:
            self.weight, self.bias = _fused_storage(self.linears)
            for fused in self.copies.values():
                fused.fused_weight, fused.fused_bias = self.weight, self.bias
        else:
            with torch.no_grad():
                for param, rows in self._pairs():
                    if param.data_ptr() != rows.data_ptr():
                        rows.copy_(param)
        self._share()


class SharedProjections:
    """A model's fusable groups, their parameters views of fused tensors; ``module_copy()`` fuses them."""

    def __init__(self, model: Optional[nn.Module]):  # no reference to the model kept: it keys a weak dictionary
        self.groups: dict[tuple[int, tuple[str, ...]], _Group] = {}  # (id of the parent module, names)
        for parent in model.modules() if model is not None else ():
            for names in GROUPS:
                if _fusable(parent, names):
                    self.groups[(id(parent), names)] = _Group(parent, names)

    def module_copy(self, model: nn.Module) -> nn.Module:
        """A shallow copy of ``model`` in which every group's projections are ``FusedSliceLinear``. Like the
        graphs, it holds the modules of the moment: modules replaced later are not seen."""
        return self._copy(model)

    def _copy(self, module: nn.Module) -> nn.Module:
        replaced = {}
        for names in GROUPS:
            group = self.groups.get((id(module), names))
            if group is not None:
                replaced.update(group.copies)
        for name, child in module.named_children():
            if name not in replaced:
                child_copy = _decode_copy(child) if isinstance(child, nn.Linear) else self._copy(child)
                if child_copy is not child:
                    replaced[name] = child_copy
        return with_children(module, replaced) if replaced else module

    def intact(self) -> bool:
        return all(group.intact() for group in self.groups.values())

    def fused(self, parent: nn.Module, names: tuple[str, ...]) -> Optional[tuple]:
        """``(weight, bias, sizes)`` of ``parent``'s fused group ``names`` (its projections' output sizes, in
        order), for a forward that computes the group's one matmul itself; None where the group is not fused."""
        group = self.groups.get((id(parent), names))
        if group is None or not group.attached() or not group.intact():
            return None
        return group.weight, group.bias, tuple(linear.out_features for linear in group.linears)

    def repair(self) -> bool:
        """Share the storage again where it was lost; True when something was repaired."""
        broken = [group for group in self.groups.values() if not group.intact()]
        for group in broken:
            group.repair()
        return bool(broken)


_SHARED: "weakref.WeakKeyDictionary[nn.Module, SharedProjections]" = weakref.WeakKeyDictionary()


def shared_projections(model: nn.Module, share: bool = True) -> SharedProjections:
    """The model's ``SharedProjections``, made on first use (before any graph captures its weights' addresses)
    and repaired on later ones. A model first met with ``share=False`` (a call that compiles nothing) keeps its
    own storage for good: graphs may hold its addresses, so its compiled copy, if any, is not fused. A group one of
    whose modules was replaced (an adapter layer, a new ``nn.Linear``) makes every group again (new fused tensors:
    the runner's ``models_signature`` changes, so its graphs are dropped)."""
    shared = _SHARED.get(model)
    if shared is not None and not all(group.attached() for group in shared.groups.values()):
        shared = None  # a module of a group was replaced: the groups are made again from the model as it is
        share = True
    if shared is None:
        shared = _SHARED[model] = SharedProjections(model if share else None)
    else:
        shared.repair()
    return shared


def _fusable(parent: nn.Module, names: tuple[str, ...]) -> bool:
    """Plain ``nn.Linear`` children (not quantised or sharded subclasses, no accelerate hooks), on one device,
    one dtype, the same input size, all with a bias or none."""
    linears = [getattr(parent, name, None) for name in names]
    if not all(type(linear) is nn.Linear for linear in linears) or not _plain(linears):
        return False
    first = linears[0]
    return all(linear.in_features == first.in_features and linear.weight.dtype == first.weight.dtype
               and linear.weight.device == first.weight.device and (linear.bias is None) == (first.bias is None)
               for linear in linears)


def _plain(linears) -> bool:
    """Ordinary tensors (not DTensor or quantised), not on meta, no accelerate hooks or forward hooks."""
    return all(plain(linear) and all(p.device.type != "meta" for p in linear.parameters()) for linear in linears)


def _fused_storage(linears) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    with torch.no_grad():
        weight = torch.cat([linear.weight.detach() for linear in linears])
        bias = torch.cat([linear.bias.detach() for linear in linears]) if linears[0].bias is not None else None
    return weight, bias
