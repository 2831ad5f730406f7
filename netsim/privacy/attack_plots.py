"""Plots of the attacks (netsim/privacy/attack.py, netsim/privacy/audit.py): the fraction of releases reconstructed
per observer set and against hops; the audit's empirical epsilon beside the accounted one against hops."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ATTACK_PLOT = "attack.png"
AUDIT_PLOT = "audit.png"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_attack(rows: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Two panels: the fraction of victim releases each observer set reconstructs (its size in the label), and
    the fraction against the victim's hops to the nearest observer (with the median error when values were
    recorded)."""
    plt = _pyplot()
    by_set: dict[str, list[int]] = defaultdict(list)
    by_hops: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_set[r["observers"]].append(r["reconstructed"])
        if r["hops"] is not None:
            by_hops[r["hops"]].append(r)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    labels = list(by_set)
    a1.bar(range(len(labels)), [np.mean(by_set[k]) for k in labels], color="tab:red")
    step = max(1, len(labels) // 20)
    a1.set_xticks(range(0, len(labels), step), [labels[i] for i in range(0, len(labels), step)],
                  rotation=90 if max(map(len, labels)) > 3 else 0, fontsize=7)
    a1.set_xlabel("observers (agent ids)")
    a1.set_ylabel("fraction of victim releases reconstructed")
    a1.set_ylim(0, 1.05)
    a1.grid(alpha=0.3, axis="y")
    hs = sorted(by_hops)
    if hs:
        a2.plot(hs, [np.mean([r["reconstructed"] for r in by_hops[h]]) for h in hs], "o-", color="tab:red",
                label="reconstructed (x_uu = 1)")
        a2.plot(hs, [np.mean([r["x_uu"] for r in by_hops[h]]) for h in hs], "s--", color="tab:grey",
                label="mean x_uu")
        errs = [[r["error"] for r in by_hops[h] if r["error"] is not None] for h in hs]
        if any(errs):
            ax = a2.twinx()
            ax.plot([h for h, e in zip(hs, errs, strict=True) if e], [np.median(e) for e in errs if e], "^:",
                    color="tab:blue", label="median relative error")
            ax.set_ylabel("relative L2 error of the estimate", color="tab:blue")
            ax.set_yscale("log")
        a2.set_xticks(hs)
        a2.legend(fontsize=7, loc="lower left")
    a2.set_xlabel("hops from the victim to the nearest observer")
    a2.set_ylim(0, 1.05)
    a2.grid(alpha=0.3)
    fig.suptitle("reconstruction from the observers' messages (El Mrini et al.)", fontsize=9)
    fig.tight_layout()
    fig.savefig(folder / ATTACK_PLOT, dpi=110)
    plt.close(fig)
    return [folder / ATTACK_PLOT]


def plot_audit(rows: list[dict[str, Any]], folder: Path) -> list[Path]:
    """epsilon_lower (what the canary audit achieved) and epsilon_upper (the accounted pairwise epsilon) against
    hops, every audited pair at its own place within its distance, violations in red."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["hops"] is not None:
            groups[r["hops"]].append(r)
    for h, rs in groups.items():
        for r, dx in zip(rs, np.linspace(-0.15, 0.15, len(rs)) if len(rs) > 1 else [0.0], strict=True):
            _audit_pair(ax, r, h + dx)
    ax.scatter([], [], marker="_", s=120, color="tab:blue", label="epsilon_upper (accounted, pairwise)")
    ax.scatter([], [], marker="o", s=18, color="tab:green", label="epsilon_lower (audit)")
    if any(r["flag"] for r in rows):
        ax.scatter([], [], marker="o", s=18, color="tab:red", label="epsilon_lower > epsilon_upper: violated")
    ax.set_xlabel("hops between victim and observer")
    ax.set_ylabel(f"epsilon (delta={rows[0]['delta']:g})")
    ax.set_xticks(sorted({r["hops"] for r in rows if r["hops"] is not None}))
    ax.set_title(f"canary audit, confidence {rows[0]['confidence']:g}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / AUDIT_PLOT, dpi=110)
    plt.close(fig)
    return [folder / AUDIT_PLOT]


def _audit_pair(ax, r: dict[str, Any], x: float) -> None:
    """One audited pair at ``x``: its accounted epsilon (a bar) over its audit bound (a dot, red when above)."""
    up = r["epsilon_upper"] if math.isfinite(r["epsilon_upper"]) else np.nan
    ax.plot([x, x], [r["epsilon_lower"], up], "-", color="lightgrey", lw=1, zorder=1)
    ax.scatter([x], [up], marker="_", s=120, color="tab:blue", zorder=2)
    ax.scatter([x], [r["epsilon_lower"]], marker="o", s=18, color="tab:red" if r["flag"] else "tab:green", zorder=3)
