"""RMSNorm in one launch (kernels/rms_norm_*.py): the Triton kernel against its torch reference (CPU,
TRITON_INTERPRET=1), and the reference against transformers' own Llama-family RMSNorm, bit for bit."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

pytest.importorskip("triton")

from hf_specdec.kernels import rms_norm_reference  # noqa: E402
from hf_specdec.kernels.rms_norm_triton import rms_norm_triton  # noqa: E402


@pytest.mark.parametrize("shape", [(5, 64), (2, 3, 80), (3, 4096), (2, 5000)])  # 5000: two column tiles
@pytest.mark.parametrize("dtype,weight_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                (torch.bfloat16, torch.float32)])
def test_triton_matches_reference(shape, dtype, weight_dtype):
    gen = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    weight = (1 + torch.randn(shape[-1], generator=gen) * 0.1).to(weight_dtype)
    got, want = rms_norm_triton(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: up to two ulps where the float32 scales round apart
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_a_strided_input_reads_its_own_rows():
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(4, 3, 96, generator=gen)
    x = wide[:, :, :64]  # rows with a stride of 96
    weight = torch.randn(64, generator=gen)
    torch.testing.assert_close(rms_norm_triton(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_transformers_norm(dtype):
    norm = LlamaRMSNorm(48, eps=1e-6)
    with torch.no_grad():
        norm.weight.mul_(torch.linspace(0.5, 1.5, 48))
    norm = norm.to(dtype)
    x = torch.randn(7, 48, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(rms_norm_reference(x, norm.weight, norm.variance_epsilon), norm(x))
