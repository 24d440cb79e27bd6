"""Time to first token with long prompts and the memory of a b = 32 call with long rows (``scale.py
--long-prompts``): what a streaming user meets before decoding starts."""
from __future__ import annotations

import statistics
import time

import torch

import hf_specdec
from benchmarks.common import sync


def random_prompt(vocab: int, batch: int, length: int, device: torch.device) -> dict:
    gen = torch.Generator().manual_seed(1000 * batch + length)
    ids = torch.randint(3, vocab, (batch, length), generator=gen).to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}



class FirstTokenClock:
    """A streamer that notes when the first generated token arrives (its first ``put`` is the prompt)."""

    def __init__(self):
        self.puts, self.at = 0, None

    def put(self, value):
        self.puts += 1
        if self.puts == 2:
            self.at = time.perf_counter()

    def end(self):
        pass


def long_prompts(target, draft, args, device: torch.device, log=print) -> dict:
    """Time to first token at b = 1 for each --long-prompts length, as a streaming user meets it: from the call to
    its streamer's first generated token, in generate(max_new_tokens=4) with SpecConfig() and the draft against
    Hugging Face's own generate (dynamic cache, the model's attention implementation), median of --long-repeats
    after a warm call each; then the peak memory of a b = 32 call with --long-batch-prompt tokens a row (caches sized
    automatically), against the GPU's memory."""
    lengths = [int(n) for n in args.long_prompts.split(",") if n.strip()]
    longest = max(lengths + [args.long_batch_prompt]) + 64
    for m in (target, draft):  # rotary positions are computed, not tabled: the limit is a check only
        m.config.max_position_embeddings = max(m.config.max_position_embeddings, longest)
    cuda = device.type == "cuda"  # no background compile beside the timings (a prefill runs the model as it is)
    spec = hf_specdec.SpecConfig(cuda_graphs=cuda or None, compile=False if cuda else None)
    plain = hf_specdec.SpecConfig(num_speculative_tokens=0, cuda_graphs=cuda or None, compile=False if cuda else None)
    out = {"ttft_ms": {}, "attn_implementation": target.config._attn_implementation}
    for n in lengths:
        prompt = random_prompt(target.config.vocab_size, 1, n, device)
        common = dict(max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
        calls = {"ours": lambda clock: target.generate(**prompt, **common, streamer=clock, assistant_model=draft,
                                                       spec_config=spec),
                 "ours_target_only": lambda clock: target.generate(**prompt, **common, streamer=clock,
                                                                   spec_config=plain),
                 "hf": lambda clock: target.generate(**prompt, **common, streamer=clock)}
        row = {}
        for name, call in calls.items():
            call(FirstTokenClock())
            times = []
            for _ in range(args.long_repeats):
                clock = FirstTokenClock()
                sync(device)
                start = time.perf_counter()
                call(clock)
                sync(device)
                times.append((clock.at - start) * 1e3)
            row[name] = statistics.median(times)
        row["ours_over_hf"] = row["ours"] / row["hf"]
        row["target_only_over_hf"] = row["ours_target_only"] / row["hf"]
        out["ttft_ms"][str(n)] = row
        log(f"time to first token, {n} tokens: ours {row['ours']:.1f} ms (target only {row['ours_target_only']:.1f}), "
            f"HF {row['hf']:.1f} ms")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        prompt = random_prompt(target.config.vocab_size, 32, args.long_batch_prompt, device)
        target.generate(**prompt, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0,
                        assistant_model=draft, spec_config=spec)
        peak, total = torch.cuda.max_memory_allocated(device), torch.cuda.get_device_properties(device).total_memory
        out["b32_memory"] = {"prompt": args.long_batch_prompt, "peak_gb": peak / 1e9, "gpu_gb": total / 1e9,
                             "fits_80gb": peak < 80e9}
        log(f"b = 32 x {args.long_batch_prompt} tokens: peak {peak / 1e9:.1f} GB of {total / 1e9:.0f} GB")
    return out
