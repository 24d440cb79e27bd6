"""Tiny random models and a driver of the paged cache for the tests/test_cache_*.py files.

The driver uses the cache's own API as a ragged decoding loop would (the runner uses it in fixed shapes):
``add_sequences`` / ``reserve`` / ``batch`` / ``paged_forward`` / ``set_lengths`` (rollback), under
``paged_attention_enabled``.
"""
from __future__ import annotations

import torch
import transformers

from hf_specdec.cache import PagedKVCache, paged_forward
from hf_specdec.call.request import cache_keyword

VOCAB = 96

_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=256, initializer_range=0.2)


def _llama():
    return transformers.LlamaConfig(**_COMMON, num_key_value_heads=2)


def _qwen2():
    return transformers.Qwen2Config(**_COMMON, num_key_value_heads=2)


def _qwen2_sliding():
    # Layer 0 full attention, layer 1 a sliding window of 8.
    return transformers.Qwen2Config(**_COMMON, num_key_value_heads=2, use_sliding_window=True,
                                    sliding_window=8, max_window_layers=1)


def _mistral():
    return transformers.MistralConfig(**_COMMON, num_key_value_heads=1, sliding_window=None)


def _mistral_sliding():
    return transformers.MistralConfig(**_COMMON, num_key_value_heads=1, sliding_window=8)


def _gpt2():
    return transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256,
                                   initializer_range=0.2, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def _gemma2():
    # Alternating sliding (window 8) / full layers, attention logit soft-capping small enough to bite.
    return transformers.Gemma2Config(**_COMMON, num_key_value_heads=2, head_dim=8, sliding_window=8,
                                     attn_logit_softcapping=2.0, final_logit_softcapping=30.0,
                                     query_pre_attn_scalar=8)


def _phi3():
    return transformers.Phi3Config(**_COMMON, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _opt():
    return transformers.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=32,
                                  init_std=0.2, dropout=0.0, attention_dropout=0.0, pad_token_id=1)


def _gpt_neox():
    return transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, max_position_embeddings=256, rotary_pct=0.5,
                                      initializer_range=0.2, hidden_dropout=0.0, attention_dropout=0.0)


CONFIGS = {
    "llama_gqa": _llama,
    "qwen2": _qwen2,
    "qwen2_sliding": _qwen2_sliding,
    "mistral": _mistral,
    "mistral_sliding8": _mistral_sliding,
    "gpt2": _gpt2,
    "gemma2_softcap_sliding": _gemma2,
    "phi3": _phi3,
    "opt": _opt,
    "gpt_neox": _gpt_neox,
}


def build_model(name: str, attn_implementation: str = "eager", seed: int = 0, **overrides):
    config = CONFIGS[name]()
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation,
                                                          dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits ``(len(tokens), V)`` of Hugging Face's own full forward over ``tokens``."""
    ids = torch.tensor([tokens])
    return model(input_ids=ids, use_cache=False).logits[0].float()


@torch.no_grad()
def hf_logits_with_cache(model, prefix: list[int], new: list[int]) -> torch.Tensor:
    """Logits ``(len(new), V)``: HF builds a DynamicCache on ``prefix``, then runs ``new`` on it."""
    cache = {cache_keyword(model): transformers.DynamicCache(config=model.config)}
    n = len(prefix)
    if n:
        model(input_ids=torch.tensor([prefix]), use_cache=True, position_ids=torch.arange(n)[None], **cache)
    out = model(input_ids=torch.tensor([new]), use_cache=True, position_ids=torch.arange(n, n + len(new))[None],
                **cache)
    return out.logits[0].float()


def shuffled_cache(num_blocks: int = 96, block_size: int = 4, max_seqs: int = 16, max_seq_len: int = 96,
                   seed: int = 0) -> PagedKVCache:
    """A cache whose free list is shuffled: filler sequences take blocks, some are freed in a random order.

    The surviving fillers keep holding blocks interleaved with the free ones, so the
    sequences added next get non-contiguous, non-monotonic block ids.
    """
    cache = PagedKVCache(num_blocks, block_size, max_seqs, max_seq_len, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    fillers = cache.add_sequences(8)
    for r in fillers:
        cache.reserve([r], [int(torch.randint(1, 4, (), generator=gen)) * block_size])
    for i in torch.randperm(len(fillers), generator=gen).tolist()[:5]:
        cache.free([fillers[i]])
    return cache


class PagedRunner:
    """Sequences on a paged cache, driven the way TargetScorer drives them."""

    def __init__(self, model, cache: PagedKVCache):
        self.model = model
        self.cache = cache
        self.rows: list[int] = []
        self.tokens: dict[int, list[int]] = {}  # row -> tokens whose K/V are in the cache

    def add(self, count: int) -> list[int]:
        rows = self.cache.add_sequences(count)
        self.rows += rows
        self.tokens.update({r: [] for r in rows})
        return rows

    @torch.no_grad()
    def step(self, rows: list[int], new: list[list[int]], commit: bool = True) -> list[torch.Tensor]:
        """One packed forward of ``new[i]`` after row ``rows[i]``'s cached tokens; logits of every new token."""
        context = [len(self.tokens[r]) for r in rows]
        qlens = [len(t) for t in new]
        self.cache.reserve(rows, [c + q for c, q in zip(context, qlens)])
        step = self.cache.batch(torch.tensor(rows), torch.tensor(context), torch.tensor(qlens), max(qlens), sum(qlens))
        input_ids = torch.tensor([t for seq in new for t in seq], dtype=torch.long)
        logits = paged_forward(self.model, input_ids, step, torch.arange(input_ids.shape[0]))
        for r, t in zip(rows, new):
            self.tokens[r] = self.tokens[r] + list(t)
        if commit:
            self.cache.set_lengths(rows, [len(self.tokens[r]) for r in rows])
        return list(logits.split(qlens))

    def rollback(self, rows: list[int], lengths: list[int]) -> None:
        self.cache.set_lengths(rows, lengths)
        for r, n in zip(rows, lengths):
            self.tokens[r] = self.tokens[r][:n]
