"""SpecConfig: what a user sets to turn ``generate()`` into speculative decoding."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

ACCEPTANCE_METHODS = ("rejection", "typical", "greedy")
PROPOSAL_METHODS = ("draft", "head", "ngram")


@dataclass
class SpecConfig:
    """Settings of speculative decoding.

    num_speculative_tokens: draft tokens proposed per round; with ``adaptive`` the most a round
        proposes (k = 0 is plain decoding through the same fixed-shape runner, no draft model
        needed: the project's own baseline).
    method: "draft" (a draft model, ``assistant_model=``), "head" (a draft head on the target's hidden
        states, ``assistant_model=hf_specdec.load_draft_head(...)``; chosen by itself when the assistant
        is one) or "ngram" (prompt lookup: the tokens that followed the latest earlier occurrence of the
        row's last n tokens; no draft model).
    prompt_lookup_min, prompt_lookup_max: the n-gram sizes tried, longest first.
    adaptive: choose each round's k in [0, num_speculative_tokens] from the acceptance measured
        per row and the round costs measured on this machine. False keeps k fixed. None: on,
        except with a ``generator`` (the k schedule follows measured timings, so seeded sampled
        runs repeat bit for bit only at a fixed k; the output distribution is exact either way).
    acceptance: "rejection" (exact; the default), "typical" (vLLM's typical acceptance:
        faster, not exact) or "greedy". Without ``do_sample`` verification is greedy
        whatever this says, so greedy output equals the target's own greedy output.
    posterior_threshold, posterior_alpha: typical acceptance's parameters.
    block_size: tokens per KV cache block.
    cache_tokens: token budget of each model's paged cache (the target and the draft get
        the same number of blocks). None sizes the cache for exactly this call's need.
    cache_memory_fraction: alternatively, the fraction of free accelerator memory the two
        caches may take (split evenly). Ignored on CPU.
    generator: a torch.Generator for every random draw (drafting and acceptance), for
        reproducible sampling without touching the global seed. CUDA graphs are captured per
        generator object: reseed one generator (``manual_seed``) rather than making a new one
        per call, which captures anew each time.
    sync_stage_timing: synchronise the device around each row prefill so that
        ``spec_metrics.prefill_seconds`` is exact (costs a little speed on GPU).
    cuda_graphs: capture the runner's draft loop and verify in CUDA graphs. None: on where
        CUDA is available (and the request allows: ``spec_metrics.fast_path`` says why not); False
        runs the same rounds without graphs; True on CPU raises.
    compile: torch.compile the models (one compiled decoder layer serves all layers; the compiled code is
        kept on disk under $HF_SPECDEC_CACHE, default $HF_HOME/hf_specdec; HF_SPECDEC_DISABLE_CACHE=1
        keeps it in memory only). None: on where CUDA graphs run, compiled in the background: calls
        run on graphs of the models as they are until the compiled code is ready (40-60 s in for
        8B/1B shapes on an H200, from an empty cache), then switch (``spec_metrics.fast_path`` says
        which ran). True: the first call waits for it
        (``hf_specdec.warmup`` also does). True without CUDA graphs raises.
    draft_tp: with a tensor-parallel target (``tp_plan="auto"``), the number of ranks the draft is
        split over: 1 = a replicated draft (an ordinary model on each rank's GPU), N = loaded with
        ``tp_plan`` over the target's N ranks. A draft loaded otherwise raises, naming the fix.
        None takes the draft as loaded. See docs/parallel.md.
    capture_every_k: with ``adaptive`` on CUDA graphs, capture the graphs of every k in
        [0, num_speculative_tokens] when a call first uses a batch bucket, instead of k = 0 and the
        largest then each other k when the policy first picks it. A first call pays more warm-up; later
        calls capture nothing whatever k they pick (``hf_specdec.warmup`` sets it).
    """

    num_speculative_tokens: int = 4
    method: str = "draft"
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3
    adaptive: Optional[bool] = None
    acceptance: str = "rejection"
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    block_size: int = 16
    cache_tokens: Optional[int] = None
    cache_memory_fraction: Optional[float] = None
    generator: Optional[torch.Generator] = None
    sync_stage_timing: bool = False
    cuda_graphs: Optional[bool] = None
    compile: Optional[bool] = None
    draft_tp: Optional[int] = None
    capture_every_k: bool = False

    def __post_init__(self):
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 64:
            raise ValueError(f"SpecConfig.num_speculative_tokens must be an int in [0, 64]; got {k!r}.")
        if self.method not in PROPOSAL_METHODS:
            raise ValueError(f"SpecConfig.method must be one of {PROPOSAL_METHODS}; got {self.method!r}.")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (lo, hi)) or not 1 <= lo <= hi <= 32:
            raise ValueError(f"SpecConfig.prompt_lookup_min/max must be ints with 1 <= min <= max <= 32; "
                             f"got {lo!r}, {hi!r}.")
        if not isinstance(self.capture_every_k, bool):
            raise ValueError(f"SpecConfig.capture_every_k must be True or False; got {self.capture_every_k!r}.")
        for name in ("cuda_graphs", "compile", "adaptive"):
            if getattr(self, name) not in (None, True, False):
                raise ValueError(f"SpecConfig.{name} must be None, True or False; got {getattr(self, name)!r}.")
        if self.compile and self.cuda_graphs is False:
            raise ValueError("SpecConfig.compile=True needs CUDA graphs; drop cuda_graphs=False or compile=True.")
        if self.acceptance not in ACCEPTANCE_METHODS:
            raise ValueError(f"SpecConfig.acceptance must be one of {ACCEPTANCE_METHODS}; got {self.acceptance!r}.")
        if not 0.0 <= self.posterior_threshold <= 1.0:
            raise ValueError(f"SpecConfig.posterior_threshold must be in [0, 1]; got {self.posterior_threshold!r}.")
        if not 0.0 <= self.posterior_alpha <= 1.0:
            raise ValueError(f"SpecConfig.posterior_alpha must be in [0, 1]; got {self.posterior_alpha!r}.")
        if not isinstance(self.block_size, int) or not 1 <= self.block_size <= 1024:
            raise ValueError(f"SpecConfig.block_size must be an int in [1, 1024]; got {self.block_size!r}.")
        if self.cache_tokens is not None and (not isinstance(self.cache_tokens, int) or self.cache_tokens < 1):
            raise ValueError(f"SpecConfig.cache_tokens must be a positive int or None; got {self.cache_tokens!r}.")
        frac = self.cache_memory_fraction
        if frac is not None and not 0.0 < frac <= 0.95:
            raise ValueError(f"SpecConfig.cache_memory_fraction must be in (0, 0.95] or None; got {frac!r}.")
        if self.cache_tokens is not None and frac is not None:
            raise ValueError("Set at most one of SpecConfig.cache_tokens and SpecConfig.cache_memory_fraction.")
        if self.generator is not None and not isinstance(self.generator, torch.Generator):
            raise ValueError(f"SpecConfig.generator must be a torch.Generator or None; got {type(self.generator)}.")
        tp = self.draft_tp
        if tp is not None and (not isinstance(tp, int) or isinstance(tp, bool) or tp < 1):
            raise ValueError(f"SpecConfig.draft_tp must be None or an int >= 1 (ranks the draft is split over); "
                             f"got {tp!r}.")
