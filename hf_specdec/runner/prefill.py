"""Prefill in fixed shapes: the prompts of the rows that start, packed into bucketed sizes, graphed.

An eager prefill is host-bound at small batches: a 16-layer model's Python and launches took about
25 ms of a 190 ms call at batch 1 on an H100 (against a few ms of GPU work), and its spread between
calls was the largest noise left in the strategies benchmark. Here a prefill's shape depends only on
buckets, so it is a function of static device buffers: one CUDA graph per shape, replayed.

Layout of one prefill of ``n`` rows (packed and ragged, as the eager prefill, plus padding):

    B  rows      ``bucket_for(n)``; rows past ``n`` have empty queries (``seq_lens`` 0)
    T  tokens    ``token_bucket(sum of prompt lengths)``; the tokens past the sum belong to no row and
                 write no K/V (slot -1, which the KV-write kernel and its reference skip); their
                 hidden states are garbage that no real token reads (attention reads the caches)
    Q  longest   ``token_bucket(longest prompt)``: the attention kernel's ``max_query_len``

Real tokens attend exactly as in the eager prefill (causal over their own row's keys), so outputs
are the same up to the kernels' tiling. Logits come from each row's last token only
(``logits_to_keep`` holds their indices). The graph runs the model itself, not its compiled version
(a new token count would compile in the middle of a call). The first use of a shape runs the forward
eagerly (its result is the prefill's) and captures it, all counted as warm-up; later uses replay.
All prefill graphs share one memory pool (a few shapes of a long prompt would otherwise each hold
their own activations), which is safe because their inputs and outputs live outside it and one
prefill graph runs at a time. At most ``PREFILL_MAX_SHAPES`` are kept.

A draft head (``draft_head.py``) reads the target's last hidden states: the target's prefill then also keeps
them for every token (``ModelPrefill.hidden``), and the head reads, at each prompt token but the last, the pair
(that token's feature, the next token's id) in the same packed layout; a row's last token writes no K/V (its
next token is the first one generated: the first round reads that pair). ``FixedPrefill.last_hidden`` holds
each row's last prompt feature for that round.

Without CUDA graphs the same packed shapes run eagerly, so the CPU tests check the very packing that
the graphs capture. A tensor-parallel target, or a model on another device than the inputs, prefills
eagerly and unpadded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..cache import PagedBatch, paged_forward
from .bucket_state import bucket_for
from .graphs import StageGraph
from .paged_model import align_vocab, feature_layout

PREFILL_MAX_TOKENS = 8192  # above this a prefill is compute-bound: eager and unpadded
PREFILL_MAX_SHAPES = 128  # graphs kept per runner (model x shape); past it all are dropped and captured anew


def token_bucket(n: int) -> int:
    """The smallest of 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, ... (four steps an octave) holding ``n``:
    at most a quarter of a prefill is padding, and prompts of 50..400 tokens meet about a dozen shapes."""
    octave = 16
    while octave * 2 < n:
        octave *= 2
    for quarter in (4, 5, 6, 7, 8):
        if n <= octave * quarter // 4:
            return octave * quarter // 4
    return octave * 2


@dataclass
class PrefillInputs:
    """Static buffers of one (B, T, Q) shape, shared by the models: what the graphs read."""

    input_ids: torch.Tensor  # (T,)
    positions: torch.Tensor  # (T,) position of each token in its row (0 past the real tokens)
    token_row: torch.Tensor  # (T,) the row of each token (0 past the real tokens)
    real: torch.Tensor  # (T,) bool: a row's token, not padding
    query_start_loc: torch.Tensor  # (B+1,) int32
    seq_lens: torch.Tensor  # (B,) int32
    last: torch.Tensor  # (B,) index of each row's last token (0 for empty rows)
    cache_rows: torch.Tensor  # (B,) each row's cache row (batch row + 1; 0, the scratch sequence, for empty rows)

    @classmethod
    def allocate(cls, B: int, T: int, device: torch.device) -> "PrefillInputs":
        long = dict(dtype=torch.long, device=device)
        return cls(torch.zeros(T, **long), torch.zeros(T, **long), torch.zeros(T, **long),
                   torch.zeros(T, dtype=torch.bool, device=device), torch.zeros(B + 1, dtype=torch.int32,
                                                                                device=device),
                   torch.zeros(B, dtype=torch.int32, device=device), torch.zeros(B, **long), torch.zeros(B, **long))


class ModelPrefill:
    """One model's side of a shape: its block tables and slots, the logits out, the graph."""

    def __init__(self, B: int, T: int, width: int, logits: torch.Tensor, device: torch.device):
        self.tables = torch.zeros(B, width, dtype=torch.int32, device=device)
        self.slots = torch.zeros(T, dtype=torch.long, device=device)
        self.logits = logits  # (B, V) fp32, shared by the model's shapes of B rows (read before the next)
        self.graph: Optional[StageGraph] = None
        self.hidden: Optional[torch.Tensor] = None  # (T, H) a target's last hidden states, when a draft head reads them
        self.input_ids: Optional[torch.Tensor] = None  # (T,) a draft head's: each token's next one in its row


class FixedPrefill:
    """The runner's prefill shapes and graphs. Graphs bake in the caches' pools: ``drop`` when they move."""

    def __init__(self):
        self.inputs: dict[tuple, PrefillInputs] = {}
        self.models: dict[tuple, ModelPrefill] = {}
        self.logits: dict[tuple, torch.Tensor] = {}  # (model, B, vocab) -> its shapes' logits out (262k-token rows)
        self.pool = None
        self.capture_seconds = 0.0  # capture time of the last ``run`` (the runner counts it as warm-up)
        self.last_hidden: Optional[torch.Tensor] = None  # (n, H) with a draft head: each row's last prompt feature

    def drop(self) -> None:
        self.inputs.clear()
        self.models.clear()
        self.logits.clear()
        self.pool = None  # a fresh pool for the next captures

    @staticmethod
    def fits(lens: list[int]) -> bool:
        return token_bucket(sum(lens)) <= PREFILL_MAX_TOKENS

    def run(self, models: dict, batch, rows: list[int], lens: list[int], width: int, graphs: bool,
            skip: tuple = ()) -> torch.Tensor:
        """Every model in ``models`` (name -> PagedModel; not those in ``skip``) reads the prompts of batch
        ``rows`` (``lens`` real tokens each, cache row ``b + 1``); the target's last logits ``(n, V)``."""
        n, device = len(rows), batch.device
        B, T, Q = bucket_for(n), token_bucket(sum(lens)), token_bucket(max(lens))
        self.capture_seconds = 0.0
        head = next((pm for name, pm in models.items() if pm.reads_hidden and name not in skip), None)
        target_mp = None
        if len(self.models) >= PREFILL_MAX_SHAPES:  # rarely: a process that met very many prompt shapes
            self.drop()
        inputs = self.inputs.get((B, T))
        if inputs is None:
            inputs = self.inputs[(B, T)] = PrefillInputs.allocate(B, T, device)
        _pack(inputs, batch, rows, lens)
        out = None
        for name, pm in models.items():
            if name in skip:
                continue
            mp = self.models.get((name, B, T, Q, width, pm.vocab_size))
            if mp is None:
                logits = self.logits.get((name, B, pm.vocab_size))
                if logits is None:
                    logits = self.logits[(name, B, pm.vocab_size)] = torch.zeros(B, pm.vocab_size, device=device)
                mp = self.models[(name, B, T, Q, width, pm.vocab_size)] = ModelPrefill(B, T, width, logits, device)
                if name == "target" and head is not None:
                    hidden, dtype = feature_layout(pm.model)
                    mp.hidden = torch.zeros(T, hidden, device=device, dtype=dtype)
            _fill_slots(mp, inputs, pm.cache, width, pm.reads_hidden)
            stage = _forward(pm, inputs, mp, Q, target_mp.hidden if pm.reads_hidden else None)
            if name == "target":
                target_mp = mp
            if not graphs:
                stage()
            elif mp.graph is None:  # the capture's warm-up computes this prefill: no replay needed
                if self.pool is None:
                    self.pool = torch.cuda.graph_pool_handle()
                what = f"the {name}'s prefill, {B} rows x {T} tokens"
                mp.graph = StageGraph(stage, [], None, pool=self.pool, what=what)
                self.capture_seconds += mp.graph.capture_seconds
            else:
                mp.graph()
            if name == "target":
                out = mp.logits[:n].clone()  # another shape's replay may reuse the pool, never this buffer
        self.last_hidden = None if head is None else target_mp.hidden[inputs.last[:n]]
        return out


def _pack(inputs: PrefillInputs, batch, rows: list[int], lens: list[int]) -> None:
    """The rows' prompt tokens into the static buffers (device arithmetic from one small host copy)."""
    n, device = len(rows), batch.device
    B, T = inputs.seq_lens.shape[0], inputs.input_ids.shape[0]
    S = sum(lens)
    starts = [0]
    for length in lens:
        starts.append(starts[-1] + length)
    fill = lambda values: values + [0] * (B + 1 - len(values))  # noqa: E731
    meta = torch.tensor([starts + [S] * (B - n), fill(lens), fill([s + m - 1 for s, m in zip(starts, lens)]),
                         fill(rows), fill([batch.pads[b] for b in rows])],
                        dtype=torch.long).to(device)  # one host-to-device copy, (5, B + 1)
    qsl, seq_lens, last, batch_rows, pads = meta[0], meta[1, :B], meta[2, :B], meta[3, :n], meta[4, :n]
    inputs.query_start_loc.copy_(qsl)
    inputs.seq_lens.copy_(seq_lens)
    inputs.last.copy_(last)
    inputs.cache_rows.copy_(torch.where(torch.arange(B, device=device) < n, meta[3, :B] + 1, 0))
    token = torch.arange(T, device=device)
    row = torch.repeat_interleave(torch.arange(n, device=device), meta[1, :n], output_size=S)
    inputs.real.fill_(False)
    inputs.real[:S] = True
    inputs.token_row.zero_()
    inputs.token_row[:S] = row
    inputs.positions.copy_(torch.where(inputs.real, token - qsl[inputs.token_row], 0))
    ids = batch.tokens[batch_rows[row], pads[row] + inputs.positions[:S]]
    inputs.input_ids.zero_()
    inputs.input_ids[:S] = ids


def _fill_slots(mp: ModelPrefill, inputs: PrefillInputs, cache, width: int, head: bool = False) -> None:
    """The model's block tables of the rows (scratch row 0 for empty rows) and the slot of every token (-1,
    nothing written, for padding tokens). Device work only: no copy from the host waits for an earlier
    model's prefill. ``head``: a draft head's shifted tokens, no K/V at a row's last token."""
    mp.tables.copy_(cache.block_tables.index_select(0, inputs.cache_rows)[:, :width])
    slots = cache.slot_mapping(mp.tables, inputs.token_row, inputs.positions)
    real = inputs.real
    if head:  # a row's last token (``last`` of an empty padding row is 0: compare within each token's own row)
        token = torch.arange(real.shape[0], device=real.device)
        real = real & (token != inputs.last[inputs.token_row])
        if mp.input_ids is None:  # a static buffer: the graph reads it
            mp.input_ids = torch.zeros_like(inputs.input_ids)
        mp.input_ids.copy_(inputs.input_ids.roll(-1))
    mp.slots.copy_(torch.where(real, slots, -1))


def _forward(pm, inputs: PrefillInputs, mp: ModelPrefill, Q: int, features: Optional[torch.Tensor] = None):
    """The stage a graph captures: the model (not compiled) over the static buffers, logits into ``mp`` (a target's
    hidden states too, where ``mp.hidden`` has room; a draft head reads the target's, ``features``)."""
    B, T = inputs.seq_lens.shape[0], inputs.input_ids.shape[0]
    # one row: its prompt then padding, so a causal self-attention over all T tokens is exact for the real ones
    # (they come first); the model's own attention computes it (several rows: their spans vary between replays)
    fresh = ((0, T),) if B == 1 else None

    def stage():
        batch = PagedBatch(pm.cache, mp.tables, inputs.seq_lens, inputs.query_start_loc, mp.slots,
                           inputs.positions, Q, fresh)
        if features is not None:  # a draft head: its K/V only (the first round reads the last pair)
            paged_forward(pm.model, mp.input_ids, batch, inputs.last[:0], call=pm.plain, features=features)
            return
        out = paged_forward(pm.model, inputs.input_ids, batch, inputs.last, call=pm.plain, hidden=mp.hidden is not None)
        if mp.hidden is not None:
            out, hidden = out
            mp.hidden.copy_(hidden)
        mp.logits.copy_(align_vocab(out, pm.vocab_size))
    return stage


def eager_prefill(models: dict, batch, rows: list[int], lens: list[int], skip: tuple, head: bool
                  ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The prompts unpadded, one ragged forward per model (not those in ``skip``): the target's last logits
    ``(n, V)`` and, with a draft head (``head``), each row's last prompt feature ``(n, H)``."""
    out, hidden, last_hidden, starts = None, None, None, [0]
    for n in lens:
        starts.append(starts[-1] + n)
    for name, pm in models.items():
        if name in skip:
            continue
        device = batch.device
        step = pm.cache.batch(torch.tensor([b + 1 for b in rows], device=device),
                              torch.zeros(len(rows), dtype=torch.long, device=device),
                              torch.tensor(lens, device=device), max(lens), sum(lens))
        step.fresh = tuple(zip(starts, starts[1:]))  # prompts from position 0: the model's own attention
        input_ids = batch.gather(rows, [batch.pads[b] for b in rows], lens)
        last = step.query_start_loc[1:].long() - 1
        if pm.reads_hidden:  # a draft head: (feature, next token) pairs; a row's last token writes no K/V
            step.slot_mapping = step.slot_mapping.index_fill(0, last, -1)
            paged_forward(pm.model, input_ids.roll(-1), step, last[:0], call=pm.plain, features=hidden)
            continue
        logits = paged_forward(pm.model, input_ids, step, last, call=pm.plain, hidden=head and name == "target")
        if name == "target":
            if head:
                logits, hidden = logits
                last_hidden = hidden[last]
            out = logits[:, : pm.vocab_size]
    return out, last_hidden
