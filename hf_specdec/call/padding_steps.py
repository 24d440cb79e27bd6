"""``output_scores`` / ``output_logits`` of rows that finished early, as plain generate() returns them.

Plain generate keeps computing every row until the whole batch stops: a finished row is fed
pad tokens, and its logits and processed scores at those padding steps are returned with the
rest. Speculative rounds drop finished rows, so at the end the padding steps are computed the
same way: one forward of the target over the finished rows' padded sequences (attention mask
and position ids as plain generate builds them), then the logits processors step by step with
the whole batch's ``input_ids`` at that step.
"""
from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel

from .batch_state import SequenceBatch
from .committer import Committer


@torch.no_grad()
def add_padding_steps(model: PreTrainedModel, batch: SequenceBatch, committer: Committer, logits,
                      pad_token_id: int, vocab_size: int) -> None:
    """Extend the kept scores / logits of every row shorter than the longest (``logits``: the
    call's processors, a ``GraphLogits`` or ``HostLogits``)."""
    if not (committer.keep_scores or committer.keep_logits):
        return
    steps = max(batch.gen_len, default=0)
    short = [b for b, n in enumerate(batch.gen_len) if n < steps]
    if not short:
        return
    P, device = batch.prompt_width, batch.device
    sequences = batch.sequences(pad_token_id)  # plain generate's input_ids, pad after a row's end
    first = min(batch.gen_len[b] for b in short)
    rows = torch.tensor(short, device=device)
    every = torch.arange(batch.size, device=device)
    mask = (torch.arange(P + steps - 1, device=device) >= torch.tensor(batch.pads, device=device)[:, None]).long()
    kwargs = {"input_ids": sequences[rows, : P + steps - 1], "attention_mask": mask[rows]}
    if "position_ids" in inspect.signature(model.forward).parameters:
        kwargs["position_ids"] = (mask[rows].cumsum(-1) - 1).clamp(min=0)
    raw = model(**kwargs, logits_to_keep=steps - first).logits[..., :vocab_size].float()  # steps first..steps-1
    for t in range(first, steps):
        index = [i for i, b in enumerate(short) if batch.gen_len[b] <= t]
        members = rows[index]
        step_raw = raw[index, t - first]
        if committer.keep_scores:
            full = step_raw.new_zeros(batch.size, step_raw.shape[-1])
            full[members] = step_raw
            ids = sequences[:, : P + t]
            scores = logits(full, ids, every, torch.full_like(every, P + t), batch_rows=every)[members]
        committer.keep(members.tolist(), scores if committer.keep_scores else None, step_raw)
