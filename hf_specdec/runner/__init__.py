"""The runner layer: fixed-shape, device-resident, CUDA-graphed execution of speculative rounds
(see docs/architecture.md, "The runner"). Strategies and generate say what to run; the runner
owns the static buffers, the captured graphs and the compiled models, and replays them."""
from .bucket_state import BUCKETS, BucketState, RowAtSync, bucket_for
from .fixed_round import RoundSpec
from .graphs import graphs_supported
from .spec_runner import SpecRunner, runner_for

__all__ = ["BUCKETS", "BucketState", "RoundSpec", "RowAtSync", "SpecRunner", "bucket_for", "graphs_supported", "runner_for"]
