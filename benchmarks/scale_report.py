"""benchmarks/scale.py's derived numbers (floor shares, ratios, projections) and its markdown tables.

Everything here is a pure function of one measured row (one batch size) or of the rows of one run, so the
projection can be recomputed from the JSON alone (tests/test_scale_smoke.py does). The projection:

    E(a, k)        = (1 - a^(k+1)) / (1 - a)                 tokens a row commits per round (docs/real_sizes.md)
    forwards(k)    = k * draft_step + (draft_first_step - draft_step) + verify(k+1)
    overhead       = round(k=4) - forwards(4)                 the measured round's non-forward work, held fixed
    round_cost(k)  = forwards(k) + overhead
    vs_hf(a, k)    = E(a, k) * hf_step / round_cost(k)        against HF's compiled plain decoding step
    vs_ours(a, k)  = E(a, k) * plain_round / round_cost(k)    against our k = 0 round (plain decoding, same runner)

verify(q) interpolates the verify forwards measured at q = 2, 5, 9 tokens a row linearly (extrapolated
linearly from the nearest segment outside them). The round and step costs are GPU times of CUDA-graph
replays (stage_timing.time_stages); hf_step is the wall time between HF's decoding steps, host included.
"""
from __future__ import annotations

from benchmarks.cold_start_report import num
from benchmarks.tp_cost_report import expected_tokens

ALPHAS = (0.6, 0.7, 0.8, 0.9)
KS = tuple(range(1, 9))
ROUND_K = 4  # the k at which the whole round is measured (its overhead is held for every k)
STEP_KEYS = ("target_step", "draft_step", "plain_round", "round", "hf_step")


def verify_at(verify: dict, tokens: int) -> float:
    """Verify forward ms at ``tokens`` a row, linear between the measured points ({"2": ms, "5": ms, ...})."""
    points = sorted((int(q), ms) for q, ms in verify.items())
    if len(points) == 1:
        return points[0][1]
    for (q0, v0), (q1, v1) in zip(points, points[1:]):
        if tokens <= q1 or (q1, v1) == points[-1]:
            return v0 + (v1 - v0) * (tokens - q0) / (q1 - q0)
    raise AssertionError("unreachable")


def forwards_ms(row: dict, k: int) -> float:
    return k * row["draft_step"] + (row["draft_first_step"] - row["draft_step"]) + verify_at(row["verify"], k + 1)


def round_overhead(row: dict) -> float:
    """The measured round at ROUND_K less its model forwards: sampling, acceptance, commit, copies."""
    return row["round"] - forwards_ms(row, ROUND_K)


def round_cost(row: dict, k: int) -> float:
    return forwards_ms(row, k) + round_overhead(row)


def projection(row: dict) -> dict:
    """Projected speedups per acceptance rate and k, and the best k per acceptance rate (JSON keys are strings)."""
    out = {"label": "projection", "overhead_ms": round_overhead(row),
           "round_ms": {str(k): round_cost(row, k) for k in KS}, "by_alpha": {}}
    for a in ALPHAS:
        per_k = {}
        for k in KS:
            e, cost = expected_tokens(a, k), round_cost(row, k)
            per_k[str(k)] = {"E": e, "vs_hf": e * row["hf_step"] / cost if row.get("hf_step") else None,
                             "vs_ours": e * row["plain_round"] / cost}
        best = {}
        for basis in ("vs_hf", "vs_ours"):
            scored = [(v[basis], int(k)) for k, v in per_k.items() if v[basis] is not None]
            if scored:
                value, k = max(scored)
                best[basis] = {"k": k, "speedup": value}
        out["by_alpha"][str(a)] = {"per_k": per_k, "best": best}
    return out


def floor_shares(row: dict, k: int = ROUND_K) -> dict:
    """Each measured step's share of its weight-read floor (floor ms / measured ms; 1.0 = at the floor)."""
    f = row["floor_ms"]
    floors = {"target_step": f["target"], "plain_round": f["target"], "hf_step": f["target"],
              "draft_step": f["draft"], "draft_first_step": f["draft_2"], "verify_5": f["target_5"],
              "round": f["draft_2"] + (k - 1) * f["draft"] + f["target_5"]}
    measured = dict(row, verify_5=row.get("verify", {}).get(str(k + 1)))
    shares = {name: floor / measured[name] for name, floor in floors.items() if measured.get(name)}
    if row.get("target_step"):
        shares["target_step_with_kv"] = f["target_with_kv"] / row["target_step"]
    return shares


def step_ratios(row: dict, k: int = ROUND_K) -> dict:
    out = {"draft_over_target": row["draft_step"] / row["target_step"],
           "verify_5_over_target": row["verify"][str(k + 1)] / row["target_step"]}
    if row.get("hf_step"):
        out["hf_over_plain_round"] = row["hf_step"] / row["plain_round"]  # > 1: our k = 0 step is faster
        out["hf_over_plain_wall"] = row["hf_step"] / row["plain_step_wall"] if row.get("plain_step_wall") else None
    return out


def batch_ratios(rows: list[dict]) -> dict:
    """Each step's cost at every batch size over its cost at the smallest one (e.g. b32_over_b1)."""
    rows = sorted((r for r in rows if r.get("target_step")), key=lambda r: r["batch"])
    if len(rows) < 2:
        return {}
    first = rows[0]
    out = {}
    for r in rows[1:]:
        out[f"b{r['batch']}_over_b{first['batch']}"] = {
            key: r[key] / first[key] for key in STEP_KEYS if r.get(key) and first.get(key)}
    return out


def derive(row: dict) -> None:
    """Add floor shares, ratios and the projection to a row with its measured costs."""
    row["floor_share"] = floor_shares(row)
    row["ratios"] = step_ratios(row)
    row["projection"] = projection(row)


# --------------------------------------------------------------------------- markdown
def _header(res: dict) -> list[str]:
    c, m = res["copy"], res["models"]
    odd = sorted({f"{k}: {p}" for r in res["rows"] for k, p in r.get("fast_path", {}).items()
                  if res["device"] == "cuda" and p != "graphs+compile"})
    weights = "; ".join(f"{name} {v['per_step_bytes_1tok'] / 1e9:.3f} GB read a step ({v['layers']} layers)"
                        for name, v in m.items())
    return [f"GPU: {res['gpu']}; {res['dtype']}; shapes {res['shapes']}; prompt {res['prompt']} + "
            f"{res['new_tokens']} new tokens; device-to-device copy {c['gb_per_s']:.0f} GB/s (read + write, "
            f"{c['bytes'] / 1e9:.2f} GB copied, median of {c['repeats']}).", f"Weights: {weights}."] + \
        ([f"NOT all runner calls on compiled code (k: path): {', '.join(odd)}"] if odd else []) + [""]


def _cost_table(rows: list[dict]) -> list[str]:
    lines = ["Step costs (ms; in brackets: floor / measured, the share of the weight-read floor)", "",
             "| b | target step | draft step | draft first step | verify 2 / 5 / 9 | round k=4 | our k=0 round | "
             "our k=0 wall | HF compiled step | HF / our k=0 | draft / target | verify5 / target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, q = r.get("floor_share", {}), r.get("ratios", {})
        cell = lambda key: f"{num(r.get(key), 3)} ({num(s.get(key))})" if key in s else num(r.get(key), 3)  # noqa
        verify = " / ".join(num(r.get("verify", {}).get(t), 3) for t in ("2", "5", "9"))
        lines.append(f"| {r['batch']} | {cell('target_step')} | {cell('draft_step')} | {cell('draft_first_step')} | "
                     f"{verify} | {cell('round')} | {cell('plain_round')} | {num(r.get('plain_step_wall'), 3)} | "
                     f"{cell('hf_step')} | {num(q.get('hf_over_plain_round'))} | "
                     f"{num(q.get('draft_over_target'))} | {num(q.get('verify_5_over_target'))} |")
    return lines


def _kernel_tables(rows: list[dict], top: int = 8) -> list[str]:
    lines = ["", "Kernels per step (per decoder layer)", "", "| b | target | draft | counted over |",
             "|---|---|---|---|"]
    for r in rows:
        kt, kd = r.get("kernels", {}).get("target"), r.get("kernels", {}).get("draft")
        fmt = lambda k: f"{k['per_step']:.0f} ({k['per_layer']:.1f})" if k else "-"  # noqa: E731
        lines.append(f"| {r['batch']} | {fmt(kt)} | {fmt(kd)} | {(kt or kd or {}).get('source', '-')} |")
    for r in rows:
        for piece, title in (("target", "Target step"), ("verify", f"Verify of {ROUND_K + 1} tokens a row")):
            kt = r.get("kernels", {}).get(piece)
            if kt:
                lines += ["", f"{title} at b = {r['batch']}: top kernels by time ({kt['busy_us']:.0f} us busy)", "",
                          "| kernel | count | us |", "|---|---|---|"]
                lines += [f"| `{name.replace('|', '/')}` | {count:g} | {us:.1f} |"
                          for name, count, us in kt["top"][:top]]
    return lines


def _projection_table(rows: list[dict]) -> list[str]:
    lines = ["", "Projection (not measured: the costs above composed by the formula in scale_report.py): speedup "
             "at each k vs HF compiled plain decoding (vs our k = 0 round); best k in bold", "",
             "| b | a | " + " | ".join(f"k={k}" for k in KS) + " | best vs HF | best vs ours |",
             "|---|---|" + "---|" * (len(KS) + 2)]
    for r in rows:
        p = r.get("projection")
        if not p:
            continue
        if p["overhead_ms"] < 0:
            lines.append(f"| {r['batch']} | round < its forwards (noise): unreliable |" + " |" * (len(KS) + 2))
        for a in ALPHAS:
            entry = p["by_alpha"][str(a)]
            best = entry["best"].get("vs_hf", entry["best"].get("vs_ours"))
            cells = []
            for k in KS:
                v = entry["per_k"][str(k)]
                text = f"{num(v['vs_hf'])} ({num(v['vs_ours'])})"
                cells.append(f"**{text}**" if best and best["k"] == k else text)
            bests = [f"k={b['k']}: {b['speedup']:.2f}" if b else "-"
                     for b in (entry["best"].get("vs_hf"), entry["best"].get("vs_ours"))]
            lines.append(f"| {r['batch']} | {a} | " + " | ".join(cells) + f" | {bests[0]} | {bests[1]} |")
    return lines


def _long_prompt_table(long: dict | None) -> list[str]:
    if not long:
        return []
    lines = ["", "Time to first token at b = 1 (ms, until a streamer gets it; ours: SpecConfig() with the draft, "
                 "which reads the prompt after that token; target only: k = 0)", "",
             "| prompt tokens | ours | target only | HF generate | ours / HF | target only / HF |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {n} | {r['ours']:.1f} | {r['ours_target_only']:.1f} | {r['hf']:.1f} | {r['ours_over_hf']:.2f} | "
              f"{r['target_only_over_hf']:.2f} |" for n, r in long["ttft_ms"].items()]
    mem = long.get("b32_memory")
    if mem:
        lines += ["", f"b = 32 x {mem['prompt']} tokens with the draft: peak {mem['peak_gb']:.1f} GB allocated "
                      f"(GPU {mem['gpu_gb']:.0f} GB; under 80 GB: {mem['fits_80gb']})"]
    return lines


def report(results: list[dict]) -> str:
    from benchmarks.scale_head import head_lines  # it imports this module's projection
    lines = []
    for res in results:
        rows = sorted(res["rows"], key=lambda r: r["batch"])
        lines += _header(res) + _cost_table(rows) + _kernel_tables(rows) + _projection_table(rows) + head_lines(rows)
        ratios = res.get("batch_ratios", {})
        if ratios:
            lines += ["", "Cost at b over cost at the smallest b: " + "; ".join(
                f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in vals.items()) for name, vals in ratios.items())]
        lines += _long_prompt_table(res.get("long_prompts"))
        lines.append("")
    return "\n".join(lines)
