"""The custom_generate callable: speculative decoding rounds inside ``model.generate()``.

transformers has already merged the generation config, built the logits processors and
stopping criteria, set max_length and expanded the batch for num_return_sequences; it
calls ``speculative_generate(model, input_ids, ...)`` with all of that. One round:

    propose  draft model, k steps          strategies/draft_model.py
    score    one ragged target forward     strategies/target_scorer.py
    verify   greedy / rejection / typical  strategies/verifier.py -> kernels/
    commit   EOS, limits, stop criteria    commit.py; both caches roll back to what was kept

That ragged loop is the eager path. Where CUDA graphs run (or SpecConfig(bucketed=True)),
the same rounds run on the fixed-shape runner instead (``fast_generate.py``, ``runner/``);
``path_choice.py`` decides, and ``spec_metrics.fast_path`` says which ran and why.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .admission import Admission
from .arguments import as_spec_config
from .batch_state import SequenceBatch
from .cache import paged_attention_enabled
from .commit import Committer
from .config import SpecConfig
from .eager_rows import EagerRows
from .fast_generate import round_spec, run_fast
from .logits import LogitsPipeline
from .metrics import SpecMetrics, StageTimer
from .padding_steps import add_padding_steps
from .path_choice import choose_path
from .runner import bucket_for, runner_for
from .sampling import choose_tokens
from .setup import build_caches, cache_budget, check_request
from .strategies.draft_model import DraftModelProposer
from .strategies.ngram import NgramProposer
from .strategies.speculation_length import GRAPH_HOLD_ROUNDS, SpeculationLength
from .strategies.target_scorer import TargetScorer
from .strategies.verifier import Verifier
from .tensor_parallel import check_ranks_agree, lockstep_generator, lockstep_group


@dataclass
class SpecDecodeOutput(GenerateDecoderOnlyOutput):
    """Hugging Face's output plus the acceptance and timing statistics of the call."""

    spec_metrics: Optional[SpecMetrics] = None


def speculative_generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor=None,
    stopping_criteria=None,
    generation_config: Optional[GenerationConfig] = None,
    spec_config: Optional[SpecConfig] = None,
    draft_model: Optional[PreTrainedModel] = None,
    spec_streamer=None,
    **model_kwargs,
):
    spec_config = as_spec_config(spec_config)  # a dict of SpecConfig's fields is accepted too
    generation_config = generation_config if generation_config is not None else model.generation_config
    request = check_request(model, draft_model, input_ids, generation_config, spec_config, model_kwargs, spec_streamer)
    k, do_sample = spec_config.num_speculative_tokens, request.do_sample
    group = lockstep_group(model, draft_model if k else None, spec_config.draft_tp)  # tensor-parallel ranks
    gen = lockstep_generator(model, group, spec_config.generator, do_sample, input_ids.device)
    path = choose_path(spec_config, input_ids.device, logits_processor, generation_config, spec_streamer,
                       request.eos_token_ids, (model, draft_model if k else None))
    metrics = SpecMetrics(num_speculative_tokens=k, fast_path=path.label)
    timer = StageTimer(metrics, input_ids.device, spec_config.sync_stage_timing)
    start = time.perf_counter()

    batch = SequenceBatch(input_ids, model_kwargs.get("attention_mask"), request.max_new_tokens, k)
    logits = LogitsPipeline(logits_processor)
    committer = Committer(request.eos_token_ids, stopping_criteria, spec_streamer,
                          generation_config.output_scores, generation_config.output_logits)
    if spec_streamer is not None:
        spec_streamer.put(input_ids.cpu())

    method, ngram_sizes = spec_config.method, (spec_config.prompt_lookup_min, spec_config.prompt_lookup_max)
    draft = draft_model if k and method == "draft" else None
    # Adaptive k follows this process's timings: tensor-parallel ranks would choose differently, so it is
    # off there (and by default with a generator: seeded runs repeat bit for bit only at a fixed k).
    if spec_config.adaptive and group is not None:
        raise ValueError("SpecConfig(adaptive=True) under tensor parallelism would let ranks pick different k "
                         "from their own timings; drop adaptive=True (the default is a fixed k there).")
    adaptive = spec_config.adaptive if spec_config.adaptive is not None else (gen is None and group is None)
    if path.bucketed:
        runner = runner_for(model, draft)
        spec = round_spec(k, do_sample, spec_config.acceptance, path.logits, gen, spec_config.posterior_threshold,
                          spec_config.posterior_alpha, method, ngram_sizes)
        blocks, hint = cache_budget(model, draft, batch, spec_config, runner.pool_bytes())
        admission = Admission(batch, spec_config.block_size, blocks, hint)  # a row too large fails here
        runner.begin(batch, spec, path.logits.signature, request.vocab_size, path.graphs, path.compile,
                     spec_config.block_size, blocks, hint,
                     fixed_prefill=group is None and (path.graphs or spec_config.bucketed is True),
                     compile_wait=spec_config.compile is True)
        if runner.compile_status():  # compiled code not ready yet (or failed): this call ran graphs of the models
            metrics.fast_path = f"graphs ({runner.compile_status()})"
        policy = SpeculationLength(k, adaptive, method, runner.policy_memory,
                                   hold_rounds=GRAPH_HOLD_ROUNDS if path.graphs else 1)
        with paged_attention_enabled(*((model,) if draft is None else (model, draft))):
            run_fast(runner, batch, spec, logits, committer, request.eos_token_ids, metrics, timer, admission,
                     policy)
        policy.end_call(metrics)
        metrics.warmup_seconds = runner.warmup_seconds
        add_padding_steps(model, batch, committer, logits, request.pad_token_id, request.vocab_size)  # output_scores
        return _finish(batch, request, generation_config, committer, metrics, start, group)

    target_cache, draft_cache = build_caches(model, draft, batch, spec_config)
    scorer = TargetScorer(model, target_cache, k)
    proposer = (NgramProposer(*ngram_sizes) if method == "ngram"
                else DraftModelProposer(draft_model, draft_cache, logits, k, request.vocab_size, do_sample, gen))
    verifier = Verifier(spec_config.acceptance, do_sample, k, gen, spec_config.posterior_threshold,
                        spec_config.posterior_alpha)
    admission = Admission(batch, spec_config.block_size, target_cache.num_blocks, target_cache.allocator.budget_hint)
    running = EagerRows(admission, batch, scorer, proposer, logits, committer, timer, request.vocab_size,
                        do_sample, gen)
    policy = SpeculationLength(k, adaptive, method)
    with paged_attention_enabled(*((model,) if draft is None else (model, draft))):
        while rows := running.next():  # waiting rows start as finished rows free their blocks
            remaining = [batch.max_new_tokens - batch.gen_len[b] for b in rows]
            k_round, started = policy.choose(bucket_for(len(rows)), rows, remaining), time.perf_counter()
            with timer("propose_seconds"):
                proposal = proposer.get_candidates(batch, rows, k_round) if k_round else None
            with timer("score_seconds"):
                raw = scorer.score(batch, rows, k_round)[:, : request.vocab_size]
                scores = logits(raw, batch.tokens, *batch.history_lens(rows, k_round + 1))
            with timer("verify_seconds"):
                if proposal is None:  # k = 0: a plain decoding step
                    emitted = choose_tokens(scores, do_sample, gen)[0][:, None]
                    num_accepted = torch.zeros(len(rows), dtype=torch.long, device=batch.device)
                else:
                    emitted, num_accepted = verifier(proposal, scores)
            counts = proposal.counts if proposal is not None and proposal.counts is not None else None
            parts = [num_accepted[:, None], emitted] + ([] if counts is None else [counts[:, None]])
            host = torch.cat(parts, dim=1).tolist()  # the round's one sync
            accepted = [h[0] for h in host]
            runs = [h[1 : a + 2] for h, a in zip(host, accepted)]
            drafted = [h[-1] for h in host] if counts is not None else [k_round] * len(rows)
            metrics.record_round(accepted, k_round, drafted)
            policy.observe(bucket_for(len(rows)), k_round, time.perf_counter() - started,
                           list(zip(rows, accepted, drafted)))
            if k_round:
                proposer.update_candidate_strategy(batch, rows, accepted)
            scorer.update_after_verify(batch, rows, accepted)
            running.release(committer.commit(batch, rows, runs, scores, raw, k_round + 1))
    policy.end_call(metrics)
    add_padding_steps(model, batch, committer, logits, request.pad_token_id, request.vocab_size)  # output_scores
    return _finish(batch, request, generation_config, committer, metrics, start, group)


def _finish(batch: SequenceBatch, request, generation_config, committer: Committer, metrics: SpecMetrics,
            start: float, group=None):
    committer.end()
    metrics.num_emitted_tokens = sum(batch.gen_len)
    metrics.total_seconds = time.perf_counter() - start
    sequences = batch.sequences(request.pad_token_id)
    check_ranks_agree(group, sequences)
    if not generation_config.return_dict_in_generate:
        return sequences
    B, V = batch.size, request.vocab_size
    return SpecDecodeOutput(
        sequences=sequences,
        scores=committer.per_step(committer.scores, B, V, batch.device) if generation_config.output_scores else None,
        logits=committer.per_step(committer.logits, B, V, batch.device) if generation_config.output_logits else None,
        spec_metrics=metrics,
    )
