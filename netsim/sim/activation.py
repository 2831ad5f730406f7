"""Activation schedules: when an agent wakes, on its own local clock (docs/architecture.md).

A schedule is an object with one public interface: ``next(now_local)`` plans the next activation after
the local time ``now_local`` (an activation that falls while the agent is busy is missed: the schedule
never depends on the algorithm), and ``defer(at, back_local)`` moves a planned activation ``at`` to the
schedule's first one at or after ``back_local`` (churn: an agent offline until then). ``tick`` is the
index of the latest planned tick (periodic and Bernoulli; the privacy ledger counts skipped ticks from
it). Jitter and churn compose with any schedule through the network's wake hook; a replayed run wraps
the agent's schedule in a recorded one (netsim/replay.py, ``Recorded``) that moves ``tick`` with
``advance_tick``. ``Agent.on_activation`` adds listeners (a dynamic topology adopts the current graph
there).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from netsim.errors import claim


class Schedule:
    """The protocol: ``next``, ``defer``, ``tick``, ``advance_tick``. Two optional parts, for schedules that
    replay recorded activations (netsim/replay.py): ``fixed`` true while the planned activation is a recorded
    one that jitter and churn must not move, and with ``settles`` true, ``settle(at, delay)`` may replace
    the planned local reading and delay after them (a recording fixes the global time as well)."""

    kind = ""
    tick = 0
    fixed = False
    settles = False

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
    """Ticks at multiples of ``period`` on the local clock."""

    kind = "periodic"

    def __init__(self, period: float, start_local: float):
        self.period = period
        self.tick = math.floor(start_local / period)

    def next(self, now_local: float) -> float:
        self.tick = max(self.tick, math.floor(now_local / self.period)) + 1
        return self.tick * self.period

    def defer(self, at: float, back_local: float) -> float:
        self.tick = max(math.ceil(back_local / self.period), self.tick + 1)
        return self.tick * self.period


class Bernoulli(Periodic):
    """Each tick with probability ``p`` (the gap to the next taken tick is geometric)."""

    kind = "bernoulli"

    def __init__(self, period: float, p: float, rng: np.random.Generator, start_local: float):
        super().__init__(period, start_local)
        self.p, self.rng = p, rng

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
        self.rate, self.rng = rate, rng
        self.upcoming = start_local + rng.exponential(1.0 / rate)

    def next(self, now_local: float) -> float:
        at = self.upcoming
        while at < now_local:
            at += self.rng.exponential(1.0 / self.rate)
        self.upcoming = at + self.rng.exponential(1.0 / self.rate)
        return at

    def defer(self, at: float, back_local: float) -> float:
        while at < back_local:
            at += self.rng.exponential(1.0 / self.rate)
        self.upcoming = at + self.rng.exponential(1.0 / self.rate)
        return at


SCHEDULES: dict[str, Callable[..., Schedule]] = {}


def register_schedule(name: str, factory: Callable[..., Schedule]) -> None:
    """Make a schedule selectable as ``agents.activation.schedule = "name"``: ``factory(spec, rng, offset)``
    returns one agent's schedule from the ``agents.activation`` table (``period``, ``rate``, ``p``), the
    agent's ``activation`` stream and its local clock at t = 0. The same factory again is a no-op; another
    under a taken name raises."""
    claim(SCHEDULES, "schedule", name, factory)


def schedule_for(spec, rng: np.random.Generator, offset: float, start_local: float) -> Schedule:
    """The scenario's ``agents.activation`` as a schedule (``offset``: the local clock at t = 0, where a
    Poisson process starts; ``start_local``: the same, from which ticks are counted)."""
    if getattr(spec, "schedule", None) is not None:
        factory = SCHEDULES.get(spec.schedule)
        if factory is None:
            from netsim.errors import InputError

            raise InputError("agents.activation.schedule",
                             f"unknown schedule {spec.schedule!r}; registered: "
                             f"{', '.join(sorted(SCHEDULES)) or 'none'} (a plugin's needs --plugin)")
        return factory(spec, rng, offset)
    if spec.kind == "poisson":
        return Poisson(spec.rate, rng, offset)
    if spec.kind == "bernoulli":
        return Bernoulli(spec.period, spec.p, rng, start_local)
    return Periodic(spec.period, start_local)
