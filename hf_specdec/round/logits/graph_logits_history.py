"""Logits processors that read ``input_ids``, rebuilt on a fixed-width token buffer.

Plain generate calls them with row ``i``'s ``input_ids = history[rows[i], :lengths[i]]``. Inside a
CUDA graph the buffer width ``W`` is fixed and ``lengths`` lives on the device, so an op never
slices: it reads the whole row and masks the columns at or beyond ``lengths[i]`` (old drafts,
anything), and a condition Hugging Face decides on ``input_ids.shape[-1]`` becomes a per-row mask
on ``lengths``. Ops take plain Python parameters (``graph_logits.py`` reads them off the processor),
build their device constants in ``prepare`` — before capture, since a captured graph may not copy
from the host — and repeat Hugging Face's arithmetic op for op, so that results equal its own.
"""
from __future__ import annotations

import torch

NEG_INF = float("-inf")


class RoundHistory:
    """One call's history, with the row gather shared by every op that reads tokens.

    ``batch_rows`` is each score row's row in plain generate's batch, which per-batch-row processor state
    is indexed by; None when buffer row ``b`` is batch row ``b``.
    """

    def __init__(self, history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor,
                 batch_rows: torch.Tensor | None = None):
        self.history, self.rows, self.lengths, self.batch_rows = history, rows, lengths, batch_rows
        self._tokens: torch.Tensor | None = None

    @property
    def tokens(self) -> torch.Tensor:
        """``(R, W)``: the buffer row of each score row, garbage columns included."""
        if self._tokens is None:
            self._tokens = self.history.index_select(0, self.rows)
        return self._tokens

    def columns(self, count: int, back: int) -> torch.Tensor:
        """``(R, count)`` column indices ``lengths - back + j``, clamped at 0 (callers mask rows too short)."""
        offsets = torch.arange(count, device=self.lengths.device)
        return (self.lengths[:, None] - back + offsets[None, :]).clamp(min=0)


def token_mask(token_ids: list[int], vocab_size: int, device) -> torch.Tensor:
    """``(V,)`` bool; ids outside the vocabulary match nothing, as with Hugging Face's ``isin(arange(V), ids)``."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[[t for t in token_ids if 0 <= t < vocab_size]] = True
    return mask.to(device)


def _seen(ids: torch.Tensor, keep: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``(R, V)`` bool: which tokens occur among ``ids`` where ``keep``; ids >= V (a lm_head smaller than the
    embedding) and dropped columns land in a spare column, as in Hugging Face's own scatter, and so do
    negative ids (a runner's padding rows), which would fault on the device."""
    index = torch.where(keep & (ids >= 0), ids.clamp(max=vocab_size), vocab_size)
    seen = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.bool, device=ids.device)
    return seen.scatter_(1, index, True)[:, :vocab_size]


class RepetitionPenalty:
    """RepetitionPenaltyLogitsProcessor: every token seen in the row's history is penalised once.

    ``ignore`` is ``prompt_ignore_length``: leading columns left out, one int for all rows or one per
    batch row (transformers >= 5.23 passes each row's padding length), then looked up by
    ``hist.batch_rows`` (or by buffer row when the buffer is laid out as the batch).
    """

    def __init__(self, penalty: float, ignore: int | tuple[int, ...]):
        self.penalty, self.ignore = penalty, ignore
        self.per_batch_row = isinstance(ignore, tuple)
        self._ignore: torch.Tensor | None = None

    def prepare(self, vocab_size: int, device) -> None:
        if isinstance(self.ignore, tuple):
            self._ignore = torch.tensor(self.ignore, dtype=torch.long, device=device)

    def __call__(self, scores: torch.Tensor, hist: RoundHistory) -> torch.Tensor:
        tokens = hist.tokens
        if isinstance(self.ignore, tuple):
            if hist.batch_rows is None and hist.history.shape[0] != len(self.ignore):
                raise ValueError("Incompatible `prompt_ignore_length` batch size")
            batch_rows = hist.rows if hist.batch_rows is None else hist.batch_rows
            start = self._ignore.index_select(0, batch_rows)[:, None]
        else:
            start = self.ignore
        positions = torch.arange(tokens.shape[1], device=tokens.device)[None, :]
        keep = (positions < hist.lengths[:, None]) & (positions >= start)
        seen = _seen(tokens, keep, scores.shape[-1])
        penalised = torch.where(scores < 0, scores * self.penalty, scores / self.penalty)
        return torch.where(seen, penalised, scores)


class BanTokens:
    """Tokens set to -inf in the rows whose length is below ``below`` or equal to ``equal`` (every row when
    both are None): MinLength (eos, below min_length), MinNewTokensLength (eos, below prompt length +
    min_new_tokens), SuppressTokens (always) and SuppressTokensAtBegin (length == begin_index)."""

    def __init__(self, token_ids: list[int], below: int | None = None, equal: int | None = None):
        self.token_ids, self.below, self.equal = token_ids, below, equal
        self._mask: torch.Tensor | None = None

    def prepare(self, vocab_size: int, device) -> None:
        self._mask = token_mask(self.token_ids, vocab_size, device)

    def __call__(self, scores: torch.Tensor, hist: RoundHistory) -> torch.Tensor:
        ban = self._mask[None, :]
        if self.below is not None:
            ban = ban & (hist.lengths < self.below)[:, None]
        elif self.equal is not None:
            ban = ban & (hist.lengths == self.equal)[:, None]
        return scores.masked_fill(ban, NEG_INF)


class ForceTokens:
    """Rows of length ``at`` become -inf except the forced tokens, which get 0: ForcedBOS (length 1) and
    ForcedEOS (length max_length - 1)."""

    def __init__(self, token_ids: list[int], at: int):
        self.token_ids, self.at = token_ids, at
        self._mask: torch.Tensor | None = None

    def prepare(self, vocab_size: int, device) -> None:
        self._mask = token_mask(self.token_ids, vocab_size, device)

    def __call__(self, scores: torch.Tensor, hist: RoundHistory) -> torch.Tensor:
        forced = scores.new_full(scores.shape[-1:], NEG_INF).masked_fill(self._mask, 0.0)
        return torch.where((hist.lengths == self.at)[:, None], forced[None, :], scores)


class NoRepeatNGram:
    """NoRepeatNGramLogitsProcessor: every complete window of the history whose first n-1 tokens equal the
    row's last n-1 tokens bans its last token. Windows are taken over the whole buffer width and those not
    ending before ``lengths`` are dropped, which also bans nothing in rows shorter than n."""

    def __init__(self, ngram_size: int):
        self.n = ngram_size

    def prepare(self, vocab_size: int, device) -> None:
        pass

    def __call__(self, scores: torch.Tensor, hist: RoundHistory) -> torch.Tensor:
        tokens, n = hist.tokens, self.n
        if tokens.shape[1] < n:  # static shape: no row can hold an n-gram
            return scores
        windows = tokens.unfold(1, n, 1)  # (R, W - n + 1, n); window s is tokens[:, s : s + n]
        starts = torch.arange(windows.shape[1], device=tokens.device)
        hits = starts[None, :] + n <= hist.lengths[:, None]
        if n > 1:
            prefix = tokens.gather(1, hist.columns(n - 1, back=n - 1))
            hits = hits & (windows[..., :-1] == prefix[:, None, :]).all(dim=-1)
        banned = _seen(windows[..., -1], hits, scores.shape[-1])
        return scores.masked_fill(banned, NEG_INF)


class SequenceBias:
    """SequenceBiasLogitsProcessor / NoBadWordsLogitsProcessor (bias -inf), multi-token entries included:
    an entry adds its bias to its last token when the row ends with the entry's other tokens.

    ``entries`` keeps Hugging Face's dict order. ``min_extra`` is how many tokens beyond the prefix the row
    must hold for an entry to count: transformers 5.17 skips entries longer than the row (1), later
    versions only prefixes longer than the row (0).
    """

    def __init__(self, entries: list[tuple[tuple[int, ...], float]], min_extra: int):
        self.entries, self.min_extra = entries, min_extra
        self._single: torch.Tensor | None = None
        self._groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def prepare(self, vocab_size: int, device) -> None:
        invalid = [t for ids, _ in self.entries for t in ids if t >= vocab_size]
        if invalid:
            raise ValueError(
                f"The model vocabulary size is {vocab_size}, but the following tokens were being biased: {invalid}"
            )
        single = [(ids[0], bias) for ids, bias in self.entries if len(ids) == 1]
        self._single = torch.zeros(vocab_size, dtype=torch.float)
        if single:
            self._single[[t for t, _ in single]] = torch.tensor([b for _, b in single])
        self._single = self._single.to(device)
        by_prefix: dict[int, list[tuple[tuple[int, ...], float]]] = {}
        for ids, bias in self.entries:
            if len(ids) > 1:
                by_prefix.setdefault(len(ids) - 1, []).append((ids, bias))
        self._groups = [
            (
                torch.tensor([ids[:-1] for ids, _ in group], device=device),
                torch.tensor([ids[-1] for ids, _ in group], device=device),
                torch.tensor([bias for _, bias in group], dtype=torch.float, device=device),
            )
            for group in by_prefix.values()
        ]

    def __call__(self, scores: torch.Tensor, hist: RoundHistory) -> torch.Tensor:
        bias = torch.zeros_like(scores)
        bias += self._single
        for prefixes, last_tokens, biases in self._groups:
            m = prefixes.shape[1]
            tail = hist.tokens.gather(1, hist.columns(m, back=m))  # (R, m): the row's last m tokens
            hits = (tail[:, None, :] == prefixes[None, :, :]).all(dim=-1)
            hits = hits & (hist.lengths >= m + self.min_extra)[:, None]
            bias.index_add_(1, last_tokens, torch.where(hits, biases, 0.0).to(bias.dtype))
        return scores + bias
