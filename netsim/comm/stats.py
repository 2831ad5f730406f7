"""Counters the communication parts keep for a run's summary (trigger counts, staleness, conflicts).

One ``CommStats`` per simulation (a service, ``agent.stats``), created on first use, so algorithms that
use no comm part add nothing to the summary. Everything here is plain counting in event order: deterministic.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs


@attrs.define
class CommStats:
    counts: Counter = attrs.field(factory=Counter)
    samples: dict[str, list[float]] = attrs.field(factory=dict)  # key -> [n, sum, max]

    def add(self, key: str, n: int | float = 1) -> None:
        self.counts[key] += n

    def observe(self, key: str, value: float) -> None:
        """One sample of a distribution (e.g. staleness): mean and max go to the summary."""
        s = self.samples.get(key)
        if s is None:
            self.samples[key] = [1, value, value]
        else:
            s[0] += 1
            s[1] += value
            s[2] = max(s[2], value)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(sorted(self.counts.items()))
        for key, (n, total, mx) in sorted(self.samples.items()):
            out[key + "_mean"] = total / n
            out[key + "_max"] = mx
            out[key + "_samples"] = int(n)
        sent, skipped = self.counts.get("trigger_sent", 0), self.counts.get("trigger_skipped", 0)
        if sent + skipped:
            out["trigger_saved_fraction"] = skipped / (sent + skipped)
        return out


def stats_of(sim: Any) -> CommStats:
    """The run's CommStats (a service of the Simulation, made on first use; agents use ``agent.stats``)."""
    return sim.services.get(CommStats)


def comm_summary(sim: Any) -> dict[str, Any]:
    s = sim.services.find(CommStats)
    return {} if s is None else s.summary()
