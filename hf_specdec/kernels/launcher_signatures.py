"""The argument kinds of the Triton launchers hf_specdec's kernels use (``triton_launchers.py`` builds them ahead).

Written by ``benchmarks/launcher_signatures.py`` on a GPU (the union of what first calls launched): each entry is
(the kinds of a kernel's arguments as Triton names them, and for host tensor descriptors whether each was lowered
to TMA, or None). Recorded on an H200 (Triton 3.6, bf16) over the project's pair: a draft model, draft heads,
n-gram drafts and k = 0, greedy and sampled, at 1 and 32 rows.
"""
SIGNATURES = (
    (('*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*i64', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'constexpr', 'constexpr', 'constexpr'), None),
    (('*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*i64', '*i32', '*i32', '*i32', 'fp32', 'i32', 'i32', 'i32', 'constexpr', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', '*fp32', '*fp32', 'i32', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr'), None),
    (('*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*i64', '*i32', '*i32', '*i32', 'fp32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', '*fp32', '*fp32', 'i32', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr'), None),
    (('*bf16', '*bf16', '*bf16', '*bf16', '*bf16', '*bf16', 'i32', 'i32', 'i32', 'fp32', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr'), None),
    (('*bf16', '*bf16', '*bf16', '*bf16', '*i32', '*i32', '*i32', 'fp32', 'fp32', 'i32', 'i32', 'i32', 'constexpr', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', '*fp32', '*fp32', 'i32', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr'), None),
    (('*bf16', '*bf16', '*bf16', '*bf16', '*i32', '*i32', '*i32', 'fp32', 'fp32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', '*fp32', '*fp32', 'i32', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr', 'constexpr'), None),
    (('*bf16', '*bf16', '*bf16', 'i32', 'i32', 'i32', 'fp32', 'constexpr', 'constexpr'), None),
    (('*bf16', '*bf16', '*bf16', 'i32', 'i32', 'i32', 'i32', 'constexpr', 'constexpr'), None),
    (('*bf16', '*fp32', '*fp32', 'i32', 'i32', 'i32', 'i32', 'i32', 'constexpr', 'constexpr', 'constexpr'), None),
    (('*i32', '*i64', '*i64', '*i64', '*i32', '*i32', '*i64', 'i32', 'i32', 'i32', 'i32', 'i32', 'constexpr'), None),
    (('*i64', '*i64', '*i32', '*i64', '*fp32', '*fp32', '*u1', '*fp64', '*fp32', '*fp32', '*i32', '*fp32', '*i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'constexpr', 'i32', 'constexpr', 'constexpr', 'constexpr', 'constexpr'), None),
    (('*i64', '*i64', '*i32', '*i64', '*fp32', '*fp32', '*u1', '*fp64', '*fp32', '*fp32', '*i32', '*fp32', '*i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'constexpr', 'constexpr', 'constexpr', 'constexpr'), None),
    (('*i64', '*i64', '*i64', '*i64', '*i64', '*i64', '*u1', '*i64', '*i64', '*i64', '*i64', '*i64', '*i64', '*i64', '*i64', '*i64', '*i64', 'i32', 'i32', 'i32', 'i32', 'i32', 'constexpr', 'constexpr'), None),
    (('*i64', '*i64', '*i64', '*i64', '*i64', 'i32', 'i32', 'constexpr', 'constexpr', 'i32', 'constexpr', 'constexpr', 'constexpr'), None),
    (('*i64', '*i64', '*i64', '*i64', '*i64', 'i32', 'i32', 'i32', 'constexpr', 'i32', 'constexpr', 'constexpr', 'constexpr'), None),
)
