"""Tiny random models for the tests: a target per family and drafts that accept all, some or nothing."""
from __future__ import annotations

import copy

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB = 97


def _config(family: str, vocab: int, layers: int, hidden: int):
    common = dict(vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "llama":
        return LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **common)
    if family == "qwen2":
        return Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256, **common)
    if family == "gpt2":
        return GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=256, **common)
    raise ValueError(family)


_CLASSES = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "gpt2": GPT2LMHeadModel}


def make_model(family: str, seed: int, vocab: int = VOCAB, layers: int = 2, hidden: int = 32, sharpen: float = 4.0):
    """A random model whose next-token distributions are peaked enough for greedy ties to be impossible."""
    torch.manual_seed(seed)
    model = _CLASSES[family](_config(family, vocab, layers, hidden)).eval()
    with torch.no_grad():
        # A fresh, untied head: tied embeddings make random models "repeat the last token",
        # which any two random models then agree on.
        head = model.get_output_embeddings()
        model.config.tie_word_embeddings = False
        w = head.weight.detach()
        head.weight = torch.nn.Parameter(torch.randn_like(w) * w.std() * sharpen)
    return model


def make_draft(target, kind: str, seed: int = 123):
    """'full': a copy (accepts every greedy draft); 'mix': a copy with weight noise; 'none': unrelated."""
    if kind == "full":
        return copy.deepcopy(target)
    if kind == "mix":
        draft = copy.deepcopy(target)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in draft.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5 * p.std().clamp(min=1e-3))
        return draft
    if kind == "none":
        family = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "GPT2LMHeadModel": "gpt2"}[type(target).__name__]
        return make_model(family, seed, vocab=target.config.vocab_size)
    raise ValueError(kind)


def left_padded_prompts(batch: int, seed: int, min_len: int = 2, max_len: int = 11, vocab: int = VOCAB):
    """Prompts of different lengths, left-padded with pad id 0, never containing pad/bos/eos ids."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (batch,), generator=gen)
    lens[0] = max_len
    width = int(lens.max())
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for b, n in enumerate(lens.tolist()):
        ids[b, width - n:] = torch.randint(3, vocab, (n,), generator=gen)
        mask[b, width - n:] = 1
    return ids, mask


class RecordingStreamer:
    """A streamer that keeps what it is given (each put as a list) and counts its end() calls."""

    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended += 1
