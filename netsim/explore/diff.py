"""Two runs of one setting (a replay and its recording, two seeds, two algorithms on one network):
the first event at which their traces differ. Both traces are in simulated-time order, so the first
differing row is where their histories part."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from netsim.explore.model import RunData

COMPARED = ("t", "kind", "agent", "peer", "msg", "size", "value", "round", "tag")


def first_difference(a: RunData, b: RunData) -> tuple[int | None, list[str]]:
    """(row, columns that differ there) of the first row where the two traces differ, comparing every
    column exactly; (min length, ['length']) when one is a prefix of the other; (None, []) when equal."""
    n = min(len(a.t), len(b.t))
    diff = np.zeros(n, dtype=bool)
    per: dict[str, np.ndarray] = {}
    for name in COMPARED:
        if name == "tag":
            ne = ~pc.equal(a._tag.slice(0, n), b._tag.slice(0, n)).to_numpy(zero_copy_only=False)
        elif name == "kind":
            ne = np.array(a.kind_names, dtype=object)[a.kind[:n]] != np.array(b.kind_names, dtype=object)[b.kind[:n]]
        else:
            ne = getattr(a, name)[:n] != getattr(b, name)[:n]
        per[name] = ne
        diff |= ne
    hit = np.flatnonzero(diff)
    if len(hit):
        i = int(hit[0])
        return i, [name for name in COMPARED if per[name][i]]
    if len(a.t) != len(b.t):
        return n, ["length"]
    return None, []
