"""A round-kernel plugin: D-PSGD with heavy-ball momentum, the shortest kernel that keeps per-agent state.

Each round (Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms?", NeurIPS 2017,
Algorithm 1, line 6, with the gradient replaced by Polyak's heavy-ball velocity: "Some methods of speeding up the
convergence of iteration methods", USSR Comput. Math. Math. Phys. 4(5), 1964, eq. (9)):

    v_i^{k+1} = mu v_i^k + grad F_i(x_i^k)                  (v_i^0 = 0)
    x_i^{k+1} = sum_j W_ij x_j^k - gamma v_i^{k+1}

``mu = 0`` is ``dpsgd`` (without its step decay) bit for bit. The velocities are rows of the parameter bank
(``shared_state``), so checkpoints keep them; ``local`` hands each agent's new velocity to ``combine`` on the batch
(``b.v``, declared ``per_row``). Both engines run this one definition, byte-identical:

    netsim run scenarios/dpsgd_scale.toml --plugin examples/plugins/heavy_ball.py \\
        --set 'algorithm={name="heavy_ball", momentum=0.9}' --engine windowed --out runs/heavy_ball
    netsim check heavy_ball --plugin examples/plugins/heavy_ball.py
"""

from __future__ import annotations

import attrs

from netsim.algorithms.registry import register
from netsim.rounds import GradientRequest, SyncKernel, SyncRounds
from netsim.scenario.structure import at_least, field, nonneg, positive


@attrs.frozen
class HeavyBallParams:
    lr: float = field(0.1, check=positive, doc="step size gamma")
    momentum: float = field(0.9, check=nonneg, doc="mu, the velocity's decay (0: D-PSGD)")
    batch: int = field(32, check=at_least(0), doc="mini-batch size (0 = all local data)")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for neighbours each round")


@register("heavy_ball", HeavyBallParams)
class HeavyBall(SyncKernel):
    """D-PSGD whose local step is the heavy ball's velocity."""

    pattern = SyncRounds(tag="model")
    reads = frozenset({"lr", "momentum", "batch"})
    per_row = frozenset({"v"})  # each agent's new velocity, from ``local`` to ``combine``

    def init(self, agents, p):
        return agents[0].shared_state("heavy_ball.velocity")  # v_i of every agent, a row of the bank each

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch)

    def local(self, b, p):
        idx = b.index()                                                  # the batch's rows of the bank state
        b.v = b.state.index_select(0, idx) * p.momentum + b.g            # v_i^{k+1}
        b.state.index_copy_(0, idx, b.v)
        b.send(b.x)                                                      # x_i^k to the out-neighbours

    def combine(self, b, p, got):
        b.mix_into_params(b.x, got, step=b.v, lr=p.lr)                   # x_i^{k+1}
