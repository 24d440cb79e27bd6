"""Triton's start-up (kernels/triton_startup.py) runs once per process, off the first call, only for CUDA models:
one thread for the start-up, one that builds the kernels' launchers ahead."""
import threading

import torch

from hf_specdec.kernels import triton_startup


def test_the_startup_fills_tritons_key_cache():
    from triton.runtime.cache import triton_key

    triton_key.cache_clear()
    triton_startup.triton_startup()
    assert triton_key.cache_info().currsize == 1


def test_the_backends_cache_key_part_is_computed_ahead_for_a_hopper_target():
    """No GPU needed: the wheel's ptxas answers for an sm_90 target, and the answer is cached for the first launch."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import compiler as nvidia_compiler

    nvidia_compiler.get_ptxas_version.cache_clear()
    key = triton_startup.backend_hash(GPUTarget("cuda", 90, 32))
    assert key.endswith("-90") and nvidia_compiler.get_ptxas_version.cache_info().currsize == 1


def test_no_thread_for_a_model_off_cuda(monkeypatch):
    started = []
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self.name))
    monkeypatch.setattr(triton_startup, "_started", threading.Event())
    triton_startup.start_triton_startup(torch.device("cpu"))
    assert started == []


def test_one_thread_per_process_for_cuda_models(monkeypatch):
    started = []
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self.name))
    monkeypatch.setattr(triton_startup, "_started", threading.Event())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for _ in range(3):
        triton_startup.start_triton_startup(torch.device("cuda", 0))
    assert started == ["hf_specdec-triton-startup", "hf_specdec-triton-launchers"]
