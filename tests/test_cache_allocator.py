"""Property tests of the paged cache's block bookkeeping (BlockAllocator and PagedKVCache).

Random sequences of add / reserve (extend) / set_length (rollback or commit) / free,
checked against a plain model after every operation: no block is handed to two
sequences, none leaks (free + held == all, each exactly once), a sequence of n tokens
holds exactly ceil(n / block_size) blocks after set_length, a reserve that cannot be
served raises CacheBudgetError naming the budget and changes nothing, and the device
block tables agree with the allocator's lists.
"""
import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_specdec.cache import BlockAllocator, CacheBudgetError, PagedKVCache, blocks_for

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _snapshot(alloc: BlockAllocator):
    return (list(alloc._free), copy.deepcopy(alloc._blocks), dict(alloc._lengths))


def _check_invariants(alloc: BlockAllocator):
    held = [b for s in alloc.sequences() for b in alloc.blocks(s)]
    free = list(alloc._free)
    assert len(set(held)) == len(held), f"a block is owned twice: {held}"
    assert len(set(free)) == len(free), f"a block is free twice: {free}"
    assert not set(held) & set(free), "a block is both free and held"
    assert sorted(held + free) == list(range(alloc.num_blocks)), "a block leaked or appeared"
    assert alloc.num_free_blocks == alloc.num_blocks - len(held)
    for s in alloc.sequences():
        assert 0 <= alloc.length(s) <= len(alloc.blocks(s)) * alloc.block_size


def _budget_error_names_budget(err: CacheBudgetError, alloc: BlockAllocator, hint: str):
    msg = str(err)
    assert f"{alloc.num_blocks} in all" in msg and f"{alloc.num_blocks * alloc.block_size} tokens" in msg, msg
    assert f"{alloc.block_size} tokens" in msg and hint in msg, msg


@SETTINGS
@given(num_blocks=st.integers(1, 24), block_size=st.integers(1, 5), data=st.data())
def test_allocator_random_operations(num_blocks, block_size, data):
    hint = "Raise cache_budget_tokens."
    alloc = BlockAllocator(num_blocks, block_size, hint)
    next_id = 0
    for _ in range(data.draw(st.integers(1, 40), label="ops")):
        seqs = alloc.sequences()
        op = data.draw(st.sampled_from(["add", "reserve", "set_length", "free"] if seqs else ["add"]))
        if op == "add":
            alloc.add(next_id)
            assert alloc.blocks(next_id) == [] and alloc.length(next_id) == 0
            with pytest.raises(ValueError):
                alloc.add(next_id)
            next_id += 1
        elif op == "reserve":
            chosen = data.draw(st.lists(st.sampled_from(seqs), min_size=1, unique=True))
            demands = {s: data.draw(st.integers(0, (num_blocks + 2) * block_size)) for s in chosen}
            before = _snapshot(alloc)
            need = sum(max(0, blocks_for(n, block_size) - len(alloc.blocks(s))) for s, n in demands.items())
            if need > alloc.num_free_blocks:
                with pytest.raises(CacheBudgetError) as info:
                    alloc.reserve(demands)
                _budget_error_names_budget(info.value, alloc, hint)
                assert _snapshot(alloc) == before, "a failed reserve changed the allocator"
            else:
                grown = alloc.reserve(demands)
                for s in seqs:
                    old_blocks = before[1][s]
                    assert alloc.blocks(s)[: len(old_blocks)] == old_blocks, "reserve moved existing blocks"
                    assert alloc.length(s) == before[2][s], "reserve changed a length"
                    want = max(len(old_blocks), blocks_for(demands.get(s, 0), block_size))
                    assert len(alloc.blocks(s)) == want
                    assert (s in grown) == (want > len(old_blocks))
        elif op == "set_length":
            s = data.draw(st.sampled_from(seqs))
            capacity = len(alloc.blocks(s)) * block_size
            n = data.draw(st.integers(0, capacity + block_size))
            before = _snapshot(alloc)
            if n > capacity:
                with pytest.raises(ValueError):
                    alloc.set_length(s, n)
                assert _snapshot(alloc) == before
            else:
                released = alloc.set_length(s, n)
                assert alloc.length(s) == n
                assert len(alloc.blocks(s)) == blocks_for(n, block_size)
                assert alloc.blocks(s) == before[1][s][: blocks_for(n, block_size)], "kept blocks changed"
                assert released == (len(before[1][s]) > blocks_for(n, block_size))
        else:
            s = data.draw(st.sampled_from(seqs))
            alloc.free(s)
            assert s not in alloc.sequences()
        _check_invariants(alloc)
    for s in alloc.sequences():
        alloc.free(s)
    assert sorted(alloc._free) == list(range(num_blocks)), "blocks leaked after freeing everything"


@SETTINGS
@given(num_blocks=st.integers(2, 20), block_size=st.integers(1, 4), max_seqs=st.integers(1, 5), data=st.data())
def test_paged_cache_tables_follow_allocator(num_blocks, block_size, max_seqs, data):
    max_seq_len = data.draw(st.integers(1, 24))
    cache = PagedKVCache(num_blocks, block_size, max_seqs, max_seq_len, torch.device("cpu"), "Use a bigger budget.")
    alloc = cache.allocator
    live: list[int] = []
    added = 0
    for _ in range(data.draw(st.integers(1, 30), label="ops")):
        ops = (["add"] if added < max_seqs else []) + (["reserve", "set_lengths", "free"] if live else [])
        if not ops:
            break
        op = data.draw(st.sampled_from(ops))
        if op == "add":
            count = data.draw(st.integers(1, max_seqs - added))
            rows = cache.add_sequences(count)
            assert rows == list(range(added, added + count))
            added += count
            live += rows
        elif op == "reserve":
            rows = data.draw(st.lists(st.sampled_from(live), min_size=1, unique=True))
            lens = [data.draw(st.integers(0, max_seq_len + block_size)) for _ in rows]
            before = _snapshot(alloc)
            tables_before = cache.block_tables.clone()
            try:
                cache.reserve(rows, lens)
            except (CacheBudgetError, ValueError) as err:
                too_long = any(blocks_for(n, block_size) > cache.max_blocks_per_seq for n in lens)
                assert isinstance(err, ValueError if too_long else CacheBudgetError), err
                if isinstance(err, CacheBudgetError):
                    _budget_error_names_budget(err, alloc, "Use a bigger budget.")
                assert _snapshot(alloc) == before and torch.equal(cache.block_tables, tables_before)
            else:
                for r, n in zip(rows, lens):
                    assert len(alloc.blocks(r)) >= blocks_for(n, block_size)
            # Every live row's table starts with exactly the allocator's blocks.
            for r in live:
                blocks = alloc.blocks(r)
                assert cache.block_tables[r, : len(blocks)].tolist() == blocks
        elif op == "set_lengths":
            rows = data.draw(st.lists(st.sampled_from(live), min_size=1, unique=True))
            lens = [data.draw(st.integers(0, len(alloc.blocks(r)) * block_size)) for r in rows]
            cache.set_lengths(rows, lens)
            for r, n in zip(rows, lens):
                assert cache.length(r) == n and len(alloc.blocks(r)) == blocks_for(n, block_size)
        else:
            r = data.draw(st.sampled_from(live))
            cache.free([r])
            live.remove(r)
        _check_invariants(alloc)
    if added >= max_seqs:
        with pytest.raises(ValueError, match="sequences"):
            cache.add_sequences(1)


def test_paged_batch_slots_follow_block_tables():
    """``batch()`` maps each new token to slot table[pos // bs] * bs + pos % bs of its own row."""
    cache = PagedKVCache(32, 4, 4, 40, torch.device("cpu"))
    rows = cache.add_sequences(3)
    cache.reserve([rows[1]], [9])
    cache.reserve([rows[0]], [5])
    cache.reserve([rows[2]], [2])
    cache.set_lengths(rows, [5, 9, 2])
    cache.reserve(rows, [5 + 4, 9 + 1, 2 + 2])  # a ragged step: 4, 1 and 2 new tokens
    ctx, q = [5, 9, 2], [4, 1, 2]
    step = cache.batch(torch.tensor(rows), torch.tensor(ctx), torch.tensor(q), max(q), sum(q))
    want_pos, want_slots = [], []
    for r, c, n in zip(rows, ctx, q):
        for pos in range(c, c + n):
            want_pos.append(pos)
            want_slots.append(cache.allocator.blocks(r)[pos // 4] * 4 + pos % 4)
    assert step.positions.tolist() == want_pos
    assert step.slot_mapping.tolist() == want_slots
    assert step.seq_lens.tolist() == [9, 10, 4]
    assert step.query_start_loc.tolist() == [0, 4, 5, 7]
    assert len(set(want_slots)) == len(want_slots)
