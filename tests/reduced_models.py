"""Tiny targets and reduced-vocabulary drafts for the reduced-vocabulary tests."""
from __future__ import annotations

import copy

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from hf_specdec.reduced_vocab import reduce_vocab
from models import make_model

SPECIAL = (0, 1, 2)  # pad, bos, eos of the tiny models


def make_gemma(seed: int, vocab: int, softcap=None, sharpen: float = 4.0):
    """A random 2-layer Gemma 3 (one sliding layer, window 8) with an untied, sharpened head."""
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                           layer_types=["sliding_attention", "full_attention"], sliding_window=8,
                           max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           final_logit_softcapping=softcap, tie_word_embeddings=False)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        w = model.lm_head.weight
        w.copy_(torch.randn_like(w) * w.std() * sharpen)
    return model


def make_phi(seed: int, vocab: int, sharpen: float = 4.0):
    """A random 2-layer Phi: its output layer has a bias (Phi-2 style), made random here (it starts at zero)."""
    from transformers import PhiConfig, PhiForCausalLM

    torch.manual_seed(seed)
    cfg = PhiConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0,
                    bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = PhiForCausalLM(cfg).eval()
    with torch.no_grad():
        w, b = model.lm_head.weight, model.lm_head.bias
        w.copy_(torch.randn_like(w) * w.std() * sharpen)
        b.copy_(torch.randn_like(b))  # as large as the logits' spread: a dropped bias shows
    return model


def make_target(family: str, seed: int, vocab: int):
    return make_gemma(seed, vocab) if family == "gemma3" else make_model(family, seed=seed, vocab=vocab)


def random_kept(vocab: int, n: int, seed: int, include=(), exclude=()) -> torch.Tensor:
    """``n`` token ids: the special ids and ``include`` first, then random others, never ``exclude``."""
    gen = torch.Generator().manual_seed(seed)
    chosen = list(dict.fromkeys([*SPECIAL, *[int(t) for t in include]]))
    banned = set(chosen) | {int(t) for t in exclude}
    for t in torch.randperm(vocab, generator=gen).tolist():
        if len(chosen) >= n:
            break
        if t not in banned:
            chosen.append(t)
    return torch.tensor(sorted(chosen))


def reduced_copy(target, kept, noise: float = 0.0, seed: int = 7):
    """The target itself with its output layer reduced to ``kept``; ``noise`` perturbs every weight but the
    input embedding (which a distilled draft keeps frozen as the target's)."""
    draft = copy.deepcopy(target)
    if noise:
        gen = torch.Generator().manual_seed(seed)
        embedding = draft.get_input_embeddings().weight
        with torch.no_grad():
            for p in draft.parameters():
                if p is embedding:
                    continue
                p.add_(torch.randn(p.shape, generator=gen) * noise * p.std().clamp(min=1e-3))
    return reduce_vocab(draft, kept)
