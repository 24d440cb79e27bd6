"""The device state of the rows of one batch bucket: everything a round reads and writes.

A bucket has a fixed number of rows (1, 2, 4, 8, 16, 24, 32, ...). Live sequences sit in
its first rows; the rest are padding rows that point at a scratch block and are marked
done, so a captured graph computes them and nothing reads the result. Every tensor here
keeps its address for the life of the bucket: CUDA graphs captured over a bucket replay
against these buffers, call after call.

Per row (``length`` counts real tokens, i.e. cache positions, prompt padding excluded):

    hist     (B, W)  plain generate's ``input_ids`` row (left-padded prompt + generated
                     tokens), followed by this round's drafts
    pads     (B,)    prompt padding columns of the row: column c is position c - pads
    length   (B,)    committed tokens; the target cache holds length-1 of them, the draft
                     cache at least length-2 (re-feeding one already cached token is an
                     identical K/V rewrite, which lets the draft's first step feed 2 tokens
                     for every row)
    gen      (B,)    generated tokens; ``done`` rows no longer change
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import torch

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def eos_width(n: int) -> int:
    """Room for ``n`` EOS ids in a bucket (a multiple of 8, so few calls change the graphs' shapes)."""
    return max(8, -(-n // 8) * 8)


def bucket_for(rows: int) -> int:
    """The smallest bucket holding ``rows`` rows (multiples of 128 past the table)."""
    for b in BUCKETS:
        if rows <= b:
            return b
    return -(-rows // 128) * 128


STAT_FIELDS = ("stat_rows", "stat_drafts", "stat_draft_tokens", "stat_accepted", "stat_per_position")


@dataclass
class RowAtSync:
    """One bucket row as a round's sync reads it (``SpecRunner.read``)."""
    done: bool
    generated: int  # new tokens so far
    kept: int  # tokens the round committed
    accepted: int  # drafts accepted
    drafted: int  # drafts proposed


@dataclass
class BucketState:
    hist: torch.Tensor
    pads: torch.Tensor
    batch_row: torch.Tensor  # (B,) the row's index in the call's batch (processors with per-row state)
    length: torch.Tensor
    gen: torch.Tensor
    done: torch.Tensor
    target_tables: torch.Tensor
    draft_tables: torch.Tensor
    draft_probs: Optional[torch.Tensor]  # (B, K, V) when sampling with a draft model
    features: Optional[torch.Tensor]  # (B, K+1, H) with a draft head: the target's last verify features (column
    # j: position length-keep-1+j), or, after a row starts, its last prompt token's in column 0 (keep = 1)
    counts: torch.Tensor  # (B,) real drafts of this round per row (n-gram rows may have fewer than k)
    keep: torch.Tensor  # (B,) tokens committed by the last round
    accepted: torch.Tensor  # (B,) drafts accepted by the last round
    max_new: torch.Tensor  # () max_new_tokens of the call
    behind: torch.Tensor  # () tokens the draft model has still to read (catch_up_draft consumes them)
    eos: torch.Tensor  # (eos_width,) EOS ids, -1 where unused
    # acceptance statistics, summed on the device over the call's rounds
    stat_rows: torch.Tensor  # () live rows, summed over rounds
    stat_drafts: torch.Tensor  # () rows that drafted (count > 0)
    stat_draft_tokens: torch.Tensor  # () draft tokens proposed
    stat_accepted: torch.Tensor  # () accepted draft tokens
    stat_per_position: torch.Tensor  # (K,) drafts whose j-th token was accepted
    scores: Optional[torch.Tensor] = None  # (B*(k+1), V) the last verify's processed scores (not a buffer)
    logits: Optional[torch.Tensor] = None  # (B*(k+1), V) and its raw logits (not a buffer)

    @property
    def size(self) -> int:
        return self.hist.shape[0]

    def stats(self) -> list[torch.Tensor]:
        """The acceptance statistics (``STAT_FIELDS``): a call's totals, whichever buckets its rounds ran in."""
        return [getattr(self, name) for name in STAT_FIELDS]

    @classmethod
    def allocate(cls, rows: int, width: int, table_width: int, k: int, vocab: Optional[int], eos_ids: int,
                 device: torch.device, features: Optional[tuple[int, torch.dtype]] = None) -> "BucketState":
        """``k``: the most drafts a round proposes; ``vocab`` given: room for the draft's distributions;
        ``eos_ids``: room for that many EOS ids; ``features`` (hidden size, dtype): room for a draft head's."""
        def z(*shape, dtype=torch.long):
            return torch.zeros(*shape, dtype=dtype, device=device)
        return cls(
            hist=z(rows, width), pads=z(rows), batch_row=z(rows), length=z(rows), gen=z(rows),
            done=z(rows, dtype=torch.bool),
            target_tables=z(rows, table_width, dtype=torch.int32), draft_tables=z(rows, table_width, dtype=torch.int32),
            draft_probs=None if vocab is None else z(rows, k, vocab, dtype=torch.float32),
            features=None if features is None else z(rows, k + 1, features[0], dtype=features[1]),
            counts=z(rows), keep=z(rows), accepted=z(rows), max_new=z(()), behind=z(()), eos=z(eos_ids), stat_rows=z(()),
            stat_drafts=z(()), stat_draft_tokens=z(()), stat_accepted=z(()), stat_per_position=z(k),
        )

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer a round may write (snapshot and restore around graph warm-up)."""
        named = ((f.name, getattr(self, f.name)) for f in fields(self))
        return [t for name, t in named if t is not None and name not in ("scores", "logits")]

    def clear_padding(self, live: int, scratch_target: torch.Tensor, scratch_draft: torch.Tensor) -> None:
        """Rows ``live:`` become padding: done, two tokens long, K/V written to scratch blocks only."""
        self.pads[live:] = 0
        self.batch_row[live:] = 0
        self.length[live:] = 2
        self.gen[live:] = 0
        self.done[live:] = True
        self.keep[live:] = 0
        self.accepted[live:] = 0
        self.target_tables[live:] = scratch_target
        self.draft_tables[live:] = scratch_draft

    def load_rows(self, source: "BucketState", index: torch.Tensor) -> None:
        """Rows ``index`` of ``source`` become this bucket's first rows (a smaller bucket takes the survivors)."""
        n = index.shape[0]
        for name in ("hist", "pads", "batch_row", "length", "gen", "done", "target_tables", "draft_tables",
                     "keep", "accepted", "counts", "features"):  # keep, accepted, counts: a round that ran before
            # the move is read after it; keep and features: what a draft head reads next
            dst, src = getattr(self, name), getattr(source, name)
            if dst is None:
                continue
            dst[:n] = src.index_select(0, index)[:, : dst.shape[1]] if dst.dim() == 2 else src.index_select(0, index)
        for name in ("max_new", "eos") + STAT_FIELDS:
            getattr(self, name).copy_(getattr(source, name))

    def head_reads(self, rows: list[int]) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """With a draft head, rows ``rows``'s features and ``keep`` (what its next round reads), to carry over a
        rebuild of the bucket (``SpecRunner.load`` starts the rows afresh); else None."""
        if self.features is None or not rows:
            return None
        index = torch.tensor(rows, device=self.hist.device)
        return self.features.index_select(0, index), self.keep.index_select(0, index)

    def restore_head_reads(self, saved: Optional[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """``head_reads`` of another (or this) bucket back into the first rows."""
        if saved is not None:
            features, keep = saved
            self.features[: features.shape[0]] = features
            self.keep[: keep.shape[0]] = keep

    # -- what the host reads at a sync (after the round: no round may run ahead then) --------------
    def last_runs(self, kept: list[int]) -> list[list[int]]:
        """The tokens the last round committed to each of the first ``len(kept)`` rows (``kept[i]`` of row i)."""
        width = max(kept, default=0)
        if not width:
            return [[] for _ in kept]
        n, device = len(kept), self.hist.device
        start = (self.pads + self.length)[:n] - torch.tensor(kept, device=device)
        values = self.hist[:n].gather(1, start[:, None] + torch.arange(width, device=device)).tolist()
        return [v[:m] for v, m in zip(values, kept)]

    def last_outputs(self, kept: list[int], scores: bool, raw: bool) -> tuple[Optional[torch.Tensor], ...]:
        """The verify's processed scores (``scores``) and raw logits (``raw``) of each committed token, row by row,
        as ``(sum(kept), V)`` copies (the graph rewrites its own next round)."""
        per_row = self.scores.shape[0] // self.size
        index = torch.tensor([i * per_row + j for i, m in enumerate(kept) for j in range(m)], dtype=torch.long,
                             device=self.scores.device)
        return self.scores[index] if scores else None, self.logits[index].float() if raw else None
