"""A gated MLP's activation in one launch (kernels/silu_mul_*.py): the Triton kernel against its torch reference
(CPU, TRITON_INTERPRET=1), and the reference against transformers' Llama MLP product, bit for bit."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch
from transformers.activations import ACT2FN

pytest.importorskip("triton")

from hf_specdec.kernels import silu_mul_reference  # noqa: E402
from hf_specdec.kernels.silu_mul_triton import silu_mul_triton  # noqa: E402


@pytest.mark.parametrize("shape", [(5, 64), (2, 3, 200), (3, 2500)])  # 2500: three column tiles, a partial one
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("strided", [False, True])
def test_triton_matches_reference(shape, dtype, strided):
    gen = torch.Generator().manual_seed(shape[-1])
    if strided:  # gate and up as the two halves of one gate/up matmul's output
        both = (torch.randn(*shape[:-1], 2 * shape[-1], generator=gen) * 4).to(dtype)
        gate, up = both[..., :shape[-1]], both[..., shape[-1]:]
    else:
        gate, up = ((torch.randn(shape, generator=gen) * 4).to(dtype) for _ in range(2))
    got, want = silu_mul_triton(gate, up), silu_mul_reference(gate, up)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: up to two ulps where the float32 exp rounds apart
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_transformers_activation_times_up(dtype):
    gate, up = torch.randn(7, 48, dtype=dtype) * 3, torch.randn(7, 48, dtype=dtype)
    assert torch.equal(silu_mul_reference(gate, up), ACT2FN["silu"](gate) * up)
