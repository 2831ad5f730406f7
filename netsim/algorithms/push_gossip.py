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
from netsim.comm.patterns import drain
from netsim.scenario.structure import at_least, field, nonneg


@attrs.frozen
class PushGossipParams:
    lr: float = field(0.1, check=nonneg, doc="step size gamma of the update")
    batch: int = field(0, check=at_least(0), doc="mini-batch size of the update (0 = all local data)")
    lr_decay: float = field(0.0, check=nonneg, doc="gamma_k = lr / (1 + lr_decay * k), k = updates so far")
    update: Literal["per_receipt", "per_round"] = field(
        "per_receipt", doc="one update after each merged model (the paper's MU rule), or one after a round's merges")


@register("push_gossip", PushGossipParams)
def push_gossip(agent, p: PushGossipParams):
    rng = agent.rng()
    neighbors = agent.neighbors
    updates = 0
    picks: list[int] = []  # peers drawn 256 at a time from the agent's own stream (one call, not 256)
    while True:
        yield agent.wake()
        got = drain(agent, "gossip")
        x = agent.params  # a copy: updated in place below (one small tensor op per step)
        if got:
            each = p.update == "per_receipt"
            for n, m in enumerate(got, 1):  # MU: merge each received model in turn, (x + x_j) / 2 ...
                x.add_(m.payload).mul_(0.5)
                if p.lr > 0 and (each or n == len(got)):  # ... then update (after each, or after the last)
                    g = yield agent.gradient(batch=p.batch, params=x)  # x is not written until g is back
                    x.sub_(g, alpha=p.lr / (1.0 + p.lr_decay * updates))
                    updates += 1
            agent.params = x
        if neighbors:  # x is never written again: it can travel as the payload without a copy
            if not picks:
                picks = rng.integers(len(neighbors), size=256).tolist()[::-1]
            agent.send(neighbors[picks.pop()], x, tag="gossip")
