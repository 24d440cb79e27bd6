"""Inductor post-grad passes over the runner's compiled layers: fewer matmuls and fewer kernels per layer.

- **One matmul per fused group.** The slices of a fused q/k/v (gate/up) group read the same input and the same
  fused weight (one buffer, deduplicated by Dynamo), so their matmuls are identical; AOTAutograd does not CSE
  inference graphs, so ``shared_matmul_cse`` keeps one of each.
- **The residual add in the projection's launch.** ``residual + decode_linear(...)`` (a decoder layer's add after
  its o_proj or down_proj) becomes one ``decode_linear_fused`` node, in half precision only: the GEMV adds the
  residual before its store, cuBLAS in its ``addmm`` epilogue (``kernels.decode_linear_fused``). The add's own
  kernel goes (at b = 1 after down_proj, where no norm follows to take it in).

Given to the runner's compile only (``inductor_options``): Hugging Face's compiled path on the same model and
any other ``torch.compile`` in the process are untouched.
"""
from __future__ import annotations

import hashlib
import inspect
import sys

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..kernels import decode_linear, decode_linear_fused  # noqa: F401  (registers torch.ops.hf_specdec.*)

try:  # a pass Inductor's FX graph cache can key on (its uuid)
    from torch._inductor.custom_graph_pass import CustomGraphPass as _PassBase
except ImportError:  # an older torch: a plain callable
    _PassBase = object

_PURE = ("mm", "addmm", "view", "_unsafe_view", "reshape", "permute", "t", "transpose", "expand")
_HALF = (torch.bfloat16, torch.float16)


def shared_matmul_cse(graph: torch.fx.Graph) -> None:
    """Identical matmuls (same inputs, through identical views) computed once."""
    pure = {getattr(torch.ops.aten, name) for name in _PURE} | {torch.ops.hf_specdec.decode_linear}
    seen: dict = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or getattr(node.target, "overloadpacket", None) not in pure:
            continue
        key = (node.target, _hashable(node.args), _hashable(tuple(sorted(node.kwargs.items()))))
        if key in seen:
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
        else:
            seen[key] = node


def fold_residual_adds(graph: torch.fx.Graph) -> None:
    """``add(decode_linear(x, w, b), r)`` (either order) -> ``decode_linear_fused(x, w, b, r, gate_act)`` where the
    projection's only user is the add and ``r`` has the sum's shape and half-precision dtype (no broadcast)."""
    linear, fused = torch.ops.hf_specdec.decode_linear.default, torch.ops.hf_specdec.decode_linear_fused.default
    for add in list(graph.nodes):
        if add.target is not torch.ops.aten.add.Tensor or add.kwargs or len(add.args) != 2:
            continue
        for proj, residual in (add.args, add.args[::-1]):
            if not (isinstance(proj, torch.fx.Node) and isinstance(residual, torch.fx.Node) and proj is not residual
                    and len(proj.users) == 1 and _same_half_tensor(proj, residual, add)):
                continue
            if proj.kwargs:  # the wrappers pass every argument by position
                continue
            if proj.target is linear and len(proj.args) == 3:
                args = (*proj.args, residual, "")
            elif proj.target is fused and len(proj.args) == 5 and proj.args[3] is None:
                args = (*proj.args[:3], residual, proj.args[4])
            else:
                continue
            with graph.inserting_before(add):
                node = graph.call_function(fused, args)
            node.meta.update(add.meta)
            add.replace_all_uses_with(node)
            graph.erase_node(add)
            graph.erase_node(proj)
            break


def _same_half_tensor(proj: torch.fx.Node, residual: torch.fx.Node, add: torch.fx.Node) -> bool:
    vals = [node.meta.get("val") for node in (proj, residual, add)]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    out = vals[2]
    return (all(v.dtype == out.dtype and v.device == out.device and v.dim() == out.dim() for v in vals)
            and out.dtype in _HALF
            and all(statically_known_true(a == b) for v in vals[:2] for a, b in zip(v.shape, out.shape)))


def _hashable(value):
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value if isinstance(value, (torch.fx.Node, int, float, bool, str, type(None), torch.dtype,
                                       torch.device, torch.memory_format, torch.layout)) else repr(value)


class DecodePasses(_PassBase):
    """The post-grad pass Inductor runs on the runner's compiled graphs: the CSE, then the residual fold."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        shared_matmul_cse(graph)
        fold_residual_adds(graph)

    def uuid(self) -> str:
        """Inductor's caches key on this: this module's source (a fixed name where the source is not shipped)."""
        try:
            return hashlib.sha256(inspect.getsource(sys.modules[__name__]).encode()).hexdigest()
        except (OSError, TypeError):
            return "hf_specdec.DecodePasses.1"


def inductor_options() -> dict:
    """The options that give Inductor the passes above."""
    return {"post_grad_custom_post_pass": DecodePasses()}
