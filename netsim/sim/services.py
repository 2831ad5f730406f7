"""Per-run services and the events that carry their results.

``Services`` is the simulation's typed registry of per-run objects that several agents share (the
algorithm statistics, a batched lookahead evaluator, an online learner's data streams, a time-varying
graph drawn once per run): one instance per key, made on first use, so nothing is hung on the
``Simulation`` as an ad-hoc attribute and a run's services are listed in one place.

``Completion`` is the one event class that replaces a simpy event's value: a request's Timeout carries
its ticket and, when it fires, yields the ticket's result. ``Lookahead`` is the batched-service pattern
of the gradient service, for an algorithm's own evaluations (PDSL's coalition values): every pending
request was made at or before the first completion with its inputs fixed, so evaluating all of them in
one batched call at that moment is exact.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

import attrs
import simpy

from netsim.sim import rows as shapes
from netsim.sim.env import Timeout

T = TypeVar("T")


class Services:
    """A run's shared services, keyed by their class (typed access) or by a hashable key."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[Hashable, Any] = {}

    def get(self, key: type[T] | Hashable, factory: Callable[[], T] | None = None) -> T:
        """The service under ``key``, made by ``factory()`` (default: ``key()`` for a class) on first use."""
        got = self._items.get(key)
        if got is None:
            if factory is None:
                if not isinstance(key, type):
                    raise KeyError(f"no service {key!r} and no factory to make one")
                factory = key
            got = self._items[key] = factory()
        return got

    def find(self, key: type[T] | Hashable) -> T | None:
        """The service under ``key`` if some agent made it, else None (reading never creates one)."""
        return self._items.get(key)

    def put(self, key: Hashable, service: Any) -> None:
        """Install ``service`` under ``key`` (replacing what was there: a rebuilt or replayed run's own)."""
        self._items[key] = service

    def __iter__(self) -> Iterator[tuple[Hashable, Any]]:
        return iter(list(self._items.items()))

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items


class Completion(Timeout):
    """A Timeout of ``delay`` that carries ``ticket`` and, when it fires, takes ``resolve(ticket)`` as
    its value (resolved before any process waiting on it resumes)."""

    __slots__ = ("_resolve", "ticket", "at")

    def __init__(self, env: simpy.Environment, delay: float, ticket: Any, resolve: Callable[[Any], Any]):
        super().__init__(env, delay, ticket)
        self._resolve = resolve
        self.ticket, self.at = ticket, env.now + delay  # what it carries, and when it fires
        self.callbacks.append(self._fire)

    def _fire(self, _ev) -> None:
        self._value = self._resolve(self._value)


class _Ticket:
    __slots__ = ("agent", "item", "result")

    def __init__(self, agent: int, item: Any):
        self.agent, self.item, self.result = agent, item, None


class Lookahead:
    """Batched requests with exact lookahead: ``request(agent, item, ct)`` returns an event that
    completes after compute time ``ct`` (traced as compute_start/compute_end) with that item's result;
    the first completion evaluates every pending item in one call ``evaluate(items) -> results``."""

    def __init__(self, env: simpy.Environment, emit_row: Callable[[tuple], None],
                 evaluate: Callable[[list[Any]], list[Any]]):
        self.env, self.emit_row, self.evaluate = env, emit_row, evaluate
        self.pending: list[_Ticket] = []
        self.calls = 0  # batched evaluations so far
        self.items = 0  # items evaluated so far

    def request(self, agent: int, item: Any, ct: float) -> simpy.Event:
        t = _Ticket(agent, item)
        self.pending.append(t)
        self.emit_row(shapes.compute_start(self.env.now, agent, ct))
        return Completion(self.env, ct, t, self._ready)

    def _ready(self, t: _Ticket) -> Any:
        if t.result is None:
            self.flush()
        self.emit_row(shapes.compute_end(self.env.now, t.agent))
        return t.result

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for t, r in zip(pending, self.value([t.item for t in pending]), strict=True):
            t.result = r

    def value(self, items: list[Any]) -> list[Any]:
        """``evaluate`` of a flush's items, counted (a windowed driver values a wave of requests here)."""
        results = self.evaluate(items)
        self.calls += 1
        self.items += len(items)
        return results


# the summary's algorithm counters: a service of every run (``Agent.stats``); ``comm`` reads them for the summary
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
