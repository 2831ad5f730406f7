"""epsilon(delta) of an agent's releases, through dp-accounting's RDP and PLD accountants.

A ledger (a list of ``Release`` events of one agent) maps to a composition of dp-accounting events:
a Gaussian release with noise std ``scale`` and L2 sensitivity ``s`` is ``GaussianDpEvent(scale/s)``
(noise multiplier), a Laplace release ``LaplaceDpEvent(scale/s)``; a release whose record enters with
probability ``r < 1`` is wrapped in ``PoissonSampledDpEvent(r, .)`` (amplification by subsampling).
Runs of identical events are composed with a count (``SelfComposedDpEvent`` semantics), so the
accountant does exactly what calling dp-accounting on the equivalent composed event does.

Two accounting modes for agents with random (Bernoulli) activation:

- ``observed`` (conservative, default): each actual release at its data-sampling rate q. Activation
  is visible to the adversary (an inactive agent sends nothing), so it buys no amplification.
- ``amplified`` (Huo, Liu, Ding, Johansson, Shi, "Decentralized Optimization with Amplified Privacy via
  Efficient Communication", Lemma 4, whose assumption is that activation is hidden): every
  activation tick is a run of the mechanism, and a record enters with probability p*q; the ticks
  an agent skipped since its previous release count as releases of the same mechanism.

Neighbouring relation: dp-accounting's add-or-remove-one; the recorded sensitivity must be the one of
that relation (per-example clipping to C: sensitivity C of the sum).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Sequence

import dp_accounting
import numpy as np
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from netsim.errors import claim
from netsim.privacy.log import ReleaseLog
from netsim.privacy.mechanisms import PrivacyError, get_mechanism
from netsim.trace.events import Release


class _QuietConvergence(logging.Filter):
    """dp-accounting logs (through absl) each fractional RDP order it drops for not converging; the
    epsilon it returns is still a valid bound over the remaining orders, so these lines are noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


logging.getLogger("absl").addFilter(_QuietConvergence())

MODES = ("observed", "amplified")
PLD_DISCRETIZATION = 1e-4  # dp-accounting's default value_discretization_interval
#: accountants by name: a factory of a fresh dp-accounting ``PrivacyAccountant`` (register_accountant)
ACCOUNTANTS: dict[str, Callable[[], dp_accounting.PrivacyAccountant]] = {}
ACCOUNTANT_DOCS: dict[str, str] = {}  # name -> what it is (paper), for reports


def register_accountant(name: str, factory: Callable[[], dp_accounting.PrivacyAccountant], doc: str = "") -> None:
    """Make an accountant available by name (``epsilon(..., accountant=name)``, ``netsim privacy
    --accountant name``, calibration): ``factory()`` returns a fresh dp-accounting ``PrivacyAccountant``
    (its ``compose(event, count)`` and ``get_epsilon(delta)`` are all netsim calls; events it does not
    support make the epsilon None). The same factory again is a no-op; another under a taken name raises."""
    claim(ACCOUNTANTS, "accountant", name, factory)
    ACCOUNTANT_DOCS[name] = doc


register_accountant("rdp", RdpAccountant, 'Renyi DP (Mironov, "Renyi Differential Privacy", CSF 2017)')
register_accountant("pld", functools.partial(PLDAccountant, value_discretization_interval=PLD_DISCRETIZATION),
                    "privacy loss distributions (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, \"Connect the Dots\", "
                    "PETS 2022)")


def check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")


#: the neighbouring relation of every figure: one record of the agent added or removed
NEIGHBOURING = "add_or_remove_one"
#: how a record's presence in a release is modelled: each record independently with probability q (Poisson
#: sampling). netsim draws fixed-size batches (with or without replacement: ``data.sampling``); taking them as
#: Poisson at q = B / |D_i| is the usual DP-SGD approximation, and the reports say so.
SAMPLING = "poisson"


def sampled(event: dp_accounting.DpEvent, rate: float) -> dp_accounting.DpEvent:
    """``event`` with each record entering at ``rate`` (SAMPLING: Poisson); itself at rate 1."""
    if rate >= 1.0 or isinstance(event, dp_accounting.NonPrivateDpEvent):
        return event
    return dp_accounting.PoissonSampledDpEvent(rate, event)


def mechanism_event(mechanism: str, scale: float, sensitivity: float) -> dp_accounting.DpEvent:
    """The mechanism's own dp-accounting event of one release (its registered ``Mechanism.event``)."""
    if scale <= 0:
        return dp_accounting.NonPrivateDpEvent()
    return get_mechanism(mechanism).event(scale, sensitivity)


def base_event(mechanism: str, multiplier: float, rate: float) -> dp_accounting.DpEvent:
    """The event of one release of noise multiplier ``multiplier`` (scale at sensitivity 1) at ``rate``."""
    return sampled(mechanism_event(mechanism, multiplier, 1.0), rate)


def release_events(r: Release, mode: str = "observed") -> tuple[dp_accounting.DpEvent, int]:
    """(event, count) of one release: count > 1 when, amplified, it stands for skipped ticks too."""
    if mode not in MODES:
        raise PrivacyError(f"accounting mode must be one of {', '.join(MODES)}, got {mode!r}")
    ev = mechanism_event(r.mechanism, r.scale, r.sensitivity)
    if mode == "observed":
        return sampled(ev, r.q), 1
    return sampled(ev, r.p * r.q), 1 + r.skipped


def unsupported(accountant: str, event: dp_accounting.DpEvent) -> str | None:
    """Why the registered ``accountant`` cannot compose ``event`` (None: it can)."""
    acc = make_accountant(accountant)
    return None if acc.supports(event) else f"the {accountant} accountant does not support {event!r}"


def grouped_events(releases: Iterable[Release],
                   mode: str = "observed") -> list[tuple[dp_accounting.DpEvent, int]]:
    """Consecutive identical events merged into (event, count)."""
    if isinstance(releases, ReleaseLog):  # a ledger's compact log: one event per run, same result
        return releases.grouped_events(mode)
    out: list[tuple[dp_accounting.DpEvent, int]] = []
    for r in releases:
        ev, n = release_events(r, mode)
        if out and out[-1][0] == ev:
            out[-1] = (ev, out[-1][1] + n)
        else:
            out.append((ev, n))
    return out


def composed_event(releases: Iterable[Release], mode: str = "observed") -> dp_accounting.DpEvent:
    """The whole ledger as one dp-accounting event (what a reader can hand to any accountant)."""
    return dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(ev, n) for ev, n in grouped_events(releases, mode)])


def make_accountant(kind: str = "rdp") -> dp_accounting.PrivacyAccountant:
    """A fresh accountant of the registered kind."""
    factory = ACCOUNTANTS.get(kind)
    if factory is None:
        raise PrivacyError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {kind!r}")
    return factory()


def epsilon(releases: Sequence[Release], delta: float, accountant: str = "rdp",
            mode: str = "observed") -> float | None:
    """epsilon(delta) of the composition of ``releases``; 0 when there are none; None when the
    accountant cannot handle an event (e.g. RDP of a subsampled Laplace)."""
    check_delta(delta)
    if not releases:
        return 0.0
    try:
        return events_epsilon(grouped_events(releases, mode), delta, accountant)
    except dp_accounting.UnsupportedEventError:
        return None


def events_epsilon(groups: Iterable[tuple[dp_accounting.DpEvent, int]], delta: float, accountant: str = "rdp") -> float:
    """epsilon(delta) of the composition of (event, count) pairs by the registered ``accountant`` (``epsilon``'s
    composition, for events built elsewhere, e.g. a pairwise view's); raises UnsupportedEventError."""
    if accountant == "rdp":  # RdpAccountant's own sum (rdp += count * rdp(event)), per-event cached
        run = RunningRdp()
        for ev, n in groups:
            run.add(ev, n)
        return run.epsilon(delta)
    acc = make_accountant(accountant)
    for ev, n in groups:
        acc.compose(ev, n)
    return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=4096)
def _rdp_of(event: dp_accounting.DpEvent) -> np.ndarray:
    acc = RdpAccountant()
    acc.compose(event)
    return acc.rdp


ORDERS = np.asarray(RdpAccountant().orders)


class RunningRdp:
    """An agent's RDP curve, updated release by release (the same vectors RdpAccountant sums)."""

    def __init__(self) -> None:
        self.rdp = np.zeros_like(ORDERS)

    @staticmethod
    def vector(ev: dp_accounting.DpEvent, n: int) -> np.ndarray:
        return n * _rdp_of(ev)

    def add(self, ev: dp_accounting.DpEvent, n: int = 1) -> None:
        self.rdp = self.rdp + self.vector(ev, n)

    def epsilon(self, delta: float, extra: np.ndarray | None = None) -> float:
        rdp = self.rdp if extra is None else self.rdp + extra
        if not rdp.any():
            return 0.0
        return float(compute_epsilon(ORDERS, rdp, delta)[0])


def epsilon_curve(releases: Sequence[Release], delta: float, mode: str = "observed",
                  points: int = 200) -> tuple[list[float], list[float]]:
    """RDP epsilon(delta) after each release (at most ``points`` of them, evenly spaced, last included)."""
    check_delta(delta)
    run = RunningRdp()
    n = len(releases)
    keep = set(np.unique(np.linspace(0, n - 1, min(points, n)).round().astype(int)).tolist()) if n else set()
    ts: list[float] = []
    eps: list[float] = []
    for i, r in enumerate(releases):
        ev, k = release_events(r, mode)
        try:
            run.add(ev, k)
        except dp_accounting.UnsupportedEventError:
            return ts, eps
        if i in keep:
            ts.append(r.t)
            eps.append(run.epsilon(delta))
    return ts, eps


def epsilon_at(releases: Sequence[Release], times: Sequence[float], delta: float,
               mode: str = "observed") -> list[tuple[float, int]]:
    """(RDP epsilon(delta), releases so far) of the releases made up to each of ``times`` (ascending):
    epsilon over time. inf once an unsupported or noiseless event has been composed."""
    check_delta(delta)
    run = RunningRdp()
    out: list[tuple[float, int]] = []
    i, n, broken = 0, len(releases), False
    for t in times:
        while i < n and releases[i].t <= t:
            ev, k = release_events(releases[i], mode)
            try:
                run.add(ev, k)
            except dp_accounting.UnsupportedEventError:
                broken = True
            i += 1
        out.append((math.inf if broken else run.epsilon(delta), i))
    return out


def finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x
