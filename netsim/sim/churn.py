"""Agent churn: offline intervals during which an agent neither computes, sends nor receives.

Sources (any combination, merged per agent): scheduled ``[[agents.offline]]`` intervals, random
exponential on/off churn (``agents.churn``, the agent's own ``churn`` stream, generated lazily), and
an availability trace (``agents.availability``, FedScale-style JSON). What offline means:

- activations that would fall in an offline interval move to the first one after it ends;
- a gradient requested while offline starts when the agent is back (compute time + wait);
- a message sent while its sender is offline, or arriving while its receiver is offline, is dropped
  with reason ``offline`` (decided at send time: the schedule is fixed in advance);
- each interval is recorded as an ``offline`` event (t = start, value = duration) when it starts.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from netsim.errors import InputError
from netsim.scenario.schema import AgentsSpec


class Intervals:
    """Sorted, disjoint [start, end) intervals, optionally repeating with ``period`` (FedScale wraps
    availability traces modulo their length)."""

    __slots__ = ("starts", "ends", "period")

    def __init__(self, pairs: Iterable[tuple[float, float]], period: float | None = None):
        merged: list[list[float]] = []
        for a, b in sorted(pairs):
            if b <= a:
                continue
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.starts = [a for a, _ in merged]
        self.ends = [b for _, b in merged]
        self.period = period

    def end_of(self, t: float) -> float | None:
        """End of the interval containing t, or None when t is not in one."""
        base = 0.0
        if self.period:
            base = math.floor(t / self.period) * self.period
            t -= base
        k = bisect.bisect_right(self.starts, t) - 1
        if k >= 0 and t < self.ends[k]:
            return base + self.ends[k]
        return None

    def next_start(self, t: float) -> float | None:
        """Start of the first interval that ends after t (clamped to t), or None."""
        base = 0.0
        if self.period:
            base = math.floor(t / self.period) * self.period
            t -= base
        k = bisect.bisect_right(self.ends, t)
        if k < len(self.starts):
            return base + max(self.starts[k], t)
        if self.period and self.starts:
            return base + self.period + self.starts[0]
        return None


class RandomChurn(Intervals):
    """Alternating Exp(mean_online) / Exp(mean_offline) periods, starting online; grown on demand."""

    __slots__ = ("rng", "on", "off", "horizon")

    def __init__(self, rng: np.random.Generator, mean_online: float, mean_offline: float):
        super().__init__(())
        self.rng, self.on, self.off = rng, mean_online, mean_offline
        self.horizon = 0.0

    def _grow(self, t: float) -> None:
        while self.horizon <= t:
            a = self.horizon + self.rng.exponential(self.on)
            b = a + self.rng.exponential(self.off)
            self.starts.append(a)
            self.ends.append(b)
            self.horizon = b

    def end_of(self, t: float) -> float | None:
        self._grow(t)
        return super().end_of(t)

    def next_start(self, t: float) -> float | None:
        self._grow(t)
        return super().next_start(t)


class Churn:
    """Every agent's offline sources; the queries the network, agents and replay ask."""

    def __init__(self, sources: dict[int, list[Intervals]]):
        self.sources = sources

    def held(self) -> list[list]:
        """The random churn drawn so far, as a checkpoint keeps it: [agent, its intervals' starts, their ends, the
        horizon] for each agent's ``RandomChurn`` (its stream is one of the run's, kept with them); the scheduled and
        traced intervals are the scenario's."""
        return [[i, list(s.starts), list(s.ends), s.horizon] for i, srcs in sorted(self.sources.items())
                for s in srcs if isinstance(s, RandomChurn)]

    def take(self, held: list) -> None:
        """``held``'s intervals back into a fresh run's random churn; ValueError where they are not its agents'
        drawn intervals (sorted, each ending after it starts, the horizon the last end)."""
        mine = {i: s for i, srcs in self.sources.items() for s in srcs if isinstance(s, RandomChurn)}
        if not (isinstance(held, list) and len(held) == len(mine)):
            raise ValueError("churn: not each agent's random churn")
        for row in held:
            ok = isinstance(row, list) and len(row) == 4 and type(row[0]) is int and row[0] in mine
            starts, ends, horizon = row[1:] if ok else ([], [], None)
            ok = ok and isinstance(starts, list) and isinstance(ends, list) and len(starts) == len(ends) and all(
                type(v) is float and math.isfinite(v) for v in (*starts, *ends)) and type(horizon) is float \
                and all(a < b for a, b in zip(starts, ends, strict=True)) \
                and all(b <= a for b, a in zip(ends, starts[1:], strict=False)) \
                and horizon == (ends[-1] if ends else 0.0)
            if not ok:
                raise ValueError("churn: not an agent's drawn intervals")
            c = mine[row[0]]
            c.starts, c.ends, c.horizon = list(starts), list(ends), horizon

    def back_online(self, i: int, t: float) -> float | None:
        """When agent i is online again if it is offline at t, else None."""
        srcs = self.sources.get(i)
        if not srcs:
            return None
        x = t
        moved = True
        while moved:
            moved = False
            for s in srcs:
                e = s.end_of(x)
                if e is not None and e > x:
                    x, moved = e, True
        return None if x == t else x

    def offline(self, i: int, t: float) -> bool:
        return self.back_online(i, t) is not None

    def wait(self, i: int, t: float) -> float:
        back = self.back_online(i, t)
        return 0.0 if back is None else back - t

    def next_interval(self, i: int, t: float) -> tuple[float, float] | None:
        starts = [s for s in (src.next_start(t) for src in self.sources.get(i, ())) if s is not None]
        if not starts:
            return None
        a = min(starts)
        b = self.back_online(i, a)
        return None if b is None else (a, b)

    def defer(self, agent, at: float) -> float:
        """Move a planned activation (local time ``at``) out of offline intervals."""
        while True:
            back = self.back_online(agent.id, agent.global_time(at))
            if back is None:
                return at
            # the schedule's first activation when it is back (a Poisson process goes on: arrivals while
            # offline are missed; ticks while offline are skipped)
            at = agent.schedule.defer(at, agent.local_time(back))

    def recorder(self, sim, i: int):
        """A process that emits agent i's ``offline`` events when each interval starts."""
        from netsim.trace.events import Offline

        env = sim.env
        t = 0.0
        while True:
            nxt = self.next_interval(i, t)
            if nxt is None:
                sim.housekeeping_ended()
                return
            a, b = nxt
            yield env.timeout(max(0.0, a - env.now))
            sim.emit(Offline(env.now, i, b - a))
            t = b


def _time(v) -> bool:
    """A JSON value usable as a time: a finite number >= 0 (not a bool; an int too large for a float
    is not finite)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(float(v)) and v >= 0
    except OverflowError:
        return False


def read_availability(path: str | Path, n: int) -> dict[int, Intervals]:
    """FedScale-style availability JSON -> offline intervals of agents 0..n-1.

    ``{"<client id>": {"active": [t...], "inactive": [t...], "finish_time": T}, ...}``: client k is
    online in [active[m], inactive[m]) and the pattern repeats every ``finish_time`` s (FedScale's
    ``cur_time % finish_time``; omit it for no repetition). Agent i is the i-th client by numeric id.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError("", f"cannot read availability trace: {e.strerror or e}", str(p)) from None
    except RecursionError:
        raise InputError("", "not valid JSON: nested too deeply", str(p)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        line = getattr(e, "lineno", "?")
        raise InputError("", f"line {line}: not valid JSON: {getattr(e, 'msg', e)}", str(p)) from None
    if not isinstance(data, dict):
        raise InputError("", "expected a JSON object {client id: {active, inactive, finish_time}}", str(p))
    try:
        ids = sorted(data, key=int)
    except ValueError:
        raise InputError("", "client ids (the object's keys) must be integers", str(p)) from None
    if len(ids) < n:
        raise InputError("", f"has {len(ids)} clients, the scenario needs {n} agents", str(p))
    out = {}
    for i, cid in enumerate(ids[:n]):
        rec = data[cid]
        where = f"client {cid}"
        if not isinstance(rec, dict) or not isinstance(rec.get("active"), list) \
                or not isinstance(rec.get("inactive"), list):
            raise InputError("", f"{where}: needs lists 'active' and 'inactive'", str(p))
        act, ina = rec["active"], rec["inactive"]
        period = rec.get("finish_time", rec.get("duration"))
        if len(act) != len(ina) or not all(_time(v) for v in act + ina):
            raise InputError("", f"{where}: 'active' and 'inactive' must be equally long lists of numbers "
                                 "(finite, >= 0)", str(p))
        if period is not None and not (_time(period) and period > 0):
            raise InputError("", f"{where}: finish_time must be a number > 0", str(p))
        on = sorted(zip(map(float, act), map(float, ina), strict=True))
        if any(b < a for a, b in on) or any(on[k][1] > on[k + 1][0] for k in range(len(on) - 1)):
            raise InputError("", f"{where}: intervals must satisfy active[m] <= inactive[m] <= active[m+1]",
                             str(p))
        end = float(period) if period is not None else math.inf
        if on and period is not None and on[-1][1] > end:
            raise InputError("", f"{where}: inactive time {on[-1][1]} is after finish_time {end}", str(p))
        # offline = the complement of the online intervals within [0, end)
        off, x = [], 0.0
        for a, b in on:
            if a > x:
                off.append((x, a))
            x = b
        if x < end:
            off.append((x, end))
        out[i] = Intervals(off, float(period) if period is not None else None)
    return out


def build_churn(spec: AgentsSpec, streams, resolve) -> Churn | None:
    """The run's churn from the scenario (None when no agent ever goes offline)."""
    n = spec.count
    sources: dict[int, list[Intervals]] = {}
    if spec.offline:
        by_agent: dict[int, list] = {}
        for k, o in enumerate(spec.offline):
            if o.agent >= n:
                raise InputError(f"agents.offline[{k}].agent", f"must be in [0, {n - 1}], got {o.agent}")
            by_agent.setdefault(o.agent, []).append((o.start, o.end))
        for i, pairs in by_agent.items():
            sources.setdefault(i, []).append(Intervals(pairs))
    if spec.churn is not None:
        for i in range(n):
            sources.setdefault(i, []).append(
                RandomChurn(streams.rng("churn", i), spec.churn.mean_online, spec.churn.mean_offline))
    if spec.availability:
        path = resolve(spec.availability, "agents.availability")
        for i, iv in read_availability(path, n).items():
            sources.setdefault(i, []).append(iv)
    return Churn(sources) if sources else None
