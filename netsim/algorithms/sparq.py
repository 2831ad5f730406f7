"""SPARQ-SGD: event-triggered and compressed decentralized SGD, run asynchronously.

Singh, Data, George, Diggavi, "SPARQ-SGD: Event-Triggered and Compressed Communication in
Decentralized Optimization" (IEEE JSAIT 2021), Algorithm 1. Each activation of agent i:
    (a) xhat_j += q_j for every q_j that arrived           (public copies, ``comm.PublicCopies``)
    (b) x_half = x_i - eta grad F_i(x_i)
    (c) if ||x_half - xhat_i|| > tau_k (``comm.EventTrigger``):
            q_i = C(x_half - xhat_i); xhat_i += q_i; send q_i to the out-neighbours
    (d) x_i = x_half + gamma sum_j W_ij (xhat_j - xhat_i)   (CHOCO's consensus step, Koloskova et al.)
Differences from the paper, as named choices: one local step per activation (its H = 1), and no
round barrier: copies are sums of the q's, so they agree whatever the arrival order, and an agent never
waits for a neighbour whose trigger stayed silent. A lost q makes i's copy of xhat_j drift (as in
CHOCO). The paper's threshold c_t eta_t^2 on the squared norm is ``trigger = "decaying"`` here.
The consensus step must be small for strong compression (CHOCO's gamma scales with the compression
quality delta): on a 4x4 torus with top-10% and gamma = 0.5 the agents drift apart exponentially,
with gamma = 0.1 they do not (measured; hence the default). Written as a kernel of the event-triggered deltas
pattern (rounds/triggered.py), so ``--engine windowed`` plays it as lookahead windows.
"""

from __future__ import annotations

import attrs

from netsim.algorithms.registry import register
from netsim.comm.compression import PUBLIC_COPIES, Compressor, CompressorKind, PublicCopyRows
from netsim.comm.triggers import TriggerKind
from netsim.rounds.kernel import GradientRequest
from netsim.rounds.triggered import DeltasKernel, TriggeredDeltas
from netsim.scenario.structure import at_least, field, fraction, nonneg, positive


@attrs.frozen
class SparqParams:
    lr: float = field(0.1, check=nonneg, doc="step size eta")
    batch: int = field(32, check=at_least(0), doc="mini-batch size (0 = full local batch)")
    gamma: float = field(0.1, check=fraction, doc="consensus step size gamma (small: see module doc)")
    compressor: CompressorKind = field("topk", doc="none | topk | randk | qsgd")
    ratio: float = field(0.1, check=fraction, doc="fraction of coordinates kept (topk, randk)")
    unbiased: bool = field(False, doc="randk: scale by d/k")
    bits: int = field(4, check=lambda v: None if 1 <= v <= 16 else f"must be in [1, 16], got {v}",
                      doc="qsgd: level bits b")
    trigger: TriggerKind = field("decaying", doc="always | absolute | relative | decaying")
    threshold: float = field(0.01, check=nonneg, doc="tau (absolute), tau/||xhat_i|| (relative), tau_0")
    decay: float = field(0.99, check=positive, doc="decaying: tau_k = threshold * decay**k")


@register("sparq", SparqParams, fixed_topology=PUBLIC_COPIES)
class Sparq(DeltasKernel):
    """Steps (a)-(d) as a kernel of the event-triggered deltas pattern (rounds/triggered.py, whose program reads
    like the steps): the copies are the run's ``PublicCopyRows``, (b) is ``update``."""

    pattern = TriggeredDeltas(tag="sparq")
    reads = frozenset(f.name for f in attrs.fields(SparqParams))

    def init(self, agents, p):
        comps = [Compressor(p.compressor, p.ratio, p.unbiased, p.bits, rng=a.rng("compress")) for a in agents]
        return PublicCopyRows(agents, comps, p.gamma)

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch) if p.lr > 0 else None

    def trigger(self, p):
        return p.trigger, p.threshold, p.decay

    def update(self, b, p, g):
        b.x = b.x - p.lr * g
