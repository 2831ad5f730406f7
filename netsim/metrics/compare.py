"""Compare runs: time to a target accuracy, and accuracy vs simulated time of several run folders
overlaid in one plot (``netsim compare RUN... --out compare.png``)."""

from __future__ import annotations

import math
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
    """(summary, metrics rows) of a run folder; errors name the folder or the malformed file."""
    from netsim.metrics.report import read_metrics, read_summary

    if not (folder / "summary.json").is_file():
        raise InputError("RUN", f"{str(folder)!r} is not a run folder (no summary.json)")
    summary = read_summary(folder)
    for k in ("target_accuracy", "time_to_target"):
        v = summary.get(k)
        if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)):
            raise InputError(k, f"must be a finite number or null, got {str(v)[:40]!r}",
                             str(folder / "summary.json"))
    return summary, read_metrics(folder)


def label(summary: dict) -> str:
    return f"{summary.get('scenario', '?')} ({summary.get('algorithm', '?')})"


def compare_plot(folders: list[Path], out: Path, key: str = "accuracy") -> list[dict]:
    """Overlay ``key`` vs simulated time of each run; returns one row per run for a table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(folder, *read_run(folder)) for folder in folders]  # every input checked before drawing
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    table, targets = [], set()
    for folder, summary, rows in runs:
        pts = [(r["time"], r[key]) for r in rows if r.get(key) is not None]
        if not pts:
            plt.close(fig)
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
    try:
        fig.savefig(out, dpi=110)
    except (OSError, ValueError) as e:  # an unwritable path, an unknown image suffix
        raise InputError("--out", f"cannot write the plot {str(out)!r}: {e}") from None
    finally:
        plt.close(fig)
    return table
