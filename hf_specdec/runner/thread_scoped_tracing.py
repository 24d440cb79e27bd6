"""torch.fx's tracing as seen by the thread that traces only, while the background compilation runs.

``torch.fx.Tracer.trace`` (under Inductor's code generation, ``make_fx``) replaces ``nn.Module.__call__`` and
``__getattr__`` on the class, and some functions in module globals, for the whole process until it returns. A
forward that another thread runs meanwhile goes through the tracer's wrapper: a module outside the traced root
then fails with ``NameError: module is not installed as a submodule`` (seen on an H200: a plain ``generate()``
beside the background compilation). It also sets a process-wide flag that makes any function compiled with
``torch.compile`` refuse to run ("Detected that you are using FX to symbolically trace a dynamo-optimized
function"). While ``tracing_patches_in_own_thread()`` is held, each patch torch makes is a function that runs the
tracer's wrapper in the thread that made it and the original in any other thread, and Dynamo's
``force_compile_during_fx_trace`` is on (torch 2.11 and later have it), so compiled functions of other threads run
(the compiling thread's own traces call none; one that must compile first waits for Dynamo's compile lock, held by
the compilation). That flag is process-wide: meanwhile a user's own ``torch.fx`` trace over a compiled function
compiles it instead of refusing. It wraps ``_Patcher.patch`` / ``patch_method``, torch's own private helpers: a
torch without them is left alone (other threads' forwards are then exposed as before). Still process-wide: torch.fx's
tracing flag itself (``is_fx_tracing()``), which a few torch internals read. ``tests/test_thread_scoped_tracing.py``
reproduces both failures on the CPU.
"""
from __future__ import annotations

import builtins
import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

_LOCK = threading.Lock()
_HOLDERS = 0
_ORIGINALS: dict = {}
_FORCE = "force_compile_during_fx_trace"  # torch._dynamo.config: compiled functions run while fx traces


def _patcher_class():
    try:
        from torch.fx._symbolic_trace import _Patcher
    except ImportError:  # pragma: no cover  (a torch without it: nothing to scope)
        return None
    return _Patcher if all(callable(getattr(_Patcher, n, None)) for n in ("patch", "patch_method")) else None


def _dynamo_config():
    import torch._dynamo.config as dynamo_config

    return dynamo_config if hasattr(dynamo_config, _FORCE) else None


def _for_owner_only(new_fn: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``new_fn`` in the thread that makes the patch, ``original`` in every other one."""
    owner = threading.get_ident()

    @functools.wraps(new_fn)
    def dispatch(*args, **kwargs):
        return (new_fn if threading.get_ident() == owner else original)(*args, **kwargs)

    return dispatch


def _scoped_patch(patch):
    @functools.wraps(patch)
    def scoped(self, frame_dict, name, new_fn, deduplicate=True):
        original = frame_dict[name] if name in frame_dict else getattr(builtins, name, None)
        if original is not None:
            new_fn = _for_owner_only(new_fn, original)
        return patch(self, frame_dict, name, new_fn, deduplicate)

    return scoped


def _scoped_patch_method(patch_method):
    @functools.wraps(patch_method)
    def scoped(self, cls, name, new_fn, deduplicate=True):
        return patch_method(self, cls, name, _for_owner_only(new_fn, getattr(cls, name)), deduplicate)

    return scoped


@contextlib.contextmanager
def tracing_patches_in_own_thread() -> Iterator[bool]:
    """Scope torch.fx's patches to the thread that makes them, and let other threads' compiled functions run, while
    held (nested and concurrent holders share one installation). Yields whether it could (False: this torch has no
    ``_Patcher`` to wrap)."""
    global _HOLDERS
    patcher = _patcher_class()
    if patcher is None:
        yield False
        return
    dynamo_config = _dynamo_config()  # resolved before anything changes
    with _LOCK:
        if _HOLDERS == 0:
            if dynamo_config is not None:
                _ORIGINALS[_FORCE] = getattr(dynamo_config, _FORCE)
                setattr(dynamo_config, _FORCE, True)
            _ORIGINALS.update(patch=patcher.patch, patch_method=patcher.patch_method)
            patcher.patch = _scoped_patch(_ORIGINALS["patch"])
            patcher.patch_method = _scoped_patch_method(_ORIGINALS["patch_method"])
        _HOLDERS += 1
    try:
        yield True
    finally:
        with _LOCK:
            _HOLDERS -= 1
            if _HOLDERS == 0:
                patcher.patch, patcher.patch_method = _ORIGINALS.pop("patch"), _ORIGINALS.pop("patch_method")
                if _FORCE in _ORIGINALS:
                    setattr(dynamo_config, _FORCE, _ORIGINALS.pop(_FORCE))
