"""A plugin event kind: each agent's disagreement with its neighbours, recorded in the trace.

D-PSGD (Lian, Zhang, Zhang, Hsieh, Zhang, Liu, "Can Decentralized Algorithms Outperform Centralized
Algorithms? A Case Study for Decentralized Parallel Stochastic Gradient Descent", NeurIPS 2017,
Algorithm 1: x_i <- sum_j W_ij x_j - gamma grad F_i(x_i)) whose agents also record, every round, the
quantity its analysis bounds (the consensus error of Theorem 1): ``value`` = ||x_i - xbar_i||_2, with
xbar_i = sum_j W_ij x_j the mixed model of the round. The record is a new event kind, ``disagreement``:
a frozen attrs ``EventRow`` registered with ``register_event_kind``, so it lands in the trace's one table
(``round`` = the round, ``size`` = how many neighbours' models arrived) like every core event.

    netsim run scenarios/quickstart.toml --plugin examples/plugins/disagreement_event.py \
        --set algorithm.name=dpsgd_disagreement --out runs/disagreement
    netsim timeline runs/disagreement --plugin examples/plugins/disagreement_event.py --kinds disagreement,send
"""

from __future__ import annotations

import attrs

from netsim.algorithms.dpsgd import DPSGDParams
from netsim.algorithms.registry import register
from netsim.comm.patterns import sync_round
from netsim.trace.events import EventRow, register_event_kind


@register_event_kind
@attrs.frozen(slots=True)
class Disagreement(EventRow):
    """Agent ``agent``'s distance to its mixed model in round ``round`` (``size``: models received)."""

    kind = "disagreement"
    glyph = ("d", "yellow", "disagreement")  # how `netsim timeline --plugin THIS_FILE` draws it
    t: float
    agent: int
    round: int
    size: int
    value: float


@register("dpsgd_disagreement", DPSGDParams)
def dpsgd_disagreement(agent, p: DPSGDParams):
    k = 0
    while True:
        yield agent.wake()
        x = agent.params
        g = yield agent.gradient(batch=p.batch, params=x)
        got = yield from sync_round(agent, x, k, timeout=p.round_timeout)
        mixed = agent.mix(x, got)
        agent.emit(Disagreement(agent.env.now, agent.id, k, len(got), float((x - mixed).norm())))
        agent.params = mixed - p.lr / (1.0 + p.lr_decay * k) * g
        k += 1
