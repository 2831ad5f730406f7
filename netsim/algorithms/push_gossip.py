"""Gossip learning: push one's model to one random neighbour each round; merge and update on each receipt.

Ormándi, Hegedűs, Jelasity, "Gossip learning with linear models on fully distributed data"
(Concurrency and Computation 25(4), 2013), Algorithm 1 (the gossip skeleton: every Delta, send the
current model to a random peer; on receipt, create a new model from the received one and the last
one) with the MU ("merge then update") model-creation rule: x <- (x + x_received)/2, then one SGD step
x <- x - gamma grad F_i(x) on local data. This is gossipy's CreateModelMode.MERGE_UPDATE.

In netsim the receipt side runs at the next round's activation, so the gradients of all agents are
evaluated in batched calls: the models that arrived since the last round are taken one by one in arrival
order, each merged and then (``update = "per_receipt"``, the paper's rule) followed by one update, as
successive receipts would be; then the model is pushed. ``update = "per_round"`` takes a single update
after all the round's merges instead (fewer gradients; not the paper's rule). Gossip learning never
updates without a receipt. A lost message costs its receiver that merge and update; nothing waits, so
there are no timeouts.
"""

from __future__ import annotations

from typing import Literal

import attrs

from netsim.algorithms.registry import register
from netsim.rounds import GradientRequest
from netsim.rounds.push import PushGossip, PushKernel
from netsim.scenario.structure import at_least, field, nonneg


@attrs.frozen
class PushGossipParams:
    lr: float = field(0.1, check=nonneg, doc="step size gamma of the update")
    batch: int = field(0, check=at_least(0), doc="mini-batch size of the update (0 = all local data)")
    lr_decay: float = field(0.0, check=nonneg, doc="gamma_k = lr / (1 + lr_decay * k), k = updates so far")
    update: Literal["per_receipt", "per_round"] = field(
        "per_receipt", doc="one update after each merged model (the paper's MU rule), or one after a round's merges")


@register("push_gossip", PushGossipParams)
class GossipLearning(PushKernel):
    """Each receipt: x <- (x + x_received) / 2, then (per receipt, or after the round's last) x <- x - gamma_k
    grad F_i(x), k = the agent's updates so far; then push x to one random neighbour."""

    pattern = PushGossip(tag="gossip")
    reads = frozenset({"lr", "batch", "lr_decay", "update"})

    def init(self, agents, p):
        return [0] * len(agents)  # updates so far, per agent

    def combine(self, b, p, received):
        b.x.add_(received).mul_(0.5)                                 # MU: merge ...

    def update_after(self, p, n, received):
        if p.lr > 0 and (p.update == "per_receipt" or n == received):
            return GradientRequest.of(p.batch)                          # ... then update
        return None

    def update(self, b, p, g):
        updates, ids = b.state, b.ids
        if p.lr_decay:
            b.step(g, [p.lr / (1.0 + p.lr_decay * updates[i]) for i in ids])
        else:  # gamma_k = lr for every k (lr / 1.0 == lr: the same bits)
            b.step(g, [p.lr] * len(ids))
        for i in ids:
            updates[i] += 1
