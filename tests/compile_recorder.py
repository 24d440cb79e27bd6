"""What the compile tests share: an ``aot_eager`` backend that keeps every graph Dynamo compiles, and a Dynamo
reset around each test (compiled code and its counters must not leak from one test into the next)."""
import pytest
import torch
import torch._dynamo
from torch._dynamo.backends.registry import lookup_backend


class Recorder:
    """aot_eager backend that keeps the code of every graph dynamo compiles (one per compiled frame)."""

    def __init__(self):
        self.codes = []

    def __call__(self, gm, example_inputs):
        self.codes.append(gm.code)
        return lookup_backend("aot_eager")(gm, example_inputs)

    @property
    def graphs(self) -> int:
        return len(self.codes)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
