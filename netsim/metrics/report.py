"""Run outputs: metrics table (CSV/Parquet), summary JSON, and the loss/accuracy plot."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

from netsim.errors import InputError


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


AGENT_METRICS = "agent_metrics.csv"
LINES_UP_TO = 200  # agent_accuracy.png draws each agent's line up to this many agents, quantile bands beyond


def write_agent_metrics(rows: list, folder: Path, title: str) -> Path | None:
    """agent_metrics.csv (time, agent, loss, accuracy: each agent's own model on the test rows, one line per
    agent and evaluation) and agent_accuracy.png (every agent's accuracy over time, or beyond
    ``LINES_UP_TO`` agents its 5-95% and 25-75% bands, with the mean and the worst); nothing without
    evaluation.metrics "agent_accuracy"."""
    if not rows:
        return None
    import numpy as np

    n = len(rows[0][1])
    times = np.repeat([r[0] for r in rows], n)
    agents = np.tile(np.arange(n), len(rows))
    loss = np.concatenate([r[1] for r in rows])
    acc = np.concatenate([r[2] for r in rows])
    path = folder / AGENT_METRICS
    with open(path, "w", newline="") as f:
        f.write("time,agent,loss,accuracy\n")
        for t, a, lo, ac in zip(times.tolist(), agents.tolist(), loss.tolist(), acc.tolist(), strict=True):
            f.write(f"{t!r},{a},{lo!r},{ac!r}\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([r[0] for r in rows])
    A = np.stack([r[2] for r in rows])  # (evaluations, agents)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if n <= LINES_UP_TO:
        ax.plot(t, A, color="tab:blue", lw=0.6, alpha=max(0.05, min(0.6, 8 / n)))
    else:  # thousands of lines draw as one blue mass and take minutes: the spread as bands instead
        lo, q1, q3, hi = np.quantile(A, [0.05, 0.25, 0.75, 0.95], axis=1)
        ax.fill_between(t, lo, hi, color="tab:blue", alpha=0.2, lw=0, label="agents, 5-95%")
        ax.fill_between(t, q1, q3, color="tab:blue", alpha=0.4, lw=0, label="agents, 25-75%")
    ax.plot(t, A.mean(1), color="black", lw=1.8, label="mean over agents")
    ax.plot(t, A.min(1), color="tab:red", lw=1.2, ls="--", label="worst agent")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("test accuracy of the agent's own model")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")  # not "best": its search walks every line's points
    fig.tight_layout()
    fig.savefig(folder / "agent_accuracy.png", dpi=110)
    plt.close(fig)
    return path


def write_summary(summary: dict, path: Path) -> None:
    """Written through a rename: a killed process never leaves a half summary (its presence marks a
    complete run folder)."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean, indent=2) + "\n")
    os.replace(tmp, path)


def read_summary(folder: str | Path) -> dict[str, Any]:
    """A run folder's summary.json as a dict; anything else (missing, not UTF-8, not JSON, not an
    object) is an InputError naming the file; so is a folder whose files are not all one run's."""
    from netsim.trace.folder import check_run_folder

    check_run_folder(folder)
    path = Path(folder) / "summary.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("", "not a complete run folder (no summary.json)", str(folder)) from None
    except OSError as e:
        raise InputError("", f"cannot read: {e.strerror or e}", str(path)) from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InputError("", f"not a JSON summary: {' '.join(str(e).split())[:160]}", str(path)) from None
    if not isinstance(data, dict):
        raise InputError("", f"expected a JSON object, got {type(data).__name__}", str(path))
    return data


def _number(text: str) -> int | float | None:
    """A metrics CSV cell: blank -> None (a CSV of None), else an int or a float (nan and inf allowed)."""
    text = text.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)


def read_metrics(folder: str | Path) -> list[dict[str, Any]]:
    """A run folder's metrics table (metrics.parquet, else metrics.csv) as rows of numbers (None for a
    blank). Every row has a finite ``time``; any other shape is an InputError naming the file, and so is a
    folder whose files are not all one run's."""
    from netsim.trace.folder import check_run_folder

    folder = Path(folder)
    check_run_folder(folder)
    pq_path, csv_path = folder / "metrics.parquet", folder / "metrics.csv"
    if pq_path.is_file():
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = pq_path
        try:
            rows = pq.read_table(pq_path).to_pylist()
        except (pa.ArrowException, OSError, ValueError) as e:
            raise InputError("", f"not a Parquet table: {' '.join(str(e).split())[:160]}", str(path)) from None
        for k, r in enumerate(rows):
            bad = [c for c, v in r.items() if not (v is None or isinstance(v, int | float))]
            if bad:
                raise InputError("", f"row {k + 1}: column {bad[0]!r} is not a number", str(path))
    elif csv_path.is_file():
        path = csv_path
        rows, reader = [], None
        try:
            with open(csv_path, newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                header = [h.strip() for h in next(reader, [])]
                if not header or len(set(header)) != len(header) or "" in header:
                    raise ValueError(f"header must name distinct columns, got {','.join(header)[:80]!r}")
                for rec in reader:
                    if len(rec) != len(header):
                        raise ValueError(f"expected {len(header)} fields, got {len(rec)}")
                    rows.append(dict(zip(header, map(_number, rec), strict=True)))
        except (ValueError, csv.Error) as e:  # UnicodeDecodeError is a ValueError
            line = max(1, reader.line_num) if reader is not None else 1
            raise InputError("", f"line {line}: {' '.join(str(e).split())[:160]}", str(path)) from None
        except OSError as e:
            raise InputError("", f"cannot read: {e.strerror or e}", str(path)) from None
    else:
        raise InputError("", "no metrics.csv or metrics.parquet", str(folder))
    for k, r in enumerate(rows):
        t = r.get("time")
        if not (isinstance(t, int | float) and math.isfinite(t)):
            raise InputError("", f"row {k + 1}: time must be a finite number, got {t!r}", str(path))
    return rows


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
