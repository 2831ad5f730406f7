"""DFedSAM and DFedSAM-MGS with their decentralized baselines DFedAvg and DFedAvgM.

Shi, Shen, Wei, Sun, Yuan, Wang, Tao, "Improving the Model Consistency of Decentralized Federated
Learning" (ICML 2023; the double-blind version's equation numbers). Every round t all m clients train
and then gossip (Algorithm 1, App. C; its y^{t,0} line sits inside the k-loop by a typo):

- K local SAM steps, eq. (3): ``g = grad F_i(y; xi)``, ``delta = rho g / ||g||_2`` (eq. (2) to first
  order, Foret et al., "Sharpness-Aware Minimization for Efficiently Improving Generalization", ICLR
  2021; one L2 norm over all parameters, + 1e-12), ``g~ = grad F_i(y + delta; xi)`` on the SAME
  mini-batch, ``y <- y - eta_t (g~ + wd y)`` from the unperturbed y (the base optimizer is SGD with
  weight decay 5e-4 and no momentum, App. B.3); eta_t = eta_0 decay^t, constant within a round (Sec. 5:
  "local learning rate as 0.1 with a decay rate 0.998 per communication round").
- Q gossip steps, eq. (5): ``z^{q+1}_i = sum_l w_il z^q_l``, each a synchronous exchange
  (``comm.sync_round``, a neighbour barrier with timeout); Q = 1 is eq. (4) (DFedSAM), Q > 1 is
  DFedSAM-MGS (Q = 4 in the experiments). Without loss the round is X^{t+1} = W^Q Z^t.

Local work: ``local_steps`` mini-batches drawn by the agent's sampler (``data.sampling``), or
``local_epochs`` > 0: the paper's unit (App. B.3: 5 local epochs, D-PSGD 1), each epoch a fresh
permutation of the client's rows cut into ceil(n_i / B) batches, the last one smaller (a shuffling
``torch.utils.data.DataLoader``); K = local_epochs * ceil(n_i / B) then depends on the shard size.

Baselines in the same loop (Sec. 5 / App. B.3): DFedAvg (Sun, Li, Wang, "Decentralized Federated
Averaging", TPAMI 2022) is rho = 0, Q = 1 and then does one gradient pass per step, so its trace is
that of DFedSAM with rho = 0; DFedAvgM (same paper) adds heavy-ball momentum theta
(``y^{k+1} = y^k - eta g + theta (y^k - y^{k-1})``, reset each round). The paper's D-PSGD (App. B.3)
is DFedAvg with one local epoch instead of five; netsim's classical ``dpsgd`` (Lian et al. 2017) is the
one-step variant.

Topology: the scenario's static graph and mixing matrix, or ``random_neighbors = k > 0``, the
time-varying graph of Sec. 5 / App. B.4 ("at most 10 neighbors ... random sampled without
replacement"), read as in the DisPFL code the paper builds on (Dai et al., ICML 2022,
``_benefit_choose(cs="random")``): in every gossip step each client independently draws k distinct
other clients as in-neighbours and averages uniformly over itself and them (weight 1/(k+1); directed
and row-stochastic, resampled per gossip step). The draw for (round t, step q) comes from the
``topology_schedule`` stream keyed (t, q), so every algorithm sees the same graphs. (A symmetrised
variant is not implemented.) Use ``topology.kind = "complete"`` so any pair may talk.

Privacy (not in the paper; netsim's option): ``noise_multiplier > 0`` clips per-example gradients to
``clip`` and releases each gradient through ``Agent.privatize`` (std z C / B). SAM's ascent gradient
is data-dependent and moves the point where the descent gradient is taken, so both passes are
privatized: two releases per SAM step. Once the budget cap is hit the client stops training and only
gossips (post-processing). The accounting assumes Poisson-subsampled batches, so it is refused with
``local_epochs`` (shuffled epochs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Literal

import attrs
import numpy as np
import torch

from netsim.algorithms.registry import register
from netsim.comm.patterns import sync_round
from netsim.scenario.structure import at_least, field, nonneg, positive


def _unit_open(v: float) -> str | None:
    return None if 0 < v <= 1 else f"must be in (0, 1], got {v}"


def _momentum(v: float) -> str | None:
    return None if 0 <= v < 1 else f"must be in [0, 1), got {v}"


@attrs.frozen
class DFedSAMParams:
    """One parameter set for the whole family (decentralized and centralized, ``fedavg.py``), so a
    sweep can switch ``algorithm.name`` over the same keys. Defaults are the paper's (Sec. 5, App. B.3)."""

    lr: float = field(0.1, check=nonneg, doc="eta_0, local learning rate")
    lr_decay: float = field(0.998, check=_unit_open, doc="eta_t = lr * lr_decay^t, once per round")
    batch: int = field(128, check=at_least(0), doc="mini-batch size B (0 = the full local data)")
    local_steps: int = field(20, check=at_least(0), doc="K local steps per round (5 epochs of 500 rows of "
                                                         "batch 128); unused when local_epochs > 0")
    local_epochs: int = field(0, check=at_least(0), doc="E > 0: E shuffled passes over the local rows per "
                                                         "round, ceil(n_i/B) batches each (the paper's unit); "
                                                         "0: local_steps batches from the agent's sampler")
    rho: float = field(0.01, check=nonneg, doc="SAM radius (0 = plain SGD: DFedAvg)")
    weight_decay: float = field(5e-4, check=nonneg, doc="wd in y <- y - eta (g + wd y)")
    momentum: float = field(0.0, check=_momentum, doc="heavy-ball theta, reset every round (DFedAvgM: 0.9)")
    gossip_steps: int = field(1, check=at_least(1), doc="Q gossip steps per round (MGS: 4)")
    random_neighbors: int = field(0, check=at_least(0), doc="k > 0: k random in-neighbours per gossip "
                                                            "step (App. B.4); 0: the scenario's topology")
    round_timeout: float = field(1.0, check=positive, doc="seconds a gossip step waits for neighbours")
    round_from: Literal["count", "clock"] = field(
        "count", doc="round t = own round count, or the activation tick's index on the local clock "
                     "(periodic/Bernoulli activation: a client that skips ticks stays in step)")
    sample_fraction: float = field(0.1, check=_unit_open, doc="centralized only: clients sampled per round")
    server_lr: float = field(1.0, check=positive, doc="centralized only: global learning rate")
    noise_multiplier: float = field(0.0, check=nonneg, doc="DP option: z (0 = no DP, as in the paper)")
    clip: float = field(1.0, check=positive, doc="DP option: per-example clip bound C")
    clip_kind: Literal["l2", "coordinate"] = field("l2", doc="DP option: L2 or coordinate clipping")


@attrs.frozen
class DFedSAMMGSParams(DFedSAMParams):
    gossip_steps: int = field(4, check=at_least(1), doc="Q gossip steps per round (MGS: 4)")


@attrs.frozen
class DFedAvgParams(DFedSAMParams):
    rho: float = field(0.0, check=nonneg, doc="SAM radius (0 = plain SGD: DFedAvg)")


@attrs.frozen
class DFedAvgMParams(DFedSAMParams):
    rho: float = field(0.0, check=nonneg, doc="SAM radius (0 = plain SGD: DFedAvg)")
    momentum: float = field(0.9, check=_momentum, doc="heavy-ball theta, reset every round (DFedAvgM: 0.9)")


# --------------------------------------------------------------------------------------------------
def local_train(agent, p: DFedSAMParams, x: torch.Tensor, t: int, dp: dict) -> Generator:
    """K local (SAM) steps from x in round t (eq. (3); Algorithm 1 lines 3-8); returns y^{t,K}.
    ``dp`` holds the agent's privacy state ({"spent": bool}); ignored when noise_multiplier = 0."""
    eta = p.lr * p.lr_decay ** t
    private = p.noise_multiplier > 0
    clip = p.clip if private else None
    n = len(agent.rows)
    size = p.batch or n
    per_epoch = math.ceil(n / size)
    steps = p.local_steps if p.local_epochs == 0 else p.local_epochs * per_epoch
    y = x.clone()
    prev = y
    for k in range(steps):
        if dp.get("spent"):
            break
        if p.local_epochs == 0:
            rows = agent.sample_rows(p.batch)                  # xi: one mini-batch for both passes
        else:                                                  # a shuffled epoch, cut into batches
            j = k % per_epoch
            if j == 0:
                order = agent.rows[agent.rng("batch").permutation(n)]
            rows = order[j * size:(j + 1) * size]
        g = yield agent.gradient(params=y, rows=rows, clip=clip, clip_kind=p.clip_kind)
        if private and (g := _privatize(agent, p, g, len(rows), dp)) is None:
            break
        if p.rho > 0:
            perturbed = y + g * (p.rho / (float(g.norm()) + 1e-12))   # delta = rho g / ||g||_2, eq. (3)
            g = yield agent.gradient(params=perturbed, rows=rows, clip=clip, clip_kind=p.clip_kind)
            if private and (g := _privatize(agent, p, g, len(rows), dp)) is None:
                break
        step = g if p.weight_decay == 0 else g + p.weight_decay * y
        new = y - eta * step
        if p.momentum > 0:
            new = new + p.momentum * (y - prev)                 # heavy ball, y^{-1} = y^0 (DFedAvgM)
        prev, y = y, new
    return y


def _privatize(agent, p: DFedSAMParams, g: torch.Tensor, b: int, dp: dict) -> torch.Tensor | None:
    per_example = p.clip if p.clip_kind == "l2" else p.clip * math.sqrt(g.numel())
    sens = per_example / b
    q = min(1.0, b / len(agent.rows))
    out = agent.privatize(g, sigma=p.noise_multiplier * sens, sensitivity=sens, q=q, what="gradient")
    if out is None:
        dp["spent"] = True
    return out


# --------------------------------------------------------------------------------------------------
class RandomInNeighbors:
    """The time-varying random graph of App. B.4: for (round t, gossip step q), every client draws k
    distinct other clients uniformly without replacement as its in-neighbours. One draw per (t, q)
    for the whole run (shared by all agents through the simulation), from a stream addressed by
    (topology_schedule, t, q), so it never shifts another stream."""

    def __init__(self, n: int, k: int, rng_at: Callable[[int, int], np.random.Generator] | None = None):
        self.n = n
        self.rng_at = rng_at  # (t, q) -> a fresh generator of the run-wide stream (topology_schedule, t, q)
        if not 0 < k < self.n:
            from netsim.errors import InputError

            raise InputError("algorithm.random_neighbors",
                             f"must be in [1, {self.n - 1}] for {self.n} agents, got {k}")
        self.k = k
        self.cache: dict[tuple[int, int], tuple[list[list[int]], list[list[int]]]] = {}

    @classmethod
    def of(cls, agent, k: int) -> RandomInNeighbors:
        """The run's schedule (a service every agent shares)."""
        return agent.service((cls, k), lambda: cls(agent.agent_count, k, lambda t, q: agent.shared_rng(
            "topology_schedule", t, q, cached=False)))

    def at(self, t: int, q: int) -> tuple[list[list[int]], list[list[int]]]:
        """(in-neighbours, out-neighbours) of every agent, sorted."""
        key = (t, q)
        got = self.cache.get(key)
        if got is None:
            rng = self.rng_at(t, q)
            ins, outs = [], [[] for _ in range(self.n)]
            for i in range(self.n):
                c = rng.choice(self.n - 1, size=self.k, replace=False)
                c[c >= i] += 1
                ins.append(sorted(int(j) for j in c))
                for j in ins[-1]:
                    outs[j].append(i)
            got = (ins, outs)
            if len(self.cache) > 64:
                self.cache.pop(next(iter(self.cache)))
            self.cache[key] = got
        return got


def gossip(agent, p: DFedSAMParams, z: torch.Tensor, t: int) -> Generator:
    """Q synchronous gossip steps of z (eq. (5)); returns z^{t,Q}. Step q of round t carries message
    round t Q + q, so a late message of an earlier step is discarded as stale."""
    Q = p.gossip_steps
    for q in range(Q):
        r = t * Q + q
        if p.random_neighbors == 0:
            got = yield from sync_round(agent, z, r, timeout=p.round_timeout, tag="gossip")
            z = agent.mix(z, got)                                    # sum_l w_il z_l (missing: own)
            continue
        ins, outs = RandomInNeighbors.of(agent, p.random_neighbors).at(t, q)
        yield agent.broadcast(z, tag="gossip", round=r, to=outs[agent.id])
        got = yield agent.gather(tag="gossip", round=r, senders=ins[agent.id], timeout=p.round_timeout)
        w = 1.0 / (p.random_neighbors + 1)
        out = z * (1.0 - w * len(got))                               # a missing neighbour's weight stays home
        for j in sorted(got):
            out.add_(got[j], alpha=w)
        z = out
    return z


def dfedsam(agent, p: DFedSAMParams):
    """Algorithm 1: every round, K local SAM steps then Q gossip steps; x^{t+1}(i) = z^{t,Q}(i)."""
    dp: dict = {}
    period = agent.activation.period
    t = 0
    while True:
        yield agent.wake()
        if p.round_from == "clock":  # the tick's index: agents that skipped ticks stay aligned
            t = max(t, round(agent.local_time() / period) - 1)
        y = yield from local_train(agent, p, agent.params, t, dp)   # z^t(i) = y^{t,K}(i)
        agent.params = y
        agent.params = yield from gossip(agent, p, y, t)            # x^{t+1}(i) = z^{t,Q}(i)
        t += 1


def _check(sim, p: DFedSAMParams) -> None:
    """Before the run writes anything (Simulation calls ``program.check``): k must fit the agents, and
    the DP option's accounting (Poisson-subsampled batches) does not describe shuffled epochs."""
    if p.random_neighbors:
        RandomInNeighbors(sim.scenario.agents.count, p.random_neighbors)  # k must fit the agents
    if p.local_epochs and p.noise_multiplier > 0:
        from netsim.errors import InputError

        raise InputError("algorithm.local_epochs", "shuffled epochs are not Poisson-subsampled batches, "
                         "which the DP option's accounting assumes; use local_steps with noise_multiplier > 0")


dfedsam.check = _check  # type: ignore[attr-defined]
register("dfedsam", DFedSAMParams)(dfedsam)
register("dfedsam_mgs", DFedSAMMGSParams)(dfedsam)
register("dfedavg", DFedAvgParams)(dfedsam)
register("dfedavgm", DFedAvgMParams)(dfedsam)
