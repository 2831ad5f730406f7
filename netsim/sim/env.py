"""netsim's simpy environment: the one place that touches simpy's internals.

The kernel needs three things simpy keeps private: the time of the next event without processing it (a
checkpoint boundary, the stall check), the queued events themselves (a checkpoint records them), and, for the
windowed drivers that play a round's events without queuing them, setting the clock to where the events engine
would be. Everything else goes through simpy's public API; tests/test_agent_api.py keeps it so.
"""

from __future__ import annotations

import simpy


class Environment(simpy.Environment):
    @property
    def queue(self) -> list:
        """The scheduled events, a heap of (time, priority, id, event): read, never written (the kernel's loop
        holds it to look at the next event's time without a call per event)."""
        return self._queue

    def queued(self) -> int:
        """How many events are scheduled."""
        return len(self._queue)

    def advance_to(self, t: float) -> None:
        """Set the clock to ``t``: for a windowed driver, which plays the run's events itself instead of this
        queue (whose events it never processes), so that what reads the clock (a ledger's release) reads the
        time the events engine would be at."""
        self._now = t
