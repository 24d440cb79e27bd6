"""``hf_specdec.warmup``: prepare the fast path at load time instead of inside a user's first calls.

A call on CUDA graphs compiles its models (``SpecConfig(compile=None)``: in the background, the first calls
running on graphs of the models as they are meanwhile) and captures the graphs of the batch buckets and
prompt shapes it meets, the first time it meets them. ``warmup`` does that work now, with a line per step: it
waits for the compiled code, then calls ``generate`` once at ``batch_size`` rows (which sizes the caches and
buffers for prompts of ``prompt_length`` plus ``max_new_tokens``: later calls no larger reuse every graph)
and once for each smaller batch bucket (a call's rows leave as they finish, which moves it to smaller
buckets), capturing every k of each bucket (``SpecConfig.capture_every_k``). Pass the ``generate`` arguments
the real calls use (``do_sample``, processors, ...): graphs are kept per configuration.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Optional

import torch
from transformers import PreTrainedModel

from .call.arguments import as_spec_config, with_proposer
from .runner import bucket_for, runner_for

_SMALL_CALL_TOKENS = 8  # new tokens of the calls that only visit a smaller bucket


def warmup(model: PreTrainedModel, assistant_model: Optional[PreTrainedModel] = None, spec_config=None, *,
           batch_size: int = 1, prompt_length: int = 256, max_new_tokens: int = 256, verbose: bool = True,
           **generate_kwargs) -> dict:
    """Compile and capture what calls of up to ``batch_size`` rows, ``prompt_length`` prompt tokens and
    ``max_new_tokens`` new tokens will use. ``model`` must have been passed to ``hf_specdec.enable``. Returns
    seconds per step (``compile``, then ``batch <b>``) and ``total``."""
    for name, value in (("batch_size", batch_size), ("prompt_length", prompt_length),
                        ("max_new_tokens", max_new_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"hf_specdec.warmup: {name} must be a positive int; got {value!r}.")
    if not getattr(model.generate, "_hf_specdec_enabled", False):
        raise ValueError("hf_specdec.warmup needs a model passed to hf_specdec.enable(model) first.")
    # every k of each bucket now (the adaptive policy may pick any later): later calls capture nothing
    spec = dataclasses.replace(with_proposer(as_spec_config(spec_config), assistant_model), capture_every_k=True)
    uses_draft = spec.num_speculative_tokens > 0 and spec.method in ("draft", "head")
    vocab = model.config.get_text_config().vocab_size
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    steps, began = {}, time.perf_counter()

    def call(rows: int, new_tokens: int, config) -> float:
        ids = torch.randint(min(3, vocab - 1), vocab, (rows, prompt_length), generator=gen).to(device)
        start = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), assistant_model=assistant_model,
                       spec_config=config, max_new_tokens=new_tokens, **generate_kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    # 1 row, 1 token: starts the compilation where the call compiles (CUDA graphs), then waits for it
    start = time.perf_counter()
    call(1, 1, spec)
    compiled = runner_for(model, assistant_model if uses_draft else None).wait_compiled()
    steps["compile"] = time.perf_counter() - start
    _say(verbose, f"compiled code ready in {steps['compile']:.1f} s" if compiled else
         f"first call in {steps['compile']:.1f} s (nothing to compile: {'no CUDA graphs' if compiled is None else 'compile failed'})")
    buckets = sorted({bucket_for(n) for n in range(1, batch_size + 1)}, reverse=True)
    for b in buckets:
        rows = batch_size if b == buckets[0] else b
        steps[f"batch {rows}"] = call(rows, max_new_tokens if b == buckets[0] else _SMALL_CALL_TOKENS, spec)
        _say(verbose, f"batch {rows}: graphs captured in {steps[f'batch {rows}']:.1f} s")
    steps["total"] = time.perf_counter() - began
    _say(verbose, f"ready for batches up to {batch_size}, prompts of {prompt_length} + {max_new_tokens} new tokens, "
                  f"in {steps['total']:.1f} s")
    return steps


def _say(verbose: bool, text: str) -> None:
    if verbose:
        print(f"hf_specdec.warmup: {text}", file=sys.stderr, flush=True)
