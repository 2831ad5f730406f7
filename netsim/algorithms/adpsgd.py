"""AD-PSGD: asynchronous decentralized parallel SGD.

Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel Stochastic Gradient Descent" (ICML 2018),
Algorithm 1. On each activation agent i (steps (a)-(d) below, in the paper's order)
    (a) reads x_i (its gradient will be taken there),
    (b) computes g = grad F_i(x_i; xi) (takes compute time; meanwhile others may average with i),
    (c) averages with one uniformly random neighbour j, atomically: x_i, x_j <- (x_i + x_j)/2,
    (d) applies x_i <- x_i - gamma g.
The gradient is stale by the averagings other agents made with i during (b): that count is
recorded per step (summary ``adpsgd_staleness_mean/max``). The exchange is ``comm.PairwiseGossip``. Written as a
kernel of the pairwise pattern (rounds/pairwise.py), so ``--engine windowed`` plays it as lookahead windows.

``roles = "bipartite"`` is the paper's deadlock-free split of its implementation: on a
bipartite graph only the agents of one side (the active ones) initiate averagings; the passive side
computes, applies gradients and serves. ``"all"`` lets everyone initiate; a request to an agent busy in
its own exchange is then refused (counted as ``gossip_refused``).
"""

from __future__ import annotations

from typing import Literal

import attrs

from netsim.algorithms.registry import register
from netsim.errors import InputError
from netsim.rounds.kernel import GradientRequest
from netsim.rounds.pairwise import Pairwise, PairwiseKernel
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
class ADPSGD(PairwiseKernel):
    """Steps (a)-(d) as a kernel of the pairwise pattern (rounds/pairwise.py, whose program reads like the
    paper's steps): the exchange is the pattern's, the step (d) is ``update``."""

    pattern = Pairwise(tag="gossip")  # requests "gossip.req", replies "gossip.rep" (``PairwiseGossip``'s)
    reads = frozenset({"lr", "batch", "reply_timeout", "atomic", "roles"})
    staleness = "adpsgd_staleness"

    def check(self, sim, p):
        import networkx as nx

        if p.roles == "bipartite" and not nx.is_bipartite(sim.world.graph.to_undirected()):
            raise InputError("algorithm.roles", "'bipartite' needs a bipartite topology "
                                                "(e.g. a ring or torus of even size)")

    def init(self, agents, p):
        """The initiating side: everyone, or one colour of the bipartite graph (computed once)."""
        if p.roles != "bipartite":
            return None
        import networkx as nx

        return nx.bipartite.color(agents[0].graph.to_undirected())

    def initiates(self, state, i):
        return state is None or state[i] == 0

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch) if p.lr > 0 else None

    def exchange(self, p):
        return p.reply_timeout, p.atomic

    def update(self, b, p, g):
        b.x = b.x - p.lr * g
