"""PDSL reproduction table from the sweeps' runs.csv files (docs/reproductions/pdsl.md).

    for m in pdsl pdsl_variants dp_cga dp_dpsgd muffliato dp_netfleet; do
      netsim sweep scenarios/pdsl_sweep_$m.toml; done
    python benchmarks/pdsl_table.py [runs/sweeps]

Per method: the headline (agents' mean test accuracy, %) of every seed, mean +- sample std, and the
independent implementation's mean +- std where there is one, with the distance in its std.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

METHODS = {  # sweep name -> (label, independent implementation's mean, std in %, or None)
    "pdsl": ("PDSL", (86.5, 1.5)),
    "pdsl_variants": ("PDSL, uniform shares", None),
    "dp_cga": ("DP-CGA", (72.5, 2.0)),
    "dp_dpsgd": ("DP-DPSGD", (69.0, 2.0)),
    "muffliato": ("MUFFLIATO", None),
    "dp_netfleet": ("DP-NET-FLEET [reconstructed]", None),
}
METRIC = "agent_accuracy_mean"


def main(root: str = "runs/sweeps") -> None:
    print("| method | per seed (%) | mean ± std (%) | avg-model acc. (%) | independent (%) | distance |")
    print("|---|---|---|---|---|---|")
    for m, (label, target) in METHODS.items():
        f = Path(root) / f"pdsl_sweep_{m}" / "runs.csv"
        if not f.exists():
            continue
        rows = sorted(csv.DictReader(f.open()), key=lambda r: int(r["seed"]))
        vals = [100 * float(r[METRIC]) for r in rows]
        avg = [100 * float(r["accuracy"]) for r in rows]
        mean = statistics.mean(vals)
        std = statistics.stdev(vals) if len(vals) > 1 else float("nan")
        per = ", ".join(f"{v:.1f}" for v in vals)
        ref = dist = "-"
        if target is not None:
            ref = f"{target[0]:.1f} ± {target[1]:.1f}"
            dist = f"{abs(mean - target[0]) / target[1]:.2f} std"
        print(f"| {label} | {per} | {mean:.1f} ± {std:.1f} | {statistics.mean(avg):.1f} | {ref} | {dist} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
