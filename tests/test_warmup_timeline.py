"""benchmarks/warmup_timeline.py on the CPU: the job runs with its hooks in place and its events are printed."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_warmup_timeline_lists_the_jobs_calls_and_prefills(tiny_pair, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n    return x + {i}\n"}) + "\n" for i in range(3)))
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "warmup_timeline.py"), "--pair",
                           str(tiny_pair), "--prompts", str(prompts), "--batch", "2", "--num-prompts", "3",
                           "--max-new-tokens", "6"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    calls = [line for line in lines if "\tCALL " in line]
    assert len(calls) == 2 and "CALL 1: " in calls[1], done.stdout  # 3 prompts in batches of 2
    assert sum("\tprefill of " in line for line in lines) >= 2, done.stdout
    assert lines[-1].startswith("job ") and "JIT compiles" in lines[-1], done.stdout
