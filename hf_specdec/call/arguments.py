"""The generate() arguments hf_specdec reads from the user, taken in the forms users pass them.

``spec_config`` may be a dict, as generation settings often are; the draft must be a loaded
model (as transformers requires of ``assistant_model``); and a ``tokenizer`` /
``assistant_tokenizer`` pair (transformers' universal assisted generation) must share one
vocabulary, since the target verifies the draft's token ids as they are.
"""
from __future__ import annotations

from dataclasses import fields, replace

import torch

from .config import SpecConfig


def as_spec_config(value) -> SpecConfig:
    """``SpecConfig``, a dict of its fields, or None (the defaults)."""
    if value is None:
        return SpecConfig()
    if isinstance(value, SpecConfig):
        return value
    if isinstance(value, dict):
        names = [f.name for f in fields(SpecConfig)]
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise ValueError(f"spec_config has unknown keys {unknown}; SpecConfig's fields are {names}.")
        return SpecConfig(**value)
    raise TypeError(f"spec_config must be a hf_specdec.SpecConfig or a dict of its fields; got {type(value).__name__} "
                    f"{value!r}.")


def with_proposer(spec: SpecConfig, draft) -> SpecConfig:
    """A draft head (``hf_specdec.DraftHead``) passed as ``assistant_model`` drafts by ``method="head"``: the
    default ``method="draft"`` becomes it. ``method="head"`` with another assistant (or none) raises."""
    is_head = getattr(draft, "reads_target_hidden", False)
    if is_head and spec.method == "draft":
        return replace(spec, method="head")
    if spec.method == "head" and not is_head and spec.num_speculative_tokens:
        raise ValueError(f"SpecConfig(method='head') drafts with a draft head, but assistant_model is "
                         f"{type(draft).__name__ if draft is not None else None}: pass "
                         "assistant_model=hf_specdec.load_draft_head(path, target=model) (or DraftHead.for_target).")
    return spec


def check_draft_model(draft) -> None:
    """The draft is a model object, not a path or a name."""
    if draft is None or isinstance(draft, torch.nn.Module):
        return
    if isinstance(draft, (str, bytes)) or hasattr(draft, "__fspath__"):
        raise TypeError(f"assistant_model must be a loaded model, not the path or name {draft!r}: load it first, e.g. "
                        f"assistant_model=AutoModelForCausalLM.from_pretrained({str(draft)!r}).")
    raise TypeError(f"assistant_model must be a loaded model (a PreTrainedModel); got {type(draft).__name__}.")


def check_tokenizers(tokenizer, assistant_tokenizer) -> None:
    """transformers' universal assisted generation translates between two tokenizers; hf_specdec needs one."""
    if assistant_tokenizer is None:
        return
    if tokenizer is None:
        raise ValueError("assistant_tokenizer= was given without tokenizer=: pass the target's tokenizer too, so that "
                         "the two vocabularies can be compared (hf_specdec needs them to be the same).")
    target, draft = tokenizer.get_vocab(), assistant_tokenizer.get_vocab()
    if target == draft:
        return
    differ = sorted(t for t in set(target) | set(draft) if target.get(t) != draft.get(t))
    example = ", ".join(f"{t!r}: {target.get(t)} vs {draft.get(t)}" for t in differ[:3])
    raise ValueError(
        f"tokenizer and assistant_tokenizer have different vocabularies ({len(target)} vs {len(draft)} tokens; "
        f"{len(differ)} differ, e.g. {example}). hf_specdec verifies the draft's token ids as they are, so the "
        "draft must use the target's tokenizer (universal assisted generation across tokenizers is not supported). "
        "Use a draft trained with the target's tokenizer, or drop spec_config to use transformers' own assisted "
        "generation."
    )
