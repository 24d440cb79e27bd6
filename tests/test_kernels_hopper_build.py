"""The Triton kernels changed since the last GPU run (the decode GEMV's, the paged attention's, the round's commit
and step metadata) compile for a Hopper GPU (sm_90: cubin through the wheel's ptxas), with no GPU.

CPU tests run the kernels under Triton's interpreter, which executes their Python but never lowers them; a
construct the compiler refuses would first fail on a GPU. This builds every variant the runner can launch
(GEMV: each gated activation, with and without the residual and the bias, bf16 and one fp16; the gated
activation's own kernel; attention: with the K/V write for a decode and a verify tile, bf16 and fp32, and without
it; commit: both run widths; step metadata) in a process without ``TRITON_INTERPRET``.
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
from hf_specdec.kernels import decode_linear_triton as dl

target = GPUTarget("cuda", 90, 32)
built = 0
gemv = [("bf16", act, residual, bias) for act in (0, 1, 2) for residual, bias in ((False, False), (True, False), (True, True))]
for dt, act, residual, bias in gemv + [("fp16", 1, True, False)]:
    sig = {name: f"*{dt}" for name in ("x_ptr", "w_ptr", "bias_ptr", "residual_ptr", "y_ptr")}
    sig.update(N="i32", K="i32", stride_wn="i32")
    consts = dict(HAS_BIAS=bias, HAS_RESIDUAL=residual, GATE_ACT=act, BLOCK_N=4, BLOCK_K=512)
    sig.update({name: "constexpr" for name in consts})
    kernel = triton.compile(ASTSource(fn=dl._gemv_kernel, signature=sig, constexprs=consts), target=target,
                            options=dict(num_warps=4, num_stages=2))
    assert kernel.asm["cubin"], "no cubin"
    built += 1
for dt, act in (("bf16", 1), ("bf16", 2), ("fp16", 1)):
    sig = dict(x_ptr=f"*{dt}", out_ptr=f"*{dt}", K="i32", stride_xr="i32", GATE_ACT="constexpr", BLOCK="constexpr")
    kernel = triton.compile(ASTSource(fn=dl._gated_rows_kernel, signature=sig, constexprs=dict(GATE_ACT=act, BLOCK=1024)),
                            target=target, options=dict(num_warps=4))
    assert kernel.asm["cubin"], "no cubin"
    built += 1
from hf_specdec.kernels import paged_attention_triton as pa
ptrs = ("out_ptr", "q_ptr", "k_cache_ptr", "v_cache_ptr")
for dt, new_kv, tokens in (("bf16", True, 1), ("bf16", True, 5), ("fp32", True, 5), ("bf16", False, 1)):
    sig = {name: f"*{dt}" for name in ptrs}
    sig.update(block_tables_ptr="*i32", seq_lens_ptr="*i32", query_start_loc_ptr="*i32", scale="fp32",
               softcap="fp32", sliding_window="i32")
    sig.update({name: "i32" for name in ("head_dim", "block_size", "num_groups", "stride_qt", "stride_qh",
                                        "stride_ot", "stride_oh", "stride_kc_blk", "stride_kc_pos", "stride_kc_h",
                                        "stride_vc_blk", "stride_vc_pos", "stride_vc_h", "stride_bt")})
    sig.update(part_acc_ptr="*fp32", part_ml_ptr="*fp32", num_kv_splits="i32", key_ptr=f"*{dt}",
               value_ptr=f"*{dt}", slot_ptr="*i64", stride_kt="i32", stride_kh="i32", stride_vt="i32",
               stride_vh="i32")
    dtype = dict(bf16=torch.bfloat16, fp32=torch.float32)[dt]
    _, _, launch, _ = pa._attention_launch(1, tokens, 32, 8, 128, 4096, 264, dtype, None, None)  # 8B-shaped
    opts = dict(num_warps=launch.pop("num_warps"), num_stages=launch.pop("num_stages"))
    consts = dict(launch, NEW_KV=new_kv, HAS_SOFTCAP=True, HAS_WINDOW=True)
    sig.update({name: "constexpr" for name in consts})
    kernel = triton.compile(ASTSource(fn=pa._paged_attention_kernel, signature=sig, constexprs=consts),
                            target=target, options=opts)
    assert kernel.asm["cubin"], "no cubin"
    built += 1
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
print("built", built)
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
    assert "built 20" in done.stdout, done.stdout
