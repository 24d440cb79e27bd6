"""What a runner keeps per configuration, so that a process alternating configurations captures once.

A ``RunnerKey`` names everything a captured graph depends on besides the bucket size. Each key
has a slot: its bucket states (``BucketState`` per bucket) and the graphs captured over them. An
eval that sweeps k, or a benchmark that interleaves its rows, then replays each configuration's
graphs when it comes back instead of capturing them again (which also made a configuration that
came back pay capture inside a call that was being timed).

The graphs bake in the addresses of both caches' pools: when a pool moves (a resize, another block
size) every slot is dropped. They (and the pools, made in the models' dtype on their device) also bake in
the models' modules and tensors: ``models_signature`` is part of the key, and a model whose tensors moved
(``model.double()``, ``load_state_dict(assign=True)``, ``model.to(device)``) or whose modules were replaced
(an adapter layer) drops every slot and the caches. The least recently used slot goes once ``MAX_SLOTS`` are kept (each
holds graph memory on the device). The speculation-length policy's memory (round costs, the
acceptance seen) is kept per (k, method, do_sample): it stays valid when only a shape grows.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

import torch

MAX_SLOTS = 16


@dataclass(frozen=True)
class RunnerKey:
    """Everything a captured graph depends on besides the bucket size."""

    k: int
    do_sample: bool
    acceptance: str
    method: str
    ngram_sizes: tuple
    logits_signature: tuple
    # the generator itself, not its id: a graph replays the state of the generator it was captured with, and
    # the id of a generator the user dropped goes to the next one made (whose seed the graphs would ignore)
    generator: Optional[torch.Generator]
    graphs: bool
    compile: bool
    block_size: int
    pool_blocks: int
    width: int
    table_width: int
    vocab: int
    eos_width: int
    models: int  # models_signature: the models' modules and their tensors' addresses, dtypes and devices


@dataclass
class Slot:
    states: dict = field(default_factory=dict)  # bucket rows -> BucketState
    graphs: dict = field(default_factory=dict)  # (stage, bucket rows, k) -> StageGraph
    move_credit: dict = field(default_factory=dict)  # bucket rows -> seconds toward its captures (call/bucket_moves.py)
    _captures: tuple = (-1, frozenset(), None)  # (graphs counted, buckets captured, mean capture seconds)

    def captures(self) -> tuple[frozenset, Optional[float]]:
        """The buckets some round of which was captured under this key, and the mean capture time of its graphs (a
        first capture's JIT compiles included; None before any). Asked every round of a call's tail: counted again
        only when a graph was added (graphs are only ever added to a slot)."""
        if self._captures[0] != len(self.graphs):
            times = [graph.capture_seconds for graph in self.graphs.values()]
            self._captures = (len(self.graphs), frozenset(key[1] for key in self.graphs),
                              sum(times) / len(times) if times else None)
        return self._captures[1:]


class RunnerSlots:
    def __init__(self, limit: int = MAX_SLOTS):
        self.limit = limit
        self._slots: OrderedDict[RunnerKey, Slot] = OrderedDict()
        # the speculation-length policy's memory per (k, method, do_sample); a benchmark comparing policy
        # variants gives each its own dict of these
        self.memories: dict[tuple, dict] = {}

    def slot(self, key: RunnerKey) -> Slot:
        """The slot of ``key`` (new and empty the first time), now the most recently used."""
        slot = self._slots.pop(key, None) or Slot()
        self._slots[key] = slot
        while len(self._slots) > self.limit:
            self._slots.popitem(last=False)
        return slot

    def drop_all(self) -> None:
        """The caches' pools moved: no kept graph may replay."""
        self._slots.clear()

    def policy_memory(self, key: RunnerKey) -> dict:
        return self.memories.setdefault((key.k, key.method, key.do_sample), {})

    def __len__(self) -> int:
        return len(self._slots)


def models_signature(models) -> int:
    """A hash of ``models``' modules and of every parameter's and buffer's (address, dtype, device): it changes
    when a module is replaced or a tensor gets new storage, which graphs captured before would never see."""
    return hash(tuple(_walk(model, tensors=True) for model in models))


def module_signature(model) -> int:
    """A hash of the identities of ``model``'s modules: a compiled copy of the model holds the modules of its
    moment, so a replaced one needs a new copy."""
    return hash(_walk(model, tensors=False))


def _walk(model, tensors: bool) -> tuple:
    """Every module of ``model`` once (by identity), with its own parameters and buffers (address, dtype, device)
    when ``tensors``: one pass over the modules' own dicts. Each call pays it (``modules()``, ``parameters()`` and
    ``buffers()`` walked the tree once each through generators: 2.2 ms an 8B/1B-shaped pair on a 2-core host;
    this loop 0.6 ms)."""
    parts, seen, stack = [], set(), [model]
    append, pop, push, add = parts.append, stack.pop, stack.extend, seen.add
    while stack:
        module = pop()
        key = id(module)
        if module is None or key in seen:
            continue
        add(key)
        append(key)
        if tensors:
            for group in (module._parameters, module._buffers):
                for t in group.values() if group else ():
                    if t is not None:
                        append((_address(t), t.dtype, t.device))
        if module._modules:
            push(reversed(module._modules.values()))
    return tuple(parts)


def _address(t: torch.Tensor) -> int:
    """Where ``t``'s data lives; a tensor subclass without storage of its own (DTensor, some quantised
    weights) by the address of its local tensor, else by identity."""
    if type(t) is torch.nn.Parameter or type(t) is torch.Tensor:  # nearly every weight: no attribute lookup
        return t.data_ptr()
    try:
        return getattr(t, "_local_tensor", t).data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return id(t)


# With graphs, the token history's least width (columns): a wider history is a new key, whose graphs are all captured
# again (2 s at b = 32 on an H200, when a job's prompts of 150-300 tokens and 256 new ones crossed 512 columns in its
# second call). To the kernels the width is only a stride; 1024 columns hold 8 KiB a row.
MIN_GRAPH_WIDTH = 1024


def history_width(columns: int, graphs: bool, previous: int = 0) -> int:
    """The width of the buckets' token history for a call of ``columns`` (prompt, new tokens, drafts): it only
    grows, in powers of two, from ``MIN_GRAPH_WIDTH`` with graphs (without them nothing is captured again: it stays
    as tight as the calls)."""
    return max(capacity(max(columns, MIN_GRAPH_WIDTH if graphs else 0), 64), previous)


def capacity(n: int, quantum: int) -> int:
    """Round ``n`` up to a power-of-two multiple of ``quantum``: capacities grow rarely."""
    c = quantum
    while c < n:
        c *= 2
    return c
