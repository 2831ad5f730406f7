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
    from netsim.trace.folder import check_run_folder

    check_run_folder(folder)
    if not (folder / "summary.json").is_file():
        raise InputError("RUN", f"{str(folder)!r} is not a run folder (no summary.json)")
    summary = read_summary(folder)
    for k in ("target_accuracy", "time_to_target"):
        v = summary.get(k)
        if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)):
            raise InputError(k, f"must be a finite number or null, got {str(v)[:40]!r}",
                             str(folder / "summary.json"))
    return summary, read_metrics(folder)


LOWER_IS_BETTER = ("loss", "consensus", "train_loss", "suboptimality", "tracking")
X_AXES = {"time": "simulated time (s)", "rounds": "rounds (mean activations per agent)", "bytes": "bytes sent"}


def lower_is_better(key: str) -> bool:
    return any(key.startswith(k) for k in LOWER_IS_BETTER)


SETTLES = ("consensus",)  # zero at the start (identical models), so "first at or below" would say t = 0


def settles(key: str) -> bool:
    return any(key.startswith(k) for k in SETTLES)


def reached(rows: list[dict], target: float, key: str) -> float | None:
    """The first evaluation time at which ``key`` reaches ``target`` (>= it, or <= it for a loss-like
    metric); for consensus, the first time from which every later evaluation stays <= it. None if never."""
    if settles(key):
        since = None
        for r in rows:
            v = r.get(key)
            if v is None or v != v:
                continue
            if v > target:
                since = None
            elif since is None:
                since = float(r["time"])
        return since
    if not lower_is_better(key):
        return time_to_target(rows, target, key)
    for r in rows:
        v = r.get(key)
        if v is not None and v == v and v <= target:
            return float(r["time"])
    return None


def bytes_at(folder: Path, times: list[float]) -> list[float]:
    """Bytes sent up to each of ``times`` (inclusive), from the run's trace."""
    import numpy as np

    from netsim.trace.io import read_trace

    if not (folder / "trace.arrows").is_file():
        raise InputError("--x", f"run {str(folder)!r} has no trace.arrows (run.trace = false): bytes sent "
                                "over time are read from it; use --x time or rounds")
    table = read_trace(folder).table
    kinds = table.column("kind").to_numpy(zero_copy_only=False)
    sends = kinds == "send"
    t = table.column("t").to_numpy()[sends]
    size = np.cumsum(table.column("size").to_numpy()[sends].astype(np.float64))
    idx = np.searchsorted(t, np.asarray(times, dtype=np.float64), side="right")
    return [float(size[i - 1]) if i > 0 else 0.0 for i in idx]


def default_labels(folders: list[Path]) -> list[str]:
    """Each run's folder name; the whole path where two runs share a name."""
    names = [f.resolve().name or str(f) for f in folders]
    return [str(f) if names.count(n) > 1 else n for f, n in zip(folders, names, strict=True)]


def compare_plot(folders: list[Path], out: Path, key: str = "accuracy", labels: list[str] | None = None,
                 target: float | None = None, x: str = "time") -> list[dict]:
    """Overlay ``key`` of each run against simulated time, rounds or bytes sent (``x``); one row per run for
    a table. ``labels`` name the runs (default: their folders); ``target`` overrides each run's
    evaluation.target_accuracy (time to target: first evaluation at or beyond it). Without ``target``,
    only ``accuracy`` has one (the run's own, if it set it): a row's ``target`` is None otherwise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if x not in X_AXES:
        raise InputError("--x", f"got {x!r}; allowed: {', '.join(X_AXES)}")
    if labels is not None and len(labels) != len(folders):
        raise InputError("--labels", f"{len(labels)} labels for {len(folders)} runs (give one per run, "
                                     "comma-separated)")
    if target is not None and not math.isfinite(target):
        raise InputError("--target", f"must be a finite number, got {target}")
    runs = [(folder, *read_run(folder)) for folder in folders]  # every input checked before drawing
    names = labels or default_labels(folders)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    table, targets = [], set()
    for (folder, summary, rows), name in zip(runs, names, strict=True):
        have = [r for r in rows if r.get(key) is not None]
        if not have:
            plt.close(fig)
            raise InputError("--metric", f"run {str(folder)!r} has no {key!r} column")
        if x == "time":
            xs = [r["time"] for r in have]
        elif x == "rounds":
            xs = [r.get("round_mean", float("nan")) for r in have]
        else:
            try:
                xs = bytes_at(folder, [r["time"] for r in have])
            except InputError:
                plt.close(fig)
                raise
        ys = [r[key] for r in have]
        ax.plot(xs, ys, marker=".", lw=1.4, label=name)
        if target is not None:
            goal, ttt = target, reached(rows, target, key)
        elif key == "accuracy":  # the run's own evaluation.target_accuracy, if it set one
            goal, ttt = summary.get("target_accuracy"), summary.get("time_to_target")
        else:  # the run's target is an accuracy: no target for another metric unless --target gives one
            goal, ttt = None, None
        if goal is not None:
            targets.add(goal)
        table.append({"run": str(folder), "label": name, key: ys[-1], "time_to_target": ttt, "target": goal,
                      "reached_by": "<=" if lower_is_better(key) else ">=", "settles": settles(key),
                      "messages_sent": summary.get("messages_sent"), "bytes_sent": summary.get("bytes_sent")})
    for t in sorted(targets):
        ax.axhline(t, color="grey", ls="--", lw=0.8)
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel(f"test {key} (average model)" if key in ("accuracy", "loss") else key)
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
