"""Chen & Wang, Sec. VII-A (mushrooms): every method over several seeds, mean ± sample std of
the tracking error, the regret and the cumulative Lemma-2 epsilon (worst learner) at checkpoints.

    NETSIM_DATA=../shared/data python benchmarks/ldp_online_reproduce.py --seeds 0 1 2 [--out runs/ldp_online]

Runs scenarios/ldp_online_cheapest{,_dsgd,_dsgd_eq,_dola,_dola_eq,_pdop}.toml; writes <out>/table.json
and prints a markdown table (docs/reproductions/ldp-online.md).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

import netsim
from netsim.privacy.ledger import releases_from_table
from netsim.privacy.report import privacy_report
from netsim.trace.io import read_trace

METHODS = {
    "Alg 1": "ldp_online_cheapest", "DSGD": "ldp_online_cheapest_dsgd",
    "DSGD (equal eps)": "ldp_online_cheapest_dsgd_eq",
    "DOLA": "ldp_online_cheapest_dola", "DOLA (equal eps)": "ldp_online_cheapest_dola_eq",
    "PDOP": "ldp_online_cheapest_pdop",
}
CHECKS = (100, 500, 1000, 2000)


def one(name: str, seed: int, out: Path) -> dict:
    folder = out / f"{name}_s{seed}"
    t0 = time.perf_counter()
    res = netsim.run(f"scenarios/{name}.toml", overrides={"run.seed": seed}, out=folder)
    wall = time.perf_counter() - t0
    rel = releases_from_table(read_trace(folder).table)
    eps = {}  # worst learner's cumulative sum Delta_t / rho_t after each checkpoint's releases
    for T in CHECKS:
        eps[T] = max(sum(r.sensitivity / r.scale for r in rs if r.round <= T) for rs in rel.values())
    rep = privacy_report(folder, pld=False, plot=False)
    rows = {int(round(r["time"])): r for r in res.metrics}
    rows[CHECKS[-1]] = res.metrics[-1]  # the final row: theta_T after all T steps
    return {
        "eps": eps, "rdp": rep["worst_epsilon"], "wall": wall,
        "mse": {T: rows[T]["tracking_mse"] for T in CHECKS},
        "avg": {T: rows[T]["tracking_avg"] for T in CHECKS},
        "regret": {T: rows[T]["regret"] for T in CHECKS},
    }


def fmt(xs) -> str:
    xs = np.asarray(xs, dtype=float)
    if not np.isfinite(xs).all() or np.abs(xs).max() > 1e6:
        return f"{np.mean(xs):.3g} ± {np.std(xs, ddof=1):.2g}"
    return f"{np.mean(xs):.4g} ± {np.std(xs, ddof=1):.2g}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/ldp_online")
    ap.add_argument("--methods", nargs="*", default=list(METHODS))
    a = ap.parse_args()
    out = Path(a.out)
    res = {m: [one(METHODS[m], s, out) for s in a.seeds] for m in a.methods}
    (out / "table.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    print(f"seeds {a.seeds}; epsilon = worst learner's Lemma-2 sum; MSE = mean_i ||theta_i - theta*_t||^2")
    print("| method | " + " | ".join(f"MSE t={T}" for T in CHECKS) + " | ||avg-θ*|| t=2000 | regret t=2000 | "
          + " | ".join(f"ε t={T}" for T in CHECKS) + " | RDP ε (δ=1e-5) | wall s |")
    print("|---" * (4 + 2 * len(CHECKS) + 2) + "|")
    for m, runs in res.items():
        cells = [fmt([r["mse"][T] for r in runs]) for T in CHECKS]
        cells += [fmt([r["avg"][2000] for r in runs]), fmt([r["regret"][2000] for r in runs])]
        cells += [fmt([r["eps"][T] for r in runs]) for T in CHECKS]
        rdp = [r["rdp"] if r["rdp"] is not None else math.inf for r in runs]
        cells += [fmt(rdp), f"{np.mean([r['wall'] for r in runs]):.0f}"]
        print(f"| {m} | " + " | ".join(cells) + " |")
    T = CHECKS[-1]
    print(f"\nper seed at T = {T} (mean_i ||theta_i - theta*||^2; ||avg - theta*||; worst Lemma-2 epsilon):")
    for m, runs in res.items():
        cells = [f"seed {s}: {r['mse'][T]:.4g} / {r['avg'][T]:.4g} / {r['eps'][T]:.5g}"
                 for s, r in zip(a.seeds, runs, strict=True)]
        print(f"- {m}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
