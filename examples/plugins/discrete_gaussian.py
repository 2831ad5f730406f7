"""A plugin mechanism: the discrete Gaussian, accounted through its own dp-accounting event (zCDP).

Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020): adding noise drawn
from the discrete Gaussian N_Z(0, sigma^2) (P[k] proportional to exp(-k^2 / (2 sigma^2)) on the integers), to
each coordinate of an integer vector of L2 sensitivity Delta is (Delta^2 / (2 sigma^2))-zCDP (their Theorem 14
for the multivariate case). Its dp-accounting event is therefore ``ZCDpEvent(rho)``, not a Gaussian one:
dp-accounting's RDP accountant composes it (rho alpha at every order) under add-or-remove-one neighbours; its
PLD accountant does not, so ``netsim privacy --pld`` refuses with the reason instead of printing a stand-in
figure; and neither composes a subsampled zCDP event, so a release with q < 1 is refused too.

The draws: inverse-CDF sampling (``torch.multinomial``) over the support [-t, t], t = ceil(12 sigma) + 1,
from the agent's own noise generator; the mass left out is below exp(-72), far under any delta used.

The algorithm ``dg_sgd_gossip`` uses it: each round an agent clips its mini-batch mean gradient to norm C,
rounds it to the integer grid of step ``grid`` (g / grid), releases it with discrete Gaussian noise, steps along
the released vector (times ``grid``) and gossips its model (post-processing of its releases). Two neighbouring
batches' clipped means differ by at most 2 C, and rounding adds at most sqrt(d) / 2 to each: the release's L2
sensitivity is 2 C / grid + sqrt(d).

    netsim run scenarios/quickstart.toml --plugin examples/plugins/discrete_gaussian.py \\
        --set algorithm.name=dg_sgd_gossip --out runs/dg
    netsim privacy runs/dg --plugin examples/plugins/discrete_gaussian.py
"""

from __future__ import annotations

import math

import attrs
import torch

from netsim.algorithms.registry import register
from netsim.privacy.mechanisms import Mechanism, clip_l2, register_mechanism
from netsim.scenario.structure import at_least, field, positive


def release(generator: torch.Generator, x: torch.Tensor, sigma: float) -> torch.Tensor:
    """x (integer valued) + discrete Gaussian noise N_Z(0, sigma^2) per coordinate."""
    t = math.ceil(12 * sigma) + 1
    k = torch.arange(-t, t + 1, dtype=torch.float64)
    w = torch.exp(-k * k / (2 * sigma * sigma))
    idx = torch.multinomial(w, x.numel(), replacement=True, generator=generator)
    return x + k[idx].reshape(x.shape).to(x.dtype).to(x.device)


def event(sigma: float, sensitivity: float):
    """Canonne, Kamath, Steinke, Theorem 14: rho = Delta^2 / (2 sigma^2)."""
    from dp_accounting import ZCDpEvent

    return ZCDpEvent(sensitivity * sensitivity / (2 * sigma * sigma))


def check(sigma: float, sensitivity: float) -> str | None:
    return None if sigma > 0 else f"needs sigma > 0 (no noise is not a discrete Gaussian), got {sigma!r}"


DISCRETE_GAUSSIAN = register_mechanism(Mechanism(
    "discrete_gaussian", release, event,
    "x + N_Z(0, sigma^2)^d on integer vectors: (Delta^2 / (2 sigma^2))-zCDP (Canonne, Kamath, Steinke, NeurIPS "
    "2020, Thm 14); L2 sensitivity", check))


@attrs.frozen
class DGParams:
    lr: float = field(0.5, check=positive, doc="step size")
    batch: int = field(16, check=at_least(1), doc="rows per gradient")
    clip: float = field(1.0, check=positive, doc="C: the mean gradient's L2 clipping bound")
    grid: float = field(0.05, check=positive, doc="the integer grid's step: the gradient is released as g / grid")
    sigma: float = field(20.0, check=positive, doc="discrete Gaussian scale, in grid units")
    round_timeout: float = field(0.2, check=positive, doc="seconds the round's gather waits")


@register("dg_sgd_gossip", DGParams)
def dg_sgd_gossip(agent, p: DGParams):
    k = 0
    while True:
        yield agent.wake()
        x = agent.params
        g = yield agent.gradient(batch=p.batch, params=x)
        ints = torch.round(clip_l2(g, p.clip) / p.grid)
        sens = 2 * p.clip / p.grid + math.sqrt(g.numel())
        noisy = agent.privatize(ints, sigma=p.sigma, sensitivity=sens, mechanism="discrete_gaussian",
                                what="gradient")
        yield agent.broadcast(x, tag="model", round=k)
        got = yield agent.gather(tag="model", round=k, timeout=p.round_timeout)
        x = agent.mix(x, got)
        agent.params = x if noisy is None else x - p.lr * p.grid * noisy
        k += 1
