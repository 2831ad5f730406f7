"""D-PSGD in synchronous rounds.

Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms?" (NeurIPS 2017),
Algorithm 1: x_i^{k+1} = sum_j W_ij x_j^k - gamma * grad F_i(x_i^k; xi_i^k).

netsim runs it over a real network: the round's exchange is a neighbour barrier with a timeout, so a
dropped or late message costs the timeout and its weight stays on the agent's own model
(``Agent.mix``); a late message of a past round is discarded as stale.
"""

from __future__ import annotations

import attrs

from netsim.algorithms.registry import register
from netsim.rounds import GradientRequest, SyncRounds
from netsim.rounds.sync import MixStepKernel
from netsim.scenario.structure import at_least, field, nonneg, positive
from netsim.sim.network import payload_size


@attrs.frozen
class DPSGDParams:
    lr: float = field(0.1, check=nonneg, doc="step size gamma (0 = pure gossip averaging)")
    batch: int = field(32, check=at_least(0), doc="mini-batch size per agent (0 = full local batch)")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for neighbours each round")
    lr_decay: float = field(0.0, check=lambda v: None if v >= 0 else "must be >= 0",
                            doc="gamma_k = lr / (1 + lr_decay * k)")


@register("dpsgd", DPSGDParams)
class DPSGD(MixStepKernel):
    """Round k of every agent i: send x_i^k, then x_i^{k+1} = sum_j W_ij x_j^k - gamma_k grad F_i(x_i^k; xi_i^k)
    (Algorithm 1, line 6: the mix-and-step round of ``MixStepKernel``)."""

    pattern = SyncRounds(tag="model")
    reads = frozenset({"lr", "batch", "lr_decay"})

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch)                              # grad F_i(x_i^k), batched

    def payload_bytes(self, p, state, params):
        return payload_size(params)                                  # x_i^k: a row of x

    def any_round(self, p):
        return not p.lr_decay                                         # gamma_k = lr: k is not read

    def step_size(self, p, k):
        return p.lr / (1.0 + p.lr_decay * k) if p.lr_decay else p.lr  # gamma_k (lr / 1.0 == lr: the same bits)
