"""Pictures: training curves from metrics.jsonl (attention views arrive with the inference issue)."""

from __future__ import annotations

import json
from pathlib import Path


def plot_curves(metrics_file: Path, out_png: Path, title: str = "training") -> Path | None:
    """Loss curves (train parts and eval) and, when present, eval accuracies, side by side."""
    rows = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = [k for k in ("loss", "mlm_loss", "nsp_loss") if any(k in r for r in rows)]
    evals = sorted({k for r in rows for k in r if k.startswith("eval_") and ("loss" in k)})
    scores = sorted({k for r in rows for k in r if k.startswith("eval_") and ("acc" in k or "f1" in k or k.endswith("_corr"))})
    fig, axes = plt.subplots(1, 2 if scores else 1, figsize=(12 if scores else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    for key in losses + evals:
        points = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
        if points:
            ax.plot(*zip(*points), label=key, marker="o" if key.startswith("eval_") else None, markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{title}: loss")
    ax.grid(alpha=0.3)
    ax.legend()
    if scores:
        ax = axes[0][1]
        for key in scores:
            points = [(r["step"], r[key]) for r in rows if key in r]
            ax.plot(*zip(*points), label=key, marker="o", markersize=3)
        ax.set_xlabel("step")
        ax.set_title(f"{title}: held-out metrics")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
