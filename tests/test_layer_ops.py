"""benchmarks/layer_ops.py on the CPU: the runner's uncompiled copy of Llama, Qwen2 and Qwen3 layers issues fewer
than half the model's own device operations a layer, with the rotary, K/V write and attention, each RMSNorm and the MLP's
activation one operation each."""
from benchmarks import layer_ops


def test_the_runner_copy_issues_under_half_the_operations(tmp_path):
    rows = layer_ops.main(["--out", str(tmp_path / "ops.json")])
    assert {(r["family"], r["tokens_per_row"]) for r in rows} == {(f, t) for f in ("llama", "qwen2", "qwen3")
                                                                   for t in (1, 5)}
    for r in rows:
        assert r["runner_copy_per_layer"] < r["model_per_layer"] / 2, r
        assert r["shared_storage_per_layer"] == r["runner_copy_per_layer"] - 3, r  # q/k/v and gate/up: a matmul each
        ops = r["runner_copy"]
        assert ops["rotary_paged_attention"] == ops["silu_mul"] == 1, ops  # rotary, K/V write, attention: one op
        assert "rotary_write_kv" not in ops and "paged_attention" not in ops, ops
        assert ops["rms_norm"] == (4 if r["family"] == "qwen3" else 2), ops  # Qwen3 norms q and k too
        assert "write_kv_to_slots" not in ops and "silu" not in ops and "rsqrt" not in ops, ops
    assert (tmp_path / "ops.json").exists()
