"""Regenerate the example traces in this folder (synthetic, made by us; see README.md).

    python traces/make_examples.py

Deterministic: the files it writes are the ones committed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
N = 8  # agents 0..7, links between ring neighbours, both directions
HORIZON = 120.0  # seconds
STEP = 5.0


def link_rows(rng: np.random.Generator):
    base = {}
    for i in range(N):
        for j in ((i + 1) % N, (i - 1) % N):
            base[(i, j)] = rng.uniform(0.01, 0.06)  # one-way latency of the link (s), asymmetric
    for k in range(int(HORIZON / STEP) + 1):
        t = k * STEP
        for (i, j), lat in sorted(base.items()):
            latency = lat * (1 + 0.3 * math.sin(2 * math.pi * t / 60 + i))  # diurnal-like swing
            bandwidth = 2.0e5 if 40 <= t < 60 else 1.0e6  # congestion everywhere between 40 and 60 s
            loss = 0.01
            if (i, j) == (2, 3) and 70 <= t < 80:
                loss = 0.5  # a flaky link for ten seconds
            yield t, i, j, round(latency, 6), bandwidth, loss


def availability(rng: np.random.Generator) -> dict:
    out = {}
    for c in range(N):
        active, inactive, t = [], [], 0.0
        while t < HORIZON:
            on = rng.exponential(40.0)
            active.append(round(t, 3))
            t = min(HORIZON, t + on)
            inactive.append(round(t, 3))
            t += rng.exponential(6.0)
        out[str(100 + c)] = {"active": active, "inactive": inactive, "finish_time": HORIZON}
    return out


def main() -> None:
    rng = np.random.default_rng(20261122)
    with open(HERE / "links_example.csv", "w") as f:
        f.write("time,src,dst,latency,bandwidth,loss\n")
        for row in link_rows(rng):
            f.write(",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in row) + "\n")
    (HERE / "availability_example.json").write_text(json.dumps(availability(rng), indent=1) + "\n")


if __name__ == "__main__":
    main()
