"""The per-agent privacy ledger: every release an agent makes, its noise, and its budget cap.

``Agent.privatize`` calls ``agent.ledger.release(...)``. A release is (1) checked against the
agent's cap (the RDP accountant's epsilon at the run's delta, after this release, must stay <= cap),
(2) recorded as a ``Release`` event in the trace and in the agent's compact ``ReleaseLog`` (about 16
bytes per release instead of a record's 400: netsim/privacy/log.py), (3) noised from the agent's own
generator. Once a release would exceed the cap, the agent is exhausted: ``release`` returns None
now and forever, and one ``BudgetExhausted`` event is traced (the algorithm sees the None).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from netsim.privacy.log import ReleaseLog
from netsim.privacy.mechanisms import MECHANISMS, NoiseSource, PrivacyError, check_release_args
from netsim.trace.events import BudgetExhausted, Release, release_tag

if TYPE_CHECKING:
    import numpy as np

    from netsim.sim.agent import Agent

#: suffix of a release's ``what`` when an event trigger decided, earlier in the same activation, whether the
#: release happens (netsim/comm/triggers.py): its occurrence depends on unreleased data
TRIGGERED = "@trigger"


def decided_by_data(r: Release) -> bool:
    """Whether the release's occurrence was decided from unreleased data (an event trigger)."""
    return r.what.endswith(TRIGGERED)


class AgentLedger:
    """One agent's releases, RDP curve and noise generator."""

    def __init__(self, agent: Agent, delta: float = 1e-5, cap: float | None = None, mode: str = "observed"):
        if not 0 < delta < 1:
            raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
        if cap is not None and not cap > 0:
            raise PrivacyError(f"epsilon cap must be > 0, got {cap!r}")
        self.agent = agent
        self.delta, self.cap, self.mode = delta, cap, mode
        self.releases = ReleaseLog(agent.id)  # a Sequence[Release], stored columnar
        self.rdp = None  # running RDP curve (accountants.RunningRdp), only with a cap
        self.exhausted = False
        self.spent = 0.0  # RDP epsilon(delta) after the last release (kept when a cap is set)
        self._noise: NoiseSource | None = None
        self._checked: set[tuple] = set()  # (mechanism, sigma, sensitivity, q) already checked
        self._tags: dict[tuple, str] = {}  # (mechanism, what, sensitivity, q, skipped) -> its ``release_tag`` (checked
        # floats > 0 and one p: equal keys make equal reprs)
        self.p = agent.activation_probability  # the agent's schedule's, like the tick count and its origin
        self._last_tick = agent.schedule.origin

    @property
    def noise(self) -> NoiseSource:
        if self._noise is None:
            a = self.agent
            self._noise = NoiseSource(int(a.rng("noise").integers(2**63 - 1)), a.device)
        return self._noise

    def _skipped(self, tick: int | None = None) -> int:
        """Activation ticks since the previous release that saw no release (Bernoulli activation); ``tick``: the
        agent's latest tick as its runner placed the release (default: now)."""
        if self.p >= 1.0:
            return 0
        tick = self.agent.last_tick if tick is None else tick
        skipped = max(0, tick - self._last_tick - 1)
        self._last_tick = max(self._last_tick, tick)
        return skipped

    def release(self, x: torch.Tensor, sigma: float, sensitivity: float, mechanism: str = "gaussian",
                q: float = 1.0, what: str = "gradient", to: int = -1) -> torch.Tensor | None:
        if not self.record(int(x.numel()), sigma, sensitivity, mechanism, q, what, to):
            return None
        mixing = getattr(self.agent, "mixing_record", None)  # the run's mixing record, when asked
        views = None if mixing is None else mixing.views  # privacy.record = "payloads" (privacy/payloads.py)
        if views is not None:
            x = views.before_noise(self.agent.id, x, sensitivity)  # an audit's gradient canaries
        out = x.clone() if sigma == 0 else self.noise.add(mechanism, x, sigma)
        if views is not None:
            views.released(self.agent.id, self.agent.round, x, out)
        return out

    def record(self, size: int, sigma: float, sensitivity: float, mechanism: str = "gaussian", q: float = 1.0,
               what: str = "gradient", to: int = -1, at: tuple | None = None) -> bool:
        """``release`` without the noise: check, account and trace one release of ``size`` coordinates, and
        say whether it may happen (False once the cap would be exceeded). The caller then adds the noise
        from ``self.noise`` itself, in this agent's release order; a runner that noises many agents'
        releases in one batch uses this (each agent's generator is its own, so the batch draws the same
        noise as one release at a time). ``at`` = (time, rows): a batch's runner places the rows itself (the
        release at that time, its row appended to ``rows``; with a cap, the agent's clock set to that time and the
        release's or the refusal's row appended). A runner that noises a release after the agent moved on (lookahead
        windows) adds the agent's round and latest tick then: ``at`` = (time, rows, round, tick)."""
        if at is not None and self.cap is not None:  # the refusal is traced by the agent: at its clock, in ``rows``
            sim = self.agent.sim
            sim.loop.env.advance_to(at[0])
            into: list = []
            with sim.recorder.writer.capturing(into):
                ok = self.record(size, sigma, sensitivity, mechanism, q, what, to)
            at[1].extend(into)
            return ok
        key = (mechanism, sigma, sensitivity, q)
        if key not in self._checked:  # the arguments of a run's releases rarely vary: check each once
            check_release_args(mechanism, sigma, sensitivity, q, self.p)
            if self.cap is not None:  # the cap is enforced by the RDP accountant: it must compose this release
                self._check_cap_accountant(mechanism, sigma, sensitivity, q)
            self._checked.add(key)
        if self.exhausted:
            return False
        a = self.agent
        if a.data_decided_this_activation and not what.endswith(TRIGGERED):
            what += TRIGGERED  # a trigger decided in this activation whether this release happens
        placed = at is not None and len(at) > 2  # (time, rows, round, tick): where the runner placed it
        t, to, sigma, sensitivity, q, skipped = float(a.env.now if at is None else at[0]), int(to), float(sigma), \
            float(sensitivity), float(q), self._skipped(at[3] if placed else None)
        rnd = at[2] if placed else a.round
        if self.cap is not None:  # the running RDP curve is only needed to enforce a cap
            # imported here: dp-accounting is a heavy import a run without caps need not pay mid-run
            from netsim.privacy.accountants import RunningRdp, release_events

            if self.rdp is None:
                self.rdp = RunningRdp()
            r = Release(t, a.id, to, a.round, size, mechanism, what, sigma, sensitivity, q, self.p, skipped)
            ev, n = release_events(r, self.mode)
            extra = RunningRdp.vector(ev, n)
            after = self.rdp.epsilon(self.delta, extra)
            if not after <= self.cap:
                self.exhausted = True
                a.emit(BudgetExhausted(t, a.id, a.round, self.spent, f"cap={self.cap!r} rdp"))
                return False
            self.rdp.rdp = self.rdp.rdp + extra
            self.spent = after
        # the Release record's row and log entry, made without the record (a run makes millions)
        self.releases.append_fields(t, rnd, to, skipped, (size, mechanism, what, sigma, sensitivity, q, self.p))
        tag = self._tags.get(key := (mechanism, what, sensitivity, q, skipped))
        if tag is None:  # (a run's releases repeat a few tags: formatting three float reprs cost ~1.5 us a release)
            tag = self._tags[key] = release_tag(mechanism, what, sensitivity, q, self.p, skipped)
        (a.emit_row if at is None else at[1].append)((t, "release", a.id, to, -1, size, sigma, rnd, tag))
        return True

    def load_rdp(self, rdp: np.ndarray) -> None:
        """Take a checkpoint's running RDP curve (a restored windowed run: sim/restore.py)."""
        from netsim.privacy.accountants import RunningRdp

        self.rdp = RunningRdp()
        self.rdp.rdp = rdp

    def _check_cap_accountant(self, mechanism: str, sigma: float, sensitivity: float, q: float) -> None:
        from netsim.privacy.accountants import release_events, unsupported

        r = Release(0.0, self.agent.id, -1, 0, 1, mechanism, "check", float(sigma), float(sensitivity), float(q),
                    self.p)
        why = unsupported("rdp", release_events(r, self.mode)[0])
        if why:
            raise PrivacyError(f"privacy.epsilon_cap is enforced with the RDP accountant, and {why}: remove the "
                               "cap, or release with a mechanism and sampling it composes")

    def epsilon(self) -> float:
        """RDP epsilon(delta) spent so far."""
        from netsim.privacy.accountants import epsilon

        return epsilon(self.releases, self.delta, "rdp", self.mode) or 0.0


def ledger_of(agent: Agent) -> AgentLedger:
    """The agent's ledger, created on its first release with the scenario's [privacy] settings."""
    return agent.ledger


def new_ledger(agent: Agent) -> AgentLedger:
    """A ledger with the scenario's [privacy] settings (``Agent.ledger`` makes one on first use)."""
    spec = getattr(agent.scenario, "privacy", None)
    if spec is None:
        return AgentLedger(agent)
    return AgentLedger(agent, spec.delta, spec.epsilon_cap, spec.accounting)


def ledgers(sim) -> dict[int, list[Release]]:
    """Releases of every agent of a finished simulation (agents that never released: empty), as lists of
    records (built on demand from the compact logs; ``release_logs`` gives the logs themselves)."""
    out: dict[int, list[Release]] = {}
    for a in sim.agents:
        led = a.existing_ledger
        out[a.id] = list(led.releases) if led is not None else []
    return out


def release_logs(sim) -> dict[int, ReleaseLog]:
    """{agent: its compact release log} of the agents that released at least once."""
    out: dict[int, ReleaseLog] = {}
    for a in sim.agents:
        led = a.existing_ledger
        if led is not None and len(led.releases):
            out[a.id] = led.releases
    return out


def releases_from_table(table, source: str | None = None) -> dict[int, list[Release]]:
    """Per-agent releases read back from a trace table (``Trace.table``), in trace order. A release
    row that does not parse, or whose parameters no mechanism could have used, is an InputError
    naming ``source``."""
    import pyarrow.compute as pc

    from netsim.errors import InputError

    rows = table.filter(pc.equal(table["kind"], "release"))
    out: dict[int, list[Release]] = defaultdict(list)
    cols = [rows[c].to_pylist() for c in ("t", "agent", "peer", "round", "size", "value", "tag")]
    for t, agent, peer, rnd, size, value, tag in zip(*cols, strict=True):
        try:
            r = Release.from_row(t, agent, peer, rnd, size, value, tag)
        except (ValueError, KeyError) as e:
            raise InputError("release", f"corrupted release record at t={t:g}, tag {tag[:60]!r}: {e}",
                             source) from None
        if r.mechanism not in MECHANISMS:
            raise InputError("release", f"mechanism {r.mechanism!r} of the release at t={t:g} is not registered "
                                        f"(registered: {', '.join(MECHANISMS)}; a plugin's needs --plugin)", source)
        try:
            check_release_args(r.mechanism, r.scale, r.sensitivity, r.q, r.p)
            if agent < 0 or r.skipped < 0:
                raise ValueError(f"agent {agent}, skipped ticks {r.skipped}")
        except (ValueError, KeyError) as e:
            raise InputError("release", f"corrupted release record at t={t:g}, tag {tag[:60]!r}: {e}",
                             source) from None
        out[agent].append(r)
    return dict(out)


def exhausted_from_table(table) -> dict[int, float]:
    """{agent: time its budget ran out} from a trace table."""
    import pyarrow.compute as pc

    rows = table.filter(pc.equal(table["kind"], "budget_exhausted"))
    return {int(a): float(t) for a, t in zip(rows["agent"].to_pylist(), rows["t"].to_pylist(), strict=True)}


