"""A draft whose output layer scores only N kept tokens of the target's vocabulary.

Why: Gemma 3 270M spends 168M of its 268M parameters on its 262k x 640 embedding / output
layer, so a draft with a full-vocabulary head reads nearly what the target reads per step.
``ReducedVocabHead`` multiplies by the N kept rows only and scatters the N logits into a
target-vocabulary-sized row filled with ``fill_value`` (a large finite negative), so
everything downstream is unchanged and sees target ids:

- Hugging Face's logits processors (repetition penalty, bad words, ...) index target ids;
- softmax gives exactly 0 outside the kept set, so the draft never proposes such a token
  and its probabilities ``q`` are a full-vocabulary row with zeros there;
- rejection sampling stays exact: where ``q = 0`` the residual ``max(0, p - q)`` is ``p``;
  greedy stays exact: a draft the target does not choose is rejected like any other.

The fill is finite rather than ``-inf`` so that no arithmetic on it gives NaN (``0 * -inf``
in an entropy, ``-inf - -inf``); ``exp(fill - max)`` is still exactly 0 in fp32.

The input embedding stays full-vocabulary (a lookup reads only the rows it uses).
Saving and loading: ``reduced_vocab_io.py``.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

_FILL = -1.0e30


def fill_value(dtype: torch.dtype) -> float:
    """The logit of a token outside the kept set: -1e30, or the dtype's lowest value where that overflows."""
    return max(_FILL, torch.finfo(dtype).min) if dtype.is_floating_point else _FILL


def check_token_ids(token_ids: Union[torch.Tensor, Sequence[int]], vocab_size: int) -> torch.Tensor:
    """Kept ids as a sorted int64 tensor; raises on duplicates, ids outside the vocabulary or an empty set."""
    ids = torch.as_tensor(token_ids, dtype=torch.long, device="cpu").flatten()  # not a device context's (meta)
    if ids.numel() == 0:
        raise ValueError("a reduced vocabulary needs at least one kept token id; got none.")
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.numel():
        raise ValueError(f"kept token ids must lie in [0, {vocab_size}) (the target's vocabulary); "
                         f"got {bad[:5].tolist()}{' ...' if bad.numel() > 5 else ''}.")
    unique = torch.unique(ids)
    if unique.numel() != ids.numel():
        raise ValueError(f"kept token ids contain {ids.numel() - unique.numel()} duplicates; pass each id once.")
    return unique  # torch.unique sorts


class ReducedVocabHead(nn.Module):
    """Logits for ``token_ids`` only, scattered into a ``vocab_size`` row filled with ``fill_value``.

    ``weight`` ``(N, hidden)``: the output rows of the kept tokens, in the order of ``token_ids`` ``(N,)``; both
    are kept sorted by id (the ids a buffer, saved with the weights). ``bias`` ``(N,)`` or None: the kept entries
    of the output layer's bias (Phi-style heads have one). ``softcap``: Gemma-style final logit soft-capping,
    applied to the kept logits here (capping the fill would turn it into ``-softcap`` and give it probability).
    Compile- and graph-friendly: one matmul and one ``index_copy`` (none when every token is kept), no host work.
    """

    def __init__(self, weight: torch.Tensor, token_ids: torch.Tensor, vocab_size: int,
                 softcap: Optional[float] = None, bias: Optional[torch.Tensor] = None):
        super().__init__()
        given = torch.as_tensor(token_ids, dtype=torch.long, device="cpu").flatten()  # not a device context's (meta)
        ids = check_token_ids(given, vocab_size)
        if weight.dim() != 2 or weight.shape[0] != ids.numel():
            raise ValueError(f"ReducedVocabHead needs one weight row per kept token: {ids.numel()} ids, "
                             f"weight of shape {tuple(weight.shape)}.")
        if bias is not None and tuple(bias.shape) != (ids.numel(),):
            raise ValueError(f"ReducedVocabHead needs one bias entry per kept token: {ids.numel()} ids, "
                             f"bias of shape {tuple(bias.shape)}.")
        order = given.argsort().to(weight.device)  # rows given in the order of token_ids, kept in the ids' order
        self.weight = nn.Parameter(weight.detach()[order])  # a gather: a copy of its own
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = nn.Parameter(bias.detach().to(device=weight.device, dtype=weight.dtype)[order])
        self.register_buffer("token_ids", ids.to(weight.device))
        self.vocab_size = int(vocab_size)
        self.softcap = softcap

    @property
    def num_kept(self) -> int:
        return self.token_ids.numel()

    def kept_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``(..., N)`` of the kept tokens, in ``token_ids`` order (what distillation trains)."""
        logits = F.linear(hidden, self.weight, self.bias)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kept = self.kept_logits(hidden)
        if self.num_kept == self.vocab_size:  # sorted unique ids of every token: in place already (a narrow head's)
            return kept
        full = kept.new_full((*kept.shape[:-1], self.vocab_size), fill_value(kept.dtype))
        return full.index_copy(-1, self.token_ids, kept)

    def extra_repr(self) -> str:
        return (f"kept={self.num_kept}, vocab_size={self.vocab_size}, hidden={self.weight.shape[1]}, "
                f"bias={self.bias is not None}, softcap={self.softcap}")


def reduced_head(model: nn.Module) -> Optional[ReducedVocabHead]:
    """The model's ``ReducedVocabHead``, or None for a model with an ordinary output layer."""
    head = model.get_output_embeddings()
    return head if isinstance(head, ReducedVocabHead) else None


def _text_configs(model: nn.Module) -> list:
    configs = [model.config]
    text = model.config.get_text_config()
    return configs if text is model.config else configs + [text]


def restrict_output_layer(model: nn.Module, token_ids: Union[torch.Tensor, Sequence[int]]) -> ReducedVocabHead:
    """``model``'s output layer over ``token_ids`` only, as a ``ReducedVocabHead`` (the layer's dtype and device):
    its rows, its bias's entries and its final soft-cap, so its kept logits are the model's at those ids.

    The one place that slices an output layer: ``reduce_vocab``, draft heads and the evals' teachers
    (distillation, head training) all start from it, so none drops the bias or the cap.
    """
    out = model.get_output_embeddings()
    if out is None or not isinstance(getattr(out, "weight", None), torch.Tensor):
        raise ValueError(f"{type(model).__name__} has no output layer with a weight (get_output_embeddings() is "
                         f"{type(out).__name__}); a reduced vocabulary needs a causal LM with a linear output layer.")
    text = model.config.get_text_config()
    vocab = text.vocab_size
    if out.weight.shape[0] < vocab:
        raise ValueError(f"output layer has {out.weight.shape[0]} rows but the vocabulary has {vocab} tokens.")
    ids = check_token_ids(token_ids, vocab)
    at = ids.to(out.weight.device)
    bias = getattr(out, "bias", None)
    with torch.no_grad():
        rows, bias = out.weight.index_select(0, at), None if bias is None else bias.index_select(0, at)
    return ReducedVocabHead(rows, ids, vocab, getattr(text, "final_logit_softcapping", None), bias)


def reduce_vocab(model: nn.Module, token_ids: Union[torch.Tensor, Sequence[int]]) -> nn.Module:
    """Replace ``model``'s output layer (in place) by a ``ReducedVocabHead`` over ``token_ids``.

    The head starts from the current output rows (and bias entries) of the kept tokens (a tied embedding
    is untied: the input embedding stays full and unchanged). The model keeps the target's vocabulary
    size, so it passes hf_specdec's vocabulary check and emits target ids. Returns ``model``.
    """
    if reduced_head(model) is not None:
        raise ValueError(f"{type(model).__name__} already has a reduced output vocabulary; reduce the original model.")
    head = restrict_output_layer(model, token_ids)
    for config in _text_configs(model):
        config.tie_word_embeddings = False  # never re-tie: the head's weight is not the embedding
        if getattr(config, "final_logit_softcapping", None) is not None:
            config.final_logit_softcapping = None  # now inside the head
    model.set_output_embeddings(head)
    return model
