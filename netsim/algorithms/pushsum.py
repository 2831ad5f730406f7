"""Subgradient-push: push-sum consensus with local gradient steps, for directed graphs.

Nedic & Olshevsky, "Distributed optimization over time-varying directed graphs" (IEEE TAC 2015),
Section II, subgradient-push: w_i = sum_j x_j / d_j, y_i = sum_j y_j / d_j, z_i = w_i / y_i,
x_i = w_i - alpha g_i(z_i).
Push-sum itself is Kempe et al. (FOCS 2003), Algorithm 1; messages carry running sums so a dropped
message is recovered by the next one (Hadjicostis, Vaidya, Dominguez-Garcia, "Robust distributed average
consensus via exchange of running sums", IEEE TAC 2016, the running-sum iteration).
Activations are asynchronous (each agent on its own clock): it absorbs what arrived (sigma_j - rho_ij per
in-neighbour j, a message overtaken by a later one from the same sender ignored), steps, keeps the share
1/(d_i + 1) of (x_i, y_i) and adds one share per out-neighbour to its running sums (sigma_i), which it
broadcasts. The bank holds z_i, the de-biased estimate, which is what evaluation sees; sum_i x_i plus the
mass in flight is conserved exactly. Use a directed topology with ``mixing = "column_stochastic"``; lr = 0
is pure push-sum averaging. The weights y are floats decided by the messages' arrivals alone, so
``--engine windowed`` plays it as lookahead windows (rounds/broadcast.py). The topology must stay fixed (a
time-varying one is refused): a running sum can be differenced only by a neighbour that got every earlier one's
link, and the share is that of a fixed out-degree.
"""

from __future__ import annotations

import attrs

from netsim.algorithms.registry import register
from netsim.comm.patterns import RunningSumPayload, newer_sum
from netsim.rounds import GradientRequest
from netsim.rounds.broadcast import Broadcast, BroadcastKernel, Take
from netsim.scenario.structure import at_least, field, nonneg


@attrs.frozen
class PushSumParams:
    lr: float = field(0.1, check=nonneg, doc="step size alpha (0 = pure push-sum averaging)")
    batch: int = field(32, check=at_least(0), doc="mini-batch size (0 = full local batch)")


class Weights:
    """An agent's push-sum floats: its weight y, the running sum of weight it sent (sigma_y), its share
    1/(d + 1) and, per in-neighbour, the last running sum it absorbed (rho: round, payload, weight sum)."""

    def __init__(self, share: float):
        self.y = 1.0
        self.sigma_y = 0.0
        self.share = share
        self.rho: dict[int, tuple] = {}


@register("pushsum", PushSumParams, fixed_topology="sends each out-neighbour the running sum of every share it "
                                                   "sent, which only a neighbour that was one all along can take the "
                                                   "difference of, and keeps the share 1/(d + 1) of its out-degree d")
class SubgradientPush(BroadcastKernel):
    """x_i += sigma_j - rho_ij (y likewise) per newer running sum; z_i = x_i / y_i; x_i -= alpha g(z_i);
    the bank holds z_i; keep the share of (x_i, y_i), add the rest to the running sums and broadcast them."""

    pattern = Broadcast(tag="pushsum")
    reads = frozenset({"lr", "batch"})
    merge_first = True
    extra_rows = ("sigma",)  # the running sum of x sent
    keeps = True  # rho_ij: the last absorbed running sum of each in-neighbour

    def request(self, p):
        return GradientRequest.of(p.batch) if p.lr > 0 else None

    def start(self, agent, p):
        return Weights(1.0 / (len(agent.neighbors) + 1))

    def choose(self, own, agent, p, got):
        takes = []
        for m in got:
            last = newer_sum(own.rho, m.src, m.round, m.handle, m.scalar)
            if last is None:
                continue  # overtaken: a later running sum already counted this mass
            base, py = last
            own.y += m.scalar - py
            takes.append(Take(m.handle, 1.0, base))
        return takes

    def scalars(self, own):
        return own.y, own.share

    def pushed(self, own, agent, p):
        own.sigma_y += own.y * own.share
        own.y *= own.share
        return own.sigma_y

    def payload(self, row, scalar):
        return RunningSumPayload(row, scalar)

    def incoming(self, payload):
        return payload.x, payload.y

    def gradient_at(self, b, p):
        return self.params(b, p)

    def update(self, b, p, g):
        b.x.sub_(g, alpha=p.lr)

    def params(self, b, p):
        import torch

        return b.x / torch.tensor([y for y, _ in b.scalars], dtype=b.x.dtype, device=b.x.device).unsqueeze(1)

    def push(self, b, p):
        import torch

        by: dict[float, list[int]] = {}
        for n, (_, s) in enumerate(b.scalars):
            by.setdefault(s, []).append(n)
        sigma, x = b.rows["sigma"], b.x
        for s, ns in by.items():
            if len(ns) == len(b):
                sigma.add_(x, alpha=s)
                x.mul_(s)
            else:
                idx = torch.tensor(ns, device=x.device)
                sigma.index_copy_(0, idx, sigma.index_select(0, idx).add_(x.index_select(0, idx), alpha=s))
                x.index_copy_(0, idx, x.index_select(0, idx).mul_(s))
        return sigma.clone()
