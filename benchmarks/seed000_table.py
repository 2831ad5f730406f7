"""Seed 000 reproduction table from the sweeps' sweep.csv files (docs/reproductions/seed-000.md).

    python benchmarks/seed000_table.py [runs/sweeps]
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

METHODS = ["pdsl", "pdsl_variants", "dp_cga", "dp_dpsgd", "muffliato", "dp_netfleet"]


def main(root: str = "runs/sweeps") -> None:
    print("| method | gamma | config | seeds | agents' mean test acc. | avg-model acc. | test loss "
          "| consensus | MB sent | RDP eps (delta 1e-5) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in METHODS:
        f = Path(root) / f"seed000_sweep_{m}" / "sweep.csv"
        if not f.exists():
            continue
        for r in csv.DictReader(f.open()):
            g = lambda k, r=r: float(r[k]) if r.get(k) not in (None, "") else float("nan")  # noqa: E731
            lr = r.get("algorithm.lr") or "0.01"
            cfg = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in r.items()
                            if "." in k and k != "algorithm.lr" and not k.endswith(("_mean", "_std")))
            print(f"| {m} | {lr} | {cfg or '-'} | {r['seeds']} "
                  f"| {100 * g('agent_accuracy_mean_mean'):.1f} ± {100 * g('agent_accuracy_mean_std'):.1f} "
                  f"| {100 * g('accuracy_mean'):.1f} ± {100 * g('accuracy_std'):.1f} "
                  f"| {g('loss_mean'):.3f} | {g('consensus_mean'):.2e} "
                  f"| {g('bytes_sent_mean') / 1e6:.0f} | {g('privacy_epsilon_max_mean'):.3g} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
