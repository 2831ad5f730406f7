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
from typing import TYPE_CHECKING, Literal

import attrs
import numpy as np

from netsim.algorithms.registry import register
from netsim.rounds import SyncKernel, SyncRounds
from netsim.scenario.structure import at_least, field, fraction, nonneg, positive

if TYPE_CHECKING:
    import torch


def _momentum(v: float) -> str | None:
    return None if 0 <= v < 1 else f"must be in [0, 1), got {v}"


@attrs.frozen
class DFedSAMParams:
    """One parameter set for the whole family (decentralized and centralized, ``fedavg.py``), so a
    sweep can switch ``algorithm.name`` over the same keys. Defaults are the paper's (Sec. 5, App. B.3)."""

    lr: float = field(0.1, check=nonneg, doc="eta_0, local learning rate")
    lr_decay: float = field(0.998, check=fraction, doc="eta_t = lr * lr_decay^t, once per round")
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
    sample_fraction: float = field(0.1, check=fraction, doc="centralized only: clients sampled per round")
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
def local_train(b, p: DFedSAMParams, x: torch.Tensor, t: int, spent: set) -> Generator:
    """K local (SAM) steps from the rows ``x`` of batch ``b`` in round t (eq. (3); Algorithm 1 lines 3-8), a
    round kernel's local steps: each ``yield`` is a wave of gradients (every agent's at once); returns the
    rows y^{t,K}. ``spent``: agents out of privacy budget (ignored when noise_multiplier = 0); they stop."""
    import torch
    eta = p.lr * p.lr_decay ** t
    private = p.noise_multiplier > 0
    clip = p.clip if private else None
    n = len(b.agents[0].rows)  # every agent of a batch has as many rows (``DFedSAM.refusal``)
    size = p.batch or n
    per_epoch = math.ceil(n / size)
    steps = p.local_steps if p.local_epochs == 0 else p.local_epochs * per_epoch
    y = x.clone()
    prev = y
    for k in range(steps):
        if any(a.id in spent for a in b.agents):
            break
        if p.local_epochs == 0:
            rows = b.sample_rows(p.batch)                      # xi: one mini-batch for both passes
        else:                                                  # a shuffled epoch, cut into batches
            j = k % per_epoch
            if j == 0:
                order = [a.rows[a.rng("batch").permutation(n)] for a in b.agents]
            rows = [o[j * size:(j + 1) * size] for o in order]
        g = yield b.gradients(y, rows, clip, p.clip_kind)
        if private and (g := _privatize(b, p, g, rows, spent)) is None:
            break
        if p.rho > 0:                                          # delta = rho g / ||g||_2, eq. (3), row by row
            perturbed = torch.stack([yr + gr * (p.rho / (float(gr.norm()) + 1e-12))
                                     for yr, gr in zip(y, g, strict=True)])
            g = yield b.gradients(perturbed, rows, clip, p.clip_kind)
            if private and (g := _privatize(b, p, g, rows, spent)) is None:
                break
        step = g if p.weight_decay == 0 else g + p.weight_decay * y
        new = y - eta * step
        if p.momentum > 0:
            new = new + p.momentum * (y - prev)                 # heavy ball, y^{-1} = y^0 (DFedAvgM)
        prev, y = y, new
    return y


def _privatize(b, p: DFedSAMParams, g: torch.Tensor, rows: list, spent: set) -> torch.Tensor | None:
    """Each agent's gradient released (std z C / B); None once an agent's budget cap is reached."""
    per_example = p.clip if p.clip_kind == "l2" else p.clip * math.sqrt(g.shape[1])
    sens = [per_example / len(r) for r in rows]
    q = [min(1.0, len(r) / len(a.rows)) for r, a in zip(rows, b.agents, strict=True)]
    out = b.privatize(g, [p.noise_multiplier * s for s in sens], sens, q, what="gradient")
    refused = b.refused(out)
    if refused:
        spent.update(refused)
        return None
    return b.stack(out)


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


@register("dfedsam", DFedSAMParams)
@register("dfedsam_mgs", DFedSAMMGSParams)
@register("dfedavg", DFedAvgParams)
@register("dfedavgm", DFedAvgMParams)
class DFedSAM(SyncKernel):
    """Algorithm 1: every round t, K local (SAM) steps, then Q gossip steps z^{q+1}_i = sum_l w_il z^q_l (each a
    barrier exchange); x^{t+1}(i) = z^{t,Q}(i)."""

    pattern = SyncRounds(tag="gossip")
    reads = frozenset({"lr", "lr_decay", "batch", "local_steps", "local_epochs", "rho", "weight_decay", "momentum",
                       "gossip_steps", "random_neighbors", "round_from", "noise_multiplier", "clip", "clip_kind",
                       # the centralized variants' (fedavg.py), which share these Params
                       "sample_fraction", "server_lr"})
    per_row = frozenset({"z"})  # z^{t,q}(i), the gossip steps' rows

    def init(self, agents, p):
        return {"t": [0] * len(agents), "spent": set()}

    def exchanges(self, p, state):
        return p.gossip_steps

    def local(self, b, p):
        ts = b.state["t"]
        if p.round_from == "clock":  # the tick's index: agents that skipped ticks stay aligned
            for a in b.agents:
                ts[a.id] = max(ts[a.id], a.tick() - 1)
        b.k = ts[b.agents[0].id]  # the round t (one for all agents of a windowed batch)
        for a in b.agents:
            ts[a.id] += 1
        y = yield from local_train(b, p, b.x, b.k, b.state["spent"])  # z^t(i) = y^{t,K}(i)
        b.set_params(y)
        b.z = y
        b.send(y)

    def routes(self, b, p):
        if p.random_neighbors == 0:
            return None
        ins, outs = RandomInNeighbors.of(b.agents[0], p.random_neighbors).at(b.k, b.s)
        i = b.agents[0].id
        return outs[i], ins[i]

    def combine(self, b, p, got):
        import torch
        if p.random_neighbors == 0:
            b.z = b.mix(b.z, got)                                       # sum_l w_il z_l (missing: own)
        else:
            w = 1.0 / (p.random_neighbors + 1)
            z = []
            for zr, g in zip(b.z, got, strict=True):
                out = zr * (1.0 - w * len(g))                           # a missing neighbour's weight stays home
                for j in sorted(g):
                    out.add_(g[j], alpha=w)
                z.append(out)
            b.z = torch.stack(z)
        if b.s + 1 < p.gossip_steps:
            b.send(b.z)
        else:
            b.set_params(b.z)                                           # x^{t+1}(i) = z^{t,Q}(i)

    def check(self, sim, p):
        """Before the run writes anything: k must fit the agents, and the DP option's accounting
        (Poisson-subsampled batches) does not describe shuffled epochs."""
        if p.random_neighbors:
            RandomInNeighbors(sim.scenario.agents.count, p.random_neighbors)  # k must fit the agents
        if p.local_epochs and p.noise_multiplier > 0:
            from netsim.errors import InputError

            raise InputError("algorithm.local_epochs", "shuffled epochs are not Poisson-subsampled batches, "
                             "which the DP option's accounting assumes; use local_steps with noise_multiplier > 0")

    def refusal(self, sim, path):
        p = sim.params
        if p.random_neighbors:
            return ("random in-neighbours per gossip step (the barriers wait for other senders each step) — set "
                    "algorithm.random_neighbors = 0")
        if p.local_epochs and len({len(a.rows) for a in sim.agents}) > 1:
            return ("local epochs over shards of different sizes (agents take different numbers of steps) — use "
                    "algorithm.local_steps instead of local_epochs")
        return None
