"""Sampling the scenario's ``Dist`` records from a named stream."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from netsim.errors import InputError
from netsim.scenario.schema import AgentsSpec, Dist, Scenario, drift_dist, seconds_dist
from netsim.sim.streams import Draws


def checked(d: Dist, key: str) -> Dist:
    """``d`` if its parameters are in range (finite, sigma and the uniform's width bounded), else an
    InputError naming ``key``: a scenario file is checked when read, a ``Dist`` built in code here."""
    if _fine(d):
        return d
    problem = d.problem()
    if problem is not None:
        raise InputError(f"{key}.{problem[0]}", problem[1])
    return d


@functools.lru_cache(maxsize=1024)
def _fine(d: Dist) -> bool:
    """Whether ``d`` has no problem (remembered: every link of a large run draws from the same few)."""
    return d.problem() is None


def check_scenario(sc: Scenario) -> None:
    """Every distribution of a scenario in range for what it is used as (seconds: never negative, at most
    MAX_SECONDS; clock drift in (-1, 1]), so no draw can overflow the clocks or the event queue. A file's
    are checked when it is read; this repeats it for a Scenario built in code, before anything runs."""
    a, net = sc.agents, sc.network
    items = [("agents.clock_offset", a.clock_offset, seconds_dist), ("agents.clock_drift", a.clock_drift, drift_dist),
             ("agents.clock_jitter", a.clock_jitter, seconds_dist), ("agents.compute_time", a.compute_time,
                                                                     seconds_dist),
             ("network.latency", net.latency, seconds_dist)]
    items += [(f"network.links[{i}].latency", o.latency, seconds_dist) for i, o in enumerate(net.links or ())]
    for key, d, role in items:
        if d is not None and (msg := role(checked(d, key))):
            raise InputError(key, msg)


def clocks(agents: AgentsSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each agent's clock offset and drift, drawn from the ``clock`` stream ``rng``; a drift <= -1 (a clock that
    stops or runs backwards) or offsets too large for the activation period to tell ticks apart are refused."""
    n = agents.count
    offsets = sampler(agents.clock_offset, rng, "agents.clock_offset")(n)
    drifts = sampler(agents.clock_drift, rng, "agents.clock_drift")(n)
    if not (drifts > -1).all():
        raise InputError("agents.clock_drift", f"drew a drift of {drifts.min():.3g}; a drift must be > -1 "
                                               "(a clock cannot stop or run backwards)")
    act = agents.activation
    if act.kind != "poisson" and offsets.max() / act.period > 2**40:
        raise InputError("agents.clock_offset", f"offsets up to {offsets.max():.3g} s are too large for "
                         f"agents.activation.period = {act.period} s: the clock could not tell ticks apart "
                         "(keep offset / period <= 2^40)")
    return offsets, drifts


def sampler(d: Dist, rng: np.random.Generator, key: str = "distribution") -> Callable[[int], np.ndarray]:
    """n -> n samples of ``d`` (``key`` names it in errors). lognormal is parameterised by its mean:
    mu = ln(mean) - sigma^2/2."""
    checked(d, key)
    if d.kind == "constant":
        v = float(d.value)  # type: ignore[arg-type]
        return lambda n: np.full(n, v)
    if d.kind == "uniform":
        return lambda n: rng.uniform(d.low, d.high, n)
    if d.kind == "exponential":  # + 0.0: a mean of -0.0 is 0 (numpy refuses a scale with its sign bit set)
        return lambda n: rng.exponential(d.mean + 0.0, n)
    if d.kind == "normal":
        return lambda n: rng.normal(d.mean, d.sigma + 0.0, n)
    if d.kind == "lognormal":
        if d.mean == 0:
            return lambda n: np.zeros(n)
        mu = np.log(d.mean) - d.sigma**2 / 2  # type: ignore[operator]
        return lambda n: rng.lognormal(mu, d.sigma, n)
    raise ValueError(f"unknown distribution kind {d.kind!r}")


def draws(d: Dist, rng: np.random.Generator | Callable[[], np.random.Generator] | None,
          key: str = "distribution", positions: bool = True, lazy: bool = False) -> Callable[[], float]:
    """One draw per call; constants skip the stream entirely (one callable per constant: a 10,000-agent run makes
    tens of thousands of links, each of which would check the distribution again). ``rng`` may be a function that
    makes the stream: a constant then never makes it (20,000 links' unused streams cost over a second); ``lazy``:
    nor do the others before their first draw (``Draws``' ``make``).
    ``positions``: whether the draws keep their stream's position for a checkpoint (``Draws``)."""
    if d.kind == "constant":
        return _constant(d, key)
    if callable(rng):
        if lazy and positions:
            checked(d, key)
            return Draws(None, make=lambda: (sampler(d, g := rng(), key), g))
        rng = rng()
    return Draws(sampler(d, rng, key), rng if positions else None)  # (sampler checks d)


@functools.lru_cache(maxsize=256)
def _constant(d: Dist, key: str) -> Callable[[], float]:
    v = float(checked(d, key).value)  # type: ignore[arg-type]
    return lambda: v


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
