"""One tiny pair (evals/build_pair.py --tiny) for every test that needs a trained pair: built once a session."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_STEPS = 300


def tiny_source_dir():
    import transformers

    # a few MB of Python source: transformers' own package is always installed
    return os.path.dirname(transformers.__file__)


def build_tiny(out_dir):
    cmd = [sys.executable, os.path.join(REPO, "evals", "build_pair.py"), "--tiny", "--out", str(out_dir),
           "--source-dir", tiny_source_dir(), "--max-bytes", "2e6", "--max-steps", str(TINY_STEPS),
           "--time-budget-s", "600", "--log-every-s", "100"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res
