"""Asynchronous push gossip SGD: no barrier; send and go on, merge whatever has arrived.

The D-PSGD update (Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms?",
NeurIPS 2017, Algorithm 1, the update step) with the neighbours' latest values
instead of the round's: x_i <- sum_j W_ij xhat_j - gamma grad F_i(x_i), where xhat_j is the latest value
that arrived from j since i's last activation (its weight stays on x_i if none did), optionally
down-weighted by its staleness (FedAsync's polynomial staleness, Xie, Koyejo, Gupta 2019, "Asynchronous
Federated Optimization", the staleness function s(t - tau) = (t - tau + 1)^-a).

Each activation: the gradient at x_i as activated; once it is back, the merge of what arrived by then
(x_i + sum_j w'_ij (xhat_j - x_i), senders in increasing order, w'_ij = W_ij (1 + s)^-a, s = i's round - 1 -
the round j pushed in, clipped at 0), the step, and the result broadcast to every out-neighbour. Written as a
kernel of the broadcast pattern (rounds/broadcast.py), so ``--engine windowed`` plays it as lookahead windows.
"""

from __future__ import annotations

import attrs

from netsim.algorithms.registry import register
from netsim.comm.patterns import latest_by_sender, staleness_weights
from netsim.rounds import GradientRequest
from netsim.rounds.broadcast import OWN, Broadcast, BroadcastKernel, Take
from netsim.scenario.structure import at_least, field, nonneg


@attrs.frozen
class AsyncPushParams:
    lr: float = field(0.1, check=nonneg, doc="step size gamma")
    batch: int = field(32, check=at_least(0), doc="mini-batch size (0 = full local batch)")
    staleness_power: float = field(0.0, check=nonneg,
                                   doc="a in w_ij (1 + staleness)^-a; 0 = plain mixing weights")


@register("async_push", AsyncPushParams)
class AsyncPushSGD(BroadcastKernel):
    """x <- x + sum_j W_ij (1 + s_j)^-a (xhat_j - x) over the latest value from each sender, then x <- x - gamma g
    with g the gradient at x as activated; broadcast x."""

    pattern = Broadcast(tag="push")
    reads = frozenset({"lr", "batch", "staleness_power"})

    def request(self, p):
        return GradientRequest.of(p.batch) if p.lr > 0 else None

    def choose(self, own, agent, p, got):
        return [Take(m.handle, w, OWN) for m, w in staleness_weights(agent, latest_by_sender(got), p.staleness_power)]

    def update(self, b, p, g):
        b.x = b.x - p.lr * g
