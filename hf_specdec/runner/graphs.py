"""CUDA-graph capture and replay of one stage of a round over one bucket's static buffers.

A stage is a function of a ``BucketState`` that writes its results in place. Capture runs
it once on a side stream first (the warm-up CUDA graphs need, and the moment a compiled
model compiles for this shape), then restores every buffer the warm-up wrote so that
capturing does not advance the decoding, then records it. K/V written by the warm-up sit
at positions the real replay rewrites before anything reads them. A user generator's state
is restored too: the warm-up draws from it, and a seeded call that captures must emit what
a later call with the same seed (replaying only) emits.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import torch

# Held while a graph is captured, and by the background compilation while it runs the compiled models on the GPU
# (background_compile.py): work of another thread on the device (an autotuning benchmark's device-wide
# synchronisation, a module load) invalidates a capture in progress.
CAPTURE_LOCK = threading.RLock()


class StageGraph:
    def __init__(self, stage: Callable[[], None], buffers: list[torch.Tensor],
                 generator: Optional[torch.Generator] = None, pool=None, what: str = "a stage"):
        """``pool``: a memory pool shared with other graphs that never run at the same time. The stage is not
        kept: its closure holds the runner, whose dicts hold this graph, and such a cycle would leave a dropped
        graph (and its memory pool) to the garbage collector instead of freeing it when it is dropped."""
        self.graph = torch.cuda.CUDAGraph()
        self.capture_seconds = 0.0
        start = time.perf_counter()
        with CAPTURE_LOCK:
            self._capture(stage, buffers, generator, pool, what)
        self.capture_seconds = time.perf_counter() - start

    def _capture(self, stage, buffers, generator, pool, what) -> None:
        saved = [t.clone() for t in buffers]
        drawn_from = generator.get_state() if generator is not None else None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            stage()
        torch.cuda.current_stream().wait_stream(side)
        for t, s in zip(buffers, saved):
            t.copy_(s)
        if generator is not None:
            generator.set_state(drawn_from)
        if generator is not None and generator.device.type == "cuda":
            self.graph.register_generator_state(generator)
        try:
            # thread_local: other threads' host work (the background compilation's tracing) may go on meanwhile
            with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
                stage()
            torch.cuda.synchronize()
        except Exception as exc:  # name what was being captured: the CUDA error alone does not say
            raise RuntimeError(f"capturing the CUDA graph of {what} failed ({type(exc).__name__}: {exc}); the warm-up "
                               "run of the same code had passed. Rerun with CUDA_LAUNCH_BLOCKING=1 to see the "
                               "operation that broke the capture, or pass SpecConfig(cuda_graphs=False).") from exc

    def __call__(self) -> None:
        self.graph.replay()


def graphs_supported(generator: Optional[torch.Generator]) -> Optional[str]:
    """None when a stage can be captured, else the reason it cannot."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if generator is not None and generator.device.type == "cuda" and not hasattr(torch.cuda.CUDAGraph,
                                                                                "register_generator_state"):
        return "this torch cannot capture a user generator in a CUDA graph"
    if generator is not None and generator.device.type != "cuda":
        return f"SpecConfig.generator lives on {generator.device}, not on the GPU"
    return None
