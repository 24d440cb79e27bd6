"""call/bucket_moves.py: the rows left in a call move to a smaller bucket at once without graphs or into a bucket
already captured; into one without graphs only once the rounds spent in a larger bucket have paid for its captures."""
from types import SimpleNamespace

from hf_specdec.call.bucket_moves import DEFAULT_CAPTURE_S, GRAPHS, SAVING, BucketMoves
from hf_specdec.runner.runner_slots import Slot


class _Graph:
    def __init__(self, seconds):
        self.capture_seconds = seconds


def _runner(graphed=True, bucket=32, captured=(), capture_s=None):
    slot = Slot()
    for b in captured:
        slot.graphs[("verify", b, 0)] = _Graph(capture_s if capture_s is not None else DEFAULT_CAPTURE_S)
    return SimpleNamespace(graphed=graphed, state=SimpleNamespace(size=bucket), slot=slot)


def test_without_graphs_the_rows_move_to_the_smallest_bucket_holding_them():
    moves = BucketMoves(_runner(graphed=False))
    assert moves.target(5) == 8 and moves.target(1) == 1 and moves.target(20) == 24 and moves.target(30) is None


def test_with_graphs_the_rows_move_only_into_a_captured_bucket_the_smallest_that_holds_them():
    moves = BucketMoves(_runner(captured=(32, 24, 16)))
    assert moves.target(5) == 16  # 8 has no graphs yet: the smallest captured bucket holding 5 rows
    assert moves.target(20) == 24
    assert BucketMoves(_runner(captured=(32,))).target(5) is None  # nothing captured below: stay


def test_a_bucket_is_captured_once_the_rounds_spent_above_it_paid_for_its_captures():
    runner = _runner(captured=(32,), capture_s=0.05)
    moves = BucketMoves(runner)
    cost = GRAPHS * 0.05  # the key's mean capture time
    round_s, rounds = 0.002, 0
    while moves.target(5) is None:
        moves.credit(5, round_s)
        rounds += 1
        assert rounds < 10 ** 5
    assert abs(rounds - cost / (SAVING * round_s)) <= 1, rounds  # credited until the captures are paid for
    assert moves.target(5) == 8 and runner.slot.move_credit[8] >= cost
    moves.credit(30, round_s)  # rows that need the current bucket credit nothing
    assert set(runner.slot.move_credit) == {8}


def test_a_captured_bucket_gets_no_credit_and_the_credit_is_the_keys():
    runner = _runner(captured=(32, 8))
    BucketMoves(runner).credit(5, 1.0)
    assert runner.slot.move_credit == {}
    BucketMoves(runner).credit(3, 1.0)  # 4 has no graphs: credited, and kept by the key's slot for later calls
    assert runner.slot.move_credit == {4: SAVING}


def test_ranks_of_a_tensor_parallel_call_move_at_once():
    """Credit follows each rank's own timings; ranks that moved at different rounds would run different graphs."""
    moves = BucketMoves(_runner(captured=(32,)), lockstep=True)
    assert moves.target(5) == 8 and moves.target(30) is None
