"""Asynchronous randomized pairwise gossip averaging with local SGD.

Boyd et al., "Randomized Gossip Algorithms" (IEEE Trans. Inf. Theory 2006), eq. (5): when i wakes
it picks a neighbour j and both set x_i = x_j = (x_i + x_j)/2; here each activation first takes a
local SGD step (as in AD-PSGD, Lian et al. 2018, Algorithm 1). The exchange crosses the network:
i sends x_i ("pull"); j replies with the x_j it had and averages; i averages on the reply. A lost
request or reply leaves i unchanged after ``reply_timeout`` (j may already have averaged: that is
what a lossy network does to pairwise gossip). i applies the *change* j made, (x_j - x_i_sent)/2,
so the sum of models is conserved even when i served other requests while waiting. Written as a kernel of the
pairwise pattern (rounds/pairwise.py), so ``--engine windowed`` plays it as lookahead windows.
"""

from __future__ import annotations

import attrs

from netsim.algorithms.registry import register
from netsim.rounds.kernel import GradientRequest
from netsim.rounds.pairwise import Pairwise, PairwiseKernel
from netsim.scenario.structure import at_least, field, nonneg, positive


@attrs.frozen
class GossipParams:
    lr: float = field(0.1, check=nonneg, doc="local SGD step size (0 = pure gossip averaging)")
    batch: int = field(32, check=at_least(0), doc="mini-batch size (0 = full local batch)")
    reply_timeout: float = field(1.0, check=positive, doc="seconds to wait for the neighbour's reply")


@register("gossip", GossipParams)
class Gossip(PairwiseKernel):
    """A local SGD step, then the exchange (``step_first``), as a kernel of the pairwise pattern without the lock:
    an agent waiting for its reply still serves others; the delta form keeps the sum exact."""

    pattern = Pairwise(tags=("pull", "push"))
    reads = frozenset({"lr", "batch", "reply_timeout"})
    step_first = True

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch) if p.lr > 0 else None

    def exchange(self, p):
        return p.reply_timeout, False

    def update(self, b, p, g):
        b.x = b.x - p.lr * g
