"""benchmarks/tp_cost_report.py: the speedup formula of docs/end_to_end.md applied to measured step costs."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.tp_cost_report import expected_tokens, report, speedups  # noqa: E402

ROW = {"target_tp": 2, "draft_tp": 1, "batch": 8, "prompt": 512, "k": 4, "draft_step": 1.0, "draft_first_step": 1.5,
       "verify_forward": 10.0, "target_step": 8.0, "round": 20.0}


def test_expected_tokens():
    assert expected_tokens(0.5, 4) == pytest.approx(1.9375)
    assert expected_tokens(1.0, 4) == 5.0


def test_speedups_from_step_costs():
    sp = speedups(ROW, 4, one_gpu_step=12.0)
    forwards = 4 * 1.0 + 0.5 + 10.0
    assert sp[0.5] == pytest.approx((1.9375 * 8 / forwards, 1.9375 * 8 / 20, 1.9375 * 12 / 20))
    assert speedups(ROW, 4, None)[0.9][2] is None


def test_report_tables():
    one_gpu = dict(ROW, target_tp=1, target_step=12.0)
    missing = {"target_tp": 2, "draft_tp": 2, "batch": 8, "prompt": 512, "k": 4}
    text = report([{"gpu": "H200", "rows": [one_gpu]}, {"gpu": "H200", "rows": [ROW, missing]}])
    lines = text.splitlines()
    assert lines[0].startswith("GPU: H200; k = 4; prompt 512 tokens")
    assert "| target TP=2, draft TP=1 | 8 | 1.000 | 1.500 | 10.000 | 8.000 | 20.000 |" in lines
    assert "| target TP=2, draft TP=2 | 8 | - | - | - |" in lines
    e = expected_tokens(0.7, 4)
    cell = f"{e * 8 / 14.5:.2f} / {e * 8 / 20:.2f} / {e * 12 / 20:.2f}"
    assert any(line.startswith("| target TP=2, draft TP=1 | 8 |") and cell in line for line in lines[-4:])
