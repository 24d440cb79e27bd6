"""Data of evals/build_pair.py: local Python source split by file, a byte-level BPE tokenizer, packed ids.

Files are split into train and held-out by a deterministic hash of their path relative to
their source root (duplicated contents dropped, so no text is on both sides); held-out
windows become benchmark prompts.
"""
from __future__ import annotations

import hashlib
import os
import random

import numpy as np

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


def _hash01(key: str) -> float:
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:12], 16) / float(16**12)


def list_source_files(source_dirs, min_file_bytes=256, max_file_bytes=1_000_000):
    """All .py files under the source dirs as (relpath, fullpath, size), deduplicated by relpath."""
    seen = set()
    out = []
    for root in source_dirs:
        root = os.path.abspath(root)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            for fn in sorted(filenames):
                if not fn.endswith(".py"):
                    continue
                full = os.path.join(dirpath, fn)
                try:
                    size = os.path.getsize(full)
                except OSError:
                    continue
                if size < min_file_bytes or size > max_file_bytes:
                    continue
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                if rel in seen:
                    continue
                seen.add(rel)
                out.append((rel, full, size))
    return out


def split_and_read(files, max_bytes, heldout_frac, heldout_max_bytes, seed):
    """Deterministic by-file split.  A file is held out iff hash(seed, relpath) < heldout_frac.

    Files are visited in hash order (a deterministic pseudo-random sample of the
    whole tree); reading stops when the train side holds ``max_bytes`` and the
    held-out side ``heldout_max_bytes``.  Files whose content was already seen
    (vendored copies) are skipped so that no text sits on both sides.
    """
    keyed = sorted(files, key=lambda f: hashlib.sha1(f"{seed}:order:{f[0]}".encode()).hexdigest())
    train, heldout = [], []
    train_bytes = heldout_bytes = 0
    seen_content = set()
    for rel, full, _size in keyed:
        is_heldout = _hash01(f"{seed}:split:{rel}") < heldout_frac
        if is_heldout and heldout_bytes >= heldout_max_bytes:
            continue
        if not is_heldout and train_bytes >= max_bytes:
            if heldout_bytes >= heldout_max_bytes:
                break
            continue
        try:
            with open(full, "rb") as fh:
                raw = fh.read()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        digest = hashlib.sha1(raw).digest()
        if digest in seen_content or not text.strip():
            continue
        seen_content.add(digest)
        if is_heldout:
            heldout.append((rel, text))
            heldout_bytes += len(raw)
        else:
            train.append((rel, text))
            train_bytes += len(raw)
    if not heldout and len(train) > 1:
        # tiny source trees: guarantee a held-out side (the last train file in hash order)
        heldout.append(train.pop())
    if not train or not heldout:
        raise SystemExit(f"not enough text: {len(train)} train files, {len(heldout)} held-out files")
    return train, heldout


def train_tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def wrap_tokenizer(tok, model_max_length):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",  # decoder-only batched generation pads on the left
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def encode_docs(tok, texts, eos_id):
    """[BOS] text [EOS] for every document, concatenated (sequence packing)."""
    enc = getattr(tok, "encode_batch_fast", tok.encode_batch)
    chunks = []
    step = 512
    for i in range(0, len(texts), step):
        for e in enc(texts[i : i + step]):
            ids = e.ids
            ids.append(eos_id)
            chunks.append(np.asarray(ids, dtype=np.int32))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)


def heldout_prompt_windows(heldout, n, seed, min_chars=400, max_chars=1200):
    """Windows of held-out source text, each ending on a line boundary, one per file."""
    rng = random.Random(seed)
    out = []
    for rel, text in heldout:
        if len(out) >= n:
            break
        lines = text.splitlines(keepends=True)
        if len(text) < min_chars or len(lines) < 8:
            continue
        start = rng.randrange(0, max(1, len(lines) // 2))
        buf = []
        size = 0
        for line in lines[start:]:
            if size + len(line) > max_chars and size >= min_chars:
                break
            buf.append(line)
            size += len(line)
        if size < min_chars // 2:
            continue
        out.append({"prompt": "".join(buf), "source": rel})
    return out
