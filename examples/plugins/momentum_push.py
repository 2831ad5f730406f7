"""A plugin kernel of the broadcast pattern: asynchronous push SGD with heavy-ball momentum, which both engines run
from this one definition, the windowed one as lookahead windows when the agents keep their own clocks.

Asynchronous push gossip SGD (netsim's ``async_push``: Lian et al., "Can Decentralized Algorithms Outperform
Centralized Algorithms?", NeurIPS 2017, Algorithm 1's update with the neighbours' latest values, optionally
down-weighted by staleness) whose local step is Polyak's heavy ball ("Some methods of speeding up the convergence
of iteration methods", USSR Comput. Math. Math. Phys. 4(5), 1964, eq. (9)):

    v_i <- mu v_i + grad F_i(x_i)          (the gradient at x_i as activated; v_i lives in an extra row)
    x_i <- x_i + sum_j w'_ij (xhat_j - x_i) - gamma v_i

``mu = 0`` is ``async_push`` itself, bit for bit. The momentum row is kept by the pattern with the model (an
``extra_rows`` entry), so the windowed driver batches it like the model:

    netsim run examples/momentum_push.toml --plugin examples/plugins/momentum_push.py --engine windowed
"""

from __future__ import annotations

import attrs

from netsim.algorithms.async_push import AsyncPushParams, AsyncPushSGD
from netsim.algorithms.registry import register
from netsim.rounds.broadcast import Broadcast
from netsim.scenario.structure import field, nonneg


@attrs.frozen
class MomentumPushParams(AsyncPushParams):
    """``async_push``'s parameters (lr, batch, staleness_power) and the heavy ball's."""

    momentum: float = field(0.9, check=nonneg, doc="mu, the heavy ball's weight on the last velocity")


@register("momentum_push", MomentumPushParams)
class MomentumPush(AsyncPushSGD):
    """``async_push``'s merge (what arrived, staleness-weighted), then the heavy-ball step; broadcast x."""

    pattern = Broadcast(tag="push")
    reads = frozenset({"lr", "batch", "momentum", "staleness_power"})
    extra_rows = ("velocity",)

    def update(self, b, p, g):
        v = b.rows["velocity"] * p.momentum + g
        b.rows["velocity"] = v
        b.x = b.x - p.lr * v
