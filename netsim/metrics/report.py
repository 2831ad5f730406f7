"""Run outputs: metrics table (CSV/Parquet), summary JSON, and the loss/accuracy plot."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path


def write_metrics(rows: list[dict], path: Path, fmt: str) -> Path:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = path.with_suffix(".parquet")
        pq.write_table(pa.table({c: [r.get(c) for r in rows] for c in cols}), path)
        return path
    path = path.with_suffix(".csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return path


def write_summary(summary: dict, path: Path) -> None:
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
    path.write_text(json.dumps(clean, indent=2) + "\n")


def plot_metrics(rows: list[dict], path: Path, title: str) -> Path | None:
    """Loss and accuracy of the average model (and consensus distance) vs simulated time."""
    panels = [k for k in ("loss", "accuracy", "consensus") if rows and k in rows[0]]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["time"] for r in rows]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, key in zip(axes[0], panels):
        ax.plot(t, [r[key] for r in rows], marker=".", lw=1.4)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel({"loss": "test loss (average model)", "accuracy": "test accuracy (average model)",
                       "consensus": "consensus distance"}[key])
        if key == "consensus":
            ax.set_yscale("symlog", linthresh=1e-6)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
