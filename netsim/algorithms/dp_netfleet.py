"""DP-NET-FLEET [reconstructed]: local steps with a recursive gradient estimator and tracking.

Zhang et al., "NET-FLEET: Achieving Linear Convergence Speedup for Fully Decentralized Federated
Learning with Heterogeneous Data" (MobiHoc 2022, arXiv:2208.08490). RECONSTRUCTED from a
description of the method as PDSL's baseline, not verified against the original paper. Round t of agent i:

  1  exchange (x_i, v_i); x <- sum_j w_ij x_j, v <- sum_j w_ij v_j                (consensus, tracking)
  2  xi <- a fresh mini-batch; g^0 = DP grad F_i(x; xi); v^0 = v + g^0 - g_prev    (tracking correction)
  3  for k = 0..K-1: x^{k+1} = x^k - eta v^k; g^{k+1} = DP grad F_i(x^{k+1}; xi);
                     v^{k+1} = v^k + g^{k+1} - g^k                               (recursive, same xi)
  4  keep x = x^K, v = v^K, g_prev = g^K

DP: every stochastic-gradient evaluation is clipped to C and noised with N(0, sigma^2 I)
before it enters v (one ledger release each, K + 1 per round); x and v are post-processing.
Defaults K = 5 and eta = gamma.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from netsim.algorithms.pdsl import (
    DPGradientParams,
    check_setting,
    release_gradient,
    request_gradient,
    resolve_sigma,
)
from netsim.algorithms.registry import register
from netsim.scenario.structure import at_least, field, positive

if TYPE_CHECKING:
    import torch


@attrs.frozen
class DPNetFleetParams(DPGradientParams):
    lr: float = field(0.001, check=positive, doc="eta: local step size")
    local_steps: int = field(5, check=at_least(1), doc="K local recursive steps per round")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for neighbours")


@register("dp_netfleet", DPNetFleetParams, check=check_setting)  # undirected graph, before the run
def dp_netfleet(agent, p: DPNetFleetParams):
    import torch
    i = agent.id
    sigma = resolve_sigma(agent, p)
    v_all = agent.shared_state("netfleet.v")
    gprev_all = agent.shared_state("netfleet.gprev")
    k = 0
    while True:
        yield agent.wake()
        x, v = agent.params, v_all[i].clone()
        yield agent.broadcast(torch.stack([x, v]), tag="fleet", round=k)
        got = yield agent.gather(tag="fleet", round=k, timeout=p.round_timeout)
        x = agent.mix(x, {j: m[0] for j, m in got.items()})
        v = agent.mix(v, {j: m[1] for j, m in got.items()})
        xi = agent.sample_rows(p.batch)
        g = yield from _dp_grad(agent, p, x, xi, sigma)
        if g is not None:
            v = v + g - gprev_all[i]
            for _ in range(p.local_steps):
                x = x - p.lr * v
                g_next = yield from _dp_grad(agent, p, x, xi, sigma)
                if g_next is None:
                    break
                v, g = v + g_next - g, g_next
            gprev_all[i] = g
        v_all[i] = v
        agent.params = x
        k += 1



def _dp_grad(agent, p: DPNetFleetParams, x: torch.Tensor, xi, sigma: float):
    g = yield request_gradient(agent, p, x, xi)
    return release_gradient(agent, p, g, sigma, what="gradient")
