"""Event-triggered decentralized SGD: D-PSGD that sends to a neighbour only when its trigger fires.

George & Gurram, "Distributed stochastic gradient descent with event-triggered communication"
(AAAI 2020): the triggering condition and the consensus update with the last received copies; SPARQ-SGD
(Singh et al., IEEE JSAIT 2021), Algorithm 1, uses the decaying threshold. Each activation:
    x_i <- W_ii x_i + sum_j W_ij xhat_j - gamma grad F_i(x_i)
with xhat_j the last value received from j (``comm.NeighborCopies``), then x_i goes to each
out-neighbour j with ||x_i - (what j last got)|| > tau_k (``comm.EventTrigger``). No barrier: an agent
never waits for messages that its neighbours' triggers may never send. ``trigger = "always"`` is the
same algorithm sending every round (the baseline for the saving reported in the summary).
"""

from __future__ import annotations

import attrs

from netsim.algorithms.registry import register
from netsim.comm.patterns import NeighborCopies
from netsim.comm.triggers import EventTrigger, TriggerKind
from netsim.scenario.structure import at_least, field, nonneg, positive


@attrs.frozen
class EventTriggeredParams:
    lr: float = field(0.1, check=nonneg, doc="step size gamma")
    batch: int = field(32, check=at_least(0), doc="mini-batch size (0 = full local batch)")
    trigger: TriggerKind = field("absolute", doc="always | absolute | relative | decaying")
    threshold: float = field(0.01, check=nonneg, doc="tau (absolute), tau/||x|| (relative), tau_0 (decaying)")
    decay: float = field(0.99, check=positive, doc="decaying: tau_k = threshold * decay**k")


@register("event_triggered", EventTriggeredParams)
def event_triggered(agent, p: EventTriggeredParams):
    copies = NeighborCopies(agent)
    trig = EventTrigger(agent, kind=p.trigger, threshold=p.threshold, decay=p.decay)
    k = 0
    while True:
        yield agent.wake()
        x = agent.params
        g = None
        if p.lr > 0:
            g = yield agent.gradient(batch=p.batch, params=x)
        copies.absorb()
        x = copies.mix(x)
        if g is not None:
            x = x - p.lr * g
        agent.params = x
        yield trig.send(x, k)
        k += 1
