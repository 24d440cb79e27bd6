"""The on-disk torch.compile cache (hf_specdec/runner/compile_cache.py): a fresh process loads what another one
compiled, and every way an entry or its directory can be bad degrades to compiling with one warning."""
import json
import multiprocessing
import os
import pathlib
import struct
import subprocess
import sys
import warnings

import pytest
import torch

from hf_specdec.runner.compile_cache import CompileCache, cache_dir, cache_key
from models import make_model

ROOT = pathlib.Path(__file__).resolve().parents[1]
X = torch.linspace(-3, 3, 16)


def _fn(x):
    return torch.sin(x) * 2 + torch.cos(x) * x


def _compiles_correctly():
    """A compile after whatever the cache did gives the eager result (dynamo reset: a real recompile)."""
    torch._dynamo.reset()
    return torch.allclose(torch.compile(_fn)(X), _fn(X))


def _caught(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [str(w.message) for w in caught]


# The round trip runs in fresh processes, each with its own empty inductor cache directory, so that only the
# hf_specdec entry can explain a cache hit in the second. TORCHINDUCTOR_VEC_ISA_OK=0 (scalar C++ kernels) spares each
# process inductor's half-dozen gcc runs that probe the CPU's vector ISAs: seconds, and nothing to do with caching.
_CHILD = r"""
import json, sys, torch
from torch._dynamo.utils import counters
from hf_specdec.runner.compile_cache import CompileCache, cache_key
cache, key = CompileCache(), cache_key([torch.nn.Linear(4, 4)], extra=("round trip",))
loaded = cache.load(key) if sys.argv[1] == "load" else None
x = torch.linspace(-3, 3, 16)
y = torch.compile(lambda x: torch.sin(x) * 2 + torch.cos(x) * x)(x)
saved = cache.save(key) if sys.argv[1] == "save" else None
print(json.dumps({"key": key, "loaded": loaded, "saved": saved, "y": y.tolist(),
                  "eager": (torch.sin(x) * 2 + torch.cos(x) * x).tolist(),
                  "hits": counters["inductor"]["fxgraph_cache_hit"],
                  "misses": counters["inductor"]["fxgraph_cache_miss"]}))
"""


def _child(mode, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_SPECDEC_", "TORCHINDUCTOR_"))}
    env.update(HF_SPECDEC_CACHE=str(tmp_path / "hf_specdec"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / mode),
               TORCHINDUCTOR_FX_GRAPH_CACHE="1", TORCHINDUCTOR_VEC_ISA_OK="0",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _CHILD, mode], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fresh_process_loads_what_another_compiled(tmp_path):
    first = _child("save", tmp_path)
    assert first["saved"] is True and first["hits"] == 0 and first["misses"] >= 1, first
    assert (tmp_path / "hf_specdec" / "compile" / f"{first['key']}.bin").is_file()
    second = _child("load", tmp_path)
    assert second["key"] == first["key"], "cache_key differs between two processes"
    assert second["loaded"] is True and second["hits"] >= 1 and second["misses"] == 0, second
    assert second["y"] == first["y"]
    assert torch.allclose(torch.tensor(second["y"]), torch.tensor(second["eager"]))


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    """The bytes of a real entry: this process compiles _fn and saves it under "good"."""
    cache = CompileCache(tmp_path_factory.mktemp("entry"))
    assert _compiles_correctly()
    assert cache.save("good") is True
    return cache.path("good").read_bytes()


def test_a_valid_entry_loads_silently(entry, tmp_path):
    cache = CompileCache(tmp_path)
    cache.path("good").parent.mkdir(parents=True)
    cache.path("good").write_bytes(entry)
    assert _caught(lambda: cache.load("good")) == (True, [])
    assert cache.path("good").exists()
    assert _caught(lambda: cache.load("absent")) == (False, [])


def _split(data):
    (length,) = struct.unpack(">I", data[8:12])
    return data[:8], json.loads(data[12:12 + length]), data[12 + length:]


def _with_header(data, **changes):
    magic, header, payload = _split(data)
    encoded = json.dumps({**header, **changes}).encode()
    return magic + struct.pack(">I", len(encoded)) + encoded + payload


def _flip_payload_byte(data):
    at = len(data) - len(_split(data)[2]) // 2
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


BAD = {"flipped payload byte": (_flip_payload_byte, "sha256"),
       "truncated": (lambda d: d[:-100], "truncated"),
       "wrong magic": (lambda d: b"PK\x03\x04zip!" + d[8:], "magic"),
       "empty": (lambda d: b"", "magic"),
       "garbage header": (lambda d: d[:12] + b"\xff" * 40 + d[52:], "header is unreadable"),
       "other torch": (lambda d: _with_header(d, torch="2.11.0+cu128"), "written by torch 2.11.0+cu128"),
       "other key": (lambda d: _with_header(d, key="another"), "holds key 'another'"),
       "other format": (lambda d: _with_header(d, format=99), "format 99")}


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_entry_warns_once_is_removed_and_compiling_works(entry, tmp_path, kind):
    spoil, reason = BAD[kind]
    cache = CompileCache(tmp_path)
    path = cache.path("good")
    path.parent.mkdir(parents=True)
    path.write_bytes(spoil(entry))
    loaded, caught = _caught(lambda: cache.load("good"))
    assert loaded is False and len(caught) == 1, caught
    assert str(path) in caught[0] and reason in caught[0] and "ignored" in caught[0], caught[0]
    assert not path.exists(), "a bad entry is removed so that the next save replaces it"
    assert _compiles_correctly()


def test_torch_failing_to_load_warns_once_and_keeps_the_entry(entry, tmp_path, monkeypatch):
    cache = CompileCache(tmp_path)
    cache.path("good").parent.mkdir(parents=True)
    cache.path("good").write_bytes(entry)

    def refuse(payload):
        raise OSError("inductor cache directory is read-only")
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", refuse)
    loaded, caught = _caught(lambda: cache.load("good"))
    assert loaded is False and len(caught) == 1 and "read-only" in caught[0] and str(cache.path("good")) in caught[0]
    assert cache.path("good").exists(), "the entry is fine; torch's environment is not"
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda payload: None)  # torch could not deserialize
    loaded, caught = _caught(lambda: cache.load("good"))
    assert loaded is False and len(caught) == 1 and "deserialize" in caught[0] and not cache.path("good").exists()


def _racer(directory, writer, rounds, size, barrier, saved):
    """One of two processes that save the same key at the same moment, `rounds` times."""
    torch.compiler.save_cache_artifacts = lambda: (_payload(r, writer, size), None)
    cache = CompileCache(directory)
    for r in range(rounds):
        barrier.wait(timeout=60)
        if not cache.save("race"):
            os._exit(3)
        with saved.get_lock():
            saved.value += 1
        barrier.wait(timeout=60)
    os._exit(0)


def _payload(round_, writer, size):
    return f"round {round_} writer {writer}:".encode() + bytes([writer + 1]) * (size + writer)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python >= 3.12
def test_two_processes_saving_at_once_leave_a_complete_entry(tmp_path, monkeypatch):
    """Two writers race each round while this process reads: it must only ever see a whole entry of one writer."""
    rounds, size = 6, 16 << 20  # writes this large take long enough to overlap the other writer and the reader
    ctx = multiprocessing.get_context("fork")  # cheap, and safe: the children touch no torch state, only files
    barrier, saved = ctx.Barrier(3), ctx.Value("i", 0)
    racers = [ctx.Process(target=_racer, args=(tmp_path, w, rounds, size, barrier, saved)) for w in (0, 1)]
    for p in racers:
        p.start()
    handed = []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda payload: handed.append(payload) or "info")
    cache = CompileCache(tmp_path)
    try:
        for r in range(rounds):
            whole = [_payload(r - 1, 0, size), _payload(r - 1, 1, size), _payload(r, 0, size), _payload(r, 1, size)]
            barrier.wait(timeout=60)  # both save now, while this process keeps reading
            while True:
                finished = saved.value == 2 * (r + 1)
                loaded, caught = _caught(lambda: cache.load("race"))
                assert caught == [] and (loaded or r == 0), f"round {r}: {caught}"
                assert not loaded or handed.pop() in whole, f"round {r}: a payload neither writer wrote"
                if finished:
                    break
            assert loaded and _caught(lambda: cache.load("race")) == (True, [])
            assert handed.pop() in whole[2:], f"round {r}: the entry is not one of this round's"
            barrier.wait(timeout=60)
    except BaseException:
        barrier.abort()  # a failed round frees the racers at once instead of at their timeout
        raise
    finally:
        for p in racers:
            p.join(timeout=60)
    assert [p.exitcode for p in racers] == [0, 0]
    assert [f.name for f in (tmp_path / "compile").iterdir()] == ["race.bin"], "temporary files left behind"


def test_an_unwritable_directory_warns_once_and_compiling_still_works(entry, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    cache = CompileCache(blocker / "cache")  # root ignores permissions, not a file where a directory should be
    assert _compiles_correctly()
    saved, caught = _caught(lambda: cache.save("k"))
    assert saved is False and len(caught) == 1, caught
    assert str(blocker / "cache") in caught[0] and "HF_SPECDEC_CACHE" in caught[0] and "memory only" in caught[0]
    assert _caught(lambda: cache.save("k")) == (False, []), "one warning per cache, not per save"
    assert _caught(lambda: cache.load("k")) == (False, [])
    assert _compiles_correctly()


def test_cache_dir_follows_hf_conventions(tmp_path, monkeypatch):
    for name in ("HF_SPECDEC_CACHE", "HF_SPECDEC_DISABLE_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hf_specdec"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "huggingface" / "hf_specdec"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    assert cache_dir() == tmp_path / "hf_home" / "hf_specdec"
    monkeypatch.setenv("HF_SPECDEC_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    assert CompileCache().path("k") == tmp_path / "mine" / "compile" / "k.bin"
    for off in ("0", "", "false"):
        monkeypatch.setenv("HF_SPECDEC_DISABLE_CACHE", off)
        assert cache_dir() == tmp_path / "mine", off
    for on in ("1", "TRUE", "yes", "On"):
        monkeypatch.setenv("HF_SPECDEC_DISABLE_CACHE", on)
        assert cache_dir() is None, on
    disabled = CompileCache()
    assert disabled.path("k") is None
    assert _caught(lambda: (disabled.save("k"), disabled.load("k"))) == ((False, False), [])
    assert not (tmp_path / "mine").exists()


def test_cache_key_tracks_what_changes_compiled_code():
    target, draft = make_model("llama", seed=0), make_model("llama", seed=1, layers=1)
    opts = ("reduce-overhead",)
    key = cache_key([target, draft], extra=opts)
    assert len(key) == 64 and int(key, 16) >= 0
    assert cache_key([target, draft], extra=opts) == key, "unstable"
    assert cache_key([None, target, draft], extra=opts) == key, "None models are skipped"
    same_config = make_model("llama", seed=5, layers=1)
    same_config.config._name_or_path = "/somewhere/else"
    assert cache_key([target, same_config], extra=opts) == key, "weights and checkpoint paths do not count"
    assert cache_key([target, draft], extra=("default",)) != key
    assert cache_key([draft, target], extra=opts) != key
    assert cache_key([target, draft.to(torch.float16)], extra=opts) != key
    draft.to(torch.float32)
    assert cache_key([target, draft], extra=opts) == key
    draft.config.rms_norm_eps = 1e-3
    assert cache_key([target, draft], extra=opts) != key
    with pytest.raises(ValueError, match="not a file name"):
        CompileCache(pathlib.Path("/tmp")).path("../escape")
