"""The runner layer: fixed-shape, device-resident, CUDA-graphed execution of speculative rounds
(see docs/architecture.md, "The runner"). The round (``round/``) says what to run; the runner
owns the static buffers, the captured graphs and the compiled models, and replays them."""
from .bucket_state import BUCKETS, BucketState, RowAtSync, bucket_for
from .graphs import graphs_supported
from .runners_on_model import runner_for
from .spec_runner import SpecRunner

__all__ = ["BUCKETS", "BucketState", "RowAtSync", "SpecRunner", "bucket_for", "graphs_supported", "runner_for"]
