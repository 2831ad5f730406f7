"""Event-triggered decentralized SGD: D-PSGD that sends to a neighbour only when its trigger fires.

George & Gurram, "Distributed stochastic gradient descent with event-triggered communication"
(AAAI 2020): the triggering condition and the consensus update with the last received copies; SPARQ-SGD
(Singh et al., IEEE JSAIT 2021), Algorithm 1, uses the decaying threshold. Each activation:
    x_i <- W_ii x_i + sum_j W_ij xhat_j - gamma grad F_i(x_i)
with xhat_j the last value received from j (``comm.NeighborCopies``), then x_i goes to each
out-neighbour j with ||x_i - (what j last got)|| > tau_k (``comm.EventTrigger``). No barrier: an agent
never waits for messages that its neighbours' triggers may never send. ``trigger = "always"`` is the
same algorithm sending every round (the baseline for the saving reported in the summary).

Privacy (``noise_multiplier > 0``): the local gradient is the DP-SGD one (Abadi et al., "Deep Learning with
Differential Privacy", CCS 2016, Alg. 1: per-example clipping to ``clip``, Gaussian noise of std z C / B),
released through ``Agent.privatize`` every activation; the model trigger then reads only values computed
from released gradients (post-processing), so the composed epsilon is a guarantee.
``lazy = true`` applies the trigger to the gradient too, as in LAG (Chen, Giannakis, Sun, Yin, "LAG: Lazily
Aggregated Gradient for Communication-Efficient Distributed Learning", NeurIPS 2018): a fresh gradient is
used, and released, only when ||g - g_last|| > tau_k, otherwise the last one is reused. That decision
reads the raw gradient, so which releases happen depends on the data: netsim marks them
(``comm/triggers.py``) and ``netsim privacy`` reports that run's epsilon as not a guarantee.
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
    noise_multiplier: float = field(0.0, check=nonneg,
                                    doc="z > 0: DP-SGD gradients, noise std z C / B on the batch mean (0: no DP)")
    clip: float = field(1.0, check=positive, doc="per-example L2 clip bound C (with noise_multiplier > 0)")
    lazy: bool = field(False, doc="LAG: a fresh gradient only when the trigger fires on its change")


@register("event_triggered", EventTriggeredParams)
def event_triggered(agent, p: EventTriggeredParams):
    copies = NeighborCopies(agent)
    trig = EventTrigger(agent, kind=p.trigger, threshold=p.threshold, decay=p.decay)
    gtrig = EventTrigger(agent, kind=p.trigger, threshold=p.threshold, decay=p.decay, initial={}) \
        if p.lazy else None
    private = p.noise_multiplier > 0
    b = p.batch or len(agent.rows)
    q = min(1.0, b / len(agent.rows))
    sens = p.clip / b
    used = None  # the gradient last used (released, when private); False once the budget cap is reached
    ref = None  # LAG: the raw gradient of the last fresh step, which the trigger compares with
    k = 0
    while True:
        yield agent.wake()
        x = agent.params
        g = None
        if p.lr > 0 and used is not False:
            g = yield agent.gradient(batch=p.batch, params=x, clip=p.clip if private else None)
            if gtrig is not None and ref is not None and not gtrig.fires(g, ref, k):
                g = used  # LAG: the change is below tau_k, reuse the last gradient (nothing released)
            else:
                ref = g
                if private:
                    g = agent.privatize(g, sigma=p.noise_multiplier * sens, sensitivity=sens, q=q,
                                        what="gradient")
                used = False if g is None else g  # None: the budget cap is reached, no more steps
        copies.absorb()
        x = copies.mix(x)
        if g is not None:
            x = x - p.lr * g
        agent.params = x
        yield trig.send(x, k)
        k += 1
