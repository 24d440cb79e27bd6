import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Workers side by side (README's `-n auto`): torch's intra-op threads of two workers on two cores spin against
    # each other (the suite ran slower than one process); one each, here and in the scripts the tests start.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks (this conftest loads before its plugin)
def pytest_collection_modifyitems(items):
    """Every test of the tiny trained pair on one xdist worker (`--dist loadgroup`): the pair is built once a worker,
    and its build is the suite's longest fixture."""
    for item in items:
        if "tiny_pair" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("tiny_pair"))


@pytest.fixture(scope="module")
def small_target():
    """A target over test_sampling_exact's V-token vocabulary, no EOS: the sampled-law tests' (n-gram, draft head)."""
    import hf_specdec
    from models import make_model
    from test_sampling_exact import V

    target = hf_specdec.enable(make_model("llama", seed=11, vocab=V, sharpen=2.0))
    target.config.eos_token_id = target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    return target


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """The session's one tiny trained pair (tests/tiny_pair.py): the build takes most of a minute on two cores, so the
    pair's own tests, the scripts' smokes and the head training share it. Tests write beside it, never into it."""
    from tiny_pair import build_tiny

    out = tmp_path_factory.mktemp("tiny_pair")
    build_tiny(out)
    return out
