"""``netsim replay``: re-run under a recorded network (docs/traces.md, "Replay").

A trace holds the realized network: every message's send time, link, size and delay (``send``),
its drop and reason (``drop``), every activation (``activate``: global time, local clock time) and
every churn interval (``offline``). Replay builds a run whose network *is* that recording:

- **exact** (the recorded scenario): the k-th message on link (i, j) gets the k-th recorded delay or
  drop, the k-th activation of agent i happens at its k-th recorded time (one the recording lacks was
  still pending when the run ended: it stays after the end). Everything else (compute,
  data, the algorithm) is the scenario's own and deterministic, so the trace comes out byte-identical.
- **conditions** (``--scenario OTHER.toml``): a message sent on (i, j) at time t takes the outcome of
  the recorded message on (i, j) sent nearest to t, if within ``window`` seconds (recorded outcomes may
  be reused); activations happen at the recorded times (a recorded time already past when the agent
  asks is skipped, like a missed tick); the recorded offline intervals replace OTHER's churn.
  Messages with no recorded neighbour in time on their link, and activations beyond the recording,
  fall back to OTHER's own link / activation models (its own streams); both are counted and reported.

An exact replay needs a plugin only where the scenario's own models are used: a plugin link model or
activation schedule the recorded scenario names but this process has not loaded stands in as ``Unloaded``
(the recording decides every message and activation; transmissions end by the scenario's bandwidth, as the
built-in links'), and says in one line which ``--plugin`` is needed when the run asks it for more.
"""

from __future__ import annotations

import bisect
import math
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

from netsim.errors import InputError
from netsim.sim.activation import SCHEDULES, Schedule
from netsim.sim.network import LINK_MODELS, ComposedLinks, hold_time
from netsim.trace.io import Trace, read_trace


class Recording:
    """The network part of a trace, indexed per link and per agent."""

    def __init__(self, trace: Trace, source: str = "trace"):
        cols = trace.table.select(["t", "kind", "agent", "peer", "msg", "value", "tag"]).to_pydict()
        kind, t, agent, peer = cols["kind"], cols["t"], cols["agent"], cols["peer"]
        msg, value, tag = cols["msg"], cols["value"], cols["tag"]
        reasons = {msg[r]: tag[r] for r in range(len(kind)) if kind[r] == "drop"}
        self.links: dict[tuple[int, int], list[tuple[float, float, str]]] = {}
        self.activations: dict[int, list[tuple[float, float]]] = {}
        self.offline: dict[int, list[tuple[float, float]]] = {}
        self.ticks_accounted = False  # a release was accounted with skipped ticks or p < 1 (its schedule's)
        for r, k in enumerate(kind):
            if k == "send":
                if not (math.isfinite(value[r]) and value[r] >= 0):
                    raise InputError("", f"corrupted trace: a send at t={t[r]:g} has delay {value[r]!r} "
                                         "(a recorded delay is finite and >= 0)", source)
                reason = reasons.get(msg[r], "")
                self.links.setdefault((agent[r], peer[r]), []).append((t[r], value[r], reason))
            elif k == "activate":
                self.activations.setdefault(agent[r], []).append((t[r], value[r]))
            elif k == "offline":
                self.offline.setdefault(agent[r], []).append((t[r], t[r] + value[r]))
            elif k == "release" and not self.ticks_accounted:
                self.ticks_accounted = not tag[r].endswith(" p=1.0 k=0")
        if not trace.complete:
            raise InputError("", f"{trace.partial_note()}; replay needs a complete recording", source)
        self.times = {k: np.array([x[0] for x in v]) for k, v in self.links.items()}
        self.t_end = max(t) if t else 0.0


class Stats:
    def __init__(self) -> None:
        self.matched = 0
        self.fallback_messages = 0
        self.activations_replayed = 0
        self.activations_skipped = 0
        self.fallback_activations = 0

    def warnings(self, exact: bool) -> list[str]:
        """Lines for a replay that is not what its name suggests: most messages (more than half) took
        the scenario's own link model, or an exact replay had messages the recording lacks."""
        total = self.matched + self.fallback_messages
        out = []
        if total and 2 * self.fallback_messages > total:
            out.append(f"only {round(100 * self.matched / total)}% of the messages ({self.matched} of {total}) "
                       f"took a recorded outcome; the other {self.fallback_messages} came from the scenario's "
                       "own link model (links, agents or times the recording does not have, or nothing recorded "
                       "within --window): this run is mostly not under the recorded network")
        elif exact and self.fallback_messages:
            out.append(f"{self.fallback_messages} of {total} messages are not in the recording and came from "
                       "the scenario's own link model: the replay is not exact")
        acts = self.activations_replayed + self.fallback_activations
        if not exact and acts and 2 * self.fallback_activations > acts:
            out.append(f"only {round(100 * self.activations_replayed / acts)}% of the activations "
                       f"({self.activations_replayed} of {acts}) happened at recorded times; the other "
                       f"{self.fallback_activations} came from the scenario's own activation model")
        return out

    def as_dict(self) -> dict[str, int]:
        return {"replay_messages_matched": self.matched, "replay_messages_fallback": self.fallback_messages,
                "replay_activations": self.activations_replayed,
                "replay_activations_skipped": self.activations_skipped,
                "replay_activations_fallback": self.fallback_activations}


class ReplayNetwork:
    """A link model (``Network.use``): outcomes from the recording, transfer from the scenario's bandwidth;
    a message never recorded takes the scenario's own model."""

    def __init__(self, sim, rec: Recording, exact: bool, window: float, stats: Stats):
        self.net, self.rec, self.exact, self.window, self.stats = sim.network, rec, exact, window, stats
        self.own = sim.network.lean()  # the scenario's own model, for messages never recorded
        self.full = isinstance(sim.network.model, ComposedLinks)  # netsim's full path: its links' transfers
        # a plugin's model: only it knows its transmission ends; asked for each message in the recorded order,
        # it draws and queues as it did in the recording
        self.plugin = sim.network.model is not None and not self.full
        self.unloaded = isinstance(sim.network.model, UnloadedLinks)  # a plugin's model that is not loaded
        self.used: dict[tuple[int, int], int] = {}

    def lookup(self, src: int, dst: int, now: float) -> tuple[float, str] | None:
        recs = self.rec.links.get((src, dst))
        if not recs:
            return None
        if self.exact:
            k = self.used.get((src, dst), 0)
            self.used[(src, dst)] = k + 1
            return recs[k][1:] if k < len(recs) else None
        times = self.rec.times[(src, dst)]
        k = bisect.bisect_left(times, now)
        best = min((c for c in (k - 1, k) if 0 <= c < len(recs)), key=lambda c: abs(times[c] - now))
        if abs(times[best] - now) > self.window:
            return None
        return recs[best][1:]

    def transfer_end(self, src: int, dst: int, now: float, size: int) -> float:
        net = self.net
        if self.plugin and not self.unloaded:
            return self.own.outcome(src, dst, now, size)[0]
        if self.full:
            return net.transfer(net.full_link(src, dst), src, now, size)
        if net.bandwidth is None:
            return now
        link = net.link(src, dst)
        end = max(now, link.busy_until) + size / net.bandwidth
        link.busy_until = end
        return end

    def outcome(self, src: int, dst: int, now: float, size: int) -> tuple[float, float, str]:
        net = self.net
        got = self.lookup(src, dst, now)
        if got is None:
            self.stats.fallback_messages += 1
            return self.own.outcome(src, dst, now, size)
        self.stats.matched += 1
        delay, reason = got
        churn = net.churn
        if churn is not None and churn.offline(src, now):
            tx_end = now  # an offline sender transmits nothing (as in Network.outcome)
        else:
            tx_end = self.transfer_end(src, dst, now, size)
        if not self.exact:
            delay = max(delay, hold_time(tx_end, now))  # cannot arrive before its own transmission ends
            if reason == "offline":  # churn is replayed as a schedule: it decides offline drops
                reason = ""
            if churn is not None:  # the same precedence as the full path: sender, outage/loss, receiver
                if churn.offline(src, now) or (not reason and churn.offline(dst, now + delay)):
                    reason = "offline"
        return tx_end, delay, reason


class Recorded(Schedule):
    """An agent's activations at its recorded (global time, local reading) pairs, around its own schedule.

    exact: the agent's own schedule plans every activation first (so its activation stream, its tick count,
    which the privacy ledger reads, and jitter and churn advance exactly as recorded); the plan is kept when
    it lands on the recorded activation (always, for an unedited trace) and replaced by the recorded time
    otherwise. conditions: the recorded times (one already past is skipped, like a missed tick), then the
    agent's own schedule once the recording is used up."""

    kind = "recorded"
    settles = True

    def __init__(self, agent, times: list[tuple[float, float]], exact: bool, stats: Stats):
        self.own, self.agent, self.times, self.exact, self.stats = agent.schedule, agent, times, exact, stats
        self.planless = isinstance(self.own, UnloadedSchedule)  # a plugin's schedule that is not loaded
        self.k = 0
        self.pending: tuple[float, float] | None = None  # the recorded activation being planned

    @property
    def tick(self) -> int:
        return self.own.tick

    @property
    def period(self) -> float | None:
        return self.own.period

    @property
    def probability(self) -> float:
        return self.own.probability

    @property
    def origin(self) -> int:
        return self.own.origin

    def tick_at(self, local: float) -> int:
        return self.own.tick_at(local)

    def advance_tick(self, tick: int) -> None:
        self.own.advance_tick(tick)

    def defer(self, at: float, back_local: float) -> float:
        return self.own.defer(at, back_local)

    def next(self, now_local: float) -> float:
        times, stats = self.times, self.stats
        if self.exact and self.agent.finished:  # finishing: the agent's own bookkeeping
            self.pending = None
            return math.inf if self.planless else self.own.next(now_local)
        if not self.exact:  # skip what is already past
            now = self.agent.env.now
            while self.k < len(times) and times[self.k][0] < now:
                self.k += 1
                stats.activations_skipped += 1
        self.pending = times[self.k] if self.k < len(times) else None
        self.fixed = self.pending is not None and (self.planless or not self.exact)
        if self.pending is None:  # beyond the recording (exact: still pending when the recorded run ended)
            stats.fallback_activations += 1
            return math.inf if self.planless else self.own.next(now_local)
        self.k += 1
        stats.activations_replayed += 1
        if self.exact and not self.planless:
            return self.own.next(now_local)
        t, local = self.pending
        period = self.own.period
        if period is not None:  # keep the tick count in step with the recording
            self.own.advance_tick(math.floor(self.agent.local_time(t) / period + 1e-9))
        return local

    def settle(self, at: float, delay: float) -> tuple[float, float]:
        if self.pending is None:
            return at, delay
        t, local = self.pending
        now = self.agent.env.now
        if self.exact and at == local and now + delay == t:  # the same float sum simpy schedules
            return at, delay
        if self.planless:  # exactly at the recorded time: simpy schedules now + delay
            return local, delay_to(now, t)
        return local, max(0.0, t - now)  # conditions, or an edited recording: at the recorded time


def delay_to(now: float, t: float) -> float:
    """The delay d >= 0 with now + d == t in floating point (t - now rounded may miss t by an ulp)."""
    d = max(0.0, t - now)
    while now + d < t:
        d = math.nextafter(d, math.inf)
    while d > 0.0 and now + d > t:
        d = math.nextafter(d, -math.inf)
    return d


class UnloadedLinks:
    """A plugin link model (``network.model``) this process has not loaded, in an exact replay: the recording
    decides every message; one it lacks would need the plugin itself."""

    def __init__(self, name: str, net):
        self.name = name

    def outcome(self, src: int, dst: int, now: float, size: int) -> tuple[float, float, str]:
        raise InputError("network.model", f"link model {self.name!r} is not loaded and the message {src} -> {dst} "
                                          f"at t = {now:g} is not in the recording: replay with --plugin (the file "
                                          "that registers it)")


class UnloadedSchedule(Schedule):
    """A plugin activation schedule (``agents.activation.schedule``) this process has not loaded, in an exact
    replay: the recording fixes every activation; its ticks, if the algorithm asks, need the plugin itself."""

    kind = "unloaded"

    def __init__(self, name: str):
        self.name = name

    def _needed(self, what: str):
        return InputError("agents.activation.schedule", f"schedule {self.name!r} is not loaded and the run "
                                                        f"reads its {what}: replay with --plugin (the file that "
                                                        "registers it)")

    def next(self, now_local: float) -> float:
        raise self._needed("next activation")

    def defer(self, at: float, back_local: float) -> float:
        raise self._needed("next activation")

    def tick_at(self, local: float) -> int:
        raise self._needed("ticks")


@contextmanager
def unloaded_plugins(sc, rec: Recording, source: str):
    """Stand-ins, while an exact replay runs, for the plugin link model and schedule the recorded scenario
    names and this process has not loaded (they are registered under their names, then removed)."""
    added = []
    name = sc.network.model
    if name is not None and name not in LINK_MODELS:
        LINK_MODELS[name] = lambda net: UnloadedLinks(name, net)
        added.append((LINK_MODELS, name))
    sched = sc.agents.activation.schedule
    if sched is not None and sched not in SCHEDULES:
        if rec.ticks_accounted:
            for reg, key in added:
                del reg[key]
            raise InputError("agents.activation.schedule",
                             f"schedule {sched!r} is not loaded and the recorded releases were accounted with its "
                             "ticks and activation probability: replay with --plugin (the file that registers it)",
                             source)
        SCHEDULES[sched] = lambda spec, rng, offset: UnloadedSchedule(sched)
        added.append((SCHEDULES, sched))
    try:
        yield
    finally:
        for reg, key in added:
            del reg[key]


def installer(rec: Recording, exact: bool, window: float, stats: Stats):
    def setup(sim) -> None:
        sim.network.use(ReplayNetwork(sim, rec, exact, window, stats))
        for a in sim.agents:
            a.use_schedule(Recorded(a, rec.activations.get(a.id, []), exact, stats))
    return setup


def _with_recorded_churn(data: dict, rec: Recording, n: int) -> dict:
    """OTHER's scenario dict with its churn replaced by the recorded offline intervals."""
    agents = {k: v for k, v in data["agents"].items() if k not in ("offline", "churn", "availability")}
    offline = [{"agent": i, "start": a, "end": b}
               for i, iv in sorted(rec.offline.items()) if i < n for a, b in iv]
    if offline:
        agents["offline"] = offline
    return {**data, "agents": agents}


def default_out(trace_path: str | Path, scenario: str | Path | None = None) -> Path:
    """Where a replay goes when no folder is given: beside the recorded run, named after it
    (``runs/a`` -> ``runs/a-replay``; under ``--scenario other.toml``: ``runs/a-replay-other``)."""
    p = Path(trace_path).absolute() if Path(trace_path).name in ("", ".", "..") else Path(trace_path)
    base = p if p.is_dir() else (p.parent if p.name == "trace.arrows" else p.with_suffix(""))
    suffix = "-replay" if scenario is None else f"-replay-{Path(scenario).stem}"
    return base.with_name(base.name + suffix)


def replay(trace_path: str | Path, scenario: str | Path | None = None, out: str | Path | None = None,
           window: float = 1.0, overrides: dict | None = None, progress=None, force: bool = True):
    """Re-run a recorded trace; returns the RunResult (summary carries the replay counters and
    ``replay_warnings``). ``out`` defaults to ``default_out``; with ``force=False`` a folder that holds
    results is refused (``api.check_fresh``) instead of replaced."""
    import tomllib

    from netsim import api
    from netsim.metrics.report import write_summary
    from netsim.scenario.load import load_scenario, scenario_from_dict, to_dict

    trace = read_trace(trace_path)
    text = trace.scenario_text
    if not text:
        raise InputError("", "trace has no recorded scenario (netsim.scenario metadata)", str(trace_path))
    rec = Recording(trace, str(trace_path))
    stats = Stats()
    if scenario is None:
        exact = True
        try:
            sc = scenario_from_dict(tomllib.loads(text), f"{trace_path} (recorded scenario)")
        except tomllib.TOMLDecodeError as e:
            raise InputError("", f"recorded scenario is not valid TOML: {e}", str(trace_path)) from None
        if overrides:
            raise InputError("--set", "an exact replay re-runs the recorded scenario as is; use --scenario")
    else:
        exact = False
        other = load_scenario(scenario, overrides)
        sc = scenario_from_dict(_with_recorded_churn(to_dict(other), rec, other.agents.count), str(scenario))
    if out is None:
        out = default_out(trace_path, scenario)
    if not force:
        api.check_fresh(Path(out))
    with unloaded_plugins(sc, rec, str(trace_path)) if exact else nullcontext():
        res = api.run(sc, out=out, progress=progress, setup=installer(rec, exact, window, stats))
    res.summary.update({"replay_of": str(trace_path), "replay_mode": "exact" if exact else "conditions",
                        "replay_window": None if exact else window, **stats.as_dict(),
                        "replay_warnings": stats.warnings(exact)})
    write_summary(res.summary, res.out / "summary.json")
    return res
