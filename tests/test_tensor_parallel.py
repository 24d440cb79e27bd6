"""Tensor-parallel target (``tp_plan="auto"``) on CPU: two gloo processes under torchrun (tests/tp_worker.py).

Greedy output equals the sharded target's own plain generate() on both paths, with a replicated
and with a tensor-parallel draft; sampling draws the same numbers on both ranks (different global
seeds: hf_specdec shares rank 0's), and with one seeded generator equals sampling from the same
weights unsharded; the paged cache holds each rank's own KV head; ranks that draw different numbers
are caught by the end-of-call check; a draft placed against SpecConfig.draft_tp is refused.
"""
import json
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One xdist worker for the module (`--dist loadgroup`): its torchrun fixture then runs once, not once a worker.
pytestmark = pytest.mark.xdist_group("tensor_parallel")


def _checkpoints(root):
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    target = LlamaForCausalLM(cfg)
    with torch.no_grad():
        target.lm_head.weight.mul_(8)  # peaked distributions: greedy ties impossible
    target.save_pretrained(root / "target")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in target.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3 * p.std())
    target.save_pretrained(root / "draft")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    _checkpoints(root)
    out = root / "out"
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(REPO, "tests", "tp_worker.py"), str(root), str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    if res.returncode != 0 and _killed_by_signal(res.stderr):
        # A rank killed by a signal inside gloo or the interpreter (a SIGSEGV once in CI, mid-forward, never
        # reproduced in 14 runs under load): one more run, so a native crash of the shared runner is not read
        # as a wrong answer; a crash that repeats, or any Python error, fails. The first run's stack is kept.
        warnings.warn("tensor-parallel ranks crashed once and were run again:\n" + res.stderr[-4000:])
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-6000:]
    return [json.load(open(out / f"rank{r}.json")) for r in (0, 1)]


def _killed_by_signal(stderr: str) -> bool:
    """torchrun's failure table gives a rank killed by a signal a negative exit code; a Python error in a rank
    (tp_worker.py prints it and exits with 1) does not count."""
    codes = [int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", stderr)]
    return bool(codes) and all(c < 0 for c in codes)


def test_weights_are_sharded_and_cache_holds_local_heads(ranks):
    for r in ranks:
        assert r["q_proj_local"] == [32, 64]  # 4 heads of 16 -> 2 per rank
        # 2 KV heads -> 1 per rank (the replicated draft caches both of its own)
        assert r["pool_kv_heads"] == {"replicated/target": [1], "replicated/draft": [2], "tp/target": [1],
                                      "tp/draft": [1]}


def test_greedy_equals_plain_generate_on_every_rank(ranks):
    for r in ranks:
        assert len(r["greedy"]) == 4
        for case, v in r["greedy"].items():
            assert v["same"], (r["rank"], case)
            assert v["fast_path"] == "bucketed"


def test_sampling_identical_across_ranks_and_to_unsharded(ranks):
    r0, r1 = ranks
    shared = [k for k in r0["sample"] if k.endswith("/shared")]
    assert len(shared) == 2
    for k in shared:
        assert r0["sample"][k] == r1["sample"][k], k
    b4 = r0["sample"]["b4/shared"]
    assert len({tuple(row) for row in b4}) == 4  # rows really sampled different continuations
    for r in ranks:
        for k, v in r["sample"].items():
            if k.endswith("/seeded"):
                assert v["same_as_unsharded"], (r["rank"], k)


def test_divergent_ranks_are_caught(ranks):
    for r in ranks:
        assert r["diverged"].startswith("RuntimeError: tensor-parallel ranks emitted different tokens in rows [")


def test_draft_tp_mismatch_is_refused(ranks):
    for r in ranks:
        e = r["draft_tp_errors"]
        assert "SpecConfig(draft_tp=2) but the draft is split over 1 rank(s)" in e["want2_got1"]
        assert "SpecConfig(draft_tp=1) but the draft is split over 2 rank(s)" in e["want1_got2"]
        assert "tensor-parallel draft needs a target sharded over the same ranks" in e["tp_draft_plain_target"]
