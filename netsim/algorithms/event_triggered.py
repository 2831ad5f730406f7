"""Event-triggered decentralized SGD: D-PSGD that sends to a neighbour only when its trigger fires.

George & Gurram, "Distributed stochastic gradient descent with event-triggered communication"
(AAAI 2020): the triggering condition and the consensus update with the last received copies; SPARQ-SGD
(Singh et al., IEEE JSAIT 2021), Algorithm 1, uses the decaying threshold. Each activation:
    x_i <- W_ii x_i + sum_j W_ij xhat_j - gamma grad F_i(x_i)
with xhat_j the last value received from j (``comm.NeighborCopies``), then x_i goes to each
out-neighbour j with ||x_i - (what j last got)|| > tau_k (``comm.EventTrigger``). No barrier: an agent
never waits for messages that its neighbours' triggers may never send. ``trigger = "always"`` is the
same algorithm sending every round (the baseline for the saving reported in the summary). Written as a kernel
of the event-triggered pattern (rounds/triggered.py), so ``--engine windowed`` plays it as lookahead windows,
DP-SGD's releases and LAG included (LAG with DP-SGD's releases runs on the events engine).

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
from netsim.comm.triggers import Rule, TriggerKind
from netsim.rounds.kernel import GradientRequest
from netsim.rounds.triggered import Triggered, TriggeredKernel
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
class EventTriggered(TriggeredKernel):
    """After the mix with the neighbour copies: x <- x - gamma g, g the gradient at x as activated (DP-SGD's, LAG's
    reused one); sent where the trigger fires. The run's state holds each agent's (gradient last used, LAG's
    reference): ``used`` is False once its budget cap is reached (no more steps)."""

    pattern = Triggered(tag="model")
    reads = frozenset(f.name for f in attrs.fields(EventTriggeredParams))

    def init(self, agents, p):
        return {}

    def gradient(self, p, state, i):
        if p.lr > 0 and state.get(i, (None, None))[0] is not False:
            return GradientRequest.of(p.batch, p.clip if p.noise_multiplier > 0 else None)
        return None

    def trigger(self, p):
        return p.trigger, p.threshold, p.decay

    def refusal(self, sim, path):
        p = sim.params
        if p.lazy and p.noise_multiplier > 0:
            return ("lazy with noise_multiplier > 0: LAG's trigger decides from the gradient, in the windows' tensor "
                    "work, whether a release happens, whose ledger entry and row belong at the gradient's completion, "
                    "in their control — set algorithm.lazy = false or algorithm.noise_multiplier = 0")
        return None

    def noise(self, state, agent, p):
        if p.noise_multiplier <= 0:
            return None
        b = p.batch or len(agent.rows)
        sens = p.clip / b  # Abadi et al. Alg. 1: the mean of B per-example gradients clipped to C
        return p.noise_multiplier * sens, sens, min(1.0, b / len(agent.rows))

    def update(self, b, p, g):
        if p.lazy:
            self._lazy(b, p, g)
            return
        if p.noise_multiplier > 0:  # g~ = g + N(0, (z C / B)^2 I), each agent's release (Abadi et al. Alg. 1)
            sigma, sens, q = zip(*(self.noise(b.state, a, p) for a in b.agents), strict=True)
            g = b.privatize(g, sigma, sens, q, what="gradient")
            spent = b.refused(g)
            if spent:  # out of budget: no step now, and no gradient asked for from now on
                import torch

                for i in spent:
                    b.state[i] = (False, None)
                b.x = torch.stack([x if r is None else x - p.lr * r for x, r in zip(b.x.unbind(0), g, strict=True)])
                return
            g = b.stack(g)
        b.x = b.x - p.lr * g   # George & Gurram: x_i <- (the mix with the copies) - gamma g_i

    def _lazy(self, b, p, g):
        # each agent's own step: the gradient it releases (or reuses) at its own activation count, none out of budget
        import torch

        ks = [r - 1 for r in b.rounds()]  # the activations before this one (the program's k)
        used = [self._released(a, k, p, b.state, r) for a, k, r in zip(b.agents, ks, g.unbind(0), strict=True)]
        b.x = torch.stack([x if u is None else x - p.lr * u for x, u in zip(b.x.unbind(0), used, strict=True)])

    def _released(self, agent, k, p, state, g):
        """The gradient the step uses: LAG's last one when its change is below tau_k (nothing released), else the
        fresh one, released through ``Agent.privatize`` when private (None: the budget cap is reached)."""
        used, ref = state.get(agent.id, (None, None))
        if p.lazy and ref is not None:
            if p.trigger != "always":
                agent.decided_by_data()  # (a data-dependent decision in this activation)
            if not Rule(p.trigger, p.threshold, p.decay).fires(g, ref, k):
                return used
        ref = g
        noise = self.noise(state, agent, p)
        if noise is not None:
            sigma, sens, q = noise
            g = agent.privatize(g, sigma=sigma, sensitivity=sens, q=q, what="gradient")
        state[agent.id] = (False if g is None else g, ref)
        return g
