"""Activation schedules: when an agent wakes, on its own local clock (docs/architecture.md).

A schedule is an object with one public interface: ``next(now_local)`` plans the next activation after
the local time ``now_local`` (an activation that falls while the agent is busy is missed: the schedule
never depends on the algorithm), and ``defer(at, back_local)`` moves a planned activation ``at`` to the
schedule's first one at or after ``back_local`` (churn: an agent offline until then). ``tick`` is the
index of the latest planned tick (periodic and Bernoulli; the privacy ledger counts skipped ticks from
it). The schedule is the one source of what an algorithm and the privacy ledger know of activation:
``period`` (None for a schedule without ticks), ``probability`` (the chance a tick activates), ``origin``
(the tick at the run's start) and ``tick_at(local)``; a plugin's schedule with its own period or
probability is therefore accounted as it behaves, whatever the scenario's table says. Jitter and churn
compose with any schedule through ``Moves`` (what moves a planned activation); a replayed run wraps the
agent's schedule in a recorded one (netsim/replay.py, ``Recorded``) that moves ``tick`` with
``advance_tick``. ``Agent.on_activation`` adds listeners (a dynamic topology adopts the current graph
there).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable

import numpy as np

from netsim.errors import claim
from netsim.sim.streams import Draws


class Schedule:
    """The protocol: ``next``, ``defer``, ``tick``, ``advance_tick``, and what the rest of a run reads of
    activation: ``period`` (seconds between ticks on the local clock; None: no ticks, as a Poisson process),
    ``probability`` (the chance a tick activates: the privacy ledger's p), ``origin`` (the tick index at the
    run's start, from which the ledger counts skipped ticks) and ``tick_at``. Two optional parts, for
    schedules that replay recorded activations (netsim/replay.py): ``fixed`` true while the planned
    activation is a recorded one that jitter and churn must not move, and with ``settles`` true,
    ``settle(at, delay)`` may replace the planned local reading and delay after them (a recording fixes the
    global time as well)."""

    kind = ""
    tick = 0
    period: float | None = None
    probability = 1.0
    origin = 0
    fixed = False
    settles = False

    def tick_at(self, local: float) -> int:
        """Index of the tick nearest the local time ``local`` (local / period rounded), so agents that skipped
        ticks stay in step with their neighbours."""
        if self.period is None:
            raise ValueError(f"activation schedule {self.kind or type(self).__name__!r} has no ticks (no period)")
        return round(local / self.period)

    def settle(self, at: float, delay: float) -> tuple[float, float]:
        return at, delay

    def next(self, now_local: float) -> float:
        raise NotImplementedError

    def defer(self, at: float, back_local: float) -> float:
        raise NotImplementedError

    def advance_tick(self, tick: int) -> None:
        """Keep the tick count at least ``tick`` (a replayed activation at that tick)."""
        self.tick = max(self.tick, tick)


class Periodic(Schedule):
    """Ticks at multiples of ``period`` on the local clock. ``ticks``: (an array, a slot) where the tick count is
    kept (a run's agents keep theirs in one array, ``RunLoop.ticks``, so a driver reads and sets a round's at once);
    by default an array of its own."""

    kind = "periodic"
    CHECKPOINTED = ("tick",)  # (a checkpoint holds it: it is not in the schedule's dict)

    def __init__(self, period: float, start_local: float, ticks: tuple[array, int] | None = None):
        self.period = period
        self.ticks_in = ticks if ticks is not None else (array("q", [0]), 0)
        self.tick = self.origin = math.floor(start_local / period)

    @property
    def tick(self) -> int:
        ticks, slot = self.ticks_in
        return ticks[slot]

    @tick.setter
    def tick(self, k: int) -> None:
        ticks, slot = self.ticks_in
        ticks[slot] = k

    def next(self, now_local: float) -> float:
        self.tick = max(self.tick, math.floor(now_local / self.period)) + 1
        return self.tick * self.period

    def defer(self, at: float, back_local: float) -> float:
        self.tick = max(math.ceil(back_local / self.period), self.tick + 1)
        return self.tick * self.period


class Bernoulli(Periodic):
    """Each tick with probability ``p`` (the gap to the next taken tick is geometric)."""

    kind = "bernoulli"

    def __init__(self, period: float, p: float, rng: np.random.Generator, start_local: float,
                 ticks: tuple[array, int] | None = None):
        super().__init__(period, start_local, ticks)
        self.p, self.rng = p, rng

    @property
    def probability(self) -> float:
        return float(self.p)

    def next(self, now_local: float) -> float:
        self.tick = max(self.tick, math.floor(now_local / self.period)) + 1
        if self.p < 1.0:
            self.tick += int(self.rng.geometric(self.p)) - 1
        return self.tick * self.period


class Poisson(Schedule):
    """A Poisson process of ``rate`` on the local clock from ``start_local``; arrivals while busy or
    offline are missed."""

    kind = "poisson"

    def __init__(self, rate: float, rng: np.random.Generator, start_local: float):
        self.rate = rate
        # the gaps drawn ahead in blocks (the stream is the schedule's alone): the values of one draw at a time
        self.gap = Draws(lambda n: rng.exponential(1.0 / rate, n), rng)
        self.upcoming = start_local + self.gap()

    def next(self, now_local: float) -> float:
        at = self.upcoming
        while at < now_local:
            at += self.gap()
        self.upcoming = at + self.gap()
        return at

    def defer(self, at: float, back_local: float) -> float:
        while at < back_local:
            at += self.gap()
        self.upcoming = at + self.gap()
        return at


class Moves:
    """What moves an activation its schedule planned: clock jitter (a delay drawn per activation from the
    agent's ``jitter`` stream), then churn (out of the agent's offline time, to the schedule's first
    activation when it is back). Not applied to an activation a replayed schedule fixes."""

    def __init__(self, jitter: list | None, churn):
        self.jitter, self.churn = jitter, churn

    def __call__(self, agent, at: float) -> float:
        if self.jitter is not None:
            at += self.jitter[agent.id]()
        if self.churn is not None:
            at = self.churn.defer(agent, at)
        return at


def moves_for(agents, streams, churn) -> Moves | None:
    """The scenario's jitter (``agents.clock_jitter``) and the run's churn as ``Moves`` (None: neither)."""
    jitter = None
    if agents.clock_jitter is not None:
        from netsim.sim.dists import draws

        jitter = [draws(agents.clock_jitter, streams.rng("jitter", i), "agents.clock_jitter")
                  for i in range(agents.count)]
    return None if jitter is None and churn is None else Moves(jitter, churn)


SCHEDULES: dict[str, Callable[..., Schedule]] = {}


def register_schedule(name: str, factory: Callable[..., Schedule]) -> None:
    """Make a schedule selectable as ``agents.activation.schedule = "name"``: ``factory(spec, rng, offset)``
    returns one agent's schedule from the ``agents.activation`` table (``period``, ``rate``, ``p``), the
    agent's ``activation`` stream and its local clock at t = 0. The same factory again is a no-op; another
    under a taken name raises."""
    claim(SCHEDULES, "schedule", name, factory)


def schedule_for(spec, rng: np.random.Generator, offset: float, start_local: float,
                 ticks: tuple[array, int] | None = None) -> Schedule:
    """The scenario's ``agents.activation`` as a schedule (``offset``: the local clock at t = 0, where a
    Poisson process starts; ``start_local``: the same, from which ticks are counted; ``ticks``: where a periodic
    schedule keeps its tick count, ``Periodic``)."""
    if getattr(spec, "schedule", None) is not None:
        factory = SCHEDULES.get(spec.schedule)
        if factory is None:
            from netsim.errors import InputError

            raise InputError("agents.activation.schedule",
                             f"unknown schedule {spec.schedule!r}; registered: "
                             f"{', '.join(sorted(SCHEDULES)) or 'none'} (a plugin's needs --plugin)")
        schedule = factory(spec, rng, offset)
        if not isinstance(schedule, Schedule):
            from netsim.errors import InputError

            raise InputError("agents.activation.schedule",
                             f"schedule {spec.schedule!r} made a {type(schedule).__name__}, not a "
                             "netsim.sim.activation.Schedule")
        return schedule
    if spec.kind == "poisson":
        return Poisson(spec.rate, rng, offset)
    if spec.kind == "bernoulli":
        return Bernoulli(spec.period, spec.p, rng, start_local, ticks)
    return Periodic(spec.period, start_local, ticks)
