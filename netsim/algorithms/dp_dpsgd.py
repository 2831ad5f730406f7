"""DP-D-PSGD: D-PSGD whose local gradient is privatized by the DP-SGD recipe.

Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms?" (NeurIPS 2017),
Algorithm 1: x_i^{k+1} = sum_j W_ij x_j^k - gamma g~_i^k, with the stochastic gradient replaced by
Abadi et al., "Deep Learning with Differential Privacy" (CCS 2016), Algorithm 1: per-example
gradients clipped to norm C, averaged over the batch B, plus N(0, (z C / B)^2 I) noise.

The noisy gradient is the agent's only data-dependent release (``Agent.privatize``: ledger entry,
then noise from the agent's own generator); the models it broadcasts are post-processing. Sampling
rate q = B / |D_i| (rows are drawn with replacement; the Poisson-sampling analysis is the usual DP-SGD
approximation). Coordinate clipping to [-C, C] has L2 sensitivity C sqrt(d) per example. Once the
agent's budget cap is reached (privatize returns None) it stops taking gradient steps and only
gossips: mixing released models is post-processing.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs

from netsim.algorithms.registry import register
from netsim.scenario.structure import at_least, field, nonneg, positive


@attrs.frozen
class DPDPSGDParams:
    lr: float = field(0.1, check=positive, doc="step size gamma")
    batch: int = field(32, check=at_least(1), doc="mini-batch size B per agent")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for neighbours each round")
    clip: float = field(1.0, check=positive, doc="per-example clip bound C")
    clip_kind: Literal["l2", "coordinate"] = field("l2", doc="L2 norm clipping or coordinate-wise clamping")
    noise_multiplier: float = field(1.0, check=nonneg, doc="z: noise std on the batch mean is z C / B")
    lr_decay: float = field(0.0, check=nonneg, doc="gamma_k = lr / (1 + lr_decay * k)")


@register("dp_dpsgd", DPDPSGDParams)
def dp_dpsgd(agent, p: DPDPSGDParams):
    q = min(1.0, p.batch / len(agent.rows))
    spent = False
    k = 0
    while True:
        yield agent.wake()
        x = agent.params
        step = None
        if not spent:
            g = yield agent.gradient(batch=p.batch, params=x, clip=p.clip, clip_kind=p.clip_kind)
            per_example = p.clip if p.clip_kind == "l2" else p.clip * math.sqrt(g.numel())
            sens = per_example / p.batch
            step = agent.privatize(g, sigma=p.noise_multiplier * sens, sensitivity=sens, q=q, what="gradient")
            spent = step is None
        yield agent.broadcast(x, tag="model", round=k)              # x_i^k (post-processing)
        got = yield agent.gather(tag="model", round=k, timeout=p.round_timeout)
        mixed = agent.mix(x, got)
        lr = p.lr / (1.0 + p.lr_decay * k)
        agent.params = mixed if step is None else mixed - lr * step  # Lian et al. Alg. 1, line 6
        k += 1
