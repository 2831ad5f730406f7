"""Counters the communication parts keep for a run's summary (trigger counts, staleness, conflicts).

One ``CommStats`` per simulation (a service, ``agent.stats``), created on first use, so algorithms that
use no comm part add nothing to the summary. Everything here is plain counting in event order: deterministic.
"""

from __future__ import annotations

from typing import Any

from netsim.sim.services import CommStats

__all__ = ["CommStats", "comm_summary", "stats_of"]


def stats_of(sim: Any) -> CommStats:
    """The run's CommStats (a service of the Simulation, made on first use; agents use ``agent.stats``)."""
    return sim.services.get(CommStats)


def comm_summary(sim: Any) -> dict[str, Any]:
    s = sim.services.find(CommStats)
    return {} if s is None else s.summary()
