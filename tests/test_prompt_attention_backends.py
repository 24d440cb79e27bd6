"""Prompt attention's backend choice (``cache.attention.prompt_sdpa_backends``): on CUDA, prompts of up to
``PROMPT_FLASH_MAX_TOKENS`` attend without cuDNN's backend (a plan built per new length); longer ones, other devices
and ``HF_SPECDEC_CUDNN_PROMPT_ATTENTION=1`` keep torch's choice; the flags are restored afterwards. The flags are
process-wide and readable without a GPU, so this runs on the CPU."""
import threading

import pytest
import torch

from hf_specdec.cache import attention
from hf_specdec.cache.attention import CUDNN_PROMPT_ATTENTION_ENV, PROMPT_FLASH_MAX_TOKENS, prompt_sdpa_backends

CUDA = torch.device("cuda")


def flags():
    b = torch.backends.cuda
    return b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled()


@pytest.fixture(autouse=True)
def torch_defaults(monkeypatch):
    monkeypatch.delenv(CUDNN_PROMPT_ATTENTION_ENV, raising=False)
    before = flags()
    assert before == (True, True, True, True)
    yield
    assert flags() == before


def test_short_prompts_on_cuda_leave_out_cudnn_and_get_it_back():
    with prompt_sdpa_backends(CUDA, PROMPT_FLASH_MAX_TOKENS):
        assert flags() == (False, True, True, True)
    assert flags() == (True, True, True, True)


@pytest.mark.parametrize("device, tokens, env", [(CUDA, PROMPT_FLASH_MAX_TOKENS + 1, None),
                                                 (torch.device("cpu"), 16, None), (CUDA, 16, "1")],
                         ids=["long prompt", "cpu", "env"])
def test_otherwise_torch_chooses(monkeypatch, device, tokens, env):
    if env:
        monkeypatch.setenv(CUDNN_PROMPT_ATTENTION_ENV, env)
    with prompt_sdpa_backends(device, tokens):
        assert flags() == (True, True, True, True)


def test_an_error_inside_restores_the_flags():
    with pytest.raises(RuntimeError, match="inside"):
        with prompt_sdpa_backends(CUDA, 16):
            raise RuntimeError("inside")


def test_a_second_thread_waits_for_the_first_to_restore():
    """Two threads entering and leaving in an interleaved order would leave cuDNN off for good without the lock."""
    inside, seen = threading.Event(), []

    def second():
        inside.wait()
        with prompt_sdpa_backends(CUDA, 16):
            seen.append(attention._PROMPT_SDPA_LOCK.locked())

    thread = threading.Thread(target=second)
    thread.start()
    with prompt_sdpa_backends(CUDA, 16):
        inside.set()
        thread.join(timeout=0.2)
        assert thread.is_alive()  # blocked on the lock while the first is inside
    thread.join(timeout=10)
    assert seen == [True] and not thread.is_alive()
