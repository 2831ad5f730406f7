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

from netsim.algorithms.pdsl import DPGradientParams, check_setting, resolve_sigma
from netsim.algorithms.registry import register
from netsim.rounds import GradientRequest, SyncKernel, SyncRounds
from netsim.scenario.structure import field, positive
from netsim.sim.network import payload_size


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
class Muffliato(SyncKernel):
    """Round t of agent i: x^{t+1/2} = x_i^t - gamma (clip_C(g_i) + n_i) (its one release), then K_g barrier
    exchanges, each x <- sum_j W_ij x_j (or Chebyshev's recursion on it); the last one is x_i^{t+1}."""

    pattern = SyncRounds(tag="muff")
    reads = frozenset({"lr", "gossip_steps", "acceleration", "clip", "clip_mode", "calibration", "sigma", "epsilon",
                       "delta", "sigma_per_eps", "phi_min", "batch"})
    per_row = frozenset({"prev"})  # the previous gossip step's rows (``w``, Chebyshev's weight, is one for all)

    def init(self, agents, p):
        a = agents[0]  # sigma, K_g and lambda are the run's (the mixing matrix's), not an agent's
        return {"sigma": resolve_sigma(a, p), "K": p.gossip_steps or default_gossip_steps(a.spectral_gap),
                "lam": 1.0 - (a.spectral_gap or 0.0)}

    def exchanges(self, p, state):
        return state["K"]

    def any_round(self, p):
        return True                                               # gamma is constant: b.k is not read

    def payload_bytes(self, p, state, params):
        return payload_size(params)                               # x: a row of x, at every exchange

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch, p.clip) if p.clip_mode == "per_example" else GradientRequest.of(p.batch)

    def local(self, b, p):
        import torch
        batch_clip = p.clip_mode == "batch"                       # eqs. (10), (13): sensitivity 2C; else C/B
        g = b.clip(b.g, p.clip) if batch_clip else b.g
        sens = 2.0 * p.clip if batch_clip else p.clip / p.batch
        n = len(b)
        noisy = b.privatize(g, [b.state["sigma"]] * n, [sens] * n, [min(1.0, p.batch / len(a.rows)) for a in b.agents])
        if not b.refused(noisy):
            b.x = b.x - p.lr * b.stack(noisy)                     # x^{t+1/2}
        else:                                                     # an agent out of budget takes no step
            b.x = torch.stack([x if z is None else x - p.lr * z for x, z in zip(b.x, noisy, strict=True)])
        b.prev, b.w = b.x, 1.0
        b.send(b.x)

    def combine(self, b, p, got):
        wx = b.mix(b.x, got)                                      # one gossip step, a barrier
        if p.acceleration == "chebyshev" and b.s > 0:
            lam = b.state["lam"]
            b.w = 2.0 / (2.0 - lam ** 2) if b.s == 1 else 1.0 / (1.0 - lam ** 2 * b.w / 4.0)
            b.prev, b.x = b.x, b.w * (wx - b.prev) + b.prev
        else:
            b.prev, b.x = b.x, wx
        if b.s + 1 < b.state["K"]:
            b.send(b.x)
        else:
            b.set_params(b.x)

    def check(self, sim, p):
        check_setting(sim, p)  # undirected graph, every agent, before the run
