"""Asynchronous push gossip SGD: no barrier; send and go on, merge whatever has arrived.

The D-PSGD update (Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms?",
NeurIPS 2017, Algorithm 1, the update step) with the neighbours' latest values
instead of the round's: x_i <- sum_j W_ij xhat_j - gamma grad F_i(x_i), where xhat_j is the latest value
that arrived from j since i's last activation (its weight stays on x_i if none did), optionally
down-weighted by its staleness (FedAsync's polynomial staleness, ``comm.AsyncPush``).
"""

from __future__ import annotations

import attrs

from netsim.algorithms.registry import register
from netsim.comm.patterns import AsyncPush
from netsim.scenario.structure import at_least, field, nonneg


@attrs.frozen
class AsyncPushParams:
    lr: float = field(0.1, check=nonneg, doc="step size gamma")
    batch: int = field(32, check=at_least(0), doc="mini-batch size (0 = full local batch)")
    staleness_power: float = field(0.0, check=nonneg,
                                   doc="a in w_ij (1 + staleness)^-a; 0 = plain mixing weights")


@register("async_push", AsyncPushParams)
def async_push(agent, p: AsyncPushParams):
    push = AsyncPush(agent, staleness_power=p.staleness_power)
    while True:
        yield agent.wake()
        g = None
        if p.lr > 0:
            g = yield agent.gradient(batch=p.batch)
        x = push.merge(agent.params)
        if g is not None:
            x = x - p.lr * g
        agent.params = x
        yield push.push(x)
