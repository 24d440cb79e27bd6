"""``enable(model)``: give one model's ``generate()`` a ``spec_config=`` keyword.

transformers does not forward ``assistant_model`` or ``streamer`` to a ``custom_generate``
callable, so the wrapper moves them under the callable's own parameter names
(``draft_model``, ``spec_streamer``) and lets transformers do all its usual preparation.
Without ``spec_config`` the call goes to the original ``generate`` untouched.
"""
from __future__ import annotations

import functools

from transformers import PreTrainedModel

from .generate import speculative_generate


def enable(model: PreTrainedModel) -> PreTrainedModel:
    if getattr(model.generate, "_hf_specdec_enabled", False):
        return model
    original = model.generate

    @functools.wraps(original)
    def generate(*args, spec_config=None, **kwargs):
        if spec_config is None:
            return original(*args, **kwargs)
        if kwargs.get("custom_generate") is not None:
            raise ValueError("spec_config and custom_generate cannot be combined: spec_config already uses it.")
        kwargs["draft_model"] = kwargs.pop("assistant_model", None)
        streamer = kwargs.pop("streamer", None)
        if streamer is not None:
            kwargs["spec_streamer"] = streamer
        return original(*args, custom_generate=speculative_generate, spec_config=spec_config, **kwargs)

    generate._hf_specdec_enabled = True
    model.generate = generate
    return model
