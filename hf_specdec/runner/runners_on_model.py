"""The runners kept on a target model: one per draft model it is used with, created on first use."""
from __future__ import annotations

from typing import Optional

from transformers import PreTrainedModel

from .spec_runner import SpecRunner


class _RunnerCache(dict):
    """The runners kept on a model. A copy of the model (``copy.deepcopy``, pickling) starts with none:
    runners hold the original's caches and graphs, and copying them would copy every draft they keep."""

    def __deepcopy__(self, memo) -> "_RunnerCache":
        return _RunnerCache()

    def __reduce__(self):
        return (_RunnerCache, ())


def runner_for(target: PreTrainedModel, draft: Optional[PreTrainedModel]) -> SpecRunner:
    """The runner of this (target, draft) pair, kept on the target across generate() calls (an attribute,
    so it lives and dies with the model)."""
    per_target = target.__dict__.setdefault("_hf_specdec_runners", _RunnerCache())
    key = id(draft) if draft is not None else None
    runner = per_target.get(key)
    if runner is None or runner.draft is not draft:
        runner = per_target[key] = SpecRunner(target, draft)
    return runner
