"""Hugging Face's logits processors as fixed-shape tensor code that a CUDA graph can capture.

A captured round replays the same kernels on the same buffers, so processing may not read a value
on the host (``.item()``, ``.tolist()``), branch on one, or make a shape depend on one. Row ``i``
of a round must still come out exactly as plain ``generate()`` would process it: the processor
list called with ``input_ids = history[rows[i], :lengths[i]]`` and ``scores[i]``.

``graph_safe_logits`` turns a processor list into a ``GraphLogits`` or says, naming the class,
why it cannot. Warpers that never read ``input_ids`` and are already pure tensor code run as
Hugging Face's own objects; Eta is rebuilt here (its ``Categorical`` validates on the host);
processors that read ``input_ids`` are rebuilt on the fixed-width history in
``graph_logits_history.py``. Only exact classes are accepted: a subclass may change ``__call__``.
"""
from __future__ import annotations

import math

import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from .graph_logits_history import (
    BanTokens,
    ForceTokens,
    NoRepeatNGram,
    RepetitionPenalty,
    RoundHistory,
    SequenceBias,
)


class GraphLogits:
    """A processor list as fixed-shape ops, applied in list order.

    ``signature`` (class names and every parameter value) is equal exactly when two pipelines behave the
    same, so a captured graph can be reused across generate() calls; shapes, dtype and device are not in
    it. Call ``prepare`` (or the pipeline once) before capture: it builds the device constants.

    ``needs_batch_rows``: some processor keeps state per row of plain generate's batch (transformers
    >= 5.23 gives repetition penalty each row's padding length); a caller whose buffer rows are not the
    batch rows (padded or compacted buckets) must then pass ``batch_rows``.
    """

    def __init__(self, ops: list, signature: tuple):
        self.ops, self.signature = ops, signature
        self.needs_batch_rows = any(getattr(op, "per_batch_row", False) for op in ops)
        self.reads_live = False  # every row alike: a mask of live rows would only add a kernel to each graph
        self.reads_history = bool(ops)  # no processors: a verify need not build rows and positions for them
        self._prepared: tuple | None = None

    def prepare(self, vocab_size: int, device) -> None:
        """Build the ops' device constants (host-to-device copies, so never inside a capture)."""
        self._ensure_prepared(vocab_size, torch.empty(0, device=device).device)  # "cuda" reads as "cuda:0"

    def _ensure_prepared(self, vocab_size: int, device: torch.device) -> None:
        if self._prepared != (vocab_size, device):
            for op in self.ops:
                op.prepare(vocab_size, device)
            self._prepared = (vocab_size, device)

    def __call__(self, scores: torch.Tensor, history: torch.Tensor, rows: torch.Tensor,
                 lengths: torch.Tensor, batch_rows: torch.Tensor | None = None, live=None) -> torch.Tensor:
        """``scores`` (R, V); ``history`` (B, W); row ``i`` reads ``history[rows[i], :lengths[i]]``.
        ``batch_rows`` (R,): row ``i``'s row in plain generate's batch; defaults to ``rows``. ``live`` is ignored
        (fixed-shape code processes every row alike)."""
        self._ensure_prepared(scores.shape[-1], scores.device)
        hist = RoundHistory(history, rows, lengths, batch_rows)
        for op in self.ops:
            scores = op(scores, hist)
        return scores


class _Refused(Exception):
    """A supported class with a setting that has no exact fixed-shape form."""


def graph_safe_logits(processors: LogitsProcessorList | None) -> tuple[GraphLogits | None, str | None]:
    """``(pipeline, None)`` when every processor is supported, else ``(None, reason)`` naming the class."""
    ops, signature = [], []
    for processor in processors or ():
        name = type(processor).__name__
        build = _BUILDERS.get(type(processor))
        if build is None:
            return None, f"{name} has no graph-safe rebuild (only Hugging Face's own processors of the supported classes)"
        try:
            params, op = build(processor)
        except _Refused as refused:
            return None, f"{name} {refused}"
        except AttributeError as missing:
            return None, f"{name} lacks attribute {missing.name!r} in this transformers version"
        signature.append((name, _freeze(params)))
        if op is not None:
            ops.append(op)
    return GraphLogits(ops, tuple(signature)), None


def _freeze(value):
    """Hashable, comparable form of a parameter (tensors by dtype, shape and values; NaN equal to itself)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), _freeze(value.flatten().tolist()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple((_freeze(k), _freeze(v)) for k, v in value.items())
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    return value


def _ids(value) -> list[int]:
    """Token ids given as an int, a list or a tensor (any device), as a list."""
    if isinstance(value, torch.Tensor):
        return [int(t) for t in value.flatten().tolist()]
    if isinstance(value, int):
        return [value]
    return [int(t) for t in value]


class _HuggingFaceWarper:
    """Hugging Face's own object: its ``__call__`` is already fixed-shape tensor code with no host reads."""

    def __init__(self, processor):
        self.processor = processor

    def prepare(self, vocab_size: int, device) -> None:
        pass

    def __call__(self, scores: torch.Tensor, hist: RoundHistory) -> torch.Tensor:
        return self.processor(hist.history, scores)  # these warpers never read input_ids


class _EtaCutoff:
    """EtaLogitsWarper with Hugging Face's arithmetic; its ``Categorical(logits=...)`` validates the logits
    with a host-side ``valid.all()``, so the entropy is written out as ``Categorical.entropy`` computes it."""

    def __init__(self, epsilon: float, dtype: torch.dtype, filter_value: float, min_tokens_to_keep: int):
        self.epsilon, self.dtype = epsilon, dtype
        self.filter_value, self.min_tokens_to_keep = filter_value, min_tokens_to_keep
        self._epsilon: torch.Tensor | None = None

    def prepare(self, vocab_size: int, device) -> None:
        self._epsilon = torch.tensor(self.epsilon, dtype=self.dtype, device=device)

    def __call__(self, scores: torch.Tensor, hist: RoundHistory) -> torch.Tensor:
        probabilities = scores.softmax(dim=-1)
        log_probs = scores - scores.logsumexp(dim=-1, keepdim=True)
        p_log_p = log_probs.clamp(min=torch.finfo(log_probs.dtype).min) * log_probs.softmax(dim=-1)
        entropy = -p_log_p.sum(-1)
        eta = torch.min(self._epsilon, torch.sqrt(self._epsilon) * torch.exp(-entropy))[..., None]
        indices_to_remove = probabilities < eta
        top_k = min(self.min_tokens_to_keep, scores.size(-1))
        indices_to_remove = indices_to_remove & (scores < torch.topk(scores, top_k)[0][..., -1, None])
        return scores.masked_fill(indices_to_remove, self.filter_value)


def _warper(*attributes: str):
    """Builder for a Hugging Face warper run as is; its signature is the named attributes."""
    return lambda p: (tuple(getattr(p, a) for a in attributes), _HuggingFaceWarper(p))


def _eta(p):
    epsilon = float(p.epsilon)
    dtype = p.epsilon.dtype if isinstance(p.epsilon, torch.Tensor) else torch.get_default_dtype()
    params = (epsilon, str(dtype), p.filter_value, p.min_tokens_to_keep)
    return params, _EtaCutoff(epsilon, dtype, p.filter_value, p.min_tokens_to_keep)


def _repetition(p):
    ignore = p.prompt_ignore_length
    if ignore is None:
        ignore = 0
    elif isinstance(ignore, torch.Tensor) and ignore.dim() == 1:
        ignore = tuple(int(t) for t in ignore.tolist())
    elif isinstance(ignore, int):
        ignore = int(ignore)
    else:
        raise _Refused(f"with prompt_ignore_length of type {type(ignore).__name__}")
    return (p.penalty, ignore), RepetitionPenalty(p.penalty, ignore)


def _min_length(p):
    eos = _ids(p.eos_token_id)
    return (p.min_length, eos), BanTokens(eos, below=p.min_length)


def _min_new_tokens(p):
    eos = _ids(p.eos_token_id)
    params = (p.prompt_length_to_skip, p.min_new_tokens, eos)
    return params, BanTokens(eos, below=p.prompt_length_to_skip + p.min_new_tokens)


def _suppress(p):
    tokens = _ids(p.suppress_tokens)
    return (tokens,), BanTokens(tokens)


def _suppress_at_begin(p):
    tokens, begin = _ids(p.begin_suppress_tokens), p.begin_index
    # Without a begin index Hugging Face's length test never holds: the processor does nothing.
    return (tokens, begin), (BanTokens(tokens, equal=begin) if begin is not None else None)


def _no_repeat_ngram(p):
    return (p.ngram_size,), NoRepeatNGram(p.ngram_size)


def _sequence_bias(p):
    entries = [(tuple(int(t) for t in ids), float(bias)) for ids, bias in p.sequence_bias.items()]
    # transformers 5.17 skips entries longer than the row; later versions (which precompute
    # `multi_token_biases`) only prefixes longer than the row.
    min_extra = 0 if hasattr(p, "multi_token_biases") else 1
    return (entries, min_extra), SequenceBias(entries, min_extra)


def _forced_bos(p):
    if p.bos_token_id is None:
        raise _Refused("without bos_token_id")
    return (p.bos_token_id,), ForceTokens([p.bos_token_id], at=1)


def _forced_eos(p):
    if p.max_length is None:
        raise _Refused("without max_length")
    eos = _ids(p.eos_token_id)
    return (p.max_length, eos), ForceTokens(eos, at=p.max_length - 1)


_FILTER = ("filter_value", "min_tokens_to_keep")
_BUILDERS = {
    TemperatureLogitsWarper: _warper("temperature"),
    TopKLogitsWarper: _warper("top_k", *_FILTER),
    TopPLogitsWarper: _warper("top_p", *_FILTER),
    MinPLogitsWarper: _warper("min_p", *_FILTER),
    TypicalLogitsWarper: _warper("mass", *_FILTER),
    EpsilonLogitsWarper: _warper("epsilon", *_FILTER),
    LogitNormalization: _warper(),
    InfNanRemoveLogitsProcessor: _warper(),
    EtaLogitsWarper: _eta,
    RepetitionPenaltyLogitsProcessor: _repetition,
    MinLengthLogitsProcessor: _min_length,
    MinNewTokensLengthLogitsProcessor: _min_new_tokens,
    SuppressTokensLogitsProcessor: _suppress,
    SuppressTokensAtBeginLogitsProcessor: _suppress_at_begin,
    NoRepeatNGramLogitsProcessor: _no_repeat_ngram,
    SequenceBiasLogitsProcessor: _sequence_bias,
    NoBadWordsLogitsProcessor: _sequence_bias,
    ForcedBOSTokenLogitsProcessor: _forced_bos,
    ForcedEOSTokenLogitsProcessor: _forced_eos,
}
