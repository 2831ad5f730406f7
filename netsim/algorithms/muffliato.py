"""MUFFLIATO: noisy local step, then K_g gossip rounds (a baseline of PDSL; "noise then gossip").

Cyffers, Even, Bellet, Massoulie, "Muffliato: Peer-to-Peer Privacy Amplification for Decentralized
Optimization and Averaging" (NeurIPS 2022), Algorithm 2 (private decentralized GD) with PDSL's
DP recipe (Wang, Yuan, Wang, Li, "PDSL"): x_i^{t+1/2} = x_i^t - gamma (clip_C(g_i) + n_i), n_i ~ N(0, sigma^2 I), then
K_g synchronous gossip rounds on x^{t+1/2}: plain x <- W x, or Chebyshev acceleration (Algorithm 1's
polynomial P_K(W)) by the recursion x^{k+1} = w_{k+1} (W x^k - x^{k-1}) + x^{k-1}, w_1 = 1,
w_2 = 2 / (2 - lambda^2), w_{k+1} = 1 / (1 - lambda^2 w_k / 4), lambda = |lambda_2(W)| (the recursion
as we read Algorithm 1; to be verified against the paper). Default K_g = ceil(1 / sqrt(1 - lambda)): 3 on the 10-ring.
The paper's privacy notion (pairwise network DP) is not what the ledger records: the ledger counts
each noisy gradient as a public release, as PDSL's comparison does.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs

from netsim.algorithms.pdsl import (
    DPGradientParams,
    check_setting,
    release_gradient,
    request_gradient,
    resolve_sigma,
)
from netsim.algorithms.registry import register
from netsim.scenario.structure import field, positive


@attrs.frozen
class MuffliatoParams(DPGradientParams):
    lr: float = field(0.001, check=positive, doc="gamma")
    gossip_steps: int | None = field(None, check=lambda v: None if v is None or v >= 1 else "must be >= 1",
                                     doc="K_g (default ceil(1 / sqrt(1 - lambda_2)))")
    acceleration: Literal["none", "chebyshev"] = field("none", doc="plain W^K or Chebyshev P_K(W)")
    round_timeout: float = field(1.0, check=positive, doc="seconds each gossip step waits for neighbours")


def default_gossip_steps(gap: float | None) -> int:
    """ceil(1 / sqrt(1 - lambda)) with gap = 1 - lambda."""
    return max(1, math.ceil(1.0 / math.sqrt(gap))) if gap else 1


@register("muffliato", MuffliatoParams)
def muffliato(agent, p: MuffliatoParams):
    sigma = resolve_sigma(agent, p)
    K = p.gossip_steps or default_gossip_steps(agent.spectral_gap)
    lam = 1.0 - (agent.spectral_gap or 0.0)
    k = 0
    while True:
        yield agent.wake()
        x = agent.params
        g = yield request_gradient(agent, p, x, agent.sample_rows(p.batch))
        noisy = release_gradient(agent, p, g, sigma, what="gradient")
        if noisy is not None:
            x = x - p.lr * noisy                                  # x^{t+1/2}
        prev, w = x, 1.0
        for s in range(K):                                        # K_g gossip steps, each a barrier
            yield agent.broadcast(x, tag="muff", round=k * K + s)
            got = yield agent.gather(tag="muff", round=k * K + s, timeout=p.round_timeout)
            wx = agent.mix(x, got)
            if p.acceleration == "chebyshev" and s > 0:
                w = 2.0 / (2.0 - lam ** 2) if s == 1 else 1.0 / (1.0 - lam ** 2 * w / 4.0)
                prev, x = x, w * (wx - prev) + prev
            else:
                prev, x = x, wx
        agent.params = x
        k += 1


muffliato.check = check_setting  # undirected graph, every agent, before the run
