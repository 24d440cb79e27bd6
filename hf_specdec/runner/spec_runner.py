"""The runner: fixed-shape, device-resident execution of speculative rounds for one model pair.

It owns what must outlive a ``generate()`` call for CUDA graphs to be replayed by the
next one: both models' paged caches (their pools' addresses are baked into the graphs),
one ``BucketState`` per batch bucket, the captured graphs and the compiled models. A call that changes nothing
that shapes a graph (``RunnerKey``) captures nothing, nor does one whose key an earlier call used (``runner_slots.py``).

Per call: ``begin`` sizes the caches; each row gets its whole budget (prompt +
max_new_tokens + k + 1) in both caches when it starts (``row_blocks.py``), so a round never
touches the allocator or a block table; ``prefill`` / ``prefill_draft`` read the prompts (in fixed
shapes, graphed: ``prefill.py``); ``load`` moves the live rows into the smallest bucket holding them;
then ``round`` / ``read`` until no row is live; ``store`` writes the rows back into the call's ``SequenceBatch``.

What a round computes comes from the layer above, as ``spec`` (``round/fixed_round.RoundSpec``): its
fields key the graphs, ``spec.stages(state, models, k)`` gives the stages to run or capture,
``spec.draft_model`` names the model the proposer drafts with and ``spec.catch_up`` feeds it what it
missed. The runner executes them and imports nothing from the round.
"""
from __future__ import annotations

import time
from typing import Optional

import torch
from transformers import PreTrainedModel

from ..cache import PagedKVCache, blocks_for, input_device, same_device
from .background_compile import BackgroundCompile, compile_job
from .bucket_state import BucketState, RowAtSync, bucket_for, eos_width
from .fused_projections import shared_projections
from .graphs import StageGraph
from .paged_model import feature_layout, paged_models
from .prefill import FixedPrefill, eager_prefill
from .runner_slots import RunnerKey, RunnerSlots, Slot, capacity, history_width, models_signature

# Tokens per row the draft model reads in one window after rounds of k = 0: at most the attention's verify tile
# (kernels QUERY_TILE), whose kernel the draft's first step of a round compiled already (16 compiled one more: 1.1 s
# of a b = 32 first call on an H200); a longer catch-up replays the window's graph more often.
CATCH_UP = 8


class SpecRunner:
    def __init__(self, target: PreTrainedModel, draft: Optional[PreTrainedModel]):
        self.target, self.draft = target, draft
        self.key: Optional[RunnerKey] = None
        self.caches: dict[str, PagedKVCache] = {}
        self.slots = RunnerSlots()  # per key: bucket states and graphs (runner_slots.py)
        self.slot = Slot()  # the current key's: its bucket states and graphs
        self.prefills = FixedPrefill()  # fixed-shape prefill buffers and graphs (prefill.py)
        self.fixed_prefill = True
        self.compiling: dict[str, BackgroundCompile] = {}  # per model: its compiled code, made off the call's path
        self.plain_copies: dict[str, tuple] = {}  # per model: its uncompiled paged copy (paged_model.paged_models)
        self.compile_asked = False  # this call wants compiled models
        self.warmup_seconds = 0.0
        self.draft_behind = 0  # tokens (rounds of k = 0, or whole rows) the draft model has not read yet
        self.draft_deferred = False  # this call's rows start without the draft model's prefill
        self.policy_memory: dict = {}  # what the speculation-length policy keeps across calls (round costs, ...)
        self.head = False  # this call drafts with a draft head (draft_head.py): it reads the target's features
        self.prompt_features: Optional[torch.Tensor] = None  # (batch rows, H) with a head: last prompt features

    # -- per call ------------------------------------------------------------------
    def begin(self, batch, spec, logits_signature: tuple, vocab: int, graphs: bool, compile: bool,
              block_size: int, cache_blocks: Optional[int], hint: str, fixed_prefill: bool = True,
              compile_wait: bool = False, eos_ids: int = 1) -> None:
        """Size (or reuse) caches and buckets for this call (rows get blocks as they start: row_blocks.py).
        ``compile``: run compiled models once they are ready (background_compile.py): until then this call runs
        graphs of the models as they are, unless ``compile_wait``.
        ``cache_blocks``: the user's budget per cache (None: what the call needs, rounded up).
        ``fixed_prefill``: prompts read in fixed shapes (prefill.py; only where every model runs on the
        inputs' device), else eagerly and unpadded."""
        self.spec, self.batch, self.warmup_seconds, self.draft_deferred = spec, batch, 0.0, False
        k = spec.k
        budgets = [batch.real_len(b) + batch.max_new_tokens + k + 1 for b in range(batch.size)]
        scratch_tokens = k + 2  # padding rows write positions 0..k+1
        need = sum(blocks_for(n, block_size) for n in budgets) + blocks_for(scratch_tokens, block_size)
        if cache_blocks is not None:
            pool_blocks = cache_blocks + blocks_for(scratch_tokens, block_size)
        else:
            pool_blocks = max(capacity(need, 64), self.key.pool_blocks if self.key else 0)
        # Capacities only grow, and with graphs block tables are as wide as the models' longest sequence
        # (a wide table costs the Triton kernels nothing: attention stops at each row's length), so few
        # calls change a shape. Without graphs (CPU) the torch reference reads whole tables: keep them tight.
        longest = max(budgets + ([self._max_positions()] if graphs else []))
        models = {"target": self.target}
        if spec.draft_model is not None:
            models[spec.draft_model] = self.draft
        # before any graph holds the addresses of the weights
        shared = {name: shared_projections(model, share=compile) for name, model in models.items()}
        self.head = spec.draft_model is not None and getattr(self.draft, "reads_target_hidden", False)
        if self.head:
            hidden, dtype = feature_layout(self.target)
            self.prompt_features = torch.zeros(batch.size, hidden, dtype=dtype, device=batch.device)
        table_width = max(capacity(blocks_for(longest, block_size), 8), self.key.table_width if self.key else 0)
        self.compile_asked = compile
        compiled = compile and self._compiled_ready(models, vocab, block_size, table_width, compile_wait)
        key = RunnerKey(k, spec.do_sample, spec.acceptance, spec.method, spec.ngram_sizes, logits_signature,
                        spec.generator, graphs, compiled, block_size, pool_blocks,
                        history_width(batch.tokens.shape[1], graphs, self.key.width if self.key else 0), table_width,
                        vocab, eos_width(eos_ids), models_signature(models.values()))
        if key != self.key:
            if self.key is not None and (key.block_size, key.pool_blocks, key.models) != (
                    self.key.block_size, self.key.pool_blocks, self.key.models):
                self.slots.drop_all()  # the graphs kept bake in the pools' and the models' addresses
                self.prefills.drop()
                if (key.block_size, key.models) != (self.key.block_size, self.key.models):
                    self.caches.clear()  # pools in the models' dtype, on their device
            for cache in self.caches.values():
                if cache.num_blocks != pool_blocks:
                    cache.resize(pool_blocks)
            self.slot = self.slots.slot(key)  # a key seen before: its states and graphs replay
            self.policy_memory = self.slots.policy_memory(key)
            self.key = key
        for name, model in models.items():
            cache = self.caches.get(name)
            if cache is None:
                device = input_device(model)
                cache = self.caches[name] = PagedKVCache(pool_blocks, block_size, batch.size + 1,
                                                         key.table_width * block_size, device, hint)
            cache.reset(batch.size + 1, key.table_width * block_size, hint)
            cache.add_sequences(1)  # row 0: the scratch sequence of padding rows
            cache.reserve([0], [scratch_tokens])
            cache.add_sequences(batch.size)  # blocks as each row starts: row_blocks.reserve_rows
        self.models = paged_models(models, self.caches, vocab, {n: self.compiling[n].compiled for n in models}
                                   if compiled else {}, self.plain_copies, key.models, shared)
        self.fixed_prefill = fixed_prefill and all(same_device(pm.cache.device, batch.device)
                                                   for pm in self.models.values())
        prepare = getattr(spec.logits, "prepare", None)
        if prepare is not None:  # device constants of the processors: host copies, never inside a capture
            prepare(vocab, batch.device)

    def defer_draft(self) -> bool:
        """Start rows without the draft model's prefill: a call whose rounds stay at k = 0 (a draft the
        policy expects to be useless) then never runs the draft; the first round that drafts has it read
        every row from position 0 (``catch_up``, in windows that stay inside each row's budget)."""
        drafts = "draft" in self.models and not self.spec.proposes_every_round
        self.draft_deferred = drafts and self._catch_up_graph_fits()
        return self.draft_deferred

    def prefill(self, rows: list[int]) -> torch.Tensor:
        """The target (and a draft head, which reads its features) reads the prompts of ``rows``; its last logits
        ``(B, V)``. In fixed shapes, graphed where graphs run (a capture counts as warm-up); else eagerly."""
        return self._prefill(rows, () if self.head else ("draft",))

    def prefill_draft(self, rows: list[int]) -> None:
        """The draft model reads the prompts of ``rows`` (not while deferred), once their first tokens are out: a
        streamer has them without waiting for it, and a row done at its first token costs it nothing."""
        if rows and "draft" in self.models and not self.head and not self.draft_deferred:
            # done before a round starts (the policy learns its time)
            self._prefill(rows, ("target",))
            if self.batch.device.type == "cuda":
                torch.cuda.current_stream(self.batch.device).synchronize()

    def _prefill(self, rows: list[int], skip: tuple) -> Optional[torch.Tensor]:
        batch = self.batch
        lens = [batch.prompt_len(b) for b in rows]  # the prompts alone: the draft, after the first token, too
        if self.fixed_prefill and FixedPrefill.fits(lens):
            out = self.prefills.run(self.models, batch, rows, lens, self.key.table_width, self.key.graphs, skip)
            self.warmup_seconds += self.prefills.capture_seconds
            if self.head:
                self.prompt_features[rows] = self.prefills.last_hidden
            return out
        out, hidden = eager_prefill(self.models, batch, rows, lens, skip, self.head)
        if self.head:
            self.prompt_features[rows] = hidden
        return out

    def load(self, rows: list[int], eos_ids: list[int], behind: int = 0) -> None:
        """The call's live ``rows`` (after the first token) fill the smallest bucket that holds them.
        ``behind``: tokens the draft model has still to read of the rows carried over (while its reading
        is deferred: all of every row's tokens)."""
        batch, key = self.batch, self.key
        s = self._state(bucket_for(len(rows)))
        device, n, W = batch.device, len(rows), batch.tokens.shape[1]
        index = torch.tensor(rows, device=device)
        s.hist[:n, :W] = batch.tokens.index_select(0, index)
        s.pads[:n] = torch.tensor([batch.pads[b] for b in rows], device=device)
        s.batch_row[:n] = index
        s.length[:n] = torch.tensor([batch.real_len(b) for b in rows], device=device)
        s.gen[:n] = torch.tensor([batch.gen_len[b] for b in rows], device=device)
        s.done[:n] = False
        for name, pm in self.models.items():
            tables = s.target_tables if name == "target" else s.draft_tables
            tables[:n] = pm.cache.block_tables.index_select(0, (index + 1).to(pm.cache.device))[:, : key.table_width]
        self._clear_padding(s, n)
        if s.features is not None:  # a draft head's first round reads each row's last prompt pair
            s.features[:n, 0] = self.prompt_features.index_select(0, index)
            s.keep[:n] = 1
        s.max_new.fill_(batch.max_new_tokens)
        s.eos.copy_(torch.tensor(eos_ids + [-1] * (s.eos.shape[0] - len(eos_ids)), device=device))
        for t in s.stats():
            t.zero_()
        self.state = s
        if self.draft_deferred:  # the draft holds nothing: the longest row's length-2 tokens, from position 0
            behind = max(behind, max(batch.real_len(b) for b in rows) - 2)
        self.draft_behind = behind

    # -- rounds --------------------------------------------------------------------
    def round(self, k: int) -> bool:
        """A round of ``k <= spec.k`` drafts for the current bucket: graph replays, or the same code eagerly.
        True when the draft model first read the tokens of earlier rounds of k = 0 (a round that cost more
        than a round of k does)."""
        s = self.state
        drafting = self.spec.draft_model is not None
        caught_up = bool(drafting and k and self.draft_behind)
        if caught_up:
            self.catch_up()
        elif drafting and not k and not self.spec.proposes_every_round:
            self.draft_behind += 1
        for stage, graph in self._stages(k):
            if graph is None:
                stage()
            else:
                graph()
                if hasattr(graph, "scores"):
                    s.scores, s.logits = graph.scores, graph.logits
        return caught_up

    def capture(self, ks) -> None:
        """Capture the current bucket's graphs for every k in ``ks`` now (before rounds that are timed). Other
        graphs (another k, the draft's catch-up) are captured when a round first needs them."""
        if self.key.graphs:
            for k in ks:
                self._stages(k)

    def time_rounds(self, ks, repeats: int = 3) -> dict[int, list[float]]:
        """Wall seconds of whole rounds of each k (graph replays and the round's sync) at the current bucket,
        the state restored after each: clean costs for the speculation-length policy before any real round
        (a host stall inside one real round would otherwise price that k out). Counted as warm-up."""
        s, began = self.state, time.perf_counter()
        saved = [t.clone() for t in s.tensors()]
        times: dict[int, list[float]] = {}
        for k in ks:
            graphs = [graph for _, graph in self._stages(k)]
            times[k] = []
            for rep in range(repeats + 1):  # the first replay warms caches and is dropped
                start = time.perf_counter()
                for graph in graphs:
                    graph()
                self.read()
                if rep:
                    times[k].append(time.perf_counter() - start)
                for t, v in zip(s.tensors(), saved):
                    t.copy_(v)
        self.warmup_seconds += time.perf_counter() - began  # warm-up, like capture: not decoding time
        return times

    def catch_up(self) -> None:
        """Feed the draft model the tokens of its rounds of k = 0, lazily: before a round that drafts (a call whose
        rounds stay at k = 0 never pays for it; a rebuild of the bucket carries the count over). In windows of
        CATCH_UP tokens per row, the same graph replayed (eagerly without graphs), where every row's budget holds
        a window; else in one eager forward."""
        behind, self.draft_behind, self.draft_deferred = self.draft_behind, 0, False
        if not behind:
            return
        s = self.state
        s.behind.fill_(behind)
        if not self._catch_up_graph_fits():
            self.spec.catch_up(s, self.models, behind, compiled=False)
            return
        window = self._catch_up_graph() if self.key.graphs else (
            lambda: self.spec.catch_up(s, self.models, CATCH_UP, compiled=False))
        for _ in range(-(-behind // CATCH_UP)):
            window()

    def _catch_up_graph_fits(self) -> bool:
        """Short rows feed positions 0..CATCH_UP-1: each must lie inside the row's reserved budget."""
        return self.batch.max_new_tokens + self.spec.k + 2 >= CATCH_UP

    def _catch_up_graph(self) -> StageGraph:
        s = self.state
        graph = self.slot.graphs.get(("catch_up", s.size, CATCH_UP))
        if graph is None:
            stage = lambda: self.spec.catch_up(s, self.models, CATCH_UP, compiled=True)  # noqa: E731
            what = f"the draft's catch-up, bucket {s.size}"
            graph = self.slot.graphs[("catch_up", s.size, CATCH_UP)] = StageGraph(stage, s.tensors(), None, what=what)
            self.warmup_seconds += graph.capture_seconds
        return graph

    def _stages(self, k: int) -> list:
        """[(stage, its graph or None)] of a round of k: propose (k > 0), then verify and commit."""
        s, B, spec = self.state, self.state.size, self.spec
        stages = spec.stages(s, self.models, k)
        if not self.key.graphs:
            return [(stage, None) for _, stage in stages]
        out = []
        for name, stage in stages:
            graph = self.slot.graphs.get((name, B, k))
            if graph is None:
                graph = self.slot.graphs[(name, B, k)] = StageGraph(stage, s.tensors(), spec.generator,
                                                                  what=f"{name}, bucket {B}, k = {k}")
                if name == "verify":  # its own output memory, read at the sync (host criteria, outputs kept)
                    graph.scores, graph.logits = s.scores, s.logits
                self.warmup_seconds += graph.capture_seconds
            out.append((stage, graph))
        return out

    @property
    def graphed(self) -> bool:
        """This call's rounds replay CUDA graphs."""
        return self.key.graphs

    @property
    def execution(self) -> tuple[bool, bool]:
        """(graphs, compiled code): how this call's rounds run, which their costs depend on besides shape and k."""
        return self.key.graphs, self.key.compile

    def pool_bytes(self) -> int:
        """Device memory held by both caches' pools."""
        return sum(t.numel() * t.element_size() for cache in self.caches.values()
                   for pools in (cache.key_pools, cache.value_pools) for t in pools.values())

    def read(self) -> list[RowAtSync]:
        """The round's one host synchronisation: each bucket row as the round left it."""
        s = self.state
        return [RowAtSync(bool(d), *rest) for d, *rest in
                torch.stack([s.done.long(), s.gen, s.keep, s.accepted, s.counts], dim=1).tolist()]

    def store(self, index: int, row: int, gen: int) -> None:
        """Bucket row ``index`` (finished) goes back to the call's ``SequenceBatch`` row ``row``."""
        batch = self.batch
        batch.tokens[row] = self.state.hist[index, : batch.tokens.shape[1]]
        batch.gen_len[row] = gen
        batch.finished[row] = True

    def stop_rows(self, cuts: dict[int, int]) -> None:
        """Host stopping criteria fired: bucket row i keeps only ``cuts[i]`` tokens of its last run, and stops."""
        s = self.state
        index = torch.tensor(list(cuts), device=s.hist.device)
        kept = torch.tensor(list(cuts.values()), device=s.hist.device)
        drop = s.keep.index_select(0, index) - kept
        s.gen.index_add_(0, index, -drop)
        s.length.index_add_(0, index, -drop)
        s.keep.index_copy_(0, index, kept)  # what a draft head re-reads next (length - keep - 1 >= 0)
        s.done.index_fill_(0, index, True)

    def shrink(self, live: torch.Tensor, bucket: int) -> None:
        """Move the ``live`` rows (device indices) of the current bucket into the smaller ``bucket``."""
        s = self._state(bucket)
        s.load_rows(self.state, live)
        self._clear_padding(s, live.shape[0])
        self.state = s

    def statistics(self) -> dict:
        """Acceptance statistics summed on the device over the call's rounds."""
        *totals, per_position = self.state.stats()
        return dict(zip(("rows", "drafts", "draft_tokens", "accepted"), torch.stack(totals).tolist()),
                    per_position=per_position.tolist())

    # -- internals -----------------------------------------------------------------
    def _max_positions(self) -> int:
        """Longest sequence the models take (capped: tables for 64k tokens are 4k entries a row)."""
        limits = [getattr(m.config.get_text_config(), "max_position_embeddings", None) or 0
                  for m in (self.target, self.draft) if m is not None]
        return min(min(limits), 65536) if all(limits) else 0

    def _state(self, rows: int) -> BucketState:
        s = self.slot.states.get(rows)
        if s is None:
            key = self.key
            s = self.slot.states[rows] = BucketState.allocate(
                rows, key.width, key.table_width, key.k,
                key.vocab if key.do_sample and self.spec.draft_model is not None else None, key.eos_width,
                self.batch.device, feature_layout(self.target) if self.head else None)
        return s

    def _clear_padding(self, s: BucketState, live: int) -> None:
        scratch = {name: pm.cache.block_tables[0, : self.key.table_width].to(s.hist.device)  # a draft on another GPU
                   for name, pm in self.models.items()}
        s.clear_padding(live, scratch["target"], scratch.get("draft", scratch["target"]))

    def _compiled_ready(self, models: dict, vocab: int, block_size: int, table_width: int, wait: bool) -> bool:
        """Every model of this call has its compiled code: started in the background the first time (or made
        now, ``wait``; that time counts as warm-up)."""
        ready = True
        for name, model in models.items():  # asked each call: a model whose modules were replaced gets a new job
            job = self.compiling[name] = compile_job(model, vocab, block_size, table_width)
            if wait and not job.finished():  # a finished job costs a call nothing: no warm-up to count
                start = time.perf_counter()
                job.wait()
                self.warmup_seconds += time.perf_counter() - start
            ready = job.start().ready() and ready
        return ready

    def wait_compiled(self) -> Optional[bool]:
        """Wait for every model's compilation that a call started: True when all are ready, False when one failed,
        None when no call asked for compiled code."""
        jobs = list(self.compiling.values())
        return all([job.wait() for job in jobs]) if jobs else None

    def compile_status(self) -> Optional[str]:
        """Why this call runs without the compiled code it asked for (None when it has it or did not ask)."""
        jobs = [job for name, job in self.compiling.items() if name in self.models]
        if self.key.compile or not self.compile_asked or not jobs:
            return None
        failed = [job.error for job in jobs if job.error]
        return f"compile failed: {failed[0]}" if failed else "compiling in the background"

