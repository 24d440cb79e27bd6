"""Triton's kernel launchers built ahead, beside the user's model loading, instead of one by one in the first call.

Triton up to 3.6 launches a kernel through a small C extension made for its argument list: the first launch of
a kernel whose list of argument kinds (pointer, i32, fp32, constexpr, tensor descriptor, ...) is new to the
Triton cache runs the C compiler (about 0.25 s each on an H200 host). A fresh process's first ``generate()``
built ten of them in turn: 2.6 s of a 10 s first call on the project's pair (cProfile, H200, Triton 3.6). The
launcher's source depends on that list alone, not on the kernel, so the lists hf_specdec's kernels launch with
(``launcher_signatures.py``, recorded on a GPU by ``benchmarks/launcher_signatures.py``) can be built before
the first call, in parallel: the compiler runs in a subprocess and the waiting threads release the GIL.

Best effort, for the cache only: a list recorded for another model's shapes or a newer kernel is built for
nothing, a missing one is built by Triton in the call as before, and any failure leaves Triton to do its own
work. Newer Triton launches every kernel through one generic launcher (no ``make_launcher``): nothing to build.
``HF_SPECDEC_PREBUILD_LAUNCHERS=0`` turns it off.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Optional

Signature = tuple  # (argument kinds, tensor descriptors lowered to TMA: a bool per descriptor, or None)


def prebuild_enabled() -> bool:
    return os.environ.get("HF_SPECDEC_PREBUILD_LAUNCHERS", "1") != "0"


def launcher_builder() -> Optional[Callable[[Signature], object]]:
    """A function that builds (or finds in Triton's cache) the launcher of one signature, as Triton's own
    ``CudaLauncher`` would; None where this Triton has no per-signature launchers."""
    try:
        from triton.backends.nvidia import driver as nvidia_driver
        from triton.runtime.build import compile_module_from_src
    except Exception:  # noqa: BLE001  (no Triton, or no NVIDIA backend)
        return None
    make_launcher = getattr(nvidia_driver, "make_launcher", None)
    if make_launcher is None or not hasattr(nvidia_driver, "library_dirs"):
        return None

    def build(signature: Signature):
        kinds, descriptors = signature
        meta = None if descriptors is None else [{} if lowered else None for lowered in descriptors]
        src = make_launcher({}, dict(enumerate(kinds)), meta)
        return compile_module_from_src(src=src, name="__triton_launcher", library_dirs=nvidia_driver.library_dirs(),
                                       include_dirs=nvidia_driver.include_dirs, libraries=nvidia_driver.libraries)

    return build


def default_workers(jobs: int) -> int:
    """Compilers at a time: at most 8, half the host's cores shared among the processes ``accelerate launch`` or
    ``torchrun`` started on it (each builds the same launchers into the same cache), at least one."""
    processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, min(8, (os.cpu_count() or 2) // (2 * processes), jobs))


def prebuild_launchers(signatures: Iterable[Signature], build: Callable[[Signature], object],
                       workers: Optional[int] = None) -> int:
    """Build each signature's launcher, ``workers`` at a time; the number built (or found cached) without error."""
    signatures = list(dict.fromkeys(signatures))
    if not signatures:
        return 0
    workers = workers or default_workers(len(signatures))

    def one(signature) -> bool:
        try:
            build(signature)
            return True
        except Exception:  # noqa: BLE001  (Triton builds it in the call instead)
            return False

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hf_specdec-launcher") as pool:
        return sum(pool.map(one, signatures))


def prebuild_recorded_launchers() -> int:
    """The recorded signatures' launchers, where this Triton builds launchers and the switch is on."""
    build = launcher_builder() if prebuild_enabled() else None
    if build is None:
        return 0
    from .launcher_signatures import SIGNATURES
    return prebuild_launchers(SIGNATURES, build)
