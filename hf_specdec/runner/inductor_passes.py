"""The post-grad passes the runner gives Inductor for its compiled layers, and the options that carry them.

- ``SharedMatmulCSE``: the slices of a fused q/k/v or gate/up group (``fused_projections.py``) read the same input
  and the same fused weight, so their matmuls are identical; it keeps one.
- ``OuterProductAsMul``: a matmul whose inner dimension is 1 is an outer product, ``a @ b == a * b`` (one product
  per output element, no sum to round; only a signed zero may differ, ``-1 x 0`` giving -0 where the matmul's sum
  gives +0). Not for float32 on CUDA while TF32 matmuls are allowed: cuBLAS may round its inputs there. Rotary
  embeddings of transformers before 5.2x compute their angles so, ``inv_freq (B, d/2, 1) @ positions (B, 1, T)``
  in float32; Inductor sends such a ``bmm`` to cuBLAS (on an H200 a 3 us SIMT SGEMM) after a kernel that lays its
  inputs out, once per forward: a draft step of the project's pair takes about 0.1 ms, so that is 3-4% of it. As a
  multiply it fuses into the kernel that takes cos and sin. (Newer transformers write the multiply themselves;
  there the pass finds nothing.)
"""
from __future__ import annotations

import hashlib
import inspect
import sys

import torch

from ..kernels import decode_linear  # noqa: F401  (registers torch.ops.hf_specdec.decode_linear)

try:  # a pass Inductor's FX graph cache can key on (its uuid)
    from torch._inductor.custom_graph_pass import CustomGraphPass as GraphPassBase
except ImportError:  # an older torch: a plain callable
    GraphPassBase = object

_MATMULS = (torch.ops.aten.bmm.default, torch.ops.aten.mm.default)
_PURE = ("mm", "addmm", "view", "_unsafe_view", "reshape", "permute", "t", "transpose", "expand")


class SharedMatmulCSE(GraphPassBase):
    """Inductor post-grad pass: identical matmuls (same inputs, through identical views) computed once."""

    def __call__(self, graph: torch.fx.Graph) -> None:
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

    def uuid(self) -> str:
        return _source_hash()


def _hashable(value):
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value if isinstance(value, (torch.fx.Node, int, float, bool, str, type(None), torch.dtype,
                                       torch.device, torch.memory_format, torch.layout)) else repr(value)


class OuterProductAsMul(GraphPassBase):
    """Inductor post-grad pass: ``mm`` / ``bmm`` with an inner dimension of 1 become a broadcast multiply."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in _MATMULS or not _inner_dim_is_one(node):
                continue
            with graph.inserting_before(node):
                product = graph.call_function(torch.ops.aten.mul.Tensor, tuple(node.args[:2]))
            product.meta.update({key: value for key, value in node.meta.items() if key != "original_aten"})
            product.meta["original_aten"] = torch.ops.aten.mul.Tensor  # kernels named for what they compute
            node.replace_all_uses_with(product)
            graph.erase_node(node)

    def uuid(self) -> str:
        return _source_hash()


def _inner_dim_is_one(node: torch.fx.Node) -> bool:
    """Both operands known, of one floating dtype, the contracted dimension exactly 1 (not symbolic), and no TF32
    rounding the matmul would have done (float32 on CUDA with ``torch.backends.cuda.matmul.allow_tf32``)."""
    a, b = (arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None for arg in node.args[:2])
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if a.dtype == torch.float32 and a.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return False
    inner = a.shape[-1]
    return (a.dtype == b.dtype and a.dtype.is_floating_point and type(inner) is int and inner == 1
            and type(b.shape[-2]) is int and b.shape[-2] == 1)


class PostGradPasses(GraphPassBase):
    """Both passes, in order, as the one ``post_grad_custom_post_pass`` Inductor takes."""

    passes = (SharedMatmulCSE(), OuterProductAsMul())

    def __call__(self, graph: torch.fx.Graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self) -> str:
        """Inductor's caches key on this."""
        return _source_hash()


def _source_hash() -> str:
    """The passes' cache key: this module's source (every pass with its helpers and tables); a fixed name where the
    source is not shipped."""
    try:
        return hashlib.sha256(inspect.getsource(sys.modules[__name__]).encode()).hexdigest()
    except (OSError, TypeError):
        return "hf_specdec.inductor_passes.3"


def inductor_options() -> dict:
    """The options of the runner's compiled layers: one matmul per fused group, outer products as multiplies."""
    return {"post_grad_custom_post_pass": PostGradPasses()}
