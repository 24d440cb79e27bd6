"""Compiling the models off the critical path: a process starts on CUDA graphs of the models as they are and
switches to compiled code once it is ready.

Graphs alone start in seconds and already beat Hugging Face's compiled decoding; compile buys the last fifth
of the step time for tens of seconds of tracing, Inductor code generation and autotuning with an empty cache.
So by default (``SpecConfig(compile=None)``) the first call that wants compiled code starts a thread, and the
calls made meanwhile run on graphs of the uncompiled models. The thread:

1. on CUDA, has a separate process (``compile_worker.py``) compile a skeleton of the model (one layer of each
   kind, the same shapes and dtypes, no weights) over every shape family the runner uses: the cold work
   lands in torch's caches and the on-disk cache (``compile_cache.py``) without touching this process's GPU
   stream, where a capture in progress would be invalidated by another thread's device-wide
   synchronisation (autotuning benchmarks do that);
2. then, holding ``graphs.CAPTURE_LOCK`` (no capture runs meanwhile), compiles the real model here
   (``compiled_regions.compile_model``: Dynamo traces one layer, Inductor finds its code in the caches)
   and runs it once per shape family on a scratch paged cache and a stream of its own; torch.fx's patches of
   ``nn.Module`` act in this thread only meanwhile (``thread_scoped_tracing.py``), so the user's other forwards
   and compiled functions run.

The first call after that captures its graphs over the compiled code (a capture, not a compilation).
``SpecConfig(compile=True)`` waits for it instead, as ``hf_specdec.warmup`` does. A failure never reaches a
call: it is kept, reported as a warning, and the runner stays on graphs of the uncompiled models (the
same output); the next call that asks compiles once more (``retry``: torch.compile in another thread of the
process can break a compilation here), and a second failure stands for the process. Without the separate
process (it failed, or no CUDA) step 2 does the whole compilation.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
import warnings
import weakref
from typing import Optional

import torch
from transformers import PreTrainedModel

from ..cache import PagedKVCache, input_device, paged_attention_enabled
from ..kernels.pdl import inductor_pdl
from .compile_cache import CompileCache, cache_key
from .inductor_passes import PostGradPasses
from .compile_worker import compile_in_subprocess
from .compiled_regions import compile_model
from .graphs import CAPTURE_LOCK
from .paged_model import PagedModel
from .runner_slots import module_signature
from .thread_scoped_tracing import tracing_patches_in_own_thread

# (rows, tokens a row, last logits only, layout) as the runner's rounds call a model (round/fixed_round.py): the
# token ids and positions are views of (rows, tokens) tables ("table": a verify, a draft's first step, a catch-up
# window) or one fresh value per row ("rows": a draft's later steps). Dynamo guards on a view's base too, whose
# first size is the row count (1 specialises), so each layout is exercised at 1 row and at several.
SHAPES = ((1, 1, True, "rows"), (2, 1, True, "rows"), (1, 1, False, "table"), (2, 1, False, "table"),
          (1, 2, True, "table"), (2, 2, True, "table"), (1, 3, False, "table"), (3, 2, False, "table"))
HEAD_SHAPES = ((1, 2, True, "no logits"), (2, 2, True, "no logits"))  # a draft head's first step at k = 0
_SWITCH_INTERVAL = 0.0005  # seconds: while this thread traces, the caller's rounds wait for the GIL at most this
_ATTEMPTS = 2  # compilations of a model per process before its calls stay on graphs of the uncompiled model
_SCRATCH_BLOCKS = 4  # blocks of its own per scratch row (its table is as wide as the runner's, the rest block 0)


_JOBS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {(vocab, block size): job}


def compile_job(model: PreTrainedModel, vocab_size: int, block_size: int, table_width: int) -> "BackgroundCompile":
    """The process's one compilation of ``model``: every runner that uses it (with a draft, alone at k = 0, beside
    another draft) shares the compiled code instead of compiling it again. Not started yet when new. A model whose
    modules were replaced since (an adapter layer) gets a new one."""
    jobs = _JOBS.setdefault(model, {})
    job = jobs.get((vocab_size, block_size))
    if job is None or job.modules != module_signature(model):  # new, or its copy holds replaced modules
        job = jobs[(vocab_size, block_size)] = BackgroundCompile(model, vocab_size, block_size,
                                                                 table_width=table_width)
    elif (retry := job.retry()) is not None:
        job = jobs[(vocab_size, block_size)] = retry
    return job


class BackgroundCompile:
    """One model's compiled callable, made in a thread (``start``) or in the caller's (``wait``)."""

    def __init__(self, model: PreTrainedModel, vocab_size: int, block_size: int, backend="inductor",
                 disk: Optional[CompileCache] = None, prewarm: Optional[bool] = None, key: Optional[str] = None,
                 table_width: int = 16, attempt: int = 1):
        """``prewarm``: compile a skeleton in a separate process first (default: on CUDA, with Inductor).
        ``table_width``: the runner's block tables' width: the kernels around the compiled regions then meet the
        real calls' shapes (their split-KV choice, Triton's integer specialisations) here, and JIT-compile here."""
        self.model, self.vocab_size, self.block_size, self.backend = model, vocab_size, block_size, backend
        self.modules = module_signature(model)  # the modules its compiled copy will hold
        self.table_width = table_width
        self.disk = disk if disk is not None else CompileCache()
        device = input_device(model)
        self.prewarm = prewarm if prewarm is not None else (device.type == "cuda" and backend == "inductor")
        self.key = key or cache_key([model], extra=("compile_regions", "dynamic", "fused_projections",
                                                    "decode_linear", "one_token_layers", str(backend), SHAPES,
                                                    f"inductor_pdl={inductor_pdl()}",
                                                    f"post_grad={PostGradPasses().uuid()[:16]}"))
        self.attempt = attempt  # a failure reported by attempt 1 is tried once more (``retry``)
        self.compiled = None
        self.error: Optional[str] = None
        self.prewarm_error: Optional[str] = None  # the separate process failed: this one compiled it all
        self.seconds = 0.0  # the compilation's own wall time (in the thread: not the calls')
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._warned = False

    def start(self) -> "BackgroundCompile":
        if self._thread is None and not self._done.is_set():
            self._thread = threading.Thread(target=self._run, name="hf_specdec-compile", daemon=True)
            self._thread.start()
        return self

    def ready(self) -> bool:
        """The compiled callable is there (False while compiling, and after a failure: ``retry`` may try again)."""
        if self._done.is_set() and self.error is not None and not self._warned:
            self._warned = True
            again = " The next call tries once more." if self.attempt < _ATTEMPTS else ""
            warnings.warn(f"hf_specdec: compiling {type(self.model).__name__} failed ({self.error}); it runs on CUDA "
                          f"graphs of the uncompiled model (same output, a little slower).{again} "
                          "SpecConfig(compile=False) skips the attempt.", RuntimeWarning, stacklevel=3)
        return self._done.is_set() and self.compiled is not None

    def retry(self) -> Optional["BackgroundCompile"]:
        """After a first failure has been reported, a new job (not started) that compiles again; else None. A
        failure need not be the model's: torch.compile in another thread of this process can break a compilation
        here (Dynamo's FX-tracing flag is process-wide; seen on an H200 beside Hugging Face's compiled generate)."""
        if not (self._warned and self.compiled is None and self.attempt < _ATTEMPTS):
            return None
        return BackgroundCompile(self.model, self.vocab_size, self.block_size, self.backend, self.disk, self.prewarm,
                                 self.key, self.table_width, self.attempt + 1)

    def finished(self) -> bool:
        """Compiled, or failed for good: waiting returns at once."""
        return self._done.is_set()

    def wait(self) -> bool:
        """Compile now if nobody started to, else wait for the thread; then ``ready()``."""
        if self._thread is None and not self._done.is_set():
            self._run()
        self._done.wait()
        return self.ready()

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            if self.prewarm:
                self.prewarm_error = compile_in_subprocess(self.model, self.key, self.vocab_size, self.block_size,
                                                           self.table_width)
                if self.prewarm_error:
                    warnings.warn(f"hf_specdec: compiling {type(self.model).__name__} in a separate process failed "
                                  f"({self.prewarm_error}); it compiles in this one instead, and a call that needs a "
                                  "new CUDA graph meanwhile waits for it.", RuntimeWarning, stacklevel=2)
            interval = sys.getswitchinterval()
            with CAPTURE_LOCK, tracing_patches_in_own_thread():
                sys.setswitchinterval(min(interval, _SWITCH_INTERVAL))  # Dynamo's tracing holds the GIL for long
                try:
                    self.disk.load(self.key)
                    compiled = compile_model(self.model, backend=self.backend)
                    self._exercise(compiled)
                finally:
                    sys.setswitchinterval(interval)
            self.disk.save(self.key)
            self.compiled = compiled
        except Exception as exc:  # kept for ready() to report: the calls go on without compiled code
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            self.error = f"{type(exc).__name__}: {' '.join(lines[:2])}"
        finally:
            self.seconds = time.perf_counter() - start
            self._done.set()

    @torch.no_grad()
    def _exercise(self, compiled) -> None:
        """Run ``compiled`` over each shape family the runner uses, on a scratch cache and a stream of its own."""
        device = input_device(self.model)
        rows = max(shape[0] for shape in SHAPES)
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        with (torch.cuda.stream(stream) if stream else contextlib.nullcontext()), paged_attention_enabled(self.model):
            cache = PagedKVCache(_SCRATCH_BLOCKS * rows, self.block_size, rows, self.table_width * self.block_size,
                                 device)
            cache.add_sequences(rows)
            tables = torch.zeros(rows, max(self.table_width, _SCRATCH_BLOCKS), device=device, dtype=torch.int32)
            tables[:, :_SCRATCH_BLOCKS] = torch.arange(_SCRATCH_BLOCKS * rows, device=device).view(rows, -1)
            scratch = PagedModel(self.model, cache, self.vocab_size, compiled)
            head = scratch.reads_hidden  # a draft head: features in, and a first step at k = 0 keeps no logits
            hidden = self.model.feature_size if head else 0  # the target's width (a narrow head's layer is narrower)
            for b, q, last_only, layout in SHAPES + (HEAD_SHAPES if head else ()):
                if layout == "rows":
                    ids = torch.full((b,), 3, dtype=torch.long, device=device)
                    positions = torch.zeros(b, dtype=torch.long, device=device)
                else:
                    ids = torch.full((b, q), 3, dtype=torch.long, device=device).view(-1)
                    positions = torch.arange(q, device=device).repeat(b, 1).view(-1)
                lens = torch.full((b,), q, dtype=torch.long, device=device)
                extra = {}
                if head:
                    dtype = self.model.fc.weight.dtype
                    extra["features"] = torch.zeros(b * q, hidden, device=device, dtype=dtype)
                    if layout == "no logits":
                        extra["rows"] = torch.zeros(0, dtype=torch.long, device=device)
                scratch.forward(ids, positions, tables[:b], lens, q, last_only, **extra)
        if stream is not None:
            stream.synchronize()
