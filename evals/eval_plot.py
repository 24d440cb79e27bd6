"""evals/run_eval.py's PNG: hf_specdec's acceptance length histogram, its acceptance per draft position, and
tokens/s per generate() call for each method (one call = ``--batch-size`` prompts)."""
from __future__ import annotations


def make_plot(summary: dict, calls: list[dict], methods: list[str], k: int, batch_size: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    spec = summary.get("hf_specdec", {})
    hist, per_pos = spec.get("acceptance_length_histogram"), spec.get("acceptance_per_position")
    ax = axes[0]
    if hist:
        ax.bar(range(len(hist)), hist, color="tab:blue")
        ax.set_xlabel("accepted draft tokens per round")
        ax.set_ylabel("drafts (rows x rounds)")
        ax.set_title(f"hf_specdec acceptance length (k={k}), mean {spec['mean_acceptance_length']:.2f}")
    else:
        _empty(ax, "no hf_specdec acceptance figures")
    ax = axes[1]
    if per_pos:
        ax.bar(range(1, len(per_pos) + 1), per_pos, color="tab:green")
        ax.set_ylim(0, 1)
        ax.set_xlabel("draft position")
        ax.set_ylabel("share of drafts accepted up to here")
        ax.set_title(f"acceptance per position (rate {spec['acceptance_rate']:.3f})")
    else:
        _empty(ax, "no hf_specdec acceptance figures")
    ax = axes[2]
    data = [[c[m]["tokens_per_s"] for c in calls if c.get(m, {}).get("tokens_per_s")] for m in methods]
    pos = list(range(len(methods)))
    if any(data):
        ax.boxplot([d if d else [0.0] for d in data], positions=pos, widths=0.5)
        for i, d in enumerate(data):
            ax.scatter([i] * len(d), d, s=8, alpha=0.5)
    ax.set_xticks(pos)
    ax.set_xticklabels(methods)
    ax.set_ylabel(f"tokens/s per call (batch {batch_size})")
    ax.set_title("speed per method")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center")
    ax.set_axis_off()
