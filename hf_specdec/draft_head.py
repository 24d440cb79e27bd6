"""A draft head: a small model on the target's own hidden states (EAGLE-style), used as ``assistant_model=``.

    head = DraftHead.for_target(target)                  # random; evals/train_draft_head.py trains one
    save_draft_head(head, "runs/head")
    head = load_draft_head("runs/head", target=target)   # refuses a head saved for another target
    target.generate(ids, assistant_model=head, spec_config=SpecConfig(num_speculative_tokens=4))

What it computes. Position i of the head reads the target's feature ``f_i`` (its last hidden state, after the
final norm: what its output layer reads) together with the embedding of token ``t_{i+1}``; one decoder layer
over those pairs (its own paged KV cache) and a norm give ``g_i``, a guess of ``f_{i+1}``, whose logits through
the *target's* output layer propose ``t_{i+2}``. The next draft step reads ``(g_i, the token just drafted)``:

    x_i = fc([embed(t_{i+1}), f_i])     g_i = norm(layer(x_i))     logits_i = lm_head(g_i)

The embedding and output layer are the target's own modules (shared, not copied, not saved), so a head costs a
decoder layer and a ``2H x H`` projection: a few percent of the target's step, against a separate draft model's
whole stack. Where the output layer is most of that (a 128k or 262k vocabulary), ``kept_ids`` gives the head an
output layer of its own over those tokens only (``reduced_vocab.ReducedVocabHead``, as EAGLE-3's draft
vocabulary): it never proposes another token, and the output stays exact. A *narrow* head (``hidden_size=`` below
the target's) runs its layer at that width: ``fc`` maps the pair down, an output layer of its own reads ``g_i``, and
``up`` (``h x H``) carries ``g_i`` back to the target's width as the next step's feature. Where the target is small
(the project's pair: a target-wide layer reads more bytes than the 29M draft model's whole step) that is what makes
a head cheaper than a draft model. The round that runs it is ``round/proposers.HeadProposer``; the target's
features come out of its verify forward (``cache.paged_forward(..., hidden=True)``), no extra forward. The runner
compiles it as it does a draft model (its layer, fc, norm and ``up``; the target's modules it reads run as they are).

Files: ``config.json`` (a ``LlamaConfig`` of the head's layer), ``model.safetensors`` (fc, layers, norm, up, and
probe rows of the target's embedding and output layer), ``draft_head.json`` (format, the target's class and
sizes).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import (LlamaDecoderLayer, LlamaPreTrainedModel, LlamaRMSNorm,
                                                       LlamaRotaryEmbedding)
from transformers.utils import ModelOutput

from .reduced_vocab import ReducedVocabHead, restrict_output_layer
from .weight_probe import matches_probe, probe

FORMAT = "hf_specdec.draft_head/1"
META_FILE = "draft_head.json"
WEIGHTS_FILE = "model.safetensors"
_PROBES = {"embedding": "hf_specdec.target_embedding_probe", "lm_head": "hf_specdec.target_lm_head_probe"}


@dataclass
class DraftHeadOutput(ModelOutput):
    logits: Optional[torch.Tensor] = None  # (1 or batch, kept tokens, V) of the rows ``logits_to_keep`` names
    hidden: Optional[torch.Tensor] = None  # (1 or batch, T, H) g_i of every token: the next step's features


class DraftHead(LlamaPreTrainedModel):
    """One (or a few) decoder layers over (token embedding, target feature) pairs; see the module docstring."""

    reads_target_hidden = True  # the runner feeds it the target's features (runner/paged_model.py)

    def __init__(self, config: LlamaConfig):
        super().__init__(config)
        hidden = config.hidden_size
        features = getattr(config, "hf_specdec_feature_size", None) or hidden  # the target's width
        self.fc = nn.Linear(2 * features, hidden, bias=False)
        self.up = nn.Linear(hidden, features, bias=False) if features != hidden else None  # a narrow head's g -> f
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        kept = getattr(config, "hf_specdec_kept", None)  # an output layer of its own over that many tokens
        bias = torch.zeros(kept) if kept and getattr(config, "hf_specdec_kept_bias", False) else None  # the target's
        self.lm_head = None if not kept else ReducedVocabHead(torch.zeros(kept, hidden),
                                                              torch.arange(kept, device="cpu"), config.vocab_size,
                                                              bias=bias)
        self._target: tuple = ()  # (input embedding, output layer, final soft-cap) of the target: ``bind``
        self.post_init()

    @classmethod
    def for_target(cls, target: PreTrainedModel, num_layers: int = 1, intermediate_size: Optional[int] = None,
                   kept_ids=None, hidden_size: Optional[int] = None) -> "DraftHead":
        """A freshly initialised head sized for ``target`` (its hidden size, heads, vocabulary), on its device and
        in its dtype, bound to it. ``kept_ids``: the only tokens it proposes, through an output layer of its own
        (initialised from the target's rows of those tokens). ``hidden_size``: a narrow head's width (a multiple of
        the target's head_dim; its heads are that many head_dims, its MLP the target's in proportion); it has an
        output layer of its own, over ``kept_ids`` or the whole vocabulary, started as the target's rows through
        ``up``."""
        if num_layers < 1:
            raise ValueError(f"num_layers={num_layers}: a draft head has at least one decoder layer (1 is EAGLE's).")
        check_target(target)
        tc = target.config.get_text_config()
        features = tc.hidden_size
        heads = tc.num_attention_heads
        head_dim = getattr(tc, "head_dim", None) or features // heads
        kv_heads = getattr(tc, "num_key_value_heads", None) or heads
        hidden, inter = features, intermediate_size or getattr(tc, "intermediate_size", None) or 4 * features
        if hidden_size is not None and hidden_size != features:
            if hidden_size <= 0 or hidden_size % head_dim:
                raise ValueError(f"hidden_size={hidden_size}: a narrow head's width must be a positive multiple of "
                                 f"the target's head_dim ({head_dim}), "
                                 f"e.g. {max(1, features // 4 // head_dim) * head_dim}.")
            hidden, heads = hidden_size, hidden_size // head_dim
            kv_heads = math.gcd(heads, kv_heads)  # grouped as the target where the counts allow
            inter = intermediate_size or max(64, inter * hidden // features // 64 * 64)
            if kept_ids is None:  # the target's output layer reads its own width: a layer of the head's own
                kept_ids = torch.arange(tc.vocab_size)
        config = LlamaConfig(
            vocab_size=tc.vocab_size, hidden_size=hidden, num_hidden_layers=num_layers, intermediate_size=inter,
            num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
            max_position_embeddings=getattr(tc, "max_position_embeddings", None) or 4096,
            rms_norm_eps=getattr(tc, "rms_norm_eps", None) or 1e-6, tie_word_embeddings=False,
            pad_token_id=getattr(tc, "pad_token_id", None), bos_token_id=getattr(tc, "bos_token_id", None),
            eos_token_id=getattr(tc, "eos_token_id", None),
        )
        config._attn_implementation = "sdpa"
        if hidden != features:
            config.hf_specdec_feature_size = features
        weight = target.get_output_embeddings().weight
        head = cls(config).to(device=weight.device, dtype=weight.dtype)
        config.hf_specdec_target = target_fingerprint(target)
        if kept_ids is not None:
            rows = restrict_output_layer(target, kept_ids)  # its rows and bias; bind sets the cap
            if head.up is None:
                head.lm_head = rows
            else:  # its logits start as the target's output layer over up(g)
                head.lm_head = ReducedVocabHead(rows.weight.new_zeros(rows.num_kept, hidden), rows.token_ids,
                                                rows.vocab_size, rows.softcap, rows.bias)
                head.fold_output_layer(rows)
            config.hf_specdec_kept = head.lm_head.num_kept
            config.hf_specdec_kept_bias = head.lm_head.bias is not None  # a bias to allocate on load
        return head.rope_in_fp32().bind(target)

    @torch.no_grad()
    def fold_output_layer(self, rows: ReducedVocabHead) -> None:
        """A narrow head's own output layer set to ``rows`` (its target's over the kept tokens,
        ``restrict_output_layer``) through ``up``: logits(g) = rows(up(g)). What ``for_target`` starts from, and what
        training ends with (``evals/head_objective.py`` trains ``up`` through the target's rows)."""
        if self.up is None or self.lm_head is None:
            raise ValueError("fold_output_layer is for a narrow head (DraftHead.for_target(..., hidden_size=...)).")
        self.lm_head.weight.copy_(rows.weight.to(self.up.weight.dtype) @ self.up.weight)
        if rows.bias is not None:
            self.lm_head.bias.copy_(rows.bias)

    def rope_in_fp32(self) -> "DraftHead":
        """Rotary frequencies in fp32 after a cast to the target's dtype (``.to`` casts buffers too): in bf16 the
        angles drift by about a radian at position 1000 from the fp32 ones the head was trained with."""
        fresh = LlamaRotaryEmbedding(self.config)
        for name in ("inv_freq", "original_inv_freq"):
            if hasattr(self.rotary_emb, name):
                setattr(self.rotary_emb, name, getattr(fresh, name).to(self.fc.weight.device))
        return self

    def bind(self, target: PreTrainedModel) -> "DraftHead":
        """Read through ``target``'s own embedding and output layer from now on (not copied, not registered)."""
        softcap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
        self._target = (target.get_input_embeddings(), target.get_output_embeddings(), softcap)
        if self.lm_head is not None:
            self.lm_head.softcap = softcap
        return self

    def prepare_skeleton(self) -> None:
        """For ``runner/compile_worker.py``'s skeleton (no target, uninitialised memory): stand-ins of the target's
        embedding and output layer, and valid kept ids. Compiled code depends on their shapes, not their values."""
        weight, vocab = self.fc.weight, self.config.vocab_size
        stand_in = dict(device=weight.device, dtype=weight.dtype)
        self._target = (nn.Embedding(vocab, self.feature_size, **stand_in),
                        nn.Linear(self.feature_size, vocab, bias=False, **stand_in), None)
        if self.lm_head is not None:
            self.lm_head.token_ids.copy_(torch.arange(self.lm_head.num_kept, device=weight.device))

    @property
    def feature_size(self) -> int:
        """The width of the features it reads and returns: its target's hidden size."""
        return self.fc.in_features // 2

    def bound_to(self, target: PreTrainedModel) -> bool:
        """It reads through ``target``'s own embedding."""
        return bool(self._target) and self._target[0] is target.get_input_embeddings()

    def get_input_embeddings(self) -> nn.Module:
        return self._bound()[0]

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head if self.lm_head is not None else self._bound()[1]

    def _bound(self) -> tuple:
        if not self._target:
            raise ValueError("this DraftHead is bound to no target: build it with DraftHead.for_target(target) or "
                             "load it with load_draft_head(path, target=target).")
        return self._target

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, features: torch.Tensor,
                logits_to_keep: Optional[torch.Tensor] = None, **kwargs) -> DraftHeadOutput:
        """``input_ids``/``position_ids`` ``(N, T)``, ``features`` ``(N, T, H)`` (the target's ``f_i`` or the head's
        own ``g``); ``logits_to_keep``: token indices whose logits to compute (None: all). ``kwargs`` go to the
        layers' attention (the runner's paged batch; without one, causal attention over each row: training;
        training's unrolled steps pass a 4-D bool ``attention_mask`` and a cache: evals/head_objective.py)."""
        embed, lm_head, softcap = self._bound()
        dtype = self.fc.weight.dtype  # its own, which may differ from its target's (a cast of either model)
        x = self.fc(torch.cat([embed(input_ids).to(dtype), features.to(dtype)], dim=-1))
        position_embeddings = self.rotary_emb(x, position_ids)
        mask = kwargs.pop("attention_mask", None)  # training's unrolled steps (evals/head_objective.py)
        for layer in self.layers[:-1]:  # the last outside the loop: the paged attention breaks torch.compile's
            x = layer(x, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings,
                      **kwargs)  # graph, and a break inside a loop would leave a head of one layer uncompiled
        x = self.layers[-1](x, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings,
                            **kwargs)
        hidden = self.norm(x)
        kept = hidden if logits_to_keep is None else hidden[:, logits_to_keep]
        if self.lm_head is not None:  # its own, over the kept tokens (soft-capped there)
            features = hidden if self.up is None else self.up(hidden)
            return DraftHeadOutput(logits=self.lm_head(kept), hidden=features)
        logits = lm_head(kept.to(lm_head.weight.dtype))
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        return DraftHeadOutput(logits=logits, hidden=hidden)


def check_target(target: PreTrainedModel) -> None:
    """A target whose logits are its output layer over its decoder's last hidden state (soft-capped or not):
    what a head's features assume and what ``paged_forward(..., hidden=True)`` computes."""
    tc = target.config.get_text_config()
    for name in ("logit_scale", "logits_scaling"):
        value = getattr(tc, name, None)
        if value not in (None, 1, 1.0):
            raise ValueError(f"{type(target).__name__} scales its logits ({name}={value}) after its output layer; "
                             "draft heads support targets whose logits are the output layer over the last hidden "
                             "state (Llama, Mistral, Qwen2/3, Gemma, GPT-2, ...). Use a draft model instead.")
    if target.get_output_embeddings() is None or not hasattr(target, "get_decoder"):
        raise ValueError(f"{type(target).__name__} has no output layer over a decoder (get_output_embeddings / "
                         "get_decoder): a draft head cannot read its hidden states.")
    diff = _logits_differ(target)
    if diff:
        raise ValueError(f"{type(target).__name__}'s forward computes its logits otherwise than its output layer over "
                         f"its decoder's last hidden state (max |difference| {diff:.3g} on a few tokens), which is "
                         "what the verify that feeds a draft head computes. Use a draft model for this target.")


@torch.no_grad()
def _logits_differ(target: PreTrainedModel) -> float:
    """0.0 when the model's own logits on a few tokens are its output layer over its decoder's last hidden state
    (soft-capped as its config says), else the largest difference (a multiplier or a cast the rebuild lacks)."""
    weight = target.get_output_embeddings().weight
    vocab = target.config.get_text_config().vocab_size
    ids = torch.arange(1, 6, device=weight.device)[None] % vocab
    own = target(input_ids=ids, use_cache=False).logits.float()
    rebuilt = target.get_output_embeddings()(target.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state)
    softcap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
    if softcap is not None:
        rebuilt = torch.tanh(rebuilt / softcap) * softcap
    diff = float((own - rebuilt.float()).abs().max())
    return 0.0 if diff <= 1e-3 * max(float(own.abs().max()), 1.0) else diff


def target_fingerprint(target: PreTrainedModel) -> dict:
    tc = target.config.get_text_config()
    return {"class": type(target).__name__, "hidden_size": tc.hidden_size, "vocab_size": tc.vocab_size,
            "num_hidden_layers": tc.num_hidden_layers}


def save_draft_head(head: DraftHead, path: Union[str, Path]) -> None:
    """The head's own weights and config, and probe rows of its target's embedding and output layer."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    embed, lm_head, _ = head._bound()
    state = {name: t.detach().contiguous().cpu() for name, t in head.state_dict().items()
             if not name.startswith("rotary_emb.")}
    state[_PROBES["embedding"]] = probe(embed.weight)  # the target's (not the head's own output layer's)
    state[_PROBES["lm_head"]] = probe(lm_head.weight)
    save_file(state, str(path / WEIGHTS_FILE))
    config = head.config.to_dict()
    target = config.pop("hf_specdec_target", None)
    (path / "config.json").write_text(json.dumps(config, indent=2, default=str))
    (path / META_FILE).write_text(json.dumps({"format": FORMAT, "target": target}, indent=2))


def load_draft_head(path: Union[str, Path], target: PreTrainedModel) -> DraftHead:
    """A saved head bound to ``target``, on its device and in its dtype; raises when ``target`` is not the model the
    head was trained for (another class, size, or other embedding / output weights)."""
    path = Path(path)
    meta_file = path / META_FILE
    if not meta_file.is_file():
        raise ValueError(f"{path} holds no draft head ({META_FILE} missing); save one with save_draft_head.")
    meta = json.loads(meta_file.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{meta_file} has format {meta.get('format')!r}; this hf_specdec reads {FORMAT!r}.")
    check_target(target)
    saved, now = meta["target"], target_fingerprint(target)
    if saved != now:
        raise ValueError(f"the draft head at {path} was trained for {saved}, not for this target {now}: pass the "
                         "target it was trained for, or train a head for this one (evals/train_draft_head.py).")
    state = load_file(str(path / WEIGHTS_FILE))
    probes = {key: state.pop(name) for key, name in _PROBES.items()}
    for key, module in (("embedding", target.get_input_embeddings()), ("lm_head", target.get_output_embeddings())):
        if not matches_probe(module.weight, probes[key]):
            raise ValueError(f"the draft head at {path} was trained for another {saved['class']} (its target's {key} "
                             "weights differ from this model's): pass the target it was trained for.")
    config = LlamaConfig.from_dict(json.loads((path / "config.json").read_text()))
    config._attn_implementation = "sdpa"
    config.hf_specdec_target = saved
    weight = target.get_output_embeddings().weight
    head = DraftHead(config)
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("rotary_emb.")]
    if missing or unexpected:
        raise ValueError(f"{path / WEIGHTS_FILE} does not fit the head its config describes: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}.")
    return head.to(device=weight.device, dtype=weight.dtype).eval().rope_in_fp32().bind(target)
