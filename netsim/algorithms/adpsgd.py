"""AD-PSGD: asynchronous decentralized parallel SGD.

Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel Stochastic Gradient Descent" (ICML 2018),
Algorithm 1. On each activation agent i (steps (a)-(d) below, in the paper's order)
    (a) reads x_i (its gradient will be taken there),
    (b) computes g = grad F_i(x_i; xi) (takes compute time; meanwhile others may average with i),
    (c) averages with one uniformly random neighbour j, atomically: x_i, x_j <- (x_i + x_j)/2,
    (d) applies x_i <- x_i - gamma g.
The gradient is stale by the averagings other agents made with i during (b): that count is
recorded per step (summary ``adpsgd_staleness_mean/max``). The exchange is ``comm.PairwiseGossip``.

``roles = "bipartite"`` is the paper's deadlock-free split of its implementation: on a
bipartite graph only the agents of one side (the active ones) initiate averagings; the passive side
computes, applies gradients and serves. ``"all"`` lets everyone initiate; a request to an agent busy in
its own exchange is then refused (counted as ``gossip_refused``).
"""

from __future__ import annotations

from typing import Literal

import attrs
import networkx as nx

from netsim.algorithms.registry import register
from netsim.comm.patterns import PairwiseGossip
from netsim.errors import InputError
from netsim.scenario.structure import at_least, field, nonneg, positive


@attrs.frozen
class ADPSGDParams:
    lr: float = field(0.1, check=nonneg, doc="step size gamma (0 = pure pairwise averaging)")
    batch: int = field(32, check=at_least(0), doc="mini-batch size (0 = full local batch)")
    reply_timeout: float = field(1.0, check=positive, doc="seconds to wait for the neighbour's reply")
    atomic: bool = field(True, doc="lock an agent during its exchange (refuse requests meanwhile)")
    roles: Literal["all", "bipartite"] = field("all", doc="who initiates: everyone, or one side of a "
                                                       "bipartite graph")


@register("adpsgd", ADPSGDParams)
def adpsgd(agent, p: ADPSGDParams):
    """Checks the roles before the run starts (a plain function returning the agent's program)."""
    active = True
    if p.roles == "bipartite":
        g = agent.graph.to_undirected()
        if not nx.is_bipartite(g):
            raise InputError("algorithm.roles", "'bipartite' needs a bipartite topology "
                                                "(e.g. a ring or torus of even size)")
        active = nx.bipartite.color(g)[agent.id] == 0
    return _adpsgd(agent, p, active)


def _adpsgd(agent, p: ADPSGDParams, active: bool):
    pg = PairwiseGossip(agent, timeout=p.reply_timeout, atomic=p.atomic)
    stats = agent.stats
    rng = agent.rng()
    while True:
        yield agent.wake()
        g = None
        if p.lr > 0:
            x = agent.params                                  # (a)
            seen = pg.served
            g = yield agent.gradient(batch=p.batch, params=x)  # (b)
            stats.observe("adpsgd_staleness", float(pg.served - seen))
        if active:
            yield from pg.exchange(pg.random_neighbor(rng))   # (c)
        if g is not None:
            agent.params = agent.params - p.lr * g            # (d)
