"""Noise for a target (epsilon, delta): dp-accounting's ``calibrate_dp_mechanism`` on the schedule.

A schedule is a sequence of (q, steps): ``steps`` Gaussian releases whose record enters with
probability ``q`` (q = 1: no subsampling). The answer is a noise *multiplier* z (noise std over L2
sensitivity); multiply by the sensitivity for the std to pass to ``Agent.privatize``.
"""

from __future__ import annotations

from collections.abc import Sequence

import dp_accounting
from dp_accounting.mechanism_calibration import LowerEndpointAndGuess

from netsim.privacy.accountants import base_event, check_delta, make_accountant
from netsim.privacy.mechanisms import PrivacyError

Schedule = Sequence[tuple[float, int]]


def _check(eps: float, delta: float, schedule: Schedule) -> None:
    if not eps > 0:
        raise PrivacyError(f"target epsilon must be > 0, got {eps!r}")
    check_delta(delta)
    if not schedule:
        raise PrivacyError("schedule is empty: give at least one (q, steps)")
    for q, steps in schedule:
        if not 0 < q <= 1:
            raise PrivacyError(f"sampling probability q must be in (0, 1], got {q!r}")
        if int(steps) != steps or steps < 1:
            raise PrivacyError(f"steps must be a positive integer, got {steps!r}")


def schedule_event(z: float, schedule: Schedule, mechanism: str = "gaussian") -> dp_accounting.DpEvent:
    return dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(base_event(mechanism, z, q), int(n)) for q, n in schedule])


def noise_multiplier(eps: float, delta: float, schedule: Schedule, accountant: str = "rdp",
                     tol: float = 1e-6) -> float:
    """Smallest Gaussian noise multiplier z with epsilon(delta) <= eps over ``schedule`` (within tol)."""
    _check(eps, delta, schedule)
    z = dp_accounting.calibrate_dp_mechanism(
        lambda: make_accountant(accountant), lambda z: schedule_event(z, schedule), eps, delta,
        bracket_interval=LowerEndpointAndGuess(1e-3, 1.0), tol=tol)
    return float(z)


def gaussian_sigma(eps: float, delta: float, sensitivity: float, schedule: Schedule,
                   accountant: str = "rdp") -> float:
    """The noise std for ``Agent.privatize``: sensitivity x the calibrated multiplier."""
    if not sensitivity > 0:
        raise PrivacyError(f"sensitivity must be > 0, got {sensitivity!r}")
    return sensitivity * noise_multiplier(eps, delta, schedule, accountant)


def max_steps(eps: float, delta: float, z: float, q: float = 1.0, accountant: str = "rdp",
              upper: int = 10**7) -> int:
    """The largest number of releases (multiplier z, sampling q) that keeps epsilon(delta) <= eps."""
    _check(eps, delta, [(q, 1)])
    if not z > 0:
        raise PrivacyError(f"noise multiplier must be > 0, got {z!r}")

    def eps_of(n: int) -> float:
        acc = make_accountant(accountant)
        acc.compose(base_event("gaussian", z, q), n)
        return acc.get_epsilon(delta)

    if eps_of(1) > eps:
        return 0
    lo, hi = 1, 2
    while hi < upper and eps_of(hi) <= eps:
        lo, hi = hi, hi * 2
    if hi >= upper and eps_of(upper) <= eps:
        return upper
    while hi - lo > 1:  # eps_of(lo) <= eps < eps_of(hi): epsilon is monotone in the step count
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps_of(mid) <= eps else (lo, mid)
    return lo
