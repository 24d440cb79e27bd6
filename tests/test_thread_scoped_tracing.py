"""torch.fx patches ``nn.Module.__call__`` for the whole process while it traces: another thread's forward then
fails with "module is not installed as a submodule" (an H200 run, beside the background compilation), and a
function compiled with torch.compile refuses to run. Under ``tracing_patches_in_own_thread`` both run, the patches
act in the tracing thread only, and the trace is unchanged."""
import math
import threading

import pytest
import torch
from torch.fx._symbolic_trace import _Patcher

from hf_specdec.runner.thread_scoped_tracing import tracing_patches_in_own_thread


class _TracedWhileOthersRun(torch.nn.Module):
    """Traced in a thread; its forward holds the trace open until the main thread has run its forwards."""

    def __init__(self, inside: threading.Event, done: threading.Event):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.inside, self.done = inside, done

    def forward(self, x):
        y = self.proj(x)
        self.inside.set()
        assert self.done.wait(30)
        return y * math.sqrt(y.shape[-1])


def _forward_during_a_trace(scoped: bool, compiled: bool = False):
    """Runs a Linear and a tiny Llama (or with ``compiled``, a function compiled with torch.compile) in this thread
    while another thread traces; returns (error or None, the traced graph's node ops)."""
    from models import make_model

    inside, done, traced = threading.Event(), threading.Event(), {}
    module_call = torch.nn.Module.__call__
    other, model = torch.nn.Linear(4, 3), make_model("llama", seed=1)
    x, ids = torch.randn(2, 4), torch.tensor([[1, 5, 7]])
    want_linear, want_logits = other(x), model(ids).logits
    sine = torch.compile(lambda t: t.sin() + 1, backend="eager")

    def trace():
        traced["graph"] = torch.fx.symbolic_trace(_TracedWhileOthersRun(inside, done))

    def run():
        try:
            assert inside.wait(30)
            if compiled:
                assert torch.equal(sine(x), x.sin() + 1)
                return None
            assert torch.equal(other(x), want_linear)
            assert torch.equal(model(ids).logits, want_logits)
            return None
        except (NameError, RuntimeError) as exc:
            return exc
        finally:
            done.set()

    if scoped:
        with tracing_patches_in_own_thread() as active:
            assert active
            worker = threading.Thread(target=trace)
            worker.start()
            error = run()
            worker.join(30)
    else:
        worker = threading.Thread(target=trace)
        worker.start()
        error = run()
        worker.join(30)
    assert not worker.is_alive() and torch.nn.Module.__call__ is module_call  # the tracer's patch reverted
    return error, [(node.op, str(node.target)) for node in traced["graph"].graph.nodes]


def test_another_threads_forward_fails_during_an_unscoped_trace():
    error, _ = _forward_during_a_trace(scoped=False)
    assert isinstance(error, NameError) and "not installed as a submodule" in str(error)


def test_another_threads_forward_runs_during_a_scoped_trace_and_the_trace_is_unchanged():
    _, unscoped_nodes = _forward_during_a_trace(scoped=False)
    error, nodes = _forward_during_a_trace(scoped=True)
    assert error is None
    assert nodes == unscoped_nodes
    assert ("call_module", "proj") in nodes  # the tracer's own __call__ wrapper ran in its thread


def _has_force_flag() -> bool:
    import torch._dynamo.config as dynamo_config

    return hasattr(dynamo_config, "force_compile_during_fx_trace")


@pytest.mark.skipif(not _has_force_flag(), reason="this torch's Dynamo has no force_compile_during_fx_trace")
def test_a_compiled_function_of_another_thread_runs_during_a_scoped_trace_only():
    error, _ = _forward_during_a_trace(scoped=False, compiled=True)
    assert isinstance(error, RuntimeError) and "symbolically trace a dynamo-optimized function" in str(error)
    error, _ = _forward_during_a_trace(scoped=True, compiled=True)
    assert error is None


def test_the_patchers_methods_come_back_after_every_holder_left():
    import torch._dynamo.config as dynamo_config

    patch, patch_method = _Patcher.patch, _Patcher.patch_method
    force = getattr(dynamo_config, "force_compile_during_fx_trace", None)
    with tracing_patches_in_own_thread():
        with tracing_patches_in_own_thread():
            assert _Patcher.patch is not patch and _Patcher.patch_method is not patch_method
            assert force is None or dynamo_config.force_compile_during_fx_trace
        assert _Patcher.patch is not patch  # the outer holder still holds
        assert force is None or dynamo_config.force_compile_during_fx_trace
    assert _Patcher.patch is patch and _Patcher.patch_method is patch_method
    assert getattr(dynamo_config, "force_compile_during_fx_trace", None) == force
    with pytest.raises(RuntimeError):
        with tracing_patches_in_own_thread():
            raise RuntimeError("inside")
    assert _Patcher.patch is patch


@torch.no_grad()
def test_the_background_compilation_traces_in_its_thread_only(tmp_path):
    """A backend that traces with torch.fx as Inductor's code generation does, held open until the main thread
    has run another model's forward: the forward runs, and the compilation succeeds."""
    import torch._dynamo

    from cache_models import build_model
    from hf_specdec.runner.background_compile import BackgroundCompile
    from hf_specdec.runner.compile_cache import CompileCache

    inside, done = threading.Event(), threading.Event()

    def tracing_backend(gm, example_inputs):  # Dynamo's graphs run as traced: no AOT tracing of each (CI time)
        if not inside.is_set():
            torch.fx.symbolic_trace(_TracedWhileOthersRun(inside, done))
        return gm.forward

    torch._dynamo.reset()
    other, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
    want = other(x)
    job = BackgroundCompile(build_model("llama_gqa"), 96, 4, backend=tracing_backend,
                            disk=CompileCache(tmp_path)).start()
    try:
        assert inside.wait(120), job.error
        got = other(x)
    finally:
        done.set()
        finished = job.wait()
        torch._dynamo.reset()
    assert torch.equal(got, want)
    assert finished and job.error is None, job.error
