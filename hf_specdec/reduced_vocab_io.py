"""Save and load a reduced-vocabulary draft: safetensors + config.json + reduced_vocab.json.

    save_reduced_draft(draft, "runs/draft", target=target, tokenizer=tok)
    draft = load_reduced_draft("runs/draft", target=target)

Directory layout: ``model.safetensors`` (every weight, the kept token ids as the head's
``lm_head.token_ids`` buffer, its bias as ``lm_head.bias`` where it has one: a file without
that key, as every file written before heads had biases, loads as a bias-free head),
``config.json`` (the draft's own config, vocabulary size = the target's), ``reduced_vocab.json``
(format, kept count, soft-capping, where the input embedding comes from), and the tokenizer
when one is given.

Why the embedding may be left out: a draft built from its target copies the target's
262k-row input embedding unchanged (frozen), which would be most of the file. Saved with
``target=`` whose embedding is equal, the file omits it and stores a few probe rows; the
loader then takes the target's embedding tensor itself (no copy, no memory), after
checking the probe rows, so a draft cannot silently run on another model's embedding.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from .reduced_vocab import ReducedVocabHead, reduced_head
from .weight_probe import matches_probe, probe

FORMAT = "hf_specdec.reduced_vocab/1"
META_FILE = "reduced_vocab.json"
WEIGHTS_FILE = "model.safetensors"
PROBE_KEY = "hf_specdec.embedding_probe"


def _embedding_key(model: nn.Module) -> str:
    weight = model.get_input_embeddings().weight
    for name, p in model.named_parameters(remove_duplicate=False):
        if p is weight:
            return name
    raise ValueError(f"{type(model).__name__}'s input embedding weight is not one of its parameters.")


def _module_name(model: nn.Module, module: nn.Module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def _same_embedding(draft_weight: torch.Tensor, target_weight: torch.Tensor) -> bool:
    """The draft's embedding is the target's, exactly once cast to the target's dtype (a frozen copy)."""
    if draft_weight.shape != target_weight.shape:
        return False
    return torch.equal(draft_weight.detach().to(device=target_weight.device, dtype=target_weight.dtype),
                       target_weight.detach())


def save_reduced_draft(draft: nn.Module, path: Union[str, Path], target: Optional[nn.Module] = None,
                       tokenizer=None, dtype: Optional[torch.dtype] = None) -> Path:
    """Write ``draft`` (built with ``reduce_vocab``) to ``path``. With ``target`` whose input embedding
    equals the draft's exactly (up to the target's dtype), the embedding is not stored
    (``load_reduced_draft`` then needs that target).
    ``dtype``: cast floating weights for the file (e.g. ``torch.bfloat16``); default as they are."""
    head = reduced_head(draft)
    if head is None:
        raise ValueError(f"{type(draft).__name__} has an ordinary output layer; build the draft with "
                         "hf_specdec.reduced_vocab.reduce_vocab(model, token_ids) before saving it here.")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    emb_key = _embedding_key(draft)
    emb = draft.get_input_embeddings().weight
    from_target = target is not None and _same_embedding(emb, target.get_input_embeddings().weight)
    state = {}
    for name, t in draft.state_dict().items():
        if from_target and name == emb_key:
            continue
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        state[name] = t.contiguous().cpu().clone()
    if from_target:
        state[PROBE_KEY] = probe(emb)
    save_file(state, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    draft.config.save_pretrained(path)
    if getattr(draft, "generation_config", None) is not None:
        draft.generation_config.save_pretrained(path)
    meta = {"format": FORMAT, "vocab_size": head.vocab_size, "num_kept": head.num_kept, "softcap": head.softcap,
            "head_key": _module_name(draft, head), "embedding_key": emb_key,
            "embedding": "target" if from_target else "stored",
            "model_class": type(draft).__name__}
    (path / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def is_reduced_draft(path: Union[str, Path]) -> bool:
    """Whether ``path`` is a directory written by ``save_reduced_draft`` (it holds ``reduced_vocab.json``);
    such a draft loads with ``load_reduced_draft``, not ``AutoModelForCausalLM.from_pretrained``."""
    return (Path(path) / META_FILE).is_file()


def _read_meta(path: Path) -> dict:
    file = path / META_FILE
    if not file.exists():
        raise FileNotFoundError(f"{file} not found: {path} is not a reduced-vocabulary draft saved by "
                                "hf_specdec.reduced_vocab_io.save_reduced_draft (load ordinary checkpoints with "
                                "AutoModelForCausalLM.from_pretrained).")
    meta = json.loads(file.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{file} has format {meta.get('format')!r}; this hf_specdec reads {FORMAT!r}.")
    return meta


_SKELETON_FIELDS = ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id")


def _skeleton(config) -> nn.Module:
    """The model class built with a 1-row vocabulary (neither a 262k-row embedding nor head is allocated),
    then given back the real vocabulary size and special ids (the config object its modules share)."""
    configs = list({id(c): c for c in (config, config.get_text_config())}.values())
    saved = [{name: getattr(c, name, None) for name in _SKELETON_FIELDS} for c in configs]
    for c in configs:
        c.vocab_size, c.pad_token_id, c.bos_token_id, c.eos_token_id = 1, None, None, None
        c.tie_word_embeddings = False
    try:
        model = AutoModelForCausalLM.from_config(config)
    finally:
        for c, fields in zip(configs, saved):
            for name, value in fields.items():
                setattr(c, name, value)
    model.config = config
    model.generation_config = GenerationConfig.from_model_config(config)
    return model


def empty_reduced_model(config, head: ReducedVocabHead) -> nn.Module:
    """The model class of ``config`` with ``head`` as output layer and a 1-row placeholder input embedding
    (``install_embedding`` puts the real one in); other weights as the class initialises them."""
    model = _skeleton(config)
    model.set_output_embeddings(head)
    return model


def install_embedding(model: nn.Module, weight: torch.Tensor, share: bool = True) -> None:
    """Make ``weight`` (vocabulary x hidden) the model's input embedding: that very tensor when ``share`` and it
    is a parameter of the model's dtype and device, else a frozen copy cast and moved to them."""
    layer = model.get_input_embeddings()
    ref = model.get_output_embeddings().weight
    if share and isinstance(weight, nn.Parameter) and weight.dtype == ref.dtype and weight.device == ref.device:
        layer.weight = weight
    else:
        layer.weight = nn.Parameter(weight.detach().to(device=ref.device, dtype=ref.dtype).clone(), requires_grad=False)
    layer.num_embeddings = weight.shape[0]
    layer.padding_idx = model.config.get_text_config().pad_token_id


def _target_embedding(target: Optional[nn.Module], state: dict, meta: dict, path: Path) -> torch.Tensor:
    if target is None:
        raise ValueError(f"{path} was saved without its input embedding (it is the target's); pass the target: "
                         "load_reduced_draft(path, target=target).")
    weight = target.get_input_embeddings().weight
    saved = state.pop(PROBE_KEY)
    if weight.shape[0] != meta["vocab_size"] or not matches_probe(weight, saved):
        raise ValueError(f"the target's input embedding (shape {tuple(weight.shape)}) is not the one the draft at "
                         f"{path} was saved with (vocabulary {meta['vocab_size']}); pass the target it was built from.")
    return weight


def load_reduced_draft(path: Union[str, Path], target: Optional[nn.Module] = None,
                       dtype: Optional[torch.dtype] = None, device: Union[str, torch.device, None] = None,
                       share_embedding: bool = True) -> nn.Module:
    """Load a draft saved by ``save_reduced_draft``, in eval mode.

    ``dtype``/``device`` default to the target's embedding's (else the file's dtype, CPU). A draft
    saved without its embedding takes the target's: the same tensor when ``share_embedding`` and
    dtype/device agree (cast and move the target first: ``.to()`` on either model changes the
    shared tensor in place), a copy otherwise.
    """
    path = Path(path)
    meta = _read_meta(path)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    state = load_file(str(path / WEIGHTS_FILE))
    emb_key, vocab = meta["embedding_key"], meta["vocab_size"]
    if meta["embedding"] == "target":
        embedding = _target_embedding(target, state, meta, path)
    else:
        embedding = state.pop(emb_key)
    if dtype is None:
        dtype = embedding.dtype if target is not None else state[f"{meta['head_key']}.weight"].dtype
    if device is None:
        device = embedding.device if target is not None else "cpu"
    prefix = meta["head_key"]
    head = ReducedVocabHead(state[f"{prefix}.weight"], state[f"{prefix}.token_ids"], vocab, meta["softcap"],
                            state.get(f"{prefix}.bias"))
    model = empty_reduced_model(config, head)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != emb_key]
    if missing or unexpected:
        raise ValueError(f"{path / WEIGHTS_FILE} does not match {meta['model_class']} built from its config.json: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}.")
    model.to(device=device, dtype=dtype)
    install_embedding(model, embedding, share=share_embedding)
    if (path / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(path, local_files_only=True)
    return model.eval()
