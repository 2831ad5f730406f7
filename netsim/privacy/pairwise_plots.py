"""Plots of the pairwise report (netsim/privacy/pairwise.py): epsilon against hops, and victim x observer."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

HOPS_PLOT = "pairwise_hops.png"
HEATMAP_PLOT = "pairwise_heatmap.png"


def plot_pairwise(rows: list[dict[str, Any]], n: int, folder: Path) -> list[Path]:
    """Write the two plots into ``folder``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    # each pair's figure is the smallest of its valid ones: say which methods gave them, and what is credited
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["method"]] = counts.get(r["method"], 0) + 1
    methods = ", ".join(f"{m} ({k})" for m, k in sorted(counts.items()))
    credited = sum(1 for r in rows if r.get("subsampling"))
    caption = textwrap.fill(f"pairs by method: {methods}" + (f"; subsampling credited in {credited}" if credited
                                                                  else ""), 80)
    by: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if r["hops"] is not None:
            by.setdefault(r["hops"], []).append(r)
    hs = sorted(by)
    if hs:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        eps = [[_finite(r["epsilon"]) for r in by[h]] for h in hs]
        lo, med, hi = ([f(e) for e in eps] for f in (np.min, np.median, np.max))
        ax.fill_between(hs, lo, hi, alpha=0.25, label="pair figure: min-max over pairs")
        ax.plot(hs, med, "o-", lw=1.4, label="pair figure: median")
        bnd = [[r["epsilon_bound"] for r in by[h] if r["epsilon_bound"] is not None] for h in hs]
        if any(bnd):
            ax.plot([h for h, b in zip(hs, bnd, strict=True) if b], [max(b) for b in bnd if b], "s--", lw=1.0,
                    label="Muffliato bound (max)")
        ax.plot(hs, [max(_finite(r["epsilon_local"]) for r in by[h]) for h in hs], ":", color="grey",
                label="local DP (no decentralization)")
        ax.set_title(f"epsilon(victim -> observer) against hops\n{caption}", fontsize=7)
        ax.set_xlabel("hops between victim and observer")
        ax.set_ylabel(f"epsilon (delta={rows[0]['delta']:g})")
        ax.set_xticks(hs)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / HOPS_PLOT, dpi=110)
        plt.close(fig)
        out.append(folder / HOPS_PLOT)
    grid = np.full((n, n), np.nan)
    for r in rows:
        grid[r["victim"], r["observer"]] = _finite(r["epsilon"])
    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    im = ax.imshow(grid, origin="upper", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("observer v")
    ax.set_ylabel("victim u")
    ax.set_title(f"epsilon(u -> v), each pair's smallest valid figure\n{caption}", fontsize=7)
    fig.colorbar(im, ax=ax, label="epsilon")
    fig.tight_layout()
    fig.savefig(folder / HEATMAP_PLOT, dpi=110)
    plt.close(fig)
    out.append(folder / HEATMAP_PLOT)
    return out


def _finite(x: float) -> float:
    return x if math.isfinite(x) else np.nan
