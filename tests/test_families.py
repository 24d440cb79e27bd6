"""Families that transformers releases move onto the AttentionInterface, checked by behaviour.

Whether a family routes attention through transformers' AttentionInterface
(``_supports_attention_backend``) is read from the installed release at run time, not
assumed: GPT-J and CodeGen have it in transformers 5.24 and lack it in 5.17. With it,
speculative greedy output equals the target's own greedy ``generate()`` (the fixed-shape
runner); without it, ``generate()`` refuses with the class name and
the reason, and the model is left as it was. A release that gives a family the interface
moves it from one check to the other: only a wrong output can turn it red.
"""
import copy

import pytest
import torch
import transformers

import hf_specdec
from models import VOCAB, left_padded_prompts

_IDS = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
_ROTARY = dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=128)

FAMILIES = {
    "GPTJForCausalLM": lambda: transformers.GPTJConfig(**_IDS, **_ROTARY),
    "CodeGenForCausalLM": lambda: transformers.CodeGenConfig(**_IDS, **_ROTARY, n_ctx=128),
    "BloomForCausalLM": lambda: transformers.BloomConfig(**_IDS, hidden_size=32, n_layer=2, n_head=4),
    "FalconForCausalLM": lambda: transformers.FalconConfig(**_IDS, hidden_size=32, num_hidden_layers=2,
                                                           num_attention_heads=4),
    "MptForCausalLM": lambda: transformers.MptConfig(**_IDS, d_model=32, n_heads=4, n_layers=2),
    "GPTNeoForCausalLM": lambda: transformers.GPTNeoConfig(**_IDS, hidden_size=32, num_layers=2, num_heads=4,
                                                           attention_types=[[["global", "local"], 1]],
                                                           window_size=6, max_position_embeddings=128),
}
MAX_NEW = 13


def _model(cls_name, seed=0):
    """A random model of the family whose next-token distributions are peaked (no greedy near-ties)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[cls_name](), dtype=torch.float32).eval()
    assert type(model).__name__ == cls_name
    with torch.no_grad():
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(torch.randn_like(head.weight) * head.weight.std() * 4.0)
    return hf_specdec.enable(model)


def _noisy_copy(target, scale=0.1):
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp(min=1e-3))
    return draft


def _spec(target, draft, ids, mask):
    return target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, do_sample=False,
                           max_new_tokens=MAX_NEW, return_dict_in_generate=True,
                           spec_config=hf_specdec.SpecConfig(num_speculative_tokens=3, block_size=4,
                                                             adaptive=False))


@pytest.mark.parametrize("cls_name", list(FAMILIES))
def test_family_greedy_exact_with_interface_refused_without(cls_name):
    target = _model(cls_name)
    ids, mask = left_padded_prompts(3, seed=11)
    expected = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW)
    if getattr(type(target), "_supports_attention_backend", False):
        # A draft that often agrees (runs accepted, rollbacks mid-run) and an unrelated one (first-token rejections).
        for kind, draft in (("noisy copy", _noisy_copy(target)), ("unrelated", _model(cls_name, seed=1))):
            out = _spec(target, draft, ids, mask)
            assert torch.equal(out.sequences, expected), f"{cls_name}, {kind} draft"
            if kind == "noisy copy":
                assert 0 < out.spec_metrics.acceptance_rate < 1
        return
    impl = target.config._attn_implementation
    for draft in (copy.deepcopy(target), None):
        with pytest.raises(ValueError, match=cls_name) as info:
            _spec(target, draft, ids, mask) if draft is not None else target.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW,
                spec_config=hf_specdec.SpecConfig(method="ngram"))
        assert "AttentionInterface" in str(info.value)
    assert target.config._attn_implementation == impl
    assert torch.equal(target.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                       max_new_tokens=MAX_NEW), expected)
