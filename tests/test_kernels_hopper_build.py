"""Triton kernels compile for a Hopper GPU (sm_90: cubin through the wheel's ptxas), with no GPU: those not yet run
on a GPU when they were written (the round's commit, step metadata, prompt lookup, the rotary + K/V write,
RMSNorm, SiLU·up), and the layer kernels' programmatic dependent launch variants (``USE_PDL``: the GEMVs (loop,
one tile, TMA), the K/V write, the attention and its split-KV combine, the rotary + K/V write, the rotary + K/V
write + attention, RMSNorm, SiLU·up).

CPU tests run the kernels under Triton's interpreter, which executes their Python but never lowers them; a
construct the compiler refuses would first fail on a GPU. This builds every variant the runner can launch
(commit: both run widths; step metadata; prompt lookup; rotary + K/V write; RMSNorm; SiLU·up; the PDL variants) in a
process without ``TRITON_INTERPRET``.
"""
import os
import pathlib
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")

_PTXAS = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"

_BUILD = r"""
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

target = GPUTarget("cuda", 90, 32)
built = 0
from hf_specdec.kernels import commit_triton as ct, step_metadata_triton as sm
sig = {name: "*i64" for name in ("emitted_ptr", "accepted_ptr", "hist_ptr", "pads_ptr", "length_ptr", "gen_ptr",
                                "max_new_ptr", "eos_ptr", "counts_ptr", "keep_ptr", "accepted_out_ptr", "rows_ptr",
                                "drafted_ptr", "draft_tokens_ptr", "accepted_total_ptr", "per_position_ptr")}
sig.update(done_ptr="*i1", B="i32", k="i32", E="i32", stride_e="i32", stride_h="i32", BLOCK_B="constexpr",
           BLOCK_K="constexpr")
for block_k in (8, 16):
    kernel = triton.compile(ASTSource(fn=ct._commit_kernel, signature=sig, constexprs=dict(BLOCK_B=32, BLOCK_K=block_k)),
                            target=target, options=dict(num_warps=4))
    assert kernel.asm["cubin"], "no cubin"
    built += 1
sig = dict(tables_ptr="*i32", positions_ptr="*i64", seq_lens_ptr="*i64", slots_ptr="*i64", starts_ptr="*i32",
           seq_lens_out_ptr="*i32", last_ptr="*i64", B="i32", q="i32", block_size="i32", width="i32", stride_t="i32",
           BLOCK="constexpr")
kernel = triton.compile(ASTSource(fn=sm._step_metadata_kernel, signature=sig, constexprs=dict(BLOCK=256)),
                        target=target, options=dict(num_warps=4))
assert kernel.asm["cubin"], "no cubin"
built += 1
from hf_specdec.kernels import ngram_lookup_triton as nl
sig = dict(tokens_ptr="*i64", pads_ptr="*i64", length_ptr="*i64", drafts_ptr="*i64", counts_ptr="*i64", W="i32",
           stride_t="i32", k="i32", min_n="i32", max_n="i32", BLOCK="constexpr", MAX_N="constexpr", BLOCK_K="constexpr")
kernel = triton.compile(ASTSource(fn=nl._ngram_drafts_kernel, signature=sig,
                                  constexprs=dict(BLOCK=1024, MAX_N=4, BLOCK_K=8)), target=target,
                        options=dict(num_warps=4))
assert kernel.asm["cubin"], "no cubin"
built += 1
from hf_specdec.kernels import rotary_write_kv_triton as rw
rw_sig = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", cos_ptr="*bf16", sin_ptr="*bf16", q_out_ptr="*bf16",
              k_out_ptr="*bf16", key_cache_ptr="*bf16", value_cache_ptr="*bf16", slot_ptr="*i64", **{n: "i32" for n in (
                  "num_heads", "num_kv_heads", "head_dim", "block_size", "store_k", "stride_qt", "stride_qh", "stride_kt",
                  "stride_kh", "stride_vt", "stride_vh", "stride_ct", "stride_st", "stride_ot", "stride_oh",
                  "stride_kot", "stride_koh", "stride_kc_blk", "stride_kc_pos", "stride_kc_h", "stride_vc_blk",
                  "stride_vc_pos", "stride_vc_h")})
rw_names = rw._rotary_write_kv_kernel.arg_names
kernel = triton.compile(ASTSource(fn=rw._rotary_write_kv_kernel,
                                  signature={n: rw_sig.get(n, "constexpr") for n in rw_names},
                                  constexprs=dict(BLOCK_H=16, BLOCK_D=128, USE_PDL=False)),
                        target=target, options=dict(num_warps=4))
assert kernel.asm["cubin"], "no cubin"
built += 1
from hf_specdec.kernels import rms_norm_triton as rn
rn_sig = dict(x_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16", H="i32", stride_x="i32", stride_o="i32", eps="fp32")
kernel = triton.compile(ASTSource(fn=rn._rms_norm_kernel,
                                  signature={n: rn_sig.get(n, "constexpr") for n in rn._rms_norm_kernel.arg_names},
                                  constexprs=dict(BLOCK=1024, USE_PDL=False)), target=target, options=dict(num_warps=4))
assert kernel.asm["cubin"], "no cubin"
built += 1
from hf_specdec.kernels import silu_mul_triton as sl
sl_sig = dict(gate_ptr="*bf16", up_ptr="*bf16", out_ptr="*bf16", N="i32", stride_g="i32", stride_u="i32",
              stride_o="i32")
kernel = triton.compile(ASTSource(fn=sl._silu_mul_kernel,
                                  signature={n: sl_sig.get(n, "constexpr") for n in sl._silu_mul_kernel.arg_names},
                                  constexprs=dict(BLOCK=1024, USE_PDL=False)), target=target, options=dict(num_warps=4))
assert kernel.asm["cubin"], "no cubin"
built += 1
from hf_specdec.kernels import decode_linear_triton as dl, paged_attention_triton as pa
from hf_specdec.kernels import rotary_paged_attention_triton as rpa
pdl = dict(options=dict(num_warps=4, launch_pdl=True))
gemv_sig = dict(x_ptr="*bf16", w_ptr="*bf16", bias_ptr="*bf16", norm_ptr="*bf16", res_ptr="*bf16", y_ptr="*bf16",
                N_OUT="i32", K="i32", stride_wn="i32", eps="fp32")
gemv_plain = dict(HAS_BIAS=False, NORM=False, GATED=False, RESIDUAL=False)
variants = [
    (dl._gemv_kernel, gemv_sig, dict(gemv_plain, BLOCK_N=4, BLOCK_K=512, ONE_TILE=False)),
    (dl._gemv_kernel, gemv_sig, dict(gemv_plain, HAS_BIAS=True, BLOCK_N=4, BLOCK_K=2048, ONE_TILE=True)),
    (dl._gemv_kernel, gemv_sig, dict(HAS_BIAS=False, NORM=True, GATED=True, RESIDUAL=False, BLOCK_N=4, BLOCK_K=512,
                                     ONE_TILE=False)),  # RMSNorm before, SiLU·up after
    (dl._gemv_tma_kernel, dict(gemv_sig, w_desc="tensordesc<bf16[8, 256]>"),
     dict(gemv_plain, BLOCK_N=8, BLOCK_K=256, NUM_STAGES=4)),
    (dl._gemv_tma_kernel, dict(gemv_sig, w_desc="tensordesc<bf16[2, 8, 256]>"),
     dict(gemv_plain, NORM=True, GATED=True, BLOCK_N=8, BLOCK_K=256, NUM_STAGES=4)),
    (dl._gemv_tma_kernel, dict(gemv_sig, w_desc="tensordesc<bf16[8, 256]>"),
     dict(gemv_plain, RESIDUAL=True, BLOCK_N=8, BLOCK_K=256, NUM_STAGES=4)),
    (dl._gemv_tma_kernel, dict(gemv_sig, w_desc="tensordesc<bf16[16, 512]>"),
     dict(gemv_plain, NORM=True, BLOCK_N=16, BLOCK_K=512, NUM_STAGES=3)),  # the 8B q/k/v launch
    (dl._gemv_tma_kernel, dict(gemv_sig, w_desc="tensordesc<bf16[2, 32, 256]>"),
     dict(gemv_plain, NORM=True, GATED=True, BLOCK_N=32, BLOCK_K=256, NUM_STAGES=3)),  # the 1B gate/up launch
    (dl._gemv_kernel, gemv_sig, dict(gemv_plain, RESIDUAL=True, BLOCK_N=8, BLOCK_K=2048, ONE_TILE=True)),  # 1B o
    (pa._write_kv_kernel, dict(key_ptr="*bf16", value_ptr="*bf16", key_cache_ptr="*bf16", value_cache_ptr="*bf16",
                               slot_ptr="*i64", **{n: "i32" for n in (
                                   "num_kv_heads", "head_dim", "block_size", "stride_kt", "stride_kh", "stride_vt",
                                   "stride_vh", "stride_kc_blk", "stride_kc_pos", "stride_kc_h", "stride_vc_blk",
                                   "stride_vc_pos", "stride_vc_h")}), dict(BLOCK_H=8, BLOCK_D=128)),
    (pa._combine_kv_splits_kernel, dict(out_ptr="*bf16", part_acc_ptr="*fp32", part_ml_ptr="*fp32", num_heads="i32",
                                        head_dim="i32", stride_ot="i32", stride_oh="i32", num_kv_splits="i32"),
     dict(BLOCK_S=16, BLOCK_D=128)),
    (pa._paged_attention_kernel, dict(out_ptr="*bf16", q_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16",
                                      block_tables_ptr="*i32", seq_lens_ptr="*i32", query_start_loc_ptr="*i32",
                                      scale="fp32", softcap="fp32", part_acc_ptr="*fp32", part_ml_ptr="*fp32",
                                      **{n: "i32" for n in (
                                          "sliding_window", "head_dim", "block_size", "num_groups", "stride_qt",
                                          "stride_qh", "stride_ot", "stride_oh", "stride_kc_blk", "stride_kc_pos",
                                          "stride_kc_h", "stride_vc_blk", "stride_vc_pos", "stride_vc_h", "stride_bt",
                                          "num_kv_splits")}),
     dict(HAS_SOFTCAP=False, HAS_WINDOW=False, IEEE_FP32=False, UPCAST=False, BLOCK_Q=4, BLOCK_M=16, BLOCK_N=32,
          BLOCK_D=128)),
    (rw._rotary_write_kv_kernel, rw_sig, dict(BLOCK_H=16, BLOCK_D=128)),
    (rpa._rotary_paged_attention_kernel, dict(
        out_ptr="*bf16", q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", cos_ptr="*bf16", sin_ptr="*bf16",
        k_cache_ptr="*bf16", v_cache_ptr="*bf16", slot_ptr="*i64", block_tables_ptr="*i32", seq_lens_ptr="*i32",
        query_start_loc_ptr="*i32", scale="fp32", part_acc_ptr="*fp32", part_ml_ptr="*fp32", **{n: "i32" for n in (
            "sliding_window", "head_dim", "block_size", "num_groups", "stride_qt", "stride_qh", "stride_kt",
            "stride_kh", "stride_vt", "stride_vh", "stride_ct", "stride_st", "stride_ot", "stride_oh", "stride_kc_blk",
            "stride_kc_pos", "stride_kc_h", "stride_vc_blk", "stride_vc_pos", "stride_vc_h", "stride_bt",
            "num_kv_splits")}),
     dict(HAS_WINDOW=True, IEEE_FP32=False, UPCAST=False, BLOCK_Q=8, BLOCK_M=32, BLOCK_N=32, BLOCK_NEW=16,
          BLOCK_D=128)),
    (rn._rms_norm_kernel, rn_sig, dict(BLOCK=1024)),
    (sl._silu_mul_kernel, sl_sig, dict(BLOCK=1024)),
]
import triton.language as tl
for fn, sig, constexprs in variants if hasattr(tl.extra.cuda, "gdc_wait") else []:  # an older Triton: no PDL
    constexprs = dict(constexprs, USE_PDL=True)
    sig = {name: sig.get(name, "constexpr") for name in fn.arg_names}  # in the kernel's own order
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=target, **pdl)
    assert "griddepcontrol.wait" in kernel.asm["ptx"] and "griddepcontrol.launch_dependents" in kernel.asm["ptx"]
    if fn is dl._gemv_tma_kernel:  # the weight tiles come by TMA, several loads in flight (a pipelined loop)
        assert kernel.asm["ptx"].count("cp.async.bulk.tensor") >= constexprs["NUM_STAGES"]  # a load a stage
    assert kernel.asm["cubin"], "no cubin"
    built += 1
print("built", built, "" if hasattr(tl.extra.cuda, "gdc_wait") else "(no PDL in this Triton)")
"""


@pytest.mark.skipif(not _PTXAS.exists(), reason="this Triton wheel ships no CUDA backend (ptxas)")
def test_kernels_build_for_hopper(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # a fresh cache: every variant is really compiled
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    root = pathlib.Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _BUILD], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "built 23" in done.stdout or "built 7 (no PDL in this Triton)" in done.stdout, done.stdout
