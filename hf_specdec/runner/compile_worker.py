"""The cold compilation in a process of its own: ``python -m hf_specdec.runner.compile_worker SPEC.json``.

It builds a skeleton of the model (its class and config with one decoder layer of each kind, each tensor in
the real model's dtype, uninitialised memory on the same GPU: compiled code depends on shapes and dtypes, not
on weights), compiles it as the runner does (``background_compile.BackgroundCompile`` without a skeleton of its
own) and saves the artifacts under the real model's key (``compile_cache.py``). The process that asked then
compiles the real model from those caches: Dynamo's tracing of one layer, without Inductor's code generation
or autotuning, and none of that GPU work in the process that is decoding.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Optional

import torch
from transformers import PreTrainedModel

_TIMEOUT_S = 1200


def compile_in_subprocess(model: PreTrainedModel, key: str, vocab_size: int, block_size: int,
                          table_width: int = 16) -> Optional[str]:
    """Run the worker for ``model``; None when it succeeded, else what went wrong (the caller compiles it all)."""
    spec = {**model_spec(model), "key": key, "vocab": vocab_size, "block": block_size, "table_width": table_width}
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(spec, fh, default=str)
    try:
        done = subprocess.run([sys.executable, "-m", "hf_specdec.runner.compile_worker", fh.name], env=env,
                              capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        os.unlink(fh.name)
    if done.returncode:
        return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return None


def model_spec(model: PreTrainedModel) -> dict:
    """What ``skeleton`` rebuilds ``model`` from: its class, config, each tensor's dtype and its device."""
    return {"class": type(model).__name__, "module": type(model).__module__, "config": model.config.to_dict(),
            "dtypes": {name: str(t.dtype).removeprefix("torch.") for name, t in _tensors(model)},
            "device": str(next(model.parameters()).device)}


def _tensors(model):
    yield from model.named_parameters()
    yield from model.named_buffers()


def skeleton(spec: dict) -> PreTrainedModel:
    """The model's class and config, one decoder layer of each kind, uninitialised, dtypes as recorded."""
    module = __import__(spec["module"], fromlist=[spec["class"]])
    cls = getattr(module, spec["class"])
    config = cls.config_class.from_dict(spec["config"])
    kinds = getattr(config, "layer_types", None)
    if getattr(cls, "reads_target_hidden", False):
        pass  # a draft head keeps its few layers: one compiles whole, more by regions (compiled_regions), as here
    elif isinstance(kinds, list) and kinds:
        config.layer_types = list(dict.fromkeys(kinds))  # the first layer of each kind
        config.num_hidden_layers = len(config.layer_types)
    else:
        config.num_hidden_layers = 1
    with torch.device("meta"):
        model = cls(config)
    model = model.to_empty(device=spec["device"]).eval()
    model.tie_weights()  # to_empty gives tied tensors each their own memory
    dtypes = spec["dtypes"]
    for name, t in list(_tensors(model)):
        want = dtypes.get(name)
        if want is not None and str(t.dtype).removeprefix("torch.") != want:
            t.data = t.data.to(getattr(torch, want))
    prepare = getattr(model, "prepare_skeleton", None)  # a model that reads another's modules (a draft head):
    if prepare is not None:  # stand-ins in its own dtypes, now set
        prepare()
    return model


def main(argv: list[str]) -> int:
    from .background_compile import BackgroundCompile

    with open(argv[0]) as fh:
        spec = json.load(fh)
    job = BackgroundCompile(skeleton(spec), spec["vocab"], spec["block"], prewarm=False, key=spec["key"],
                            table_width=spec["table_width"])
    if not job.wait():
        print(f"compiling the skeleton failed: {job.error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
