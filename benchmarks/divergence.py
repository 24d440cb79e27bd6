"""Where a greedy output leaves plain greedy's, and whether rounding explains it (benchmarks/e2e.py).

In fp32 hf_specdec's greedy output is the target's own, token for token. In bf16/fp16 two
computations of the same logits (another batch shape, another attention kernel, a paged cache)
round differently, and where the target's two best tokens are that close, argmax can pick either:
Hugging Face's own static-cache + compile path diverges from its eager path for that reason. So for
every greedy row that differs from plain eager greedy, this finds the first divergent position t
(plain chose token a, the other method token b) and re-scores the common prefix (the prompt and the
t tokens both agree on) with the target twice:

  plain   the model's own forward (Hugging Face attention, no cache): plain generate's arithmetic
  paged   hf_specdec's paged forward of the same prefix (the runner's prefill, output_logits)

For each it reports the top-2 margin and the gap ``logit[a] - logit[b]``, with the resolution of
those logits: the spacing of the model dtype's numbers at their magnitude (one bf16 ulp).
A divergence is a near-tie when the two tokens' logits lie within ``tie_ulps`` resolutions in
either forward; one that is not (``suspect``) is not explained by rounding: a bug to look at.
"""
from __future__ import annotations

import math
from typing import Optional

import torch


def first_divergence(plain: list[int], other: list[int]) -> Optional[int]:
    """First index where the two token lists differ (the shorter one's length if one is a prefix); None if equal."""
    for t, (a, b) in enumerate(zip(plain, other)):
        if a != b:
            return t
    return None if len(plain) == len(other) else min(len(plain), len(other))


def resolution(value: float, dtype: torch.dtype) -> float:
    """Spacing of ``dtype``'s numbers at ``|value|``: the smallest difference two logits there can have."""
    info = torch.finfo(dtype)
    return info.eps * 2.0 ** math.floor(math.log2(max(abs(value), info.tiny)))


def token_gap(logits: torch.Tensor, a: Optional[int], b: Optional[int]) -> dict:
    """Top-2 margin of ``logits`` ``(V,)`` and the gap between tokens a and b (None where a token is missing)."""
    top = torch.topk(logits.float(), 2)
    out = {"argmax": int(top.indices[0]), "top2": [int(i) for i in top.indices],
           "margin": float(top.values[0] - top.values[1])}
    if a is not None and b is not None:
        out["gap"] = float(logits[a].float() - logits[b].float())
        out["magnitude"] = float(max(abs(logits[a].float()), abs(logits[b].float())))
    return out


@torch.no_grad()
def plain_logits(target, prefix: torch.Tensor) -> torch.Tensor:
    """The target's last-position logits for ``prefix`` ``(L,)`` from its own forward."""
    return target(input_ids=prefix[None], attention_mask=torch.ones_like(prefix)[None], use_cache=False).logits[0, -1]


def paged_logits(target, draft, prefix: torch.Tensor) -> torch.Tensor:
    """The same logits from hf_specdec's paged forward: the runner's prefill (one new token: no round runs)."""
    import hf_specdec

    hf_specdec.enable(target)
    out = target.generate(input_ids=prefix[None], attention_mask=torch.ones_like(prefix)[None], assistant_model=draft,
                          max_new_tokens=1, do_sample=False, output_logits=True, return_dict_in_generate=True,
                          spec_config=hf_specdec.SpecConfig(num_speculative_tokens=1))
    return out.logits[0][0]


def analyse_row(target, draft, prompt: torch.Tensor, plain: list[int], other: list[int], dtype: torch.dtype,
                tie_ulps: float = 1.0, cache: Optional[dict] = None) -> Optional[dict]:
    """The divergence of one row (``prompt``: its real tokens, no padding), or None where the outputs agree."""
    t = first_divergence(plain, other)
    if t is None:
        return None
    a = plain[t] if t < len(plain) else None
    b = other[t] if t < len(other) else None
    prefix = torch.cat([prompt, torch.tensor(plain[:t], dtype=prompt.dtype, device=prompt.device)])
    key = tuple(prefix.tolist())
    if cache is None or key not in cache:
        logits = {"plain": plain_logits(target, prefix)}
        if draft is not None:
            logits["paged"] = paged_logits(target, draft, prefix)
        if cache is not None:
            cache[key] = logits
    logits = cache[key] if cache is not None else logits
    row = {"position": t, "plain_token": a, "other_token": b}
    for name, values in logits.items():
        row[name] = token_gap(values, a, b)
    if "paged" in logits:
        row["noise"] = float((logits["plain"].float() - logits["paged"].float()).abs().max())
    if a is None or b is None:
        row["near_tie"] = None  # one output ended earlier: no token pair to compare
        return row
    row["resolution"] = res = resolution(row["plain"]["magnitude"], dtype)
    gaps = [abs(row[name]["gap"]) for name in logits]
    row["gap_ulps"] = min(gaps) / res
    row["near_tie"] = min(gaps) <= tie_ulps * res
    return row


def analyse(target, draft, ids: torch.Tensor, mask: torch.Tensor, plain_rows: list[list[int]],
            other_rows: list[list[int]], dtype: torch.dtype, tie_ulps: float = 1.0,
            cache: Optional[dict] = None) -> dict:
    """Every divergent row of one run against plain greedy (row i: prompt ``ids[i]`` with ``mask[i]``)."""
    rows = []
    for i, (plain, other) in enumerate(zip(plain_rows, other_rows)):
        row = analyse_row(target, draft, ids[i][mask[i].bool()], plain, other, dtype, tie_ulps, cache)
        if row is not None:
            rows.append({"row": i, **row})
    return {"rows_compared": len(plain_rows), "divergent": len(rows),
            "near_ties": sum(1 for r in rows if r["near_tie"]),
            "suspect": sum(1 for r in rows if r["near_tie"] is False),
            "tie_ulps": tie_ulps, "dtype": str(dtype).replace("torch.", ""), "divergences": rows}


# --------------------------------------------------------------------------- #
# benchmarks/e2e.py: every greedy row against plain eager greedy of the same batch size
def add_to_results(bench, tie_ulps: float) -> None:
    """``divergence`` in every greedy result that has outputs (plain_eager's own excepted)."""
    dtype = next(bench.target.parameters()).dtype
    cache: dict = {}
    for r in bench.results:
        if r["mode"] != "greedy" or not r.get("outputs") or r["method"] == "plain_eager":
            continue
        ref = next((x for x in bench.results if (x["method"], x["mode"], x["batch_size"]) ==
                    ("plain_eager", "greedy", r["batch_size"]) and x.get("outputs")), None)
        if ref is not None and len(ref["outputs"]) == len(r["outputs"]):
            r["divergence"] = analyse(bench.target, bench.draft, bench.ids, bench.mask, ref["outputs"], r["outputs"],
                                      dtype, tie_ulps, cache)


def _cell(d: dict, name: str) -> str:
    g = d.get(name)
    if not g or "gap" not in g:
        return f"{'-':>22}"
    return f"{g['gap']:>+9.4f} {g['margin']:>8.4f}  {'=' if g['argmax'] == d['plain_token'] else '!'}"


def table_lines(results: list[dict]):
    """One line per divergence: where, which tokens, both forwards' gap and margin, resolution, verdict."""
    rows = [r for r in results if r.get("divergence", {}).get("divergent")]
    if not rows:
        return
    yield (f"{'method':<15}{'variant':<20}{'b':>4}{'row':>5}{'pos':>5}{'plain':>7}{'other':>7}"
           f"{'plain gap  margin':>22}{'paged gap  margin':>22}{'res':>9}{'ulps':>7}{'noise':>8}  verdict")
    for r in rows:
        for d in r["divergence"]["divergences"]:
            verdict = {True: "near-tie", False: "SUSPECT", None: "length"}[d["near_tie"]]
            yield (f"{r['method']:<15}{r['variant']:<20}{r['batch_size']:>4}{d['row']:>5}{d['position']:>5}"
                   f"{str(d['plain_token']):>7}{str(d['other_token']):>7}{_cell(d, 'plain')}{_cell(d, 'paged')}"
                   f"{d.get('resolution', float('nan')):>9.4f}{d.get('gap_ulps', float('nan')):>7.1f}"
                   f"{d.get('noise', float('nan')):>8.4f}  {verdict}")
    yield ("(pos = first divergent generated token; gap = logit[plain's token] - logit[other's] and margin = top-2 "
           "margin, from the target's own forward (plain) and hf_specdec's paged forward (paged) of the common "
           "prefix; '=' when that forward's argmax is plain's token; res = one ulp of the model dtype at those logits; "
           "ulps = the smaller |gap| in ulps; noise = max |plain - paged| over the vocabulary)")


def summary_line(results: list[dict]) -> Optional[str]:
    """Divergent rows, near-ties and suspects over all greedy runs, then per run that diverged (None when
    nothing was analysed)."""
    runs = [r for r in results if "divergence" in r]
    if not runs:
        return None
    total = {key: sum(r["divergence"][key] for r in runs) for key in ("divergent", "rows_compared", "near_ties",
                                                                      "suspect")}
    parts = [f"{r['method']} {r['variant']} b={r['batch_size']} {r['divergence']['divergent']}/"
             f"{r['divergence']['rows_compared']} ({r['divergence']['near_ties']} near-ties)"
             for r in runs if r["divergence"]["divergent"]]
    return (f"greedy rows diverging from plain eager: {total['divergent']} of {total['rows_compared']} compared, "
            f"{total['near_ties']} near-ties (within {runs[0]['divergence']['tie_ulps']:g} ulp), "
            f"{total['suspect']} suspect" + ("; " + ", ".join(parts) if parts else ""))
