"""Triton's launchers built ahead (kernels/triton_launchers.py) from the recorded signatures
(kernels/launcher_signatures.py, written by benchmarks/launcher_signatures.py)."""
import re
import threading

import pytest

from benchmarks import launcher_signatures as recorder
from hf_specdec.kernels import triton_launchers
from hf_specdec.kernels.launcher_signatures import SIGNATURES

KIND = re.compile(r"^(\*(i|u|fp|bf)\d+|i1|[iu](8|16|32|64)|fp(16|32|64)|bf16|constexpr|tensordesc<.+\[.+\]>)$")


def test_each_signature_built_once_in_parallel_and_failures_left_to_triton():
    calls, lock, threads = [], threading.Lock(), set()
    sigs = [(("*bf16", "i32"), None), (("*fp32", "constexpr"), None), (("bad",), None), (("*bf16", "i32"), None)]

    def build(sig):
        with lock:
            calls.append(sig)
            threads.add(threading.current_thread().name)
        if sig[0] == ("bad",):
            raise RuntimeError("no compiler")

    assert triton_launchers.prebuild_launchers(sigs, build, workers=3) == 2
    assert sorted(calls, key=repr) == sorted(set(sigs), key=repr)  # the repeated one built once
    assert all(name.startswith("hf_specdec-launcher") for name in threads)
    assert triton_launchers.prebuild_launchers([], build) == 0


def test_the_switch_turns_it_off(monkeypatch):
    asked = []
    monkeypatch.setattr(triton_launchers, "launcher_builder", lambda: asked.append(1) or (lambda sig: None))
    monkeypatch.setenv("HF_SPECDEC_PREBUILD_LAUNCHERS", "0")
    assert triton_launchers.prebuild_recorded_launchers() == 0 and asked == []
    monkeypatch.setenv("HF_SPECDEC_PREBUILD_LAUNCHERS", "1")
    assert triton_launchers.prebuild_recorded_launchers() == len(set(SIGNATURES)) and asked == [1]


def test_builder_hands_triton_what_its_own_launcher_would(monkeypatch):
    """Triton's CudaLauncher passes the kernel's signature dict (its values, in order) and the tensor descriptors'
    metadata; the source's cache key depends on those alone, so the builder must reproduce them."""
    from triton.backends.nvidia import driver as nvidia_driver
    from triton.runtime import build as triton_build
    seen = {}
    monkeypatch.setattr(nvidia_driver, "make_launcher",
                        lambda constants, signature, meta: seen.update(sig=signature, meta=meta) or "SRC",
                        raising=False)
    monkeypatch.setattr(nvidia_driver, "library_dirs", lambda: ["/lib"], raising=False)
    monkeypatch.setattr(nvidia_driver, "include_dirs", ["/inc"], raising=False)
    monkeypatch.setattr(nvidia_driver, "libraries", ["libcuda.so.1"], raising=False)
    monkeypatch.setattr(triton_build, "compile_module_from_src", lambda **kw: seen.update(kw) or "MODULE")
    build = triton_launchers.launcher_builder()
    kinds = ("*bf16", "tensordesc<bf16[1, 4, 512]>", "i32", "constexpr", "tensordesc<bf16[16, 64]>", "fp32")
    assert build((kinds, (True, False))) == "MODULE"
    assert list(seen["sig"].values()) == list(kinds)
    assert seen["meta"][0] is not None and seen["meta"][1] is None  # lowered to TMA, and not
    assert seen["src"] == "SRC" and seen["name"] == "__triton_launcher"
    assert seen["library_dirs"] == ["/lib"] and seen["include_dirs"] == ["/inc"]
    build((("*bf16", "i32"), None))
    assert seen["meta"] is None


def test_no_builder_where_triton_has_one_generic_launcher(monkeypatch):
    from triton.backends.nvidia import driver as nvidia_driver
    monkeypatch.delattr(nvidia_driver, "make_launcher", raising=False)
    assert triton_launchers.launcher_builder() is None


def test_the_recorded_signatures_are_well_formed():
    assert isinstance(SIGNATURES, tuple) and SIGNATURES and len(set(SIGNATURES)) == len(SIGNATURES)
    for kinds, descriptors in SIGNATURES:
        assert kinds and all(isinstance(k, str) and KIND.match(k) for k in kinds), kinds
        tma = [k for k in kinds if k.startswith("tensordesc")]
        assert descriptors is None if not tma else (len(descriptors) == len(tma)
                                                     and all(isinstance(d, bool) for d in descriptors))


@pytest.mark.parametrize("meta", [None, [object(), None]])
def test_the_recorder_keeps_what_the_launcher_source_depends_on(meta):
    sig = {"x_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr"}
    if meta:
        sig.update(a="tensordesc<bf16[2, 64]>", b="tensordesc<bf16[16, 64]>")
    kinds, descriptors = recorder.signature_of(sig, meta)
    assert kinds == tuple(sig.values())
    assert descriptors == (None if meta is None else (True, False))


def test_the_recorder_writes_a_module_that_reads_back():
    sigs = [(("*bf16", "i32", "constexpr"), None), (("*fp32", "tensordesc<bf16[2, 64]>"), (True,)),
            (("*bf16", "i32", "constexpr"), None)]
    text = recorder.format_signatures(sigs)
    namespace = {}
    exec(compile(text, "launcher_signatures.py", "exec"), namespace)
    assert sorted(namespace["SIGNATURES"], key=repr) == sorted(set(sigs), key=repr)
    assert len(namespace["SIGNATURES"]) == 2 and namespace["__doc__"].startswith("The argument kinds")


def test_compilers_at_a_time_shared_among_a_hosts_processes(monkeypatch):
    monkeypatch.setattr(triton_launchers.os, "cpu_count", lambda: 32)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert triton_launchers.default_workers(15) == 8 and triton_launchers.default_workers(3) == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert triton_launchers.default_workers(15) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert triton_launchers.default_workers(15) == 1
