"""DP-D-PSGD: D-PSGD whose local gradient is privatized before the step.

Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms?" (NeurIPS 2017),
Algorithm 1: x_i^{k+1} = sum_j W_ij x_j^k - gamma g~_i^k, with the stochastic gradient g~_i^k replaced
by a clipped, noised one. Two clippings (``clip_mode``):

- ``per_example`` (default): Abadi et al., "Deep Learning with Differential Privacy" (CCS 2016),
  Algorithm 1: per-example gradients clipped to norm C, averaged over the batch B, plus Gaussian
  noise; L2 sensitivity C / B (add or remove one example).
- ``batch``: the mini-batch mean gradient clipped as ONE vector to norm C, plus N(0, sigma^2 I):
  x_i <- sum_j w_ij x_j - gamma (clip_C(grad F_i(x_i; xi)) + n_i). This is the DP-DPSGD baseline
  of Wang, Yuan, Wang, Li, "PDSL: Privacy-preserved decentralized stochastic learning with
  heterogeneous data distribution" (the clipping of their eqs. (10), (13)); sensitivity 2C (the
  clipped vectors of two neighbouring batches both lie in the C-ball).

Coordinate clipping (``clip_kind = "coordinate"``, to [-C, C]) multiplies either sensitivity by
sqrt(d). The noise is set by exactly one of (default: ``noise_multiplier`` = 1):

- ``noise_multiplier`` z: noise std = z x sensitivity;
- ``sigma``: the noise std per coordinate itself (e.g. the PDSL paper's baselines: one sigma shared
  by every method);
- ``epsilon``: a target epsilon(delta) for the agent's whole run: z is calibrated by
  ``netsim.privacy.calibration.noise_multiplier`` on the schedule [(q, T)] (T releases, each a
  Poisson-subsampled Gaussian with q = B / |D_i|), the same composition the ledger's accountant
  reports, so a run that releases T times ends at epsilon(delta) <= the target.

The noisy gradient is the agent's only data-dependent release (``Agent.privatize``: ledger entry,
then noise from the agent's own generator); the models it broadcasts are post-processing. Sampling
rate q = B / |D_i| (rows are drawn with replacement; the Poisson-sampling analysis is the usual DP-SGD
approximation). Once the agent's budget cap is reached (privatize returns None) it stops taking
gradient steps and only gossips: mixing released models is post-processing.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import attrs

from netsim.algorithms.registry import register
from netsim.errors import InputError
from netsim.rounds import GradientRequest, SyncKernel, SyncRounds
from netsim.scenario.structure import at_least, field, nonneg, positive
from netsim.sim.network import payload_size


def _opt_nonneg(v: float | None) -> str | None:
    return None if v is None or v >= 0 else "must be >= 0"


def _opt_pos(v: float | None) -> str | None:
    return None if v is None or v > 0 else "must be > 0"


@attrs.frozen
class DPDPSGDParams:
    lr: float = field(0.1, check=positive, doc="step size gamma")
    batch: int = field(32, check=at_least(1), doc="mini-batch size B per agent")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for neighbours each round")
    clip: float = field(1.0, check=positive, doc="clip bound C")
    clip_kind: Literal["l2", "coordinate"] = field("l2", doc="L2 norm clipping or coordinate-wise clamping")
    clip_mode: Literal["per_example", "batch"] = field(
        "per_example", doc="per_example: mean of per-example clipped gradients (Abadi et al., sensitivity "
                           "C/B); batch: the mini-batch mean gradient clipped as one vector (sensitivity 2C)")
    noise_multiplier: float | None = field(
        None, check=_opt_nonneg, doc="z: noise std = z x sensitivity (default 1 when neither sigma nor "
                                     "epsilon is given)")
    sigma: float | None = field(None, check=_opt_nonneg, doc="noise std per coordinate, given directly")
    epsilon: float | None = field(None, check=_opt_pos,
                                  doc="target epsilon(delta) over the run: z calibrated by the accountant")
    delta: float | None = field(None, check=lambda v: None if v is None or 0 < v < 1 else "must be in (0, 1)",
                                doc="delta of the epsilon target (default: privacy.delta)")
    accountant: Literal["rdp", "pld"] = field("rdp", doc="accountant the epsilon target is calibrated with")
    rounds: int | None = field(None, check=lambda v: None if v is None or v >= 1 else "must be >= 1",
                               doc="T releases the epsilon target covers (default: run.rounds)")
    lr_decay: float = field(0.0, check=nonneg, doc="gamma_k = lr / (1 + lr_decay * k)")

    def __check__(self) -> tuple[str, str] | None:
        given = [k for k in ("noise_multiplier", "sigma", "epsilon") if getattr(self, k) is not None]
        if len(given) > 1:
            return given[1], f"give one of noise_multiplier, sigma, epsilon (got {' and '.join(given)})"
        return None


def sensitivity(p: DPDPSGDParams, dim: int) -> float:
    """L2 sensitivity of the released gradient under add-or-remove of one example."""
    per = p.clip if p.clip_kind == "l2" else p.clip * math.sqrt(dim)
    return per / p.batch if p.clip_mode == "per_example" else 2.0 * per


@functools.lru_cache(maxsize=64)
def _multiplier(eps: float, delta: float, q: float, steps: int, accountant: str) -> float:
    from netsim.privacy.calibration import noise_multiplier

    return noise_multiplier(eps, delta, [(q, steps)], accountant)


def _delta(scenario, p: DPDPSGDParams) -> float:
    if p.delta is not None:
        return p.delta
    spec = getattr(scenario, "privacy", None)
    return spec.delta if spec is not None else 1e-5


def noise_std(agent, p: DPDPSGDParams, dim: int) -> float:
    """The Gaussian std per coordinate of agent's release (noise_multiplier, sigma or epsilon)."""
    if p.sigma is not None:
        return p.sigma
    sens = sensitivity(p, dim)
    if p.epsilon is None:
        return (1.0 if p.noise_multiplier is None else p.noise_multiplier) * sens
    q = min(1.0, p.batch / len(agent.rows))
    steps = p.rounds or agent.scenario.run.rounds
    return sens * _multiplier(p.epsilon, _delta(agent.scenario, p), q, int(steps), p.accountant)


@register("dp_dpsgd", DPDPSGDParams)
class DPDPSGD(SyncKernel):
    """Round k of agent i: g~ = clip, then noise (its one release), send x_i^k, then x_i^{k+1} = sum_j W_ij x_j^k
    - gamma_k g~. An agent whose budget cap is reached (its release refused) stops taking gradients and only
    gossips."""

    pattern = SyncRounds(tag="model")
    reads = frozenset({"lr", "batch", "clip", "clip_kind", "clip_mode", "noise_multiplier", "sigma", "epsilon",
                       "delta", "accountant", "rounds", "lr_decay"})
    per_row = frozenset({"step"})  # the noisy gradients ``local`` hands to ``combine``

    def init(self, agents, p):
        return {"spent": set(), "scale": {}}  # agents out of budget; agent: (sensitivity, sigma)

    def gradient(self, p, state, i):
        if state is not None and i in state["spent"]:
            return None
        if p.clip_mode == "per_example":  # Abadi et al. Alg. 1: clip each example, average
            return GradientRequest.of(p.batch, p.clip, p.clip_kind)
        return GradientRequest.of(p.batch)   # the batch mean gradient, clipped as one vector in ``local``

    def payload_bytes(self, p, state, params):
        return payload_size(params)                                  # x_i^k: a row of x

    def local(self, b, p):
        b.step = None
        if b.g is not None:
            g = b.g if p.clip_mode == "per_example" else b.clip(b.g, p.clip, p.clip_kind)
            scale = [b.state["scale"].get(a.id) or b.state["scale"].setdefault(a.id, release_scale(a, p, g.shape[1]))
                     for a in b.agents]
            q = [min(1.0, p.batch / len(a.rows)) for a in b.agents]
            b.step = b.privatize(g, [s for _, s in scale], [s for s, _ in scale], q, what="gradient")
            b.state["spent"].update(b.refused(b.step))                # out of budget: gossip only
        b.send(b.x)                                                   # x_i^k (post-processing)

    def any_round(self, p):
        return not p.lr_decay                                         # gamma_k = lr: b.k is not read

    def combine(self, b, p, got):
        lr = p.lr / (1.0 + p.lr_decay * b.k) if p.lr_decay else p.lr  # (lr / 1.0 == lr: the same bits)
        b.mix_into_params(b.x, got, step=b.step, lr=lr)              # Lian et al. Alg. 1, line 6 (batched)

    def refusal(self, sim, path):
        from netsim.rounds.windowed import budget_cap_refusal

        return budget_cap_refusal(sim)  # an agent out of budget leaves the round's order

    def check(self, sim, p):
        """Before the run: an epsilon target needs the number of releases T, and its noise multiplier is calibrated
        here (the accountant's search takes seconds: a setting's cost, not the simulation's; cached for the run)."""
        if p.epsilon is None:
            return
        if p.rounds is None and sim.scenario.run.rounds is None:
            raise InputError("algorithm.rounds", "an epsilon target needs T: set algorithm.rounds or run.rounds")
        for a in {len(a.rows): a for a in sim.agents}.values():  # one calibration per sampling rate q
            noise_std(a, p, 1)


def release_scale(agent, p: DPDPSGDParams, dim: int) -> tuple[float, float]:
    """(sensitivity, noise std) of agent's releases of a dim-sized gradient."""
    return sensitivity(p, dim), noise_std(agent, p, dim)
