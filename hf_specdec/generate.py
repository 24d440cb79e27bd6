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
from .runner import runner_for
from .setup import build_caches, cache_budget, check_request
from .strategies.draft_model import DraftModelProposer
from .strategies.target_scorer import TargetScorer
from .strategies.verifier import Verifier


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
    k, do_sample, gen = spec_config.num_speculative_tokens, request.do_sample, spec_config.generator
    path = choose_path(spec_config, input_ids.device, logits_processor, generation_config, spec_streamer,
                       request.eos_token_ids)
    metrics = SpecMetrics(num_speculative_tokens=k, fast_path=path.label)
    timer = StageTimer(metrics, input_ids.device, spec_config.sync_stage_timing)
    start = time.perf_counter()

    batch = SequenceBatch(input_ids, model_kwargs.get("attention_mask"), request.max_new_tokens, k)
    logits = LogitsPipeline(logits_processor)
    committer = Committer(request.eos_token_ids, stopping_criteria, spec_streamer,
                          generation_config.output_scores, generation_config.output_logits)
    if spec_streamer is not None:
        spec_streamer.put(input_ids.cpu())

    if path.bucketed:
        runner = runner_for(model, draft_model if k else None)
        spec = round_spec(k, do_sample, spec_config.acceptance, path.logits, gen, spec_config.posterior_threshold,
                          spec_config.posterior_alpha)
        blocks, hint = cache_budget(model, draft_model if k else None, batch, spec_config, runner.pool_bytes())
        admission = Admission(batch, spec_config.block_size, blocks, hint)  # a row too large fails here
        runner.begin(batch, spec, path.logits.signature, request.vocab_size, path.graphs, path.compile,
                     spec_config.block_size, blocks, hint)
        models = (model,) if k == 0 else (model, draft_model)
        with paged_attention_enabled(*models):
            run_fast(runner, batch, spec, logits, committer, request.eos_token_ids, metrics, timer, admission)
        metrics.warmup_seconds = runner.warmup_seconds
        return _finish(batch, request, generation_config, committer, metrics, start)

    target_cache, draft_cache = build_caches(model, draft_model, batch, spec_config)
    scorer = TargetScorer(model, target_cache, k)
    proposer = DraftModelProposer(draft_model, draft_cache, logits, k, request.vocab_size, do_sample, gen)
    verifier = Verifier(spec_config.acceptance, do_sample, k, gen, spec_config.posterior_threshold,
                        spec_config.posterior_alpha)
    admission = Admission(batch, spec_config.block_size, target_cache.num_blocks, target_cache.allocator.budget_hint)
    running = EagerRows(admission, batch, scorer, proposer, logits, committer, timer, request.vocab_size,
                        do_sample, gen)
    with paged_attention_enabled(model, draft_model):
        while rows := running.next():  # waiting rows start as finished rows free their blocks
            with timer("propose_seconds"):
                proposal = proposer.get_candidates(batch, rows)
            with timer("score_seconds"):
                raw = scorer.score(batch, rows)[:, : request.vocab_size]
                scores = logits(raw, batch.tokens, *batch.history_lens(rows, k + 1))
            with timer("verify_seconds"):
                emitted, num_accepted = verifier(proposal, scores)
            host = torch.cat([num_accepted[:, None], emitted], dim=1).tolist()  # the round's one sync
            accepted = [h[0] for h in host]
            runs = [h[1 : a + 2] for h, a in zip(host, accepted)]
            metrics.record_round(accepted, k)
            proposer.update_candidate_strategy(batch, rows, accepted)
            scorer.update_after_verify(batch, rows, accepted)
            running.release(committer.commit(batch, rows, runs, scores, raw, k + 1))
    add_padding_steps(model, batch, committer, logits, request.pad_token_id, request.vocab_size)  # output_scores
    return _finish(batch, request, generation_config, committer, metrics, start)


def _finish(batch: SequenceBatch, request, generation_config, committer: Committer, metrics: SpecMetrics,
            start: float):
    committer.end()
    metrics.num_emitted_tokens = sum(batch.gen_len)
    metrics.total_seconds = time.perf_counter() - start
    sequences = batch.sequences(request.pad_token_id)
    if not generation_config.return_dict_in_generate:
        return sequences
    B, V = batch.size, request.vocab_size
    return SpecDecodeOutput(
        sequences=sequences,
        scores=committer.per_step(committer.scores, B, V, batch.device) if generation_config.output_scores else None,
        logits=committer.per_step(committer.logits, B, V, batch.device) if generation_config.output_logits else None,
        spec_metrics=metrics,
    )
