"""benchmarks/cold_start.py's rows from its processes' results, its progress lines, its JSON writer and its
markdown table (one run, or several runs of parts merged)."""
from __future__ import annotations

import json
import os

FIXED = [("method", None), ("b", None), ("first call s", "first_call_s"), ("steady call s", "steady_call_s"),
         ("new length s", "new_length_s"), ("ms/token", "ms_per_token"),
         ("2nd process first call s", "second_process_first_call_s"), ("warm-up s", "first_warmup_seconds"),
         ("compiled after s", "compiled_after_s"), ("switch call s", "switch_call_s"),
         ("compiled call s", "compiled_steady_call_s"), ("path", None)]
JOB = [("method", None), ("b", None), ("prompts", "n_prompts"), ("job s", "job_s"), ("first call s", "first_call_s"),
       ("2nd process job s", "second_process_job_s"), ("job / hf", None), ("2nd job / hf", None),
       ("warm-up s", "first_warmup_seconds"), ("path", None)]


def write_json(path, obj):
    """Written whole or not at all (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
    os.replace(tmp, path)


def num(value, digits=2):
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


def hf_row(row, report, reports):
    """hf_compiled's row of the same shape and batch: from the same run, else from a merged run on the same device."""
    def match(rep):
        return next((r for r in rep["rows"] if r["method"] == "hf_compiled" and r["batch_size"] == row["batch_size"]
                     and r.get("n_prompts") == row.get("n_prompts") and rep["shapes"] == report["shapes"]), None)
    found = match(report)
    if found is None:
        name = (report.get("env") or {}).get("device_name")
        for rep in reports:
            found = found or ((rep.get("env") or {}).get("device_name") == name and match(rep)) or None
    return found


def ratio(row, hf, key):
    if hf is None or not isinstance(row.get(key), (int, float)) or not isinstance(hf.get(key), (int, float)):
        return "-"
    return f"{row[key] / hf[key]:.2f}"


def cells(row, report, reports, columns):
    if row.get("skipped"):
        return [row["method"], str(row["batch_size"]), "skipped"] + [""] * (len(columns) - 3)
    hf = hf_row(row, report, reports)
    out = []
    for title, key in columns:
        if title == "method":
            out.append(row["method"] + (" (ERROR)" if row.get("error") else ""))
        elif title == "b":
            out.append(str(row["batch_size"]))
        elif title == "path":
            out.append(row.get("fast_path") or "-")
        elif title == "job / hf":
            out.append(ratio(row, hf, "job_s"))
        elif title == "2nd job / hf":
            out.append(ratio(row, hf, "second_process_job_s"))
        elif key == "ms_per_token":
            out.append(num(row.get(key), 3))
        else:
            out.append(num(row.get(key)) if key != "n_prompts" else str(row.get(key, "-")))
    return out


def table(reports):
    """Markdown: one line per run's environment, one table per shape, then the rows skipped or failed."""
    lines, notes = [], []
    for rep in reports:
        env = rep.get("env") or {}
        lines.append(f"cold_start --shapes {rep['shapes']}: {env.get('device_name', '?')}, "
                     f"torch {env.get('torch', '?')}, "
                     f"transformers {env.get('transformers', '?')}, {rep.get('total_s', 0):.0f} s")
    for shapes in dict.fromkeys(rep["shapes"] for rep in reports):
        columns = JOB if shapes == "pair" else FIXED
        lines += ["", "| " + " | ".join(t for t, _ in columns) + " |", "|" + "---|" * len(columns)]
        for rep in (r for r in reports if r["shapes"] == shapes):
            for row in rep["rows"]:
                lines.append("| " + " | ".join(cells(row, rep, reports, columns)) + " |")
                tag = f"{shapes} {row['method']} b={row['batch_size']}"
                for key in ("skipped", "error", "second_process_skipped", "second_process_error", "note"):
                    if row.get(key):
                        notes.append(f"- {tag} {key.replace('_', ' ')}: {row[key][:400]}")
    if any(rep["shapes"] != "pair" for rep in reports):
        lines.append("\nms/token: the steady call's seconds / new tokens per row (one decoding step of the whole "
                     "batch). warm-up: spec_metrics.warmup_seconds of the first call.")
    return "\n".join(lines + ([""] + notes if notes else []))


def summarize(row, cold, warm):
    """The row's headline fields from its processes' calls."""
    calls = cold.get("calls", {})
    for name in ("first", "steady", "new_length"):
        if name in calls:
            row[f"{name}_call_s"] = calls[name]["s"]
            row[f"{name}_warmup_seconds"] = calls[name]["warmup_seconds"]
    if "call_0" in calls:
        row["first_call_s"] = calls["call_0"]["s"]
        row["first_warmup_seconds"] = calls["call_0"]["warmup_seconds"]
        row["calls_s"] = [c["s"] for c in calls.values()]
        row["new_tokens"] = sum(c["new_tokens"] for c in calls.values())
    if "job_s" in cold:
        row["job_s"] = cold["job_s"]
        row["job_tokens_per_s"] = row["new_tokens"] / cold["job_s"]
    if "steady" in calls:
        row["new_length_s"] = row.pop("new_length_call_s", None)
        row["ms_per_token"] = 1000.0 * calls["steady"]["s"] / max(1, calls["steady"]["steps"])
        row["ms_per_token_basis"] = "steady call / new tokens per row: one decoding step of the whole batch"
        row["ms_per_row_token"] = 1000.0 * calls["steady"]["s"] / max(1, calls["steady"]["new_tokens"])
    paths = sorted({c["fast_path"] for c in calls.values() if c.get("fast_path")})
    row["fast_path"] = " | ".join(paths) if paths else None
    if row["method"] == "hf_compiled" and "compiled" in cold:
        row["fast_path"] = "hf static cache + compile" if cold["compiled"] else "hf static cache, eager (no compile)"
    for key in ("compiled", "note", "load_s", "error", "compiled_after_s", "switch_call_s", "switch_warmup_s",
                "compiled_steady_call_s"):
        if key in cold:
            row[key] = cold[key]
    if warm:
        wcalls = warm.get("calls", {})
        first = wcalls.get("first") or wcalls.get("call_0")
        if first:
            row["second_process_first_call_s"] = first["s"]
            row["second_process_warmup_seconds"] = first["warmup_seconds"]
        if "job_s" in warm:
            row["second_process_job_s"] = warm["job_s"]
            row["second_process_calls_s"] = [c["s"] for c in wcalls.values()]
        if "error" in warm:
            row["second_process_error"] = warm["error"]
    row["cold_process"], row["second_process"] = cold, warm


def progress(row):
    fmt = lambda key: f"{row[key]:.2f}" if isinstance(row.get(key), (int, float)) else "-"  # noqa: E731
    text = f"first {fmt('first_call_s')} s"
    text += f", job {fmt('job_s')} s" if "job_s" in row else f", steady {fmt('steady_call_s')} s, new length " \
        f"{fmt('new_length_s')} s"
    text += f", 2nd process first {fmt('second_process_first_call_s')} s"
    text += f", 2nd job {fmt('second_process_job_s')} s" if "job_s" in row else ""
    text += f" [{row.get('fast_path') or '-'}]"
    for key in ("error", "second_process_error"):
        if key in row:
            text += f"  {key.upper()} {row[key][:300]}"
    return text


def mark_agreement(report):
    """same_tokens_as_hf_compiled: every call's generated tokens (their hash) equal those of hf_compiled's call of
    the same name at the same batch size; None without both. Greedy: always so in fp32; in bf16 a near-tie may
    round either way (README)."""
    for row in report["rows"]:
        hf = next((r for r in report["rows"] if r["method"] == "hf_compiled" and r["batch_size"] == row["batch_size"]
                   and r.get("n_prompts") == row.get("n_prompts")), None)
        if row["method"] == "hf_compiled" or not hf or not row.get("cold_process") or not hf.get("cold_process"):
            continue
        ours, theirs = row["cold_process"]["calls"], hf["cold_process"]["calls"]
        common = [name for name in ours if name in theirs]
        row["same_tokens_as_hf_compiled"] = all(ours[n]["sha"] == theirs[n]["sha"] for n in common) if common else None
