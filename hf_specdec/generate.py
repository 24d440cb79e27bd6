"""The custom_generate callable: speculative decoding rounds inside ``model.generate()``.

transformers has already merged the generation config, built the logits processors and
stopping criteria, set max_length and expanded the batch for num_return_sequences; it
calls ``speculative_generate(model, input_ids, ...)`` with all of that. Here the request is
checked, the runner sized for it (``runner/``), and the call loop (``call/loop.py``) runs
its rounds: propose, score, verify and commit on the device, one host synchronisation each.
``call/path_choice.py`` says how they execute (CUDA graphs, compiled models) and
``spec_metrics.fast_path`` reports it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .cache import paged_attention_enabled
from .call.admission import Admission
from .call.arguments import as_spec_config, with_proposer
from .call.batch_state import SequenceBatch
from .call.committer import Committer
from .call.config import SpecConfig
from .call.loop import run_fast
from .call.metrics import SpecMetrics, StageTimer
from .call.padding_steps import add_padding_steps
from .call.path_choice import choose_path
from .call.request import cache_budget, check_host_stops, check_request
from .call.stream_feed import StreamFeed
from .call.tensor_parallel import check_ranks_agree, lockstep_generator, lockstep_group
from .call.timeline import span
from .round.fixed_round import RoundSpec
from .round.policy.speculation_length import GRAPH_HOLD_ROUNDS, SpeculationLength
from .runner import runner_for


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
    spec_config = with_proposer(as_spec_config(spec_config), draft_model)  # a dict of SpecConfig's fields too
    generation_config = generation_config if generation_config is not None else model.generation_config
    start = time.perf_counter()
    with span("setup"):
        call = _Call(model, draft_model, input_ids, logits_processor, stopping_criteria, generation_config,
                     spec_config, spec_streamer, model_kwargs)
    try:
        with paged_attention_enabled(*((model,) if call.draft is None else (model, call.draft))):
            run_fast(call.runner, call.batch, call.spec, call.committer, call.request.eos_token_ids, call.metrics,
                     call.timer, call.admission, call.policy, spec_config.capture_every_k,
                     lockstep=call.group is not None)
        with span("finish"):
            call.policy.end_call(call.metrics)
            call.metrics.warmup_seconds = call.runner.warmup_seconds
            add_padding_steps(model, call.batch, call.committer, call.spec.logits, call.request.pad_token_id,
                              call.request.vocab_size)  # output_scores / output_logits of rows that ended early
            return _finish(call.batch, call.request, generation_config, call.committer, call.metrics, start,
                           call.group)
    except BaseException:  # an exception or KeyboardInterrupt: a streamer's consumer is released, then it goes on
        call.committer.end_after_failure()
        raise


class _Call:
    """One call's objects: the checked request, its rows, the runner sized for it, the policy."""

    def __init__(self, model, draft_model, input_ids, logits_processor, stopping_criteria, generation_config,
                 spec_config: SpecConfig, streamer, model_kwargs: dict):
        self.request = request = check_request(model, draft_model, input_ids, generation_config, spec_config,
                                               model_kwargs)
        k, do_sample = spec_config.num_speculative_tokens, request.do_sample
        self.group = group = lockstep_group(model, draft_model if k else None, spec_config.draft_tp)  # TP ranks
        gen = lockstep_generator(model, group, spec_config.generator, do_sample, input_ids.device)
        self.draft = draft = draft_model if k and spec_config.method in ("draft", "head") else None
        path = choose_path(spec_config, input_ids.device, logits_processor, input_ids.shape[0], (model, draft))
        self.metrics = SpecMetrics(num_speculative_tokens=k, fast_path=path.label)
        self.timer = StageTimer(self.metrics, input_ids.device, spec_config.sync_stage_timing)
        self.batch = batch = SequenceBatch(input_ids, model_kwargs.get("attention_mask"), request.max_new_tokens, k)
        stream = None if streamer is None else StreamFeed(streamer, batch.size, request.pad_token_id)
        returns = generation_config.return_dict_in_generate  # scores and logits are kept only where returned
        self.committer = Committer(request.eos_token_ids, stopping_criteria, stream,
                                   returns and generation_config.output_scores, returns and generation_config.output_logits)
        check_host_stops(self.committer.criteria, request.eos_token_ids, batch.size)
        # Adaptive k follows this process's timings: tensor-parallel ranks would choose differently, so it is
        # off there (and by default with a generator: seeded runs repeat bit for bit only at a fixed k).
        if spec_config.adaptive and group is not None:
            raise ValueError("SpecConfig(adaptive=True) under tensor parallelism would let ranks pick different k "
                             "from their own timings; drop adaptive=True (the default is a fixed k there).")
        adaptive = spec_config.adaptive if spec_config.adaptive is not None else (gen is None and group is None)
        self.runner = runner = runner_for(model, draft)
        self.spec = RoundSpec(k, do_sample, spec_config.acceptance if do_sample else "greedy", path.logits, gen,
                              spec_config.posterior_threshold, spec_config.posterior_alpha, spec_config.method,
                              (spec_config.prompt_lookup_min, spec_config.prompt_lookup_max))
        blocks, hint = cache_budget(model, draft, batch, spec_config, runner.pool_bytes())
        self.admission = Admission(batch, spec_config.block_size, blocks, hint)  # a row too large fails here
        runner.begin(batch, self.spec, path.logits.signature, request.vocab_size, path.graphs, path.compile,
                     spec_config.block_size, blocks, hint, fixed_prefill=group is None,
                     compile_wait=spec_config.compile is True, eos_ids=len(request.eos_token_ids))
        if runner.compile_status():  # compiled code not ready yet (or failed): this call runs graphs of the models
            self.metrics.fast_path = f"graphs ({runner.compile_status()})"
        self.policy = SpeculationLength(k, adaptive, spec_config.method, runner.policy_memory,
                                        hold_rounds=GRAPH_HOLD_ROUNDS if path.graphs else 1,
                                        execution=runner.execution)
        if streamer is not None:  # once nothing in the setup can refuse the call (a streamer is then ended too)
            streamer.put(input_ids.cpu())


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
        scores=committer.per_step("scores", B, V, batch.device) if generation_config.output_scores else None,
        logits=committer.per_step("logits", B, V, batch.device) if generation_config.output_logits else None,
        spec_metrics=metrics,
    )
