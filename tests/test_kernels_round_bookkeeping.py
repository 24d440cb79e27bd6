"""A round's bookkeeping in one launch each (CPU, TRITON_INTERPRET=1): the commit (kernels/commit_triton.py) and a
fixed-shape forward's paged metadata (kernels/step_metadata_triton.py) against their torch references, bit for bit."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton")

from hf_specdec.kernels import commit_reference, commit_round, step_metadata, step_metadata_reference  # noqa: E402
from hf_specdec.kernels.commit_triton import commit_triton  # noqa: E402
from hf_specdec.kernels.step_metadata_triton import step_metadata_triton  # noqa: E402


def _commit_state(gen, B, k, eos_ids=(3, 7), width=64, eos_width=8):
    """A bucket after a verify: runs of accepted drafts (-1 after each), rows done or near max_new, EOS ids among
    the tokens, rows that drafted nothing; the statistics already counting earlier rounds."""
    def ints(*shape, hi):
        return torch.randint(0, hi, shape, generator=gen)
    accepted = ints(B, hi=k + 1)
    emitted = torch.where(torch.arange(k + 1)[None] <= accepted[:, None], ints(B, k + 1, hi=20), -1)
    eos = torch.full((eos_width,), -1)
    eos[: len(eos_ids)] = torch.tensor(eos_ids)
    max_new = torch.tensor(12)
    gen_count = torch.minimum(ints(B, hi=14), max_new - 1)
    done = torch.rand(B, generator=gen) < 0.2
    counts = torch.where(torch.rand(B, generator=gen) < 0.8, torch.tensor(k), 0)
    stats = [torch.tensor(5), torch.tensor(3), torch.tensor(9), torch.tensor(2), torch.arange(max(8, k))]
    return [emitted, accepted, ints(B, width, hi=100), ints(B, hi=5), ints(B, hi=20) + 1, gen_count, done, max_new,
            eos, counts, torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long), stats, k]


def _clone(args):
    return [[t.clone() for t in a] if isinstance(a, list) else a.clone() if torch.is_tensor(a) else a for a in args]


def _assert_same(got, want):
    for a, b in zip(got, want):
        for x, y in zip(a, b) if isinstance(a, list) else [(a, b)]:
            if torch.is_tensor(x):
                assert x.dtype == y.dtype and torch.equal(x, y), (x, y)


@pytest.mark.parametrize("B", [1, 3, 33, 70])  # one block of rows, several, a ragged last one
@pytest.mark.parametrize("k", [0, 1, 4, 7, 12])  # a plain step, k + 1 within 8, beyond 8
def test_commit_in_one_launch_is_the_reference(B, k):
    state = _commit_state(torch.Generator().manual_seed(B * 31 + k), B, k)
    got, want = _clone(state), _clone(state)
    commit_triton(*got)
    commit_reference(*want)
    _assert_same(got, want)
    if int(got[10].sum()):  # some row kept tokens: they were written
        assert not torch.equal(state[2], got[2])
    assert torch.equal(got[5] - state[5], got[10])  # gen advanced by keep


def test_commit_cuts_at_eos_and_max_new_and_skips_done_rows():
    """Row 0 emits EOS at its 2nd token, row 1 would pass max_new, row 2 is done: keep 2, 1, 0."""
    emitted = torch.tensor([[5, 7, 9, -1], [4, 4, 4, 4], [1, 2, -1, -1]])
    accepted = torch.tensor([2, 3, 1])
    hist = torch.zeros(3, 16, dtype=torch.long)
    pads, length, gen = torch.tensor([1, 0, 0]), torch.tensor([4, 4, 4]), torch.tensor([0, 9, 3])
    done, max_new, eos = torch.tensor([False, False, True]), torch.tensor(10), torch.tensor([7, -1, -1, -1])
    stats = [torch.tensor(0), torch.tensor(0), torch.tensor(0), torch.tensor(0), torch.zeros(3, dtype=torch.long)]
    keep, acc = torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long)
    commit_triton(emitted, accepted, hist, pads, length, gen, done, max_new, eos, torch.tensor([3, 3, 3]), keep, acc,
                  stats, 3)
    assert keep.tolist() == [2, 1, 0] and acc.tolist() == [2, 3, 0]
    assert hist[0, 5:8].tolist() == [5, 7, 0] and hist[1, 4:6].tolist() == [4, 0] and not hist[2].any()
    assert done.tolist() == [True, True, True] and gen.tolist() == [2, 10, 3] and length.tolist() == [6, 5, 4]
    assert [int(s) for s in stats[:4]] == [2, 2, 6, 5] and stats[4].tolist() == [2, 2, 1]


def test_commit_op_dispatches_to_the_reference_on_cpu():
    state = _commit_state(torch.Generator().manual_seed(0), 5, 3)
    got, want = _clone(state), _clone(state)
    commit_round(*got)
    commit_reference(*want)
    _assert_same(got, want)


@pytest.mark.parametrize("B,q,block_size,width", [(1, 1, 16, 4), (3, 5, 4, 9), (70, 2, 16, 12), (33, 9, 1, 300),
                                                  (300, 1, 16, 20)])
def test_step_metadata_in_one_launch_is_the_reference(B, q, block_size, width):
    """Slots (negative positions as torch divides them: floor, the table's end), offsets, lengths, last tokens."""
    gen = torch.Generator().manual_seed(B * q)
    tables = torch.randint(0, 1000, (B, width), generator=gen, dtype=torch.int32)
    positions = torch.randint(-2 * block_size, width * block_size, (B * q,), generator=gen)
    seq_lens = torch.randint(1, 100, (B,), generator=gen)
    got = step_metadata_triton(tables, positions, seq_lens, q, block_size)
    want = step_metadata_reference(tables, positions, seq_lens, q, block_size)
    for x, y in zip(got, want):
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert all(torch.equal(x, y) for x, y in zip(step_metadata(tables, positions, seq_lens, q, block_size), want))


def test_ops_schemas():
    tables, positions, seq_lens = torch.zeros(2, 3, dtype=torch.int32), torch.arange(4), torch.tensor([3, 4])
    torch.library.opcheck(torch.ops.hf_specdec.step_metadata.default, (tables, positions, seq_lens, 2, 4))
    state = _commit_state(torch.Generator().manual_seed(1), 4, 2)
    torch.library.opcheck(torch.ops.hf_specdec.commit_round.default, (*state[:12], *state[12], 2))
