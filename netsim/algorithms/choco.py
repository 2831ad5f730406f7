"""CHOCO-SGD: decentralized SGD with compressed communication and public-copy memories.

Koloskova, Stich, Jaggi, "Decentralized Stochastic Optimization and Gossip Algorithms with
Compressed Communication" (ICML 2019), Algorithm 2 (CHOCO-SGD), built on CHOCO-GOSSIP (Algorithm 1):
    x_i^{t+1/2} = x_i^t - eta grad F_i(x_i^t)                         (a)
    q_i = Q(x_i^{t+1/2} - xhat_i)                                      (b)
    send q_i, receive q_j (synchronous round, ``comm.sync_round``)     (c)
    xhat_j += q_j for j in N_i and i                                   (d)
    x_i^{t+1} = x_i^{t+1/2} + gamma sum_j W_ij (xhat_j - xhat_i)       (e)
Messages are ``comm.Encoded`` payloads, so bandwidth and traces see the compressed size. A q_j lost
or late past ``round_timeout`` is never applied, so i's copy of xhat_j drifts from j's own: CHOCO
assumes reliable links (the summary's drop count tells how far from that a run was).
"""

from __future__ import annotations

import attrs

from netsim.algorithms.registry import register
from netsim.comm.compression import PUBLIC_COPIES, Compressor, CompressorKind, PublicCopyRows
from netsim.rounds import GradientRequest, SyncKernel, SyncRounds
from netsim.scenario.structure import at_least, field, fraction, nonneg, positive


@attrs.frozen
class ChocoParams:
    lr: float = field(0.1, check=nonneg, doc="step size eta")
    batch: int = field(32, check=at_least(0), doc="mini-batch size (0 = full local batch)")
    gamma: float = field(0.5, check=fraction,
                         doc="consensus step size gamma")
    compressor: CompressorKind = field("topk", doc="none | topk | randk | qsgd")
    ratio: float = field(0.1, check=fraction,
                         doc="fraction of coordinates kept (topk, randk)")
    unbiased: bool = field(False, doc="randk: scale by d/k")
    bits: int = field(4, check=lambda v: None if 1 <= v <= 16 else f"must be in [1, 16], got {v}",
                      doc="qsgd: level bits b (s = 2^b - 1 levels, plus a sign bit)")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for neighbours each round")


@register("choco", ChocoParams, fixed_topology=PUBLIC_COPIES)
class Choco(SyncKernel):
    """Steps (a)-(e) of every agent of a batch at once; the public copies of all agents are the run's state
    (``comm.PublicCopyRows``): each row is compressed by its agent's own compressor and stream."""

    pattern = SyncRounds(tag="model")
    reads = frozenset({"lr", "batch", "gamma", "compressor", "ratio", "unbiased", "bits"})
    per_row = frozenset({"half"})  # x^{k+1/2}, from ``local`` to ``combine``

    def init(self, agents, p):
        comps = [Compressor(p.compressor, p.ratio, p.unbiased, p.bits, rng=a.rng("compress")) for a in agents]
        return PublicCopyRows(agents, comps, p.gamma)

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch) if p.lr > 0 else None

    def any_round(self, p):
        return True                                                  # eta is constant: b.k is not read

    def local(self, b, p):
        b.half = b.x - p.lr * b.g if b.g is not None else b.x      # (a)
        q, sizes = b.state.delta(b.agents, b.half)                   # (b), (d) for the own copies
        b.send(q, sizes)                                             # (c): the q's travel decoded, sized encoded

    def combine(self, b, p, got):
        b.state.receive(b.agents, got)                               # (d)
        b.defer(b.state.consensus(b.agents, b.half))                 # (e)
