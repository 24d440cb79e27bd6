"""Kernel variants: split count and speculation length never compile a new Triton kernel; batch size at most one.

Every distinct set of constexprs (and every int argument Triton specialises: == 1, divisible by 16)
is a JIT compile in the middle of a user's call (0.3-0.5 s each on an H200). The launchers decide
their constexprs in small pure helpers; for the decode and verify shapes of a Llama-8B-like and a
1B-like model those must be one dict per kernel across batch buckets 1..32 and k = 1..7, but for the
attention's two launches (split short tiles for small grids, unsplit 128-key tiles for wide ones). A second
test runs the real launchers with spied kernels and checks every argument the way Triton keys its
cache. CPU only: nothing here launches a kernel.
"""
import inspect
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest
import torch

pytest.importorskip("triton")

from hf_specdec.kernels import acceptance_common_triton as common  # noqa: E402
from hf_specdec.kernels import paged_attention_triton as pa  # noqa: E402
from hf_specdec.kernels import rejection_sampler_triton as rs  # noqa: E402
from hf_specdec.kernels import rotary_paged_attention_triton as rpa  # noqa: E402
from hf_specdec.kernels import typical_acceptance_triton as ta  # noqa: E402

CONFIGS = {  # heads, kv heads, head_dim, vocabulary
    "llama-8b": (32, 8, 128, 128256),
    "llama-1b": (32, 8, 64, 128256),
}
BATCHES = range(1, 33)
KS = range(1, 8)
MAX_CONTEXT = 8192 * 16  # a block table of 8192 blocks of 16
TARGETS = (2 * 132, 2 * 114, 2 * 78, 8)  # two programs per SM: H100 SXM / H200, H100 PCIe, 78 SMs, off-GPU


def _distinct(dicts):
    return {tuple(sorted(d.items())) for d in dicts}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("target", TARGETS)
def test_attention_constexprs_independent_of_batch_and_k(config, target):
    H, KVH, D, _ = CONFIGS[config]
    verify, decode, combine, splits = [], [], [], set()
    for B in BATCHES:
        for k in (0, *KS):
            s, grid, attention, comb = pa._attention_launch(B, k + 1, H, KVH, D, MAX_CONTEXT, target,
                                                            torch.bfloat16, None, None)
            (verify if k else decode).append(attention)
            combine.append(comb)
            splits.add(s)
            assert grid == (B, 1, KVH * s)  # one query block: the tile holds k + 1 <= 8 tokens
            assert s <= comb["BLOCK_S"]
    # two launches each: small grids split short tiles, wide grids (the batch sizes past the threshold) do not
    wide = [B * KVH * pa.WIDE_GRID_SHARE >= target for B in BATCHES]
    for dicts, per_batch in ((verify, len(KS)), (decode, 1)):  # a decode step keeps its own (smaller) tile
        for kind in (True, False):
            chosen = [d for i, d in enumerate(dicts) if wide[i // per_batch] == kind]
            assert len(_distinct(chosen)) == (1 if chosen else 0), (kind, _distinct(chosen))
            assert all((d["BLOCK_N"] == 128) == kind for d in chosen)  # the wide launch's 128-key tiles
    assert len(_distinct(combine)) == 1, _distinct(combine)
    if target > 8:
        assert len(splits) > 2, splits  # the split count does vary with the batch: a runtime argument


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("target", TARGETS)
def test_sampler_constexprs_independent_of_batch_and_k(config, target):
    """Greedy and sampled rejection (the split path is the vocabulary-split argmax for greedy rows),
    and typical acceptance: one constexpr dict per kernel (per-sequence or split) and mode."""
    V = CONFIGS[config][3]
    launches = {}
    for B in BATCHES:
        for k in (0, *KS):
            for mode, (splits, slice_len, kw) in {
                "greedy": rs._rejection_launch(B, V, k, False, target),
                "sampled": rs._rejection_launch(B, V, k, True, target),
                "typical": ta._typical_launch(B, V, k, target),
            }.items():
                path = "split" if splits > 1 else "per-sequence"
                launches.setdefault((mode, path), []).append(kw)
                if splits > 1:
                    assert splits <= kw["BLOCK_S"] and slice_len % common.SPLIT_BLOCK_V == 0
                    assert splits * slice_len >= V > (splits - 1) * slice_len  # no empty slice
                assert kw["BLOCK_K"] >= k + 1
    for key, kws in launches.items():
        assert len(_distinct(kws)) == 1, (key, _distinct(kws))
    if target == 2 * 132:  # an H100/H200: every bucket up to 32 splits the vocabulary
        assert {path for _, path in launches} == {"split"}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("target", TARGETS)
def test_the_drafts_catch_up_window_runs_the_attention_its_first_step_compiled(config, target):
    """After rounds of k = 0 the draft model reads what it missed in windows of CATCH_UP tokens a row; its first
    step of every round reads 2. Both must be one launch (constexprs and grid class) at every batch size: else
    the first catch-up of a process JIT-compiles another attention kernel in the middle of a call (1.1 s at
    b = 32 on an H200 with windows of 16)."""
    from hf_specdec.runner.spec_runner import CATCH_UP

    H, KVH, D, _ = CONFIGS[config]
    for B in BATCHES:
        window, first_step = (pa._attention_launch(B, q, H, KVH, D, MAX_CONTEXT, target, torch.bfloat16, None, None)
                              for q in (CATCH_UP, 2))
        assert window[2] == first_step[2] and window[1][1] == 1, (B, window, first_step)


def test_block_k_covers_k_up_to_7_then_grows():
    assert {common._sampler_launch(1, 32000, k, 8)[2]["BLOCK_K"] for k in range(8)} == {8}
    assert common._sampler_launch(1, 32000, 8, 8)[2]["BLOCK_K"] == 16


# -- the launchers themselves, with spied kernels: every argument as Triton keys its kernel cache ----------

def _unspecialised(kernel):
    """The names a kernel declares ``do_not_specialize`` (compiled or interpreted Triton)."""
    if hasattr(kernel, "do_not_specialize"):  # a compiled kernel
        return set(kernel.do_not_specialize or ())
    if isinstance(getattr(kernel, "kwargs", None), dict):  # TRITON_INTERPRET=1 keeps the decorator's arguments
        return set(kernel.kwargs.get("do_not_specialize") or ())
    pytest.skip("this Triton version does not expose do_not_specialize")


def _cache_key(kernel, bound):
    """What of each argument enters Triton's cache key: constexprs by value; ints by width, and == 1 /
    divisible by 16 unless ``do_not_specialize``; tensors by dtype (alignment is 16 for every allocation)."""
    params = inspect.signature(kernel.fn).parameters
    unspec = _unspecialised(kernel)
    assert unspec <= set(params), unspec - set(params)  # Triton ignores a misspelt name silently
    key = []
    for name, value in sorted(bound.items()):
        if name in params and "constexpr" in str(params[name].annotation):
            key.append((name, value))
        elif isinstance(value, bool) or name not in params:  # launch options (num_warps, ...)
            key.append((name, value))
        elif isinstance(value, int):
            width = "i32" if -2**31 <= value < 2**31 else "i64"
            spec = None if name in unspec else ("one" if value == 1 else "div16" if value % 16 == 0 else "")
            key.append((name, width, spec))
        elif isinstance(value, float):
            key.append((name, "fp32"))
        else:  # Triton also keys pointers on 16-byte alignment (a view at an odd offset compiles anew)
            key.append((name, value.dtype, value.data_ptr() % 16 == 0))
    return tuple(key)


class _Spy:
    """Stands in for a kernel: files each launch's cache key under ``(mode, kernel name)``, runs nothing."""

    def __init__(self, kernel, logs, mode):
        self.kernel, self.logs, self.mode = kernel, logs, mode

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            bound = dict(zip(inspect.signature(self.kernel.fn).parameters, args), **kwargs)
            self.logs.setdefault((self.mode[0], self.kernel.fn.__name__), []).append(_cache_key(self.kernel, bound))
        return launch


KERNELS = {pa: ("_paged_attention_kernel", "_combine_kv_splits_kernel"),
           rs: ("_rejection_sample_kernel", "_rejection_sample_split_kernel"),
           ta: ("_typical_accept_kernel", "_typical_accept_split_kernel")}


@pytest.mark.parametrize("target", [2 * 132, 8])
def test_launchers_compile_one_variant_per_kernel(monkeypatch, target):
    """Decode, verify and sampling of the 8B-like model over batches and k = 0..7: one cache key per
    kernel and mode (the attention: per mode and grid class; the off-GPU target also reaches the per-sequence
    sampler kernels)."""
    logs, mode = {}, [None]
    for mod, names in KERNELS.items():
        monkeypatch.setattr(mod, "_num_programs_target", lambda device: target)
        for name in names:
            monkeypatch.setattr(mod, name, _Spy(getattr(mod, name), logs, mode))
    fused = "_rotary_paged_attention_kernel"  # the runner's Llama-family layers: rotary, K/V write and attention
    monkeypatch.setattr(rpa, fused, _Spy(getattr(rpa, fused), logs, mode))
    H, KVH, D, V = CONFIGS["llama-8b"]
    caches = torch.empty(2, 16, KVH, D, dtype=torch.bfloat16)
    for B in (1, 2, 3, 16, 24, 32):
        tables = torch.zeros(B, 8192, dtype=torch.int32)
        lens, starts = torch.zeros(B, dtype=torch.int32), torch.zeros(B + 1, dtype=torch.int32)
        wide = "-wide" if B * KVH * pa.WIDE_GRID_SHARE >= target else ""  # the attention's second launch
        for k in (0, 1, 3, 4, 7):
            for mode[0], q_len in [("decode" + wide, 1)] + [("verify" + wide, k + 1)] * (k > 0):
                query = torch.empty(B * q_len, H, D, dtype=torch.bfloat16)
                pa.paged_attention_triton(query, caches, caches, tables, lens, starts, q_len, D ** -0.5)
                key, angles = torch.empty(B * q_len, KVH, D, dtype=torch.bfloat16), torch.empty(B * q_len, D)
                rpa.rotary_paged_attention_triton(query, key, key, angles, angles, caches, caches, tables, lens,
                                                  starts, torch.zeros(B * q_len, dtype=torch.int64), q_len, D ** -0.5)
            cu = torch.arange(1, B + 1) * k
            drafts, target_probs = torch.zeros(B * k, dtype=torch.int64), torch.empty(B * (k + 1), V)
            noise_u, noise_e = torch.empty(B * k, dtype=torch.float64), torch.empty(B, V)
            mode[0] = "sampled"
            rs.rejection_sample_triton(drafts, cu, torch.empty(B * k, V), target_probs,
                                       torch.zeros(B, dtype=torch.bool), k, noise_u, noise_e)
            mode[0] = "greedy"  # all-greedy: no q, placeholder noise
            rs.rejection_sample_triton(drafts, cu, None, target_probs, torch.ones(B, dtype=torch.bool), k,
                                       torch.zeros(1, dtype=torch.float64), torch.ones(1, 1))
            mode[0] = "typical"
            ta.typical_accept_triton(drafts, cu, target_probs, k, 0.09, 0.3, noise_e)
    seen = {}
    for (mode_, kernel), keys in logs.items():
        seen.setdefault(kernel, set()).add(mode_)
        assert len(set(keys)) == 1, (mode_, kernel, set(keys))
    assert seen["_rejection_sample_split_kernel"] == {"greedy", "sampled"}
    if target > 8:  # off-GPU, 8 kv heads alone fill the 8-program target: no split KV
        assert seen["_combine_kv_splits_kernel"] == {"decode", "verify"}  # the wide launch runs unsplit
        assert seen["_paged_attention_kernel"] == {"decode", "verify", "decode-wide", "verify-wide"}
        assert seen["_rotary_paged_attention_kernel"] == seen["_paged_attention_kernel"]
        for q in ("decode", "verify"):
            assert logs[(q, "_paged_attention_kernel")][0] != logs[(q + "-wide", "_paged_attention_kernel")][0]
    else:
        assert seen["_rejection_sample_kernel"] == {"greedy", "sampled"}
        assert seen["_typical_accept_kernel"] == {"typical"}


@pytest.mark.parametrize("acceptance", ["greedy", "rejection", "typical"])
def test_a_rounds_acceptance_compiles_one_sampler_variant_at_every_bucket(monkeypatch, acceptance):
    """The verify's own ``accept`` (round/fixed_round.py) with the arguments a round passes: its drafts are a view
    of the verify's input ids, which at one row is contiguous at an offset of one token. Triton keys pointers on
    16-byte alignment, and a b = 32 call of the pair on an H200 compiled the greedy split kernel a second time
    when its last row ran alone (0.67 s)."""
    from types import SimpleNamespace

    import importlib

    from hf_specdec.kernels import ops
    from hf_specdec.round.fixed_round import accept

    monkeypatch.setattr(ops, "_impl", lambda tensor, module, name, reference: getattr(  # the CUDA route, on CPU
        importlib.import_module(f"hf_specdec.kernels.{module}"), name))
    logs, mode = {}, [acceptance]
    for mod, names in KERNELS.items():
        monkeypatch.setattr(mod, "_num_programs_target", lambda device: 2 * 132)
        for name in names:
            monkeypatch.setattr(mod, name, _Spy(getattr(mod, name), logs, mode))
    V, k = 16384, 4
    spec = SimpleNamespace(acceptance=acceptance, generator=None, posterior_threshold=0.09, posterior_alpha=0.3)
    for B in (32, 24, 16, 8, 4, 2, 1):
        input_ids = torch.zeros(B * (k + 1), dtype=torch.long)  # as the verify gathers them from the history
        s = SimpleNamespace(size=B, hist=torch.zeros(B, 8, dtype=torch.long),
                            draft_probs=torch.full((B, k, V), 1.0 / V) if acceptance == "rejection" else None)
        accept(s, torch.zeros(B * (k + 1), V), spec, k, input_ids.view(B, k + 1)[:, 1:])
    assert logs, "no sampler kernel was launched"
    for (mode_, kernel), keys in logs.items():
        assert len(set(keys)) == 1, (mode_, kernel, [k_ for k_ in set(keys)])


@pytest.mark.parametrize("drafter", ["draft model", "draft head"])
def test_a_calls_step_metadata_gets_aligned_pointers_at_one_row(monkeypatch, drafter):
    """Every forward's paged metadata (one Triton kernel) through real calls at 3 rows and at one: its tensors keep
    one dtype and 16-byte alignment, the way Triton keys the kernel. At one row a draft step's positions and lengths
    were row j of a (k, 1) table, 8j bytes in: two more compiles of the kernel in a b = 1 call (H200)."""
    import importlib

    import hf_specdec
    from hf_specdec.kernels import ops
    from models import left_padded_prompts, make_draft, make_model

    keys, launcher = set(), importlib.import_module("hf_specdec.kernels.step_metadata_triton").step_metadata_triton

    def recorded(tables, positions, seq_lens, q, block_size):
        keys.add(tuple((t.dtype, t.data_ptr() % 16 == 0, t.is_contiguous()) for t in (tables, positions, seq_lens)))
        return launcher(tables, positions, seq_lens, q, block_size)

    real = ops._impl
    monkeypatch.setattr(ops, "_impl", lambda tensor, module, name, reference: recorded if module ==
                        "step_metadata_triton" else real(tensor, module, name, reference))
    target = hf_specdec.enable(make_model("llama", seed=5))
    draft = make_draft(target, "mix") if drafter == "draft model" else hf_specdec.DraftHead.for_target(target)
    ids, mask = left_padded_prompts(3, seed=2)
    for rows in (3, 1):
        target.generate(input_ids=ids[:rows], attention_mask=mask[:rows], do_sample=False, max_new_tokens=10,
                        assistant_model=draft, spec_config=hf_specdec.SpecConfig(num_speculative_tokens=4,
                                                                                adaptive=False))
    assert len(keys) == 1 and all(aligned for key in keys for _, aligned, _ in key), keys


def test_every_triton_launch_of_real_calls_gets_aligned_pointers(monkeypatch):
    """Calls at 3 rows (finishing at different times) and at one, greedy and sampled, with a draft model, a draft head
    and prompt lookup, every op on its Triton kernel (interpreted): no launch gets a tensor off 16-byte alignment,
    which Triton would key a kernel of its own on (a JIT compile in the middle of a user's call)."""
    import importlib

    import hf_specdec
    from hf_specdec.kernels import ops
    from models import left_padded_prompts, make_draft, make_model

    misaligned = {}

    class Aligned:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                bound = dict(zip(inspect.signature(self.kernel.fn).parameters, args), **kwargs)
                for name, value in bound.items():
                    if isinstance(value, torch.Tensor) and value.data_ptr() % 16:
                        misaligned.setdefault(self.kernel.fn.__name__, set()).add(name)
                return self.kernel[grid](*args, **kwargs)
            return launch

    for module, names in {"paged_attention_triton": ("_paged_attention_kernel", "_combine_kv_splits_kernel",
                                                     "_write_kv_kernel"),
                          "rejection_sampler_triton": ("_rejection_sample_kernel", "_rejection_sample_split_kernel"),
                          "commit_triton": ("_commit_kernel",), "step_metadata_triton": ("_step_metadata_kernel",),
                          "ngram_lookup_triton": ("_ngram_drafts_kernel",)}.items():
        mod = importlib.import_module(f"hf_specdec.kernels.{module}")
        for name in names:
            monkeypatch.setattr(mod, name, Aligned(getattr(mod, name)))
    monkeypatch.setattr(ops, "_impl", lambda tensor, module, name, reference: getattr(
        importlib.import_module(f"hf_specdec.kernels.{module}"), name))
    target = hf_specdec.enable(make_model("llama", seed=5))
    ids, mask = left_padded_prompts(3, seed=2)
    plain = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=7, eos_token_id=None)
    kw = dict(max_new_tokens=7, eos_token_id=int(plain[0, ids.shape[1] + 2]), pad_token_id=0)  # row 0 ends early
    spec = hf_specdec.SpecConfig(num_speculative_tokens=4, adaptive=False)
    draft = make_draft(target, "mix")
    # one row greedy: the head's and prompt lookup's calls below (the draft model's is the same launches)
    for rows, sample in ((3, False), (3, True), (1, True)):
        target.generate(input_ids=ids[:rows], attention_mask=mask[:rows], do_sample=sample, assistant_model=draft,
                        spec_config=spec, **kw)
    target.generate(input_ids=ids[:1], attention_mask=mask[:1], do_sample=False, spec_config=spec, **kw,
                    assistant_model=hf_specdec.DraftHead.for_target(target))
    target.generate(input_ids=ids[:1], attention_mask=mask[:1], do_sample=False, **kw,
                    spec_config=hf_specdec.SpecConfig(num_speculative_tokens=4, method="ngram"))
    assert not misaligned, misaligned


# The uncompiled copy's layer kernels: one variant for a target and its draft, prompts and decode steps.
LAYER_CONFIGS = {  # hidden, heads, kv heads, head_dim, intermediate
    "pair target": (1536, 12, 4, 128, 4096),
    "pair draft": (512, 8, 4, 64, 1536),
    "llama-8b": (4096, 32, 8, 128, 14336),
    "llama-1b": (2048, 32, 8, 64, 8192),
}


def test_layer_kernels_compile_one_variant_for_every_model_and_step(monkeypatch):
    """RMSNorm, SiLU·up and the rotary + K/V write are JIT-compiled inside a process's first call (its prefill):
    a variant per model or per use was one more compile each (0.3 s on an H200 host; the pair's first call gained
    1.1 s from seven of them). Every width, head count and head_dim up to 128, prompt or decode step, one key."""
    from hf_specdec.kernels import rms_norm_triton as rn, rotary_write_kv_triton as rw, silu_mul_triton as sm

    logs, mode = {}, [None]
    for mod, name in ((rn, "_rms_norm_kernel"), (sm, "_silu_mul_kernel"), (rw, "_rotary_write_kv_kernel")):
        monkeypatch.setattr(mod, name, _Spy(getattr(mod, name), logs, mode))
    dtype = torch.bfloat16
    for model, (hidden, H, KVH, D, inter) in LAYER_CONFIGS.items():
        caches = torch.empty(4, 16, KVH, D, dtype=dtype)
        for T in (1, 2, 5, 32, 300):  # a decode step, a verify, prompts
            mode[0] = "layer"
            rn.rms_norm_triton(torch.empty(T, hidden, dtype=dtype), torch.empty(hidden, dtype=dtype), 1e-5)
            fused = torch.empty(T, 2 * inter, dtype=dtype)  # gate/up as one matmul leaves them (strided views)
            sm.silu_mul_triton(fused[:, :inter], fused[:, inter:])
            sm.silu_mul_triton(torch.empty(T, inter, dtype=dtype), torch.empty(T, inter, dtype=dtype))
            qkv = torch.empty(T, (H + 2 * KVH) * D, dtype=dtype)
            q, k, v = (x.view(T, -1, D) for x in qkv.split([H * D, KVH * D, KVH * D], dim=1))
            angles = torch.empty(T, D, dtype=dtype)
            for return_key in (False, True):
                rw.rotary_write_kv_triton(q, k, v, angles, angles, caches, caches,
                                          torch.zeros(T, dtype=torch.int64), return_key)
    for (_, kernel), keys in logs.items():
        assert len(set(keys)) == 1, (kernel, set(keys))
    assert len(logs) == 3
