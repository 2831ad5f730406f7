"""The causal past of an agent at a time: who could have influenced it, over delivered messages."""

from __future__ import annotations

import math

import numpy as np

from netsim.explore.model import RunData


def causal_past(run: RunData, a: int, t: float) -> dict[int, float]:
    """{agent: latest time its state could still reach agent a by time t} over delivered messages
    (Lamport's happened-before): one sweep over deliveries backwards in time."""
    need = {a: t}
    if "deliver" not in run.code:
        return need
    rows = np.flatnonzero((run.kind == run.code["deliver"]) & (run.t <= t))
    dst, src = run.agent[rows], run.peer[rows]
    sent = run.t[rows] - run.value[rows]
    tt = run.t[rows]
    for i in range(len(rows) - 1, -1, -1):
        d = int(dst[i])
        if d in need and tt[i] <= need[d]:
            s = int(src[i])
            if need.get(s, -math.inf) < sent[i]:
                need[s] = float(sent[i])
    return need
