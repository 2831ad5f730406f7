"""A round-kernel plugin: gradient tracking, which both engines run from this one definition.

DIGing (Nedić, Olshevsky, Shi, "Achieving Geometric Convergence for Distributed Optimization over
Time-Varying Graphs", SIAM J. Optim. 27(4), 2017, Algorithm (3)-(4) with a fixed graph):
    x_i^{k+1} = sum_j W_ij x_j^k - alpha y_i^k
    y_i^{k+1} = sum_j W_ij y_j^k + grad f_i(x_i^{k+1}) - grad f_i(x_i^k),   y_i^0 = grad f_i(x_i^0)
Each agent tracks the network's average gradient in y_i, so with full local gradients (``batch = 0``) the
agents converge to the exact minimiser with a constant step (D-PSGD only to a neighbourhood of it).

In round k an agent takes grad f_i(x_i^k), finishes y_i^k = (its mixed y) + g^k - g^{k-1}, and sends x_i^k
and y_i^k together; ``combine`` mixes both. The trackers live in the parameter bank (``shared_state``), so
checkpoints keep them. Written as a ``RoundKernel``, it runs on the events engine and, with no other code,
on ``--engine windowed``:

    netsim run scenarios/quickstart.toml --plugin examples/plugins/gradient_tracking.py \\
        --set algorithm.name=gradient_tracking --set algorithm.lr=0.5 --engine windowed --out runs/tracking
"""

from __future__ import annotations

import attrs
import torch

from netsim.algorithms.registry import register
from netsim.rounds import GradientRequest, SyncKernel, SyncRounds
from netsim.scenario.structure import at_least, field, positive


@attrs.frozen
class TrackingParams:
    lr: float = field(0.1, check=positive, doc="step size alpha")
    batch: int = field(0, check=at_least(0), doc="mini-batch size (0 = all local data: exact convergence)")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for neighbours each round")


@register("gradient_tracking", TrackingParams)
class GradientTracking(SyncKernel):
    """DIGing's two mixing steps, one round of messages carrying (x_i^k, y_i^k)."""

    pattern = SyncRounds(tag="model")
    reads = frozenset({"lr", "batch"})
    per_row = frozenset({"y"})  # y_i^k, from ``local`` to ``combine``

    def init(self, agents, p):
        a = agents[0]  # sum_j W_ij y_j^{k-1} and g^{k-1} of every agent, kept in the bank
        return a.shared_state("tracking.mixed_y"), a.shared_state("tracking.last_g")

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch)

    def local(self, b, p):
        mixed_y, last_g = b.state
        idx = b.index()
        b.y = mixed_y.index_select(0, idx) + b.g - last_g.index_select(0, idx)  # y_i^k
        last_g.index_copy_(0, idx, b.g)
        b.send(torch.cat([b.x, b.y], dim=1))                                     # (x_i^k, y_i^k)

    def combine(self, b, p, got):
        d = b.x.shape[1]
        xs = [{j: m[:d] for j, m in g.items()} for g in got]
        ys = [{j: m[d:] for j, m in g.items()} for g in got]
        b.mix_into_params(b.x, xs, step=b.y, lr=p.lr)                           # x_i^{k+1}
        b.state[0].index_copy_(0, b.index(), b.mix(b.y, ys))                     # sum_j W_ij y_j^k
