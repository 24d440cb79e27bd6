"""Triton's once-per-process start-up, done beside the user's model loading instead of inside the first call.

The first Triton launch of a process hashes Triton's own sources into its cache key (``triton_key``: about
0.4 s on an H200 host) and imports the compiler's Gluon front end (about 0.1 s), even when every kernel is
in Triton's disk cache, and its compiler backend asks ``ptxas`` for its version (about 0.2 s) for every kernel's cache
key. ``hf_specdec.enable`` starts these in a daemon thread: file reads and hashing release
the GIL, so they overlap what the user does next (loading a draft, tokenising) and the first
``generate()`` finds them done. The same thread creates Triton's CUDA driver (its utility module: a C build with
an empty cache, 0.6 s); another builds the kernels' launchers ahead (``triton_launchers.py``). Best effort: a failure
here only means the first call does the work itself.
"""
from __future__ import annotations

import os
import threading

import torch

_started = threading.Event()


def start_triton_startup(device: torch.device) -> None:
    """Start the start-up work once per process, for a model on a CUDA ``device`` (nothing to do elsewhere)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" or _started.is_set():
        return
    _started.set()
    threading.Thread(target=triton_startup, name="hf_specdec-triton-startup", daemon=True).start()
    threading.Thread(target=_prebuild_launchers, name="hf_specdec-triton-launchers", daemon=True).start()


def triton_startup() -> None:
    """What the first Triton launch would do before compiling or loading a kernel."""
    try:
        from triton.runtime.cache import triton_key

        triton_key()  # functools.lru_cache: the first launch then reads the result
    except Exception:  # noqa: BLE001  (another Triton: the first call does its own start-up)
        pass
    try:
        import triton.experimental.gluon  # noqa: F401
    except Exception:  # noqa: BLE001
        pass
    try:
        from triton.runtime import driver

        driver.active  # noqa: B018  (created on first use: the first launch then finds it)
        backend_hash(driver.active.get_current_target())
    except Exception:  # noqa: BLE001
        pass


def backend_hash(target) -> str:
    """The compiler backend's part of every kernel's cache key for ``target``: on NVIDIA GPUs it runs ``ptxas
    --version`` once a process (functools.lru_cache; 0.2 s of a first call in a process whose caches were warm)."""
    from triton.compiler.compiler import make_backend

    return make_backend(target).hash()


def _prebuild_launchers() -> None:
    try:
        from .triton_launchers import prebuild_recorded_launchers

        prebuild_recorded_launchers()
    except Exception:  # noqa: BLE001
        pass
