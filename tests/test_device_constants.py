"""kernels.device_constant: one tensor per key and device, made once; a round's verify reads the kept ones."""
import torch

from hf_specdec import kernels


def test_made_once_per_key_and_device():
    made = []

    def make():
        made.append(1)
        return torch.arange(3)

    cpu = torch.device("cpu")
    first = kernels.device_constant(("test offsets", 3), cpu, make)
    assert kernels.device_constant(("test offsets", 3), cpu, make) is first and len(made) == 1
    assert kernels.device_constant(("test offsets", 4), cpu, make) is not first and len(made) == 2
    assert kernels.all_true(5, cpu) is kernels.all_true(5, cpu) and bool(kernels.all_true(5, cpu).all())


def test_not_kept_while_traced():
    """A tensor made inside a torch.compile trace belongs to that graph: the trace makes its own every time."""
    def make():
        return torch.ones(2)

    @torch.compile(backend="eager", fullgraph=True)
    def f(x):
        return x + kernels.device_constant(("test traced", 2), x.device, make)

    assert torch.equal(f(torch.zeros(2)), torch.ones(2))
    assert ("test traced", 2) not in {key for key, _ in kernels.device_constants._MADE}
