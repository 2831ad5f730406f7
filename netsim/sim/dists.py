"""Sampling the scenario's ``Dist`` records from a named stream."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from netsim.scenario.schema import Dist
from netsim.sim.streams import Draws


def sampler(d: Dist, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    """n -> n samples of ``d``. lognormal is parameterised by its mean: mu = ln(mean) - sigma^2/2."""
    if d.kind == "constant":
        v = float(d.value)  # type: ignore[arg-type]
        return lambda n: np.full(n, v)
    if d.kind == "uniform":
        return lambda n: rng.uniform(d.low, d.high, n)
    if d.kind == "exponential":
        return lambda n: rng.exponential(d.mean, n)
    if d.kind == "normal":
        return lambda n: rng.normal(d.mean, d.sigma, n)
    if d.kind == "lognormal":
        if d.mean == 0:
            return lambda n: np.zeros(n)
        mu = np.log(d.mean) - d.sigma**2 / 2  # type: ignore[operator]
        return lambda n: rng.lognormal(mu, d.sigma, n)
    raise ValueError(f"unknown distribution kind {d.kind!r}")


def draws(d: Dist, rng: np.random.Generator) -> Callable[[], float]:
    """One draw per call; constants skip the stream entirely."""
    if d.kind == "constant":
        v = float(d.value)  # type: ignore[arg-type]
        return lambda: v
    return Draws(sampler(d, rng))


def scipy_dist(d: Dist):
    """The matching frozen scipy.stats distribution (used by tests for KS checks)."""
    from scipy import stats

    if d.kind == "uniform":
        return stats.uniform(d.low, d.high - d.low)  # type: ignore[operator]
    if d.kind == "exponential":
        return stats.expon(scale=d.mean)
    if d.kind == "normal":
        return stats.norm(d.mean, d.sigma)
    if d.kind == "lognormal":
        mu = np.log(d.mean) - d.sigma**2 / 2  # type: ignore[operator]
        return stats.lognorm(s=d.sigma, scale=np.exp(mu))
    raise ValueError(f"no continuous scipy distribution for {d.kind!r}")
