"""Programmatic dependent launch is chosen per device and by ``HF_SPECDEC_PDL``; the compile cache keys on it."""
import pytest
import torch

from hf_specdec.kernels import pdl

CUDA = torch.device("cuda", 0)


@pytest.fixture
def hopper(monkeypatch):
    """A CUDA device of compute capability 9.0, compiled kernels (no interpreter), PDL switched on."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(pdl.ENV, "1")


@pytest.mark.parametrize("value", ["1", "true", " On "])
def test_on_for_hopper_when_switched_on(hopper, monkeypatch, value):
    monkeypatch.setenv(pdl.ENV, value)
    assert pdl.pdl_enabled(CUDA)
    assert pdl.pdl_launch(CUDA) == {"USE_PDL": True, "launch_pdl": True}


@pytest.mark.parametrize("value", [None, "0", "false", "off", " No "])
def test_off_by_default_and_when_switched_off(hopper, monkeypatch, value):
    if value is None:
        monkeypatch.delenv(pdl.ENV)
    else:
        monkeypatch.setenv(pdl.ENV, value)
    assert not pdl.pdl_enabled(CUDA)
    assert pdl.pdl_launch(CUDA) == {"USE_PDL": False}  # no launch_pdl keyword: a plain launch


def test_off_before_hopper_on_cpu_and_in_the_interpreter(hopper, monkeypatch):
    assert not pdl.pdl_enabled(torch.device("cpu"))
    for value in ("1", "true", "On"):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert not pdl.pdl_enabled(CUDA)
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert not pdl.pdl_enabled(CUDA)


def test_the_compile_cache_keys_on_inductors_switch_only(hopper, monkeypatch):
    """Inductor's PDL is compiled into its code: code made with it on is never loaded by a process with it off, nor
    back. Ours is read at each launch (compiled code calls our kernels as opaque ops): no recompilation for it."""
    import torch._inductor.config as inductor_config
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_specdec.runner.background_compile import BackgroundCompile

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    model = LlamaForCausalLM(cfg).eval()
    monkeypatch.setattr("hf_specdec.runner.background_compile.input_device", lambda m: CUDA)
    key = lambda: BackgroundCompile(model, 64, 16, prewarm=False).key  # noqa: E731
    ours_on = key()
    monkeypatch.setenv(pdl.ENV, "0")
    assert key() == ours_on
    if hasattr(inductor_config.triton, "enable_pdl"):
        monkeypatch.setattr(inductor_config.triton, "enable_pdl", not inductor_config.triton.enable_pdl)
        assert key() != ours_on


def test_off_on_rocm(hopper, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    assert not pdl.pdl_enabled(CUDA)
