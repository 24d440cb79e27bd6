"""How long a fresh process's Triton compiles of the layer kernels take, one after another, in threads, in processes.

The first call of a fresh process JIT-compiles RMSNorm, SiLU·up and the rotary + K/V write (one variant each,
``docs/kernels.md``) inside its first prefill, one after another. Whether compiling them ahead (at ``enable()``) or
side by side would shorten that call depends on how much of a compile holds the GIL. Each mode runs in a child
process with an empty Triton cache (``TRITON_CACHE_DIR``), compiling without launching (``JITFunction.warmup``)
through the kernels' own wrappers, at the project pair's target shapes in bf16:

    serial     the three, one after another (what a first prefill does), each timed
    threads    one thread each, timed until all are done
    busy       as threads, while the main thread runs a Python loop: its rate against an idle one is the share
               of the GIL the compiles leave to the caller
    processes  one child process each (its imports included), timed from the first spawn

    python benchmarks/jit_compile_probe.py --out $OUT/jit_probe.json     # CUDA; about a minute
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

MODES = ("serial", "threads", "busy", "processes")
KERNELS = ("rms_norm", "silu_mul", "rotary_write_kv")


def _warm(name: str) -> float:
    """Seconds to compile kernel ``name`` through its wrapper, launching nothing."""
    import torch

    from hf_specdec.kernels import rms_norm_triton as rn, rotary_write_kv_triton as rw, silu_mul_triton as sm

    class Warm:  # stands in for the kernel: ``kernel[grid](...)`` compiles it and returns
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: self.kernel.warmup(*args, grid=grid, **kwargs)

    dev, dt = torch.device("cuda"), torch.bfloat16
    hidden, heads, kv_heads, head_dim, inter = 1536, 12, 4, 128, 4096
    start = time.perf_counter()
    if name == "rms_norm":
        rn._rms_norm_kernel = Warm(rn._rms_norm_kernel)
        x, weight = torch.empty(8, hidden, dtype=dt, device=dev), torch.empty(hidden, dtype=dt, device=dev)
        rn.rms_norm_triton(x, weight, 1e-6)
    elif name == "silu_mul":
        sm._silu_mul_kernel = Warm(sm._silu_mul_kernel)
        fused = torch.empty(8, 2 * inter, dtype=dt, device=dev)
        sm.silu_mul_triton(fused[:, :inter], fused[:, inter:])
    else:
        rw._rotary_write_kv_kernel = Warm(rw._rotary_write_kv_kernel)
        qkv = torch.empty(8, (heads + 2 * kv_heads) * head_dim, dtype=dt, device=dev)
        q, k, v = (x.view(8, -1, head_dim) for x in qkv.split([heads * head_dim, kv_heads * head_dim,
                                                                 kv_heads * head_dim], dim=1))
        angles = torch.empty(8, head_dim, dtype=dt, device=dev)
        cache = torch.empty(4, 16, kv_heads, head_dim, dtype=dt, device=dev)
        rw.rotary_write_kv_triton(q, k, v, angles, angles, cache, cache, torch.zeros(8, dtype=torch.int64, device=dev),
                                  False)
    return time.perf_counter() - start


def _loop_rate(stop: threading.Event) -> float:
    """Python loop iterations per second until ``stop``."""
    n, start = 0, time.perf_counter()
    while not stop.is_set():
        n += 1
    return n / (time.perf_counter() - start)


def child(mode: str) -> dict:
    began = time.perf_counter()
    import torch

    import hf_specdec.kernels  # noqa: F401  (what enable() has imported)

    torch.cuda.init()
    torch.empty(1, device="cuda")
    out = {"imports_and_context_s": time.perf_counter() - began}
    if mode in ("rms_norm", "silu_mul", "rotary_write_kv"):  # one kernel, for the processes mode
        out["compile_s"] = _warm(mode)
        return out
    if mode == "serial":
        out["per_kernel_s"] = {name: _warm(name) for name in KERNELS}
        out["wall_s"] = sum(out["per_kernel_s"].values())
        return out
    stop = threading.Event()
    idle = threading.Thread(target=lambda: out.setdefault("idle_rate", _loop_rate(stop)))
    if mode == "busy":  # the loop's rate alone, for a second
        idle.start()
        time.sleep(1.0)
        stop.set()
        idle.join()
        stop.clear()
    times: dict = {}
    threads = [threading.Thread(target=lambda n=name: times.__setitem__(n, _warm(n))) for name in KERNELS]
    start = time.perf_counter()
    for t in threads:
        t.start()
    if mode == "busy":
        rate = {}
        loop = threading.Thread(target=lambda: rate.setdefault("r", _loop_rate(stop)))
        loop.start()
    for t in threads:
        t.join()
    out["wall_s"] = time.perf_counter() - start
    if mode == "busy":
        stop.set()
        loop.join()
        out["busy_rate_share"] = rate["r"] / out["idle_rate"]
    out["per_kernel_s"] = times
    return out


def run_child(mode: str, cache: str) -> subprocess.Popen:
    env = dict(os.environ, TRITON_CACHE_DIR=cache)
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", mode], env=env,
                            stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(
                                os.path.abspath(__file__))))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return {}
    import torch

    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": []}
    for _ in range(args.repeats):
        for mode in MODES:
            with tempfile.TemporaryDirectory() as cache:
                start = time.perf_counter()
                if mode == "processes":
                    procs = [run_child(name, cache) for name in KERNELS]
                    parts = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
                    row = {"mode": mode, "wall_s": time.perf_counter() - start,
                           "per_kernel": dict(zip(KERNELS, parts))}
                else:
                    p = run_child(mode, cache)
                    row = {"mode": mode, **json.loads(p.communicate()[0].strip().splitlines()[-1])}
            report["runs"].append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    return report


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
