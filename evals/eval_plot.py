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
    if hist:
        _bars(axes[0], range(len(hist)), hist, "tab:blue", "accepted draft tokens per round", "drafts (rows x rounds)",
              f"hf_specdec acceptance length (k={k}), mean {spec['mean_acceptance_length']:.2f}")
    else:
        _empty(axes[0], "no hf_specdec acceptance figures")
    if per_pos:
        _bars(axes[1], range(1, len(per_pos) + 1), per_pos, "tab:green", "draft position",
              "share of drafts accepted up to here", f"acceptance per position (rate {spec['acceptance_rate']:.3f})")
        axes[1].set_ylim(0, 1)
    else:
        _empty(axes[1], "no hf_specdec acceptance figures")
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


def _bars(ax, xs, values, color: str, xlabel: str, ylabel: str, title: str) -> None:
    ax.bar(list(xs), values, color=color)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center")
    ax.set_axis_off()
