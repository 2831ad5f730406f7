"""Compare runs: time to a target accuracy, and accuracy vs simulated time of several run folders
overlaid in one plot (``netsim compare RUN... --out compare.png``)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from netsim.errors import InputError


def time_to_target(rows: list[dict], target: float, key: str = "accuracy") -> float | None:
    """The first evaluation time whose ``key`` >= ``target`` (None if never, or not measured)."""
    for r in rows:
        v = r.get(key)
        if v is not None and v == v and v >= target:
            return float(r["time"])
    return None


def read_run(folder: Path) -> tuple[dict, list[dict]]:
    """(summary, metrics rows) of a run folder; errors name the folder."""
    summary_path = folder / "summary.json"
    if not summary_path.is_file():
        raise InputError("RUN", f"{str(folder)!r} is not a run folder (no summary.json)")
    summary = json.loads(summary_path.read_text())
    csv_path, pq_path = folder / "metrics.csv", folder / "metrics.parquet"
    if csv_path.is_file():
        with open(csv_path, newline="") as f:
            rows = [{k: float(v) if v not in ("", None) else None for k, v in r.items()}
                    for r in csv.DictReader(f)]
    elif pq_path.is_file():
        import pyarrow.parquet as pq

        rows = pq.read_table(pq_path).to_pylist()
    else:
        raise InputError("RUN", f"{str(folder)!r} has no metrics.csv or metrics.parquet")
    return summary, rows


def label(summary: dict) -> str:
    return f"{summary.get('scenario', '?')} ({summary.get('algorithm', '?')})"


def compare_plot(folders: list[Path], out: Path, key: str = "accuracy") -> list[dict]:
    """Overlay ``key`` vs simulated time of each run; returns one row per run for a table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    table, targets = [], set()
    for folder in folders:
        summary, rows = read_run(folder)
        pts = [(r["time"], r[key]) for r in rows if r.get(key) is not None]
        if not pts:
            raise InputError("--metric", f"run {str(folder)!r} has no {key!r} column")
        ax.plot(*zip(*pts, strict=True), marker=".", lw=1.4, label=label(summary))
        if summary.get("target_accuracy") is not None and key == "accuracy":
            targets.add(summary["target_accuracy"])
        table.append({"run": str(folder), "label": label(summary), key: pts[-1][1],
                      "time_to_target": summary.get("time_to_target"),
                      "messages_sent": summary.get("messages_sent"), "bytes_sent": summary.get("bytes_sent")})
    for t in sorted(targets):
        ax.axhline(t, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(f"test {key} (average model)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return table
