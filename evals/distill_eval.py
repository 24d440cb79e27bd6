"""What a distilled reduced-vocabulary draft is worth: acceptance on held-out text and cost per step.

- ``token_metrics``: per held-out position, the target's mass on the kept set (the ceiling of
  sampled acceptance for any reduced draft), whether the target's argmax is kept, greedy agreement
  (draft argmax == target argmax) and the expected sampled acceptance sum_v min(p_v, q_v).
- ``spec_acceptance``: the real thing: hf_specdec's generate() on held-out prompts, greedy or
  sampled (temperature 1, no top-k/top-p), k fixed (adaptive k would mix the per-position figures of
  several k), acceptance rate and mean acceptance length; greedy
  output also compared token for token with the target's own greedy generate().
- ``eager_step_ms``: one-token forward at a batch size with Hugging Face's own cache (any device);
  ``runner_stage_ms``: the runner's draft and target steps as CUDA graphs (what a round costs).
- ``read_bytes``: weight bytes a decode step reads (the input embedding is a lookup: not counted).
"""
from __future__ import annotations

import statistics
import time

import torch

import hf_specdec
from hf_specdec.call.request import cache_keyword


def _autocast(device, dtype):
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


@torch.no_grad()
def token_metrics(target, draft, windows: torch.Tensor, kept: torch.Tensor, batch_size: int, device,
                  autocast_dtype) -> dict:
    vocab = target.config.get_text_config().vocab_size
    in_kept = torch.zeros(vocab, dtype=torch.bool, device=device)
    in_kept[kept.to(device)] = True
    sums = {"target_mass_on_kept": 0.0, "target_argmax_kept": 0.0, "greedy_agreement": 0.0,
            "expected_sampled_acceptance": 0.0}
    for start in range(0, windows.shape[0], batch_size):
        ids = windows[start:start + batch_size].to(device)
        with _autocast(device, autocast_dtype):
            p = torch.softmax(target(input_ids=ids).logits.float(), -1)
            q = torch.softmax(draft(input_ids=ids).logits.float(), -1)
        top = p.argmax(-1)
        sums["target_mass_on_kept"] += float((p * in_kept).sum())
        sums["target_argmax_kept"] += float(in_kept[top].sum())
        sums["greedy_agreement"] += float((q.argmax(-1) == top).sum())
        sums["expected_sampled_acceptance"] += float(torch.minimum(p, q).sum())
        del p, q
    n = windows.numel()
    return {name: value / n for name, value in sums.items()} | {"positions": n}


@torch.no_grad()
def spec_acceptance(target, draft, tok, prompts: list[str], mode: str, k: int, batch_size: int, max_new: int,
                    spec_kwargs: dict, check_identical: bool = True) -> dict:
    """Acceptance of ``draft`` over ``prompts`` (batches of ``batch_size``), summed over calls."""
    device = target.get_input_embeddings().weight.device
    tot = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "emitted": 0, "rounds": 0, "seconds": 0.0,
           "warmup_seconds": 0.0, "identical_rows": 0, "rows": 0}
    per_position = [0] * k
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if mode == "sample" else dict(do_sample=False)
    path = None
    for start in range(0, len(prompts), batch_size):
        enc = tok(prompts[start:start + batch_size], return_tensors="pt", padding=True).to(device)
        t = time.perf_counter()
        out = target.generate(**enc, assistant_model=draft, max_new_tokens=max_new, return_dict_in_generate=True,
                              spec_config=hf_specdec.SpecConfig(num_speculative_tokens=k, adaptive=False, **spec_kwargs),
                              **kw)
        tot["seconds"] += time.perf_counter() - t
        m = out.spec_metrics
        path = m.fast_path
        tot["drafts"] += m.num_drafts
        tot["draft_tokens"] += m.num_draft_tokens
        tot["accepted"] += m.num_accepted_tokens
        tot["emitted"] += m.num_emitted_tokens
        tot["rounds"] += m.num_rounds
        tot["warmup_seconds"] += m.warmup_seconds
        per_position = [a + b for a, b in zip(per_position, m.accepted_per_position or [0] * k)]
        tot["rows"] += enc.input_ids.shape[0]
        if mode == "greedy" and check_identical:
            plain = target.generate(**enc, do_sample=False, max_new_tokens=max_new)
            same = (out.sequences.shape == plain.shape) and (out.sequences == plain).all(-1)
            tot["identical_rows"] += int(same.sum()) if isinstance(same, torch.Tensor) else 0
    result = dict(tot, mode=mode, k=k, fast_path=path,
                  acceptance_rate=tot["accepted"] / max(1, tot["draft_tokens"]),
                  mean_acceptance_length=1 + tot["accepted"] / max(1, tot["drafts"]),
                  acceptance_per_position=[a / max(1, tot["drafts"]) for a in per_position])
    if mode != "greedy" or not check_identical:
        result.pop("identical_rows")
    return result


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def eager_step_ms(model, batch: int, context: int, repeats: int = 20) -> float:
    """Median ms of a one-token forward per row after a ``context``-token prefill (Hugging Face's cache)."""
    device = model.get_input_embeddings().weight.device
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (batch, context), generator=gen).to(device)
    key = cache_keyword(model)  # `cache` (`past_key_values` warns from transformers 5.24) or the older name
    past, step = getattr(model(input_ids=ids, use_cache=True), key), ids[:, -1:]
    times = []
    for i in range(repeats + 3):
        _sync(device)
        t = time.perf_counter()
        out = model(input_ids=step, use_cache=True, **{key: past})
        _sync(device)
        if i >= 3:
            times.append((time.perf_counter() - t) * 1000)
        past = getattr(out, key)
    return statistics.median(times)


def runner_stage_ms(target, draft, tok, prompts: list[str], batch: int, k: int, spec_kwargs: dict) -> dict:
    """The runner's stage costs (``hf_specdec.runner.stage_timing``) at ``batch`` rows, after one greedy call."""
    from hf_specdec.runner import bucket_for, runner_for
    from hf_specdec.runner.stage_timing import time_stages

    device = target.get_input_embeddings().weight.device
    rows = (prompts * batch)[:batch]
    enc = tok(rows, return_tensors="pt", padding=True).to(device)
    target.generate(**enc, assistant_model=draft, do_sample=False, max_new_tokens=16,
                    spec_config=hf_specdec.SpecConfig(num_speculative_tokens=k, **spec_kwargs))
    return time_stages(runner_for(target, draft), bucket_for(batch))


def read_bytes(model) -> int:
    """Bytes of the weights one decode step reads: every parameter but the input embedding, plus the output
    layer even when it is tied to the embedding (then it is read in full as the output layer)."""
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings().weight
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen or p is emb:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    if out is emb:
        total += out.numel() * out.element_size()
    return total
