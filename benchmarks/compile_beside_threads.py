"""GPU check: the user's own work runs while hf_specdec compiles in the background.

A speculative call with the default ``SpecConfig()`` returns on CUDA graphs and leaves a thread compiling the
target and the draft (``runner/background_compile.py``). Meanwhile this script's main thread runs, over and
over, another model's forward (a Llama never passed to ``enable``) and a function of its own compiled with
``torch.compile``, until a call with ``SpecConfig(compile=True)`` (in a third thread) sees the compilation
finished. Before ``runner/thread_scoped_tracing.py`` such forwards failed with torch.fx's ``NameError: module is
not installed as a submodule`` and the compiled function with "Detected that you are using FX to symbolically
trace a dynamo-optimized function" whenever they fell inside one of the compilation's traces. It prints, as
JSON, how many of each ran, how many of them ran while torch.fx traced (its process-wide flag sampled before each),
and every error; exit status 1 on an error or a changed output.

    python benchmarks/compile_beside_threads.py [--out $OUT/beside.json]
"""
import argparse
import collections
import copy
import json
import os
import sys
import tempfile
import threading
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, not installed
import hf_specdec  # noqa: E402


def _llama(seed: int, layers: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024)
    return LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()


def _fx_tracing() -> bool:
    import torch.fx._symbolic_trace as symbolic_trace

    return bool(getattr(symbolic_trace, "_is_fx_tracing_flag", False))


@torch.no_grad()
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--max-wait-s", type=float, default=400.0)
    args = ap.parse_args()
    if "HF_SPECDEC_CACHE" not in os.environ:  # an empty compile cache: the compilation does its whole work here
        os.environ["HF_SPECDEC_CACHE"] = tempfile.mkdtemp(prefix="hf_specdec_cache_")
    target = hf_specdec.enable(_llama(0, 4))
    draft = copy.deepcopy(target)
    other = _llama(1, 2)  # the user's other model, never enabled
    ids = torch.randint(3, 4096, (2, 37), device="cuda")
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16)
    other_ids = torch.randint(3, 4096, (1, 19), device="cuda")
    want_other = other(other_ids).logits
    sine = torch.compile(lambda t: (t.float().sin() + 1).to(t.dtype))
    x = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    want_sine = sine(x)

    start = time.perf_counter()
    first = target.generate(**kw, assistant_model=draft, spec_config=hf_specdec.SpecConfig(), return_dict_in_generate=True)
    compiled, waited = threading.Event(), {}

    def wait_for_compiled():
        try:
            out = target.generate(**kw, assistant_model=draft, spec_config=hf_specdec.SpecConfig(compile=True),
                                  return_dict_in_generate=True)
            waited.update(fast_path=out.spec_metrics.fast_path, same=torch.equal(out.sequences, first.sequences))
        except Exception as exc:  # reported below
            waited["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            waited["seconds"] = time.perf_counter() - start
            compiled.set()

    threading.Thread(target=wait_for_compiled, daemon=True).start()
    counts, during_trace, errors = collections.Counter(), collections.Counter(), collections.Counter()
    while not compiled.is_set() and time.perf_counter() - start < args.max_wait_s:
        for name, run, want in (("other_forward", lambda: other(other_ids).logits, want_other),
                                ("compiled_function", lambda: sine(x), want_sine)):
            tracing = _fx_tracing()
            try:
                if not torch.equal(run(), want):
                    errors[f"{name}: output changed"] += 1
            except Exception as exc:
                errors[f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"] += 1
            counts[name] += 1
            during_trace[name] += tracing
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "first_call_fast_path": first.spec_metrics.fast_path, "compiled_call": waited,
              "runs": dict(counts), "runs_while_fx_traced": dict(during_trace), "errors": dict(errors),
              "finished": compiled.is_set()}
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    ok = compiled.is_set() and not errors and "error" not in waited and waited.get("same")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
