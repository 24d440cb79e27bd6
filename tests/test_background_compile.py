"""Compiling off the critical path (runner/background_compile.py), on CPU with ``aot_eager``.

* The thread's compiled callable gives the model's own paged logits, for every shape family it exercised,
  without compiling again when the caller then uses it; real calls (draft steps, verifies of several k, batch
  buckets, sampling) after it compile nothing more.
* A compilation that fails is kept, reported once as a warning, and never raised into a call; the next call
  compiles once more.
* While the thread runs paged forwards of a model, the caller's paged forwards of the same model keep the
  paged implementation until the last one ends, and the user's own implementation comes back after both.
"""
import threading
import warnings

import pytest
import torch
import torch._dynamo

from cache_models import build_model
from compile_recorder import Recorder, fresh_dynamo  # noqa: F401  (an autouse fixture)
from hf_specdec.cache import PagedKVCache, paged_attention_enabled, paged_forward
from hf_specdec.cache.attention import _paged_implementation
from hf_specdec.runner.background_compile import BackgroundCompile
from hf_specdec.runner.compile_cache import CompileCache




@torch.no_grad()
def test_compiled_in_a_thread_then_used_without_compiling_again(tmp_path):
    model = build_model("llama_gqa", num_hidden_layers=3)
    recorder = Recorder()
    job = BackgroundCompile(model, 96, 4, backend=recorder, disk=CompileCache(tmp_path)).start()
    assert job.wait() and job.error is None, job.error
    made = recorder.graphs
    assert made > 0
    cache = PagedKVCache(64, 4, 4, 64, torch.device("cpu"))
    rows = cache.add_sequences(3)
    cache.reserve(rows, [24] * 3)
    with paged_attention_enabled(model):
        for b, q in ((1, 1), (3, 2), (2, 5)):
            step = cache.batch(torch.tensor(rows[:b]), torch.tensor([6] * b), torch.tensor([q] * b), q, b * q)
            ids = torch.randint(3, 90, (b * q,))
            got = paged_forward(model, ids, step, torch.arange(b * q), call=job.compiled)
            want = paged_forward(model, ids, step, torch.arange(b * q))
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert recorder.graphs == made, "the caller's shapes compiled again: the thread missed a shape family"


def test_a_finished_compilation_costs_a_waiting_call_no_warmup(tmp_path, monkeypatch):
    """SpecConfig(compile=True) waits for the compiled code; once it is there, a call's warm-up stays 0."""
    from hf_specdec.runner import spec_runner

    model = build_model("llama_gqa")
    job = BackgroundCompile(model, 96, 4, backend=Recorder(), disk=CompileCache(tmp_path))
    assert job.wait() and job.finished()
    monkeypatch.setattr(spec_runner, "compile_job", lambda *args: job)
    runner = spec_runner.SpecRunner(model, None)
    assert runner._compiled_ready({"target": model}, 96, 4, 16, wait=True)
    assert runner.warmup_seconds == 0.0


def test_a_failed_compilation_is_reported_once_and_never_raised(tmp_path):
    model = build_model("llama_gqa")

    def broken(gm, example_inputs):
        raise RuntimeError("no compiler here")

    job = BackgroundCompile(model, 96, 4, backend=broken, disk=CompileCache(tmp_path)).start()
    job._thread.join()
    with pytest.warns(RuntimeWarning, match="compiling LlamaForCausalLM failed.*no compiler here"):
        assert not job.ready()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not job.ready() and not job.wait()  # once only


def test_a_failed_compilation_is_tried_once_more_by_the_next_call(tmp_path, monkeypatch):
    """torch.compile in another thread of the process can break a compilation here (Dynamo's FX-tracing flag is
    process-wide): the next call that asks compiles again, once."""
    from hf_specdec.runner import background_compile

    model = build_model("llama_gqa")
    failures = [RuntimeError("Detected that you are using FX to symbolically trace a dynamo-optimized function")]

    def flaky(gm, example_inputs):
        if failures:
            raise failures.pop()
        return gm.forward

    made = []

    class Flaky(background_compile.BackgroundCompile):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.backend, self.disk, self.prewarm = flaky, CompileCache(tmp_path), False
            made.append(self)

    monkeypatch.setattr(background_compile, "BackgroundCompile", Flaky)
    first = background_compile.compile_job(model, 96, 4, 16)
    assert background_compile.compile_job(model, 96, 4, 16) is first  # not failed: the same job
    first.start()._thread.join()
    assert background_compile.compile_job(model, 96, 4, 16) is first  # failed, not yet reported: no retry
    with pytest.warns(RuntimeWarning, match="failed.*The next call tries once more"):
        assert not first.ready()
    second = background_compile.compile_job(model, 96, 4, 16)
    assert second is not first and second.attempt == 2 and len(made) == 2
    assert second.start().wait() and second.error is None and second.compiled is not None
    assert background_compile.compile_job(model, 96, 4, 16) is second


def test_a_second_failure_stands(tmp_path):
    model = build_model("llama_gqa")

    def broken(gm, example_inputs):
        raise RuntimeError("no compiler here")

    job = BackgroundCompile(model, 96, 4, backend=broken, disk=CompileCache(tmp_path), attempt=2).start()
    job._thread.join()
    with pytest.warns(RuntimeWarning, match="no compiler here.*slower\\). SpecConfig"):
        assert not job.ready()
    assert job.retry() is None


def _paged_forward_in_another_thread(model):
    """Returns once another thread is inside a paged forward of ``model``; calling the result lets it end."""
    inside, release = threading.Event(), threading.Event()

    def hold():
        with _paged_implementation(model):
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert inside.wait(10)

    def finish():
        release.set()
        thread.join()
    return finish


@torch.no_grad()
def test_paged_forwards_of_two_threads_keep_the_implementation_until_the_last_ends():
    model = build_model("llama_gqa", attn_implementation="sdpa")
    with paged_attention_enabled(model):
        finish = _paged_forward_in_another_thread(model)
        with _paged_implementation(model):
            assert model.config._attn_implementation == "hf_specdec_paged"
        assert model.config._attn_implementation == "hf_specdec_paged", "the other thread's forward lost it"
    assert model.config._attn_implementation == "hf_specdec_paged", "the block's exit took it from a live forward"
    finish()
    assert model.config._attn_implementation == "sdpa"


def test_the_workers_skeleton_has_one_layer_of_each_kind_in_the_models_dtypes():
    from hf_specdec.runner.compile_worker import _tensors, skeleton

    model = build_model("gemma2_softcap_sliding", num_hidden_layers=2)  # sliding, full
    model.model.layers[0].mlp.to(torch.float64)  # a dtype the config does not say
    spec = {"module": type(model).__module__, "class": type(model).__name__, "config": model.config.to_dict(),
            "device": "cpu", "dtypes": {n: str(t.dtype).removeprefix("torch.") for n, t in _tensors(model)}}
    small = skeleton(spec)
    assert small.config.layer_types == ["sliding_attention", "full_attention"] and len(small.model.layers) == 2
    assert small.model.layers[0].mlp.up_proj.weight.dtype == torch.float64
    shapes = {n: t.shape for n, t in _tensors(model)}
    assert all(shapes[n] == t.shape for n, t in _tensors(small)), "the skeleton's tensors differ in shape"


def test_a_worker_that_fails_says_why():
    from hf_specdec.runner.compile_worker import compile_in_subprocess

    model = build_model("llama_gqa")
    model.config.hidden_act = "no_such_activation"  # the worker cannot rebuild this model
    error = compile_in_subprocess(model, "k" * 16, 96, 4)
    assert error is not None and "no_such_activation" in error


@torch.no_grad()
def test_a_block_entered_while_another_threads_forward_runs_restores_the_users_implementation():
    model = build_model("llama_gqa", attn_implementation="sdpa")
    finish = _paged_forward_in_another_thread(model)
    with paged_attention_enabled(model):  # entered while the other thread's forward holds the paged name
        finish()
    assert model.config._attn_implementation == "sdpa"


def compiled_calls_on_cpu(monkeypatch, tmp_path) -> Recorder:
    """generate() calls on CPU that run compiled models (the runner without graphs), each model compiled by the
    background job in the caller's thread (Triton's interpreter, CI's kernels, is not thread-safe) with a recording
    backend: the returned Recorder counts every graph compiled."""
    import hf_specdec.generate as generate_module
    from hf_specdec.runner import background_compile

    recorder = Recorder()

    class Recorded(BackgroundCompile):
        def __init__(self, model, vocab_size, block_size, **kwargs):
            super().__init__(model, vocab_size, block_size, backend=recorder, disk=CompileCache(tmp_path),
                             prewarm=False, table_width=kwargs.get("table_width", 16))

        def start(self):
            self.wait()
            return self

    choose = generate_module.choose_path

    def compiled_on_cpu(*args, **kwargs):
        path = choose(*args, **kwargs)
        path.compile = True
        return path

    monkeypatch.setattr(background_compile, "BackgroundCompile", Recorded)
    monkeypatch.setattr(generate_module, "choose_path", compiled_on_cpu)
    return recorder


@torch.no_grad()
def test_the_runners_rounds_reuse_what_the_thread_compiled(monkeypatch, tmp_path):
    """Real calls (draft steps, verifies of several k, batch buckets, greedy and sampled) after the compilation
    finished compile nothing more: the thread's exercise met every way the rounds lay out a model's inputs. On an
    H200 a missed layout made the call that switched to compiled code recompile 8 graphs (3.6 s). The output stays
    the target's own."""
    import hf_specdec
    from hf_specdec.runner import runner_for

    recorder = compiled_calls_on_cpu(monkeypatch, tmp_path)
    target = hf_specdec.enable(build_model("llama_gqa", num_hidden_layers=2))
    draft = build_model("llama_gqa", seed=1, num_hidden_layers=1)

    def call(batch, spec, do_sample=False):
        ids = torch.randint(3, 90, (batch, 11), generator=torch.Generator().manual_seed(batch))
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, eos_token_id=None,
                  pad_token_id=0, do_sample=do_sample)
        out = target.generate(**kw, assistant_model=draft, spec_config=spec, return_dict_in_generate=True)
        if not do_sample:
            assert torch.equal(out.sequences, target.generate(**kw)), (batch, spec)
        return out.spec_metrics.fast_path

    call(1, hf_specdec.SpecConfig(num_speculative_tokens=4))
    assert runner_for(target, draft).wait_compiled()
    made = recorder.graphs
    assert made > 0
    for batch, spec, do_sample in ((1, hf_specdec.SpecConfig(num_speculative_tokens=4), False),
                                   (1, hf_specdec.SpecConfig(num_speculative_tokens=1), False),
                                   (3, hf_specdec.SpecConfig(num_speculative_tokens=3), False),
                                   (2, hf_specdec.SpecConfig(num_speculative_tokens=2), True),
                                   (1, hf_specdec.SpecConfig(num_speculative_tokens=0), False)):
        assert call(batch, spec, do_sample) == "bucketed", "the call did not run the compiled models"
        assert recorder.graphs == made, f"b={batch} {spec.num_speculative_tokens=} compiled again: a layout missed"


@torch.no_grad()
def test_a_draft_heads_rounds_reuse_what_the_thread_compiled(monkeypatch, tmp_path):
    """A draft head compiles like a draft model (its layer, fc, norm, its own reduced output layer): its rounds
    (features in, a first step of k+1 tokens, one that keeps no logits at k = 0) and the target's verify that hands
    out its hidden states compile nothing after the thread's exercise; the output stays the target's. Two heads on
    one target (the target's output layer, then one of its own over 40 tokens): the target compiles once."""
    import hf_specdec
    from hf_specdec.round.policy.speculation_length import SpeculationLength
    from hf_specdec.runner import runner_for

    recorder = compiled_calls_on_cpu(monkeypatch, tmp_path)
    target = hf_specdec.enable(build_model("llama_gqa", num_hidden_layers=2))
    choose = SpeculationLength._choose
    for kept in (None, 40):
        head = hf_specdec.DraftHead.for_target(target, kept_ids=None if kept is None else torch.arange(kept))

        def call(batch, k, adaptive=False, do_sample=False):
            ids = torch.randint(3, 90, (batch, 11), generator=torch.Generator().manual_seed(batch))
            kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, eos_token_id=None,
                      pad_token_id=0, do_sample=do_sample)
            spec = hf_specdec.SpecConfig(num_speculative_tokens=k, adaptive=adaptive)
            out = target.generate(**kw, assistant_model=head, spec_config=spec, return_dict_in_generate=True)
            if not do_sample:
                assert torch.equal(out.sequences, target.generate(**kw)), (kept, batch, k)
            assert runner_for(target, head).models["draft"].call is not None, f"the head ({kept=}) ran uncompiled"
            return out.spec_metrics

        call(1, 4)
        assert runner_for(target, head).wait_compiled()
        made = recorder.graphs
        for batch, k, adaptive, do_sample in ((1, 4, False, False), (3, 3, False, False), (2, 2, False, True),
                                              (1, 1, False, False)):
            assert call(batch, k, adaptive, do_sample).fast_path == "bucketed"
            assert recorder.graphs == made, f"{kept=} b={batch} k={k} compiled again: a layout missed"
        monkeypatch.setattr(SpeculationLength, "_choose",  # 0, 3, 0, 3, ...: the head's first step without logits
                            lambda self, bucket, rows, remaining: 3 if sum(self.histogram.values()) % 2 else 0)
        for batch in (1, 3):
            assert call(batch, 3, adaptive=True).k_histogram.get(0, 0) >= 2
            assert recorder.graphs == made, f"{kept=} b={batch}: rounds of k = 0 compiled again"
        monkeypatch.setattr(SpeculationLength, "_choose", choose)


def test_the_workers_skeleton_of_a_draft_head_runs_without_its_target():
    """The worker rebuilds a head from its class and config alone: stand-ins for the target's embedding and output
    layer, valid kept ids (to_empty leaves them garbage), and its forward runs."""
    import hf_specdec
    from hf_specdec.runner.compile_worker import _tensors, skeleton

    target = build_model("llama_gqa", num_hidden_layers=2)
    head = hf_specdec.DraftHead.for_target(target, kept_ids=torch.arange(5, 45))
    spec = {"module": type(head).__module__, "class": type(head).__name__, "config": head.config.to_dict(),
            "device": "cpu", "dtypes": {n: str(t.dtype).removeprefix("torch.") for n, t in _tensors(head)}}
    small = skeleton(spec)
    assert torch.equal(small.lm_head.token_ids, torch.arange(40))
    assert {n: t.shape for n, t in _tensors(small)} == {n: t.shape for n, t in _tensors(head)}
    out = small(torch.zeros(1, 3, dtype=torch.long), torch.arange(3)[None], torch.zeros(1, 3, head.config.hidden_size))
    assert out.logits.shape == (1, 3, target.config.vocab_size)


def test_the_workers_skeleton_of_a_head_keeps_its_layers_and_so_how_it_compiles():
    """A head of two layers compiles by regions, one of one layer whole (compiled_regions.compiled_whole): its
    skeleton keeps every layer, so the worker compiles what the caller's process will."""
    import hf_specdec
    from hf_specdec.runner.compile_worker import model_spec, skeleton
    from hf_specdec.runner.compiled_regions import compiled_whole

    target = build_model("llama_gqa", num_hidden_layers=2)
    for layers in (1, 2):
        head = hf_specdec.DraftHead.for_target(target, num_layers=layers)
        small = skeleton(model_spec(head))
        assert len(small.layers) == layers and compiled_whole(small) == compiled_whole(head) == (layers == 1)
