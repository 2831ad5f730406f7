"""netsim's simpy environment: the one place that touches simpy's internals.

The kernel needs three things simpy keeps private: the time of the next event without processing it (a
checkpoint boundary, the stall check), the queued events themselves (a checkpoint records them), and, for the
windowed drivers that play a round's events without queuing them, setting the clock to where the events engine
would be. Everything else goes through simpy's public API; tests/test_agent_api.py keeps it so.

The events engine reads the clock about nine times per agent and round and processes every event through
``step``: here the clock is a plain attribute (``now``; simpy's own ``_now`` maps to it) and ``steps`` processes
events as ``step`` does, in one loop without a call per event. The same events in the same order: the same run.
"""

from __future__ import annotations

from heapq import heappop, heappush

import simpy
from simpy.core import NORMAL, StopSimulation


class Timeout(simpy.events.Timeout):
    """simpy's ``Timeout`` (the same event, the same name in a checkpoint's queue), scheduled without a call: the
    events engine makes several per agent and round."""

    def __init__(self, env: simpy.Environment, delay: float, value=None):
        if delay < 0:
            raise ValueError(f"Negative delay {delay}")
        self.env = env
        self.callbacks = []
        self._value = value
        self._delay = delay
        self._ok = True
        heappush(env._queue, (env.now + delay, NORMAL, next(env._eid), self))


class _NoBoundary:
    next_boundary = float("inf")


_NO_BOUNDARY = _NoBoundary()


class Environment(simpy.Environment):
    now = 0.0  # the current simulated time: an instance attribute (simpy's is a property, one call per read)

    def __init__(self, initial_time: float = 0) -> None:
        super().__init__(initial_time)
        # an event already over, shared by every send that costs no time: yielding it resumes a process at once
        self.over = simpy.Event(self)
        self.over._ok, self.over._value, self.over.callbacks = True, None, None

    @property
    def _now(self) -> float:  # simpy's own name for the clock, for the code of simpy's that reads it
        return self.now

    @_now.setter
    def _now(self, t: float) -> None:
        self.now = t

    def schedule(self, event: simpy.Event, priority=NORMAL, delay: float = 0) -> None:
        """simpy's ``schedule``, reading the clock as an attribute."""
        heappush(self._queue, (self.now + delay, priority, next(self._eid), event))

    def step(self) -> None:
        """simpy's ``step``: the next event processed (EmptySchedule when none is left)."""
        if not self._queue:
            raise simpy.core.EmptySchedule
        self.steps(0, 1, [], _NO_BOUNDARY)

    def steps(self, n: int, limit: int, done: list, marks) -> int:
        """Process events as ``step`` does, one after the other, while ``done`` is empty, ``n`` (the events processed,
        counted on) is not ``limit`` and the next event is before ``marks.next_boundary``; returns ``n``. It stops
        before an event at or past the boundary, and when no event is left."""
        queue = self._queue
        self.processed = n  # where it stands when a callback raises (the kernel's count of events processed)
        try:
            while not done and n != limit and queue and queue[0][0] < marks.next_boundary:
                self.now, _, _, event = heappop(queue)
                callbacks, event.callbacks = event.callbacks, None
                try:
                    for callback in callbacks:
                        callback(event)
                except StopSimulation:
                    event.callbacks = callbacks[callbacks.index(callback) + 1:]
                    self.schedule(event, simpy.core.EventPriority(-1))
                    raise
                if not event._ok and not hasattr(event, "_defused"):
                    exc = type(event._value)(*event._value.args)
                    exc.__cause__ = event._value
                    raise exc
                n += 1
        except BaseException:
            self.processed = n
            raise
        return n

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
        self.now = t
