"""Subgradient-push: push-sum consensus with local gradient steps, for directed graphs.

Nedic & Olshevsky, "Distributed optimization over time-varying directed graphs" (IEEE TAC 2015),
Section II, subgradient-push: w_i = sum_j x_j / d_j, y_i = sum_j y_j / d_j, z_i = w_i / y_i,
x_i = w_i - alpha g_i(z_i).
Push-sum itself is Kempe et al. (FOCS 2003), Algorithm 1; messages carry running sums so a dropped
message is recovered by the next one (Hadjicostis et al., IEEE TAC 2016), see ``comm.PushSum``.
Activations are asynchronous (each agent on its own clock): it absorbs what arrived, steps, pushes.
The bank holds z_i, the de-biased estimate, which is what evaluation sees. Use a directed topology
with ``mixing = "column_stochastic"``; lr = 0 is pure push-sum averaging.
"""

from __future__ import annotations

import attrs

from netsim.algorithms.registry import register
from netsim.comm.patterns import PushSum
from netsim.scenario.structure import at_least, field, nonneg


@attrs.frozen
class PushSumParams:
    lr: float = field(0.1, check=nonneg, doc="step size alpha (0 = pure push-sum averaging)")
    batch: int = field(32, check=at_least(0), doc="mini-batch size (0 = full local batch)")


@register("pushsum", PushSumParams)
def pushsum(agent, p: PushSumParams):
    ps = PushSum(agent, agent.params)
    while True:
        yield agent.wake()
        ps.absorb()                                               # w_i, y_i
        if p.lr > 0:
            g = yield agent.gradient(batch=p.batch, params=ps.estimate)  # g_i(z_i), z_i = w_i / y_i
            ps.x.sub_(g, alpha=p.lr)                              # x_i = w_i - alpha g_i
        agent.params = ps.estimate
        yield ps.push()
