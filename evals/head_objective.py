"""What a draft head is trained on and measured by (``train_draft_head.py``; EAGLE-1, see its docstring).

The frozen target gives features f (its last hidden state after the final norm) and logits. With a head whose
output layer covers only its kept tokens (``--kept-vocab``), the target's logits are computed for those tokens
alone and the head's loss reads its kept logits directly: the CE is over the kept tokens either way, and a
262k-token vocabulary (Gemma 3) no longer materialises (batch, length, vocab) fp32 tensors each step (16 GiB
at 32 x 512). Evaluation compares argmaxes over the whole vocabulary: it computes full logits a few windows at
a time (``windows_per_chunk``), and the greedy reference only at the last position.
"""
from __future__ import annotations

import inspect
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from hf_specdec.reduced_vocab import ReducedVocabHead, restrict_output_layer

# what a decoder layer calls its cache argument: past_key_values (transformers 5.17), cache (newer)
CACHE_KWARG = "cache" if "cache" in inspect.signature(LlamaDecoderLayer.forward).parameters else "past_key_values"


def teacher_layer(target, head) -> Optional[ReducedVocabHead]:
    """The target's output layer over the head's kept tokens (``restrict_output_layer``: rows and bias, in the
    head's ``token_ids`` order); None for a head over the whole vocabulary."""
    return None if head.lm_head is None else restrict_output_layer(target, head.lm_head.token_ids).requires_grad_(False)


@torch.no_grad()
def target_features(target, ids, autocast):
    """The frozen target's features f (fp32): its last hidden state after the final norm."""
    with autocast():
        return target.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state.float()


@torch.no_grad()
def target_logits(target, f, autocast, kept: Optional[ReducedVocabHead] = None):
    """The target's logits (fp32, soft-capped as its forward does) of features ``f``: over the whole vocabulary,
    or over the kept tokens only with ``kept`` (``teacher_layer``; capped here, in fp32, not by the head)."""
    with autocast():
        logits = target.get_output_embeddings()(f) if kept is None else F.linear(f, kept.weight, kept.bias)
    softcap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
    logits = logits.float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def target_outputs(target, ids, autocast, kept: Optional[ReducedVocabHead] = None):
    """Features and logits of the frozen target (``target_features``, ``target_logits``)."""
    f = target_features(target, ids, autocast)
    return f, target_logits(target, f, autocast, kept)


def windows_per_chunk(target, t: int, batch: int) -> int:
    """Windows of ``t`` tokens evaluated at once: at most ``batch``, and full-vocabulary logits of at most 2^27
    values (512 MiB in fp32; one 512-token window of a 262k vocabulary)."""
    vocab = target.config.get_text_config().vocab_size
    return max(1, min(batch, (1 << 27) // max(t * vocab, 1)))


def positions(n, t, device):
    return torch.arange(t, device=device).expand(n, t)


def unroll_mask(t: int, s: int, device) -> torch.Tensor:
    """``(1, 1, t, (s+1) t)`` bool, for unrolled step ``s`` (0-based) over the keys of steps 0..s: its query at
    position i sees step 0's keys at j <= i - s (read with the target's features) and step r's key at i - s + r
    for r = 1..s (each read with the step before's own guess), as draft step s + 1 of a round does at
    inference. Its own key (r = s) is always there: no row is empty."""
    i = torch.arange(t, device=device)[:, None]
    j = torch.arange(t, device=device)[None, :]
    return torch.cat([j <= i - s] + [j == i - s + r for r in range(1, s + 1)], dim=1)[None, None]


def unrolled_steps(head, ids, f, steps, autocast, through=None):
    """The head over a window, ``steps`` times (EAGLE-3's training-time test): step 0 reads the target's
    features f_i; step s reads at i the step before's own g at i-1 and attends as ``unroll_mask`` says. Yields
    (s, g, logits): logits over the head's kept tokens for a reduced head, else over the vocabulary; positions
    i < s have no such input and are left out of the loss. ``through``: a narrow head's logits are its target's
    kept rows over ``up(g)`` (``teacher_layer``), the layer its own output layer is folded from after training."""
    n, t = ids.shape
    reduced = head.lm_head is not None
    keep = torch.zeros(0, dtype=torch.long, device=ids.device) if reduced else None  # no scatter to the vocabulary
    tokens, pos, feats = ids[:, 1:], positions(n, t - 1, ids.device), f[:, :-1]
    cache = DynamicCache() if steps > 1 else None
    if cache is not None and head.config._attn_implementation != "sdpa":  # the bool mask means "attend" there only
        raise ValueError(f"unrolled steps need the head's sdpa attention, not {head.config._attn_implementation}")
    for s in range(steps):
        extra = {} if cache is None else {CACHE_KWARG: cache}  # pass 0: plain causal attention (flash, GQA)
        if s:
            extra["attention_mask"] = unroll_mask(t - 1, s, ids.device)
        with autocast():
            out = head(tokens, pos, feats, logits_to_keep=keep, **extra)
            layer = head.lm_head if through is None else through  # a narrow head: the target's rows over up(g)
            logits = layer.kept_logits(out.hidden) if reduced else out.logits
        yield s, out.hidden, logits
        feats = torch.cat([feats[:, :1], out.hidden[:, :-1].to(feats.dtype)], dim=1)


def head_loss(head, ids, f, logits_t, ce_weight, autocast, steps: int = 1, through=None):
    """EAGLE-1 loss of one batch of windows: smooth-L1 on g vs the next feature + w * soft CE, averaged over
    ``steps`` unrolled steps (1: EAGLE-1). ``logits_t``: the target's logits over the head's kept tokens for a
    reduced head (``target_outputs(..., kept)``), else over the vocabulary."""
    p = torch.softmax(logits_t[:, 1:], dim=-1)
    loss = feat_sum = ce_sum = 0.0
    for s, g, logits in unrolled_steps(head, ids, f, steps, autocast, through):
        feat = F.smooth_l1_loss(g.float()[:, s:], f[:, 1 + s:])
        ce = -(p[:, s:] * torch.log_softmax(logits.float()[:, s:], dim=-1)).sum(-1).mean()
        loss, feat_sum, ce_sum = loss + feat + ce_weight * ce, feat_sum + feat.detach(), ce_sum + ce.detach()
    return loss / steps, feat_sum / steps, ce_sum / steps


@torch.no_grad()
def top1_agreement(head, target, eval_windows, batch, device, autocast):
    """Share of positions where the head's argmax at i equals the target's argmax at i+1."""
    hits = count = 0
    batch = windows_per_chunk(target, eval_windows.shape[1], batch)
    for i in range(0, len(eval_windows), batch):
        ids = torch.from_numpy(eval_windows[i : i + batch].astype(np.int64)).to(device)
        f, logits_t = target_outputs(target, ids, autocast)
        n, t = ids.shape
        with autocast():
            out = head(ids[:, 1:], positions(n, t - 1, device), f[:, :-1])
        hits += int((out.logits.argmax(-1) == logits_t[:, 1:].argmax(-1)).sum())
        count += n * (t - 1)
    return hits / max(count, 1)


@torch.no_grad()
def greedy_continuation(target, prompts, k, autocast):
    seq = prompts
    for _ in range(k):
        logits = target_logits(target, target_features(target, seq, autocast)[:, -1:], autocast)
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[:, prompts.shape[1]:]


@torch.no_grad()
def head_drafts(head, target, prompts, k, autocast):
    """k greedy drafts: step 1 reads the target's features of the prompt, step j+1 reads (g of step j, draft j)."""
    f = target_features(target, prompts, autocast)
    n, ids, feats, drafts = prompts.shape[0], prompts[:, 1:], f[:, :-1], []
    keep = torch.tensor([-1], device=prompts.device)
    for _ in range(k):
        with autocast():
            out = head(ids, positions(n, ids.shape[1], prompts.device), feats, logits_to_keep=keep)
        d = out.logits[:, -1].argmax(-1, keepdim=True)
        drafts.append(d)
        ids, feats = torch.cat([ids, d], dim=1), torch.cat([feats, out.hidden[:, -1:].float()], dim=1)
    return torch.cat(drafts, dim=1)


@torch.no_grad()
def accepted_length(head, target, prompt_windows, k, batch, device, autocast):
    """Mean leading matches of the head's k greedy drafts with the target's greedy continuation, and the share
    of each draft step that matches given all earlier ones did."""
    accepted, reached = [], torch.zeros(k + 1)
    for i in range(0, len(prompt_windows), batch):
        prompts = torch.from_numpy(prompt_windows[i : i + batch].astype(np.int64)).to(device)
        ref = greedy_continuation(target, prompts, k, autocast)
        run = (head_drafts(head, target, prompts, k, autocast) == ref).long().cumprod(dim=1)
        accepted.append(run.sum(1).float().cpu())
        reached += torch.cat([torch.full((1,), float(len(prompts))), run.sum(0).float().cpu()])
    return {f"accepted_len_k{k}": float(torch.cat(accepted).mean()),
            "step_acceptance": [float(reached[j + 1] / max(reached[j], 1)) for j in range(k)]}


def evaluate(head, target, eval_windows, prompt_windows, args, device, autocast):
    top1 = top1_agreement(head, target, eval_windows, args.batch_size, device, autocast)
    return {"top1": top1, **accepted_length(head, target, prompt_windows, args.k, args.batch_size, device, autocast)}
