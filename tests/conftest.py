import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


import pytest  # noqa: E402


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
