"""An on-disk cache of torch.compile artifacts: a new process that compiles the same models loads, not recompiles.

What: torch's mega-cache (torch.compiler.save/load_cache_artifacts, torch >= 2.7; older torch: no-op): every artifact
this process's compiles produced or hit -- inductor FX graphs (Triton kernels bundled on GPU; on CPU the C++ source,
which gcc rebuilds), AOTAutograd entries, autotuning results, dynamic-shape (PGO) decisions. Loading fills torch's own
caches, so later compiles of the same graphs hit.
Where: <cache_dir()>/compile/<key>.bin; cache_dir() is $HF_SPECDEC_CACHE, else $HF_HOME/hf_specdec (HF_HOME as
huggingface_hub computes it); HF_SPECDEC_DISABLE_CACHE=1 keeps compiled code in memory only. A file is a header
(magic, format, key, the torch version that wrote it, payload length, sha256) and torch's payload, written to a temp
file and os.replace()d into place: concurrent writers leave one complete file, the last one's.
Keyed by: cache_key(): the models' classes, configs and parameter dtypes, the device (GPU name, capability), python /
torch / triton / transformers / hf_specdec versions and the caller's compile options. The key only picks the file:
torch keys its caches by graph content and versions, so a stale entry costs a miss, never a wrong result.
Failures degrade to compiling, never to an exception: a missing entry is a silent miss; an invalid one (or one torch
cannot read) gives one warning naming the file, is removed, and the caller compiles; an unwritable directory gives
one warning per CompileCache, which then stops saving.
"""
import contextlib
import hashlib
import importlib.metadata
import json
import os
import pathlib
import re
import secrets
import struct
import sys
import warnings
from typing import Optional

import torch

_MAGIC = b"HFSDCC\x00\n"  # hf_specdec compile cache
_FORMAT = 1
_HEADER_LEN = struct.Struct(">I")
_KEY_RE = re.compile(r"[0-9A-Za-z_.-]{1,128}")
_DEFAULT = object()


def cache_dir() -> Optional[pathlib.Path]:
    """Where hf_specdec keeps files across processes; None when HF_SPECDEC_DISABLE_CACHE is set. Read at call
    time, not import time, so a process can redirect or disable it after importing hf_specdec."""
    if os.environ.get("HF_SPECDEC_DISABLE_CACHE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return None
    if explicit := os.environ.get("HF_SPECDEC_CACHE"):
        return pathlib.Path(os.path.expandvars(os.path.expanduser(explicit)))
    # huggingface_hub.constants.HF_HOME, recomputed: that constant is frozen when huggingface_hub is imported.
    xdg = os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    hf_home = os.environ.get("HF_HOME", os.path.join(xdg, "huggingface"))
    return pathlib.Path(os.path.expandvars(os.path.expanduser(hf_home))) / "hf_specdec"


def _version(module: str) -> str:
    """A module's version for the key; hf_specdec's is read lazily, as this module is imported before it is set."""
    try:
        found = getattr(sys.modules.get(module) or __import__(module), "__version__", None)
        return str(found) if found is not None else importlib.metadata.version(module)
    except Exception:  # absent or broken: that is part of the key too
        return "none"


def _describe(model) -> dict:
    """What of one model changes its compiled code (its checkpoint path does not)."""
    config = getattr(model, "config", None)
    config = {k: v for k, v in config.to_dict().items() if k not in ("_name_or_path", "_commit_hash")} \
        if hasattr(config, "to_dict") else None
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    devices = {f"cuda {torch.cuda.get_device_name(d)} {torch.cuda.get_device_capability(d)}" if d.type == "cuda"
               else d.type for d in {p.device for p in params}}
    return {"class": f"{type(model).__module__}.{type(model).__qualname__}", "config": config,
            "dtypes": sorted({str(p.dtype) for p in params}), "devices": sorted(devices)}


def cache_key(models, extra: tuple = ()) -> str:
    """A hex digest of everything that changes the compiled code of `models` (None entries skipped) under `extra`."""
    if isinstance(models, torch.nn.Module):
        models = (models,)
    described = {
        "python": list(sys.version_info[:3]), "torch": torch.__version__, "triton": _version("triton"),
        "transformers": _version("transformers"), "hf_specdec": _version("hf_specdec"), "extra": repr(tuple(extra)),
        "models": [_describe(m) for m in models if m is not None]}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=repr).encode()).hexdigest()


def _torch_api():
    """(save, load) from torch.compiler, or None on a torch without the mega-cache (before 2.7): then no caching."""
    api = tuple(getattr(torch.compiler, name, None) for name in ("save_cache_artifacts", "load_cache_artifacts"))
    return api if None not in api else None


def _encode(key: str, payload: bytes) -> bytes:
    header = json.dumps({"format": _FORMAT, "key": key, "torch": torch.__version__, "payload_bytes": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    return _MAGIC + _HEADER_LEN.pack(len(header)) + header + payload


def _decode(data: bytes, key: str):
    """(payload, None) for a valid entry of `key`, else (None, why it is not)."""
    start = len(_MAGIC) + _HEADER_LEN.size
    if len(data) < start or not data.startswith(_MAGIC):
        return None, "it is not an hf_specdec compile cache file (wrong magic bytes)"
    (length,) = _HEADER_LEN.unpack_from(data, len(_MAGIC))
    try:
        if length > 1 << 16:
            raise ValueError(f"header length {length}")
        header = json.loads(data[start:start + length].decode())
        fmt, entry_key, written_by = header["format"], header["key"], header["torch"]
        size, digest = int(header["payload_bytes"]), str(header["sha256"])
    except (ValueError, KeyError, TypeError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None, f"its header is unreadable ({err})"
    payload = data[start + length:]
    for bad, why in ((fmt != _FORMAT, f"it has format {fmt!r}, this hf_specdec reads format {_FORMAT}"),
                     (written_by != torch.__version__,
                      f"it was written by torch {written_by}, this process runs torch {torch.__version__}"),
                     (entry_key != key, f"it holds key {entry_key!r}, not {key!r}"),
                     (len(payload) != size, f"it is truncated: payload of {len(payload)} bytes, header says {size}"),
                     (hashlib.sha256(payload).hexdigest() != digest, "its payload does not match its sha256")):
        if bad:
            return None, why
    return payload, None


class CompileCache:
    """Loads and saves this process's torch.compile artifacts under a key, in `directory` (default: cache_dir()
    as it is now; None: disabled, load and save return False)."""

    def __init__(self, directory: "str | os.PathLike | None" = _DEFAULT):
        directory = cache_dir() if directory is _DEFAULT else directory
        self.directory = None if directory is None else pathlib.Path(directory)
        self._save_failed = False

    def path(self, key: str) -> Optional[pathlib.Path]:
        """Where the entry of `key` lives (None when the cache is disabled)."""
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise ValueError(f"compile cache key {key!r} is not a file name; pass cache_key(...)'s hex digest")
        return None if self.directory is None else self.directory / "compile" / f"{key}.bin"

    def load(self, key: str) -> bool:
        """Hot-load the entry of `key` into torch's caches; True when one was found, valid and loaded."""
        path, api = self.path(key), _torch_api()
        if path is None or api is None:
            return False
        why, remove, stat = None, True, None
        try:
            with open(path, "rb") as f:
                stat, data = os.fstat(f.fileno()), f.read()
        except (FileNotFoundError, NotADirectoryError):  # no entry, or no directory: save() says why
            return False
        except OSError as err:
            why, remove = f"it cannot be read ({err})", False
        if why is None:
            payload, why = _decode(data, key)
            if why is None:
                try:
                    if api[1](payload) is not None:
                        return True
                    why = "torch could not deserialize its artifacts"
                except Exception as err:  # e.g. torch's own cache directory unwritable: keep the entry
                    why, remove = f"torch failed to load it ({type(err).__name__}: {err})", False
        if remove and _unlink_if_unchanged(path, stat):
            why += "; the file was removed"
        warnings.warn(f"hf_specdec compile cache entry {path} is ignored: {why}. Compiling instead.", stacklevel=2)
        return False

    def save(self, key: str) -> bool:
        """Write every compile artifact of this process under `key`; False when there is nothing or it failed."""
        path, api = self.path(key), _torch_api()
        if path is None or api is None or self._save_failed:
            return False
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
        try:
            result = api[0]()
            if result is None:
                return False
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "xb") as f:
                f.write(_encode(key, result[0]))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            return True
        except Exception as err:
            self._save_failed = True
            with contextlib.suppress(OSError):
                tmp.unlink()
            warnings.warn(f"hf_specdec could not save the compile cache entry {path} ({type(err).__name__}: {err}); "
                          "compiled code is kept in memory only; set HF_SPECDEC_CACHE to a writable directory or "
                          "HF_SPECDEC_DISABLE_CACHE=1", stacklevel=2)
            return False


def _unlink_if_unchanged(path: pathlib.Path, stat) -> bool:
    """Remove a bad entry unless another process has replaced it since it was read."""
    with contextlib.suppress(OSError):
        now = os.stat(path)
        if (now.st_ino, now.st_mtime_ns, now.st_size) == (stat.st_ino, stat.st_mtime_ns, stat.st_size):
            os.unlink(path)
            return True
    return False
