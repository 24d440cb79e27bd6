"""benchmarks/divergence.py: the first divergent position of a greedy row and whether it is a near-tie.

A divergence is forced on a tiny fp32 model: once by swapping a generated token for the runner-up
(a clear margin: suspect), once on a model whose output head has two identical rows (an exact tie:
near-tie). Both forwards (the model's own and hf_specdec's paged prefill) must agree on the gap.
"""
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from models import left_padded_prompts, make_draft, make_model

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root
from benchmarks.divergence import (  # noqa: E402
    add_to_results, analyse, first_divergence, resolution, summary_line, table_lines,
)


def greedy_rows(target, ids, mask, new):
    out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new, eos_token_id=None,
                          pad_token_id=0)
    return [row[ids.shape[1]:].tolist() for row in out]


def test_first_divergence_and_resolution():
    assert first_divergence([5, 6, 7], [5, 6, 7]) is None
    assert first_divergence([5, 6, 7], [5, 9, 7]) == 1
    assert first_divergence([5, 6], [5, 6, 2]) == 2
    assert resolution(20.0, torch.bfloat16) == 0.125  # 16 <= 20 < 32: 8 bits of mantissa -> 2**4 / 2**7
    assert resolution(-1.5, torch.float32) == 2.0 ** -23


@pytest.fixture(scope="module")
def model():
    return make_model("llama", seed=5)


def test_clear_margin_is_suspect(model):
    ids, mask = left_padded_prompts(3, seed=2)
    plain = greedy_rows(model, ids, mask, 6)
    t, row = 3, 1
    prefix = torch.cat([ids[row][mask[row].bool()], torch.tensor(plain[row][:t])])
    with torch.no_grad():
        logits = model(prefix[None]).logits[0, -1]
    runner_up = int(torch.topk(logits, 2).indices[1])
    other = [list(r) for r in plain]
    other[row] = plain[row][:t] + [runner_up] + plain[row][t + 1:]
    report = analyse(model, make_draft(model, "mix"), ids, mask, plain, other, torch.float32)
    assert (report["divergent"], report["near_ties"], report["suspect"]) == (1, 0, 1)
    d = report["divergences"][0]
    assert (d["row"], d["position"], d["plain_token"], d["other_token"]) == (row, t, plain[row][t], runner_up)
    margin = float(torch.topk(logits, 2).values.diff().abs())
    for name in ("plain", "paged"):  # the gap between plain's token and the runner-up is the top-2 margin
        assert d[name]["gap"] == pytest.approx(margin, abs=1e-4) and d[name]["argmax"] == plain[row][t]
    assert d["noise"] < 1e-4 and d["gap_ulps"] > 1e3 and d["near_tie"] is False


def test_exact_tie_is_a_near_tie():
    model = make_model("llama", seed=6)
    ids, mask = left_padded_prompts(2, seed=3)
    first = greedy_rows(model, ids, mask, 1)[0][0]
    twin = (first + 1) % model.config.vocab_size
    with torch.no_grad():
        model.lm_head.weight[twin] = model.lm_head.weight[first]  # the two tokens' logits are equal everywhere
    plain = greedy_rows(model, ids, mask, 4)
    a = plain[0][0]
    b = twin if a == first else first
    other = [[b] + plain[0][1:], plain[1]]
    report = analyse(model, make_draft(model, "mix"), ids, mask, plain, other, torch.bfloat16)
    assert (report["divergent"], report["near_ties"], report["suspect"]) == (1, 1, 0)
    d = report["divergences"][0]
    assert d["position"] == 0 and d["plain"]["gap"] == 0.0 and d["near_tie"] is True


def test_e2e_glue_and_lines(model):
    ids, mask = left_padded_prompts(2, seed=4)
    plain = greedy_rows(model, ids, mask, 5)
    other = [plain[0], plain[1][:2] + [(plain[1][2] + 1) % model.config.vocab_size] + plain[1][3:]]
    results = [
        {"method": "plain_eager", "variant": "dynamic_cache", "batch_size": 2, "mode": "greedy", "outputs": plain},
        {"method": "hf_specdec", "variant": "fast k=3", "batch_size": 2, "mode": "greedy", "outputs": other},
        {"method": "hf_specdec", "variant": "fast k=3", "batch_size": 2, "mode": "sample", "outputs": other},
    ]
    bench = SimpleNamespace(target=model, draft=None, ids=ids, mask=mask, results=results)
    add_to_results(bench, tie_ulps=1.0)
    assert "divergence" not in results[0] and "divergence" not in results[2]
    report = results[1]["divergence"]
    assert report["divergent"] == 1 and report["divergences"][0]["position"] == 2
    lines = list(table_lines(results))
    assert len(lines) == 3 and "SUSPECT" in lines[1] and " fast k=3" in lines[1]
    assert summary_line(results) == ("greedy rows diverging from plain eager: 1 of 2 compared, 0 near-ties (within 1 "
                                     "ulp), 1 suspect; hf_specdec fast k=3 b=2 1/2 (0 near-ties)")
