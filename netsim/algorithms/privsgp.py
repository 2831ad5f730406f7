"""PrivSGP-VR and its baselines (reproduction notes: docs/reproductions/privsgp-vr.md).

Zhu, Huang, Wang, Xu, "PrivSGP-VR: Differentially Private Variance-Reduced Stochastic Gradient Push
with Tight Utility Bounds" (IJCAI 2024, arXiv 2405.02638), Algorithm 1, iteration k at node i (all nodes in lock-step):
    xi ~ U{1..J};  h = grad f_i(z_i^k; xi)                                   (per-sample gradient)
    g = h - T_i[xi] + (1/J) sum_j T_i[j];   T_i[xi] <- h                   (SAGA, eqs. (5)-(6))
    g~ = g + N(0, sigma_i^2 I)                                             (eq. (7))
    x_i^{k+1/2} = x_i^k - gamma g~
    x_i^{k+1} = sum_j P^k_ij x_j^{k+1/2},  w_i^{k+1} = sum_j P^k_ij w_j^k,  z = x / w   (push-sum)
The table starts with a full pass at x^0 (J gradients per node, not counted in K). Push-sum is
Kempe et al.'s (FOCS 2003) with sender-chosen column-stochastic shares: agent i keeps 1/(d_i^k + 1) of (x_i, w_i)
and sends one such share to each of its d_i^k out-neighbours of round k (plain shares, not ``comm.PushSum``'s
running sums: on a time-varying graph the out-neighbour changes every round). Both methods are round kernels of
barrier rounds (``rounds.SyncRounds``: each round ends with a barrier on the round's in-neighbours), so they run on
both engines with the same bits. Use ``[topology.dynamic] kind = "one_peer_exponential"`` for the paper's
time-varying directed exponential graph (P^k = (I + Pi_k)/2, App. D) or any directed topology with ``mixing =
"column_stochastic"``. The bank holds z_i (what is evaluated); the numerators x_i, the SAGA table and its average
live in bank state (``push_numerator``, ``saga_table``, ``saga_average``), the weights w_i in the kernel's state (as
doubles; ``push_weight`` in bank state is their copy in the bank's dtype). Every node finishes after its K rounds
(``horizon``).

Noise and K (``netsim.privacy.closed_forms``): sigma_i by eq. (11) (c_2 = ``[privacy] c2``) for the run's
K; ``iterations = 0`` means K = k_scale * K* with K* from eq. (12), A = 13 F^0 + 6 L ||x^0||^2 + 18 L b^2
from the problem constants given as parameters (estimate them with ``estimate_constants``). Step size
``lr = 0`` means the theory's gamma = sqrt(n/K) (Theorem 1). The per-sample gradient is clipped to
norm G (which makes the 3G sensitivity of App. B true). Releases are recorded with
sensitivity 3G and rate 1/J, so ``closed_form = "privsgp_vr"`` inverts eq. (11) and dp-accounting gives
the rigorous epsilon (far larger).

Baselines: ``privsgp`` (Algorithm 2: the same without variance reduction, eq. (4)); ``dp2_sgd``
(DP^2-SGD [reconstructed], Yu et al. 2021: D-PSGD, x_i = sum_j W_ij x_j - gamma(grad + N), a round kernel too);
``adp2_sgd`` (A(DP)^2SGD [reconstructed], Xu et al. 2021: AD-PSGD with gradient noise).
"""

from __future__ import annotations

import math
from typing import ClassVar

import attrs
import numpy as np

from netsim.algorithms.do_adp import finish, privacy_spec
from netsim.algorithms.registry import register
from netsim.comm.patterns import PairwiseGossip, RunningSumPayload
from netsim.errors import InputError
from netsim.privacy import closed_forms as cf
from netsim.rounds import GradientRequest, SyncKernel, SyncRounds
from netsim.scenario.structure import at_least, field, nonneg, positive


def _opt_pos(v: float | None) -> str | None:
    return None if v is None or v > 0 else f"must be > 0, got {v}"


def _opt_nonneg(v: float | None) -> str | None:
    return None if v is None or v >= 0 else f"must be >= 0, got {v}"


@attrs.frozen
class PrivSGPParams:
    iterations: int = field(0, check=at_least(0), doc="K; 0 = k_scale * K* (eq. 12)")
    k_scale: float = field(1.0, check=positive, doc="with iterations = 0: K = round(k_scale * K*)")
    lr: float = field(0.0, check=nonneg, doc="gamma; 0 = sqrt(n/K) (Theorem 1)")
    lr_max: float | None = field(None, check=_opt_pos, doc="optional cap on gamma")
    epsilon: float = field(1.0, check=positive, doc="per-node epsilon_i (eq. 11)")
    delta: float = field(1e-5, check=lambda v: None if 0 < v < 1 else f"must be in (0, 1), got {v}",
                         doc="per-node delta_i (eq. 11)")
    sigma: float | None = field(None, check=_opt_nonneg, doc="fixed noise std (overrides eq. (11))")
    G: float = field(1.0, check=positive, doc="per-sample gradient bound (clip norm)")
    clip: bool = field(True, doc="clip each per-sample gradient to norm G")
    sens_mult: float = field(3.0, check=positive, doc="recorded sensitivity = sens_mult * G (paper: 3)")
    L: float | None = field(None, check=_opt_pos, doc="smoothness L (for K*)")
    F0: float | None = field(None, check=_opt_nonneg, doc="f(x^0) - f* (for K*)")
    b2: float | None = field(None, check=_opt_nonneg, doc="heterogeneity b^2 (for K*)")
    batch: int = field(1, check=at_least(1), doc="dp2_sgd / adp2_sgd: samples per gradient")
    block: int = field(1, check=at_least(1), doc="samples per SAGA table entry (1 = exact; b > 1 = block-"
                                                 "SAGA: J // b fixed blocks, rest unused)")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for the round's in-neighbours")


@attrs.frozen
class Plan:
    K: int
    K_star: float | None
    sigma: float
    lr: float
    J: int


def plan(agent, p: PrivSGPParams, J: int | None = None) -> Plan:
    """K, K*, sigma_i and gamma of this run (identical at every node but sigma_i, which uses J_i); ``J``: the
    smallest local dataset (computed here when not given)."""
    n = agent.agent_count
    J = min(len(part) for part in agent.partition) if J is None else J
    c2 = privacy_spec(agent).c2
    K_star = None
    K = p.iterations
    if K == 0:
        missing = [k for k in ("L", "F0", "b2") if getattr(p, k) is None]
        if missing:
            raise InputError(f"algorithm.{missing[0]}", "iterations = 0 (K = K*) needs the problem constants "
                                                        "L, F0 and b2 (see privsgp.estimate_constants)")
        x0 = agent.params
        A = cf.privsgp_vr_A(p.F0, p.L, float(x0.double().pow(2).sum()), p.b2)
        try:
            K_star = cf.privsgp_vr_k_star(A, J, p.L, x0.numel(), p.G, [p.epsilon] * n, [p.delta] * n, c2)
        except cf.ClosedFormError as e:
            raise InputError("algorithm", e.message) from None
        K = max(1, round(p.k_scale * K_star))
    sigma = p.sigma if p.sigma is not None else cf.privsgp_vr_sigma(K, p.epsilon, p.delta, len(agent.rows), p.G,
                                                                 c2, p.sens_mult)
    lr = p.lr if p.lr > 0 else math.sqrt(n / K)
    if p.lr_max is not None:
        lr = min(lr, p.lr_max)
    return Plan(K, K_star, sigma, lr, J)


def estimate_constants(sim, samples: int = 2000, seed: int = 0) -> dict[str, float]:
    """Rough problem constants at x^0 for K*: G = max per-sample gradient norm, L = max
    ||grad_j(x) - grad_j(y)|| / ||x - y|| over random pairs near x^0, b^2 = max_i ||grad f_i - grad f||^2,
    F0 = f(x^0) (f* taken as 0). ``samples`` rows are used for G and L."""
    import torch
    rng = np.random.default_rng(seed)
    model, X, y = sim.model, sim.X, sim.y.long()
    x0 = sim.bank.get(0)
    rows = rng.choice(len(X), size=min(samples, len(X)), replace=False)
    W0 = x0.expand(len(rows), -1)
    g0 = model.grad(W0, X[rows].unsqueeze(1), y[rows].unsqueeze(1))
    G = float(g0.norm(dim=1).max())
    u = torch.as_tensor(rng.normal(size=(len(rows), x0.numel())), dtype=x0.dtype, device=x0.device) * 0.1
    g1 = model.grad(W0 + u, X[rows].unsqueeze(1), y[rows].unsqueeze(1))
    L = float(((g1 - g0).norm(dim=1) / u.norm(dim=1)).max())
    full = model.grad(x0.unsqueeze(0), X.unsqueeze(0), y.unsqueeze(0))[0]
    b2 = max(float((model.grad(x0.unsqueeze(0), X[part].unsqueeze(0), y[part].unsqueeze(0))[0] - full)
                   .pow(2).sum()) for part in sim.data.parts)
    F0 = float(model.evaluate(x0.unsqueeze(0), X, y)[0][0])
    return {"G": G, "L": L, "b2": b2, "F0": F0}


class PushSumSGP(SyncKernel):
    """Algorithm 1 (``vr``) or Algorithm 2, iteration k at node i: draw xi, the per-sample gradient at z_i^k, the
    SAGA-corrected gradient (Alg. 1), its noisy release, the half step x^{k+1/2}, then push-sum: keep one share
    of (x, w), push one to each out-neighbour of round k, add what arrived (sorted by sender), z = x / w."""

    pattern = SyncRounds(tag="privsgp")
    reads = frozenset({"iterations", "k_scale", "lr", "lr_max", "epsilon", "delta", "sigma", "G", "clip", "sens_mult",
                       "L", "F0", "b2", "batch", "block"})  # (batch: the baselines')
    per_row = frozenset({"xh", "yh"})  # each agent's kept share (x, w), from ``local`` to ``combine``
    vr: ClassVar[bool] = True

    def init(self, agents, p):
        """Each node's plan (K, sigma_i, gamma), its table entries (blocks of ``block`` rows), w_i^0 = 1, x_i^0 the
        bank's row, and (Alg. 1) the table's full pass at x^0 (phi^0 = x^0), node by node as the paper's init."""
        J = min(len(part) for part in agents[0].partition)
        plans = [plan(a, p, J) for a in agents]
        blocks = []
        for a in agents:
            nb = max(1, len(a.rows) // p.block)                           # table entries (blocks of b rows)
            blocks.append(a.rows[:nb * p.block].reshape(nb, -1))
        numer = agents[0].shared_state("push_numerator")                  # x_i (push-sum numerators)
        weight = agents[0].shared_state("push_weight", shape=())          # w_i in the bank's dtype (a copy)
        for a in agents:
            numer[a.id] = a.params
            weight[a.id] = 1.0
        st = {"plan": plans, "blocks": blocks, "w": [1.0] * len(agents), "numer": numer, "weight": weight,
              # per node: sensitivity of its release (a mean of b clipped gradients), sampling rate b / J_i
              "sens": [p.sens_mult * p.G / bl.shape[1] for bl in blocks],
              "q": [min(1.0, bl.shape[1] / len(a.rows)) for a, bl in zip(agents, blocks, strict=True)]}
        if self.vr:
            x0 = agents[0].params
            clip = p.G if p.clip else None
            table = agents[0].shared_state("saga_table", shape=(max(len(bl) for bl in blocks), x0.numel()))
            avg = agents[0].shared_state("saga_average")
            X, y = agents[0].training_set
            import torch
            for a, bl in zip(agents, blocks, strict=True):
                nb = len(bl)
                idx = torch.as_tensor(bl.ravel())
                table[a.id, :nb] = a.model.grad(a.params.expand(nb, -1), X[idx].view(nb, bl.shape[1], -1),
                                                y.long()[idx].view(nb, -1), clip)   # full pass at x^0
                avg[a.id] = table[a.id, :nb].mean(0)
            st.update(table=table, avg=avg)
        return st  # (the tensors are the bank's states: a restored checkpoint writes them in place)

    def horizon(self, p, state):
        return state["plan"][0].K                                         # K iterations (K* of eq. (12), or given)

    def local(self, b, p):
        import torch
        st, ids = b.state, b.ids
        one = len(b) == 1
        sel = slice(ids[0], ids[0] + 1) if one else b.index()            # the batch's rows of the states
        blocks = [st["blocks"][i] for i in ids]
        xi = [int(a.rng().integers(len(bl))) for a, bl in zip(b.agents, blocks, strict=True)]  # xi ~ U{1..J}
        clip = p.G if p.clip else None
        h = yield b.gradients(b.x, [bl[j] for bl, j in zip(blocks, xi, strict=True)], clip)  # grad f_i(z_i^k; xi)
        if self.vr:
            table, avg = st["table"], st["avg"]
            at = (ids[0], slice(xi[0], xi[0] + 1)) if one else (sel, torch.tensor(xi, device=h.device))
            old, mean = table[at], avg[sel]
            g = h - old + mean                                            # eq. (6), old table
            step = h - old
            nbs = [len(bl) for bl in blocks]                              # eq. (5): the average, then T_i[xi] = h
            if nbs.count(nbs[0]) == len(nbs):
                avg[sel] = mean.add_(step, alpha=1.0 / nbs[0])
            else:
                for nb, ns in _by(nbs).items():
                    rows = torch.tensor(ns, device=h.device)
                    avg[sel[rows]] = mean.index_select(0, rows).add_(step.index_select(0, rows), alpha=1.0 / nb)
            table[at] = h
        else:
            g = h                                                         # eq. (4)
        noisy = b.privatize(g, [st["plan"][i].sigma for i in ids], [st["sens"][i] for i in ids],
                            [st["q"][i] for i in ids])                    # eq. (7): g + N(0, sigma_i^2 I)
        x = st["numer"][sel]
        if one:
            x = x.clone()
        lr = st["plan"][ids[0]].lr                                        # (gamma: the same at every node)
        if not b.refused(noisy):
            x.sub_(b.stack(noisy), alpha=lr)                              # x^{k+1/2} = x^k - gamma g~
        else:                                                             # out of budget: no step
            for n, z in enumerate(noisy):
                if z is not None:
                    x[n].sub_(z, alpha=lr)
        shares = [1.0 / (len(a.neighbors) + 1) for a in b.agents]        # P^k's column i: 1/(d_i^k + 1)
        if shares.count(shares[0]) == len(shares):
            x.mul_(shares[0])
        else:
            x.mul_(torch.tensor(shares, dtype=x.dtype, device=x.device)[:, None])
        b.xh, b.yh = x, [st["w"][i] * s for i, s in zip(ids, shares, strict=True)]
        size = x[0].numel() * x.element_size() + 8                        # (RunningSumPayload.size_bytes)
        b.send([RunningSumPayload(r, y) for r, y in zip(x.unbind(0), b.yh, strict=True)], [size] * len(b))
        b.k += 1                                                          # message round: pushes so far (1..K)

    def combine(self, b, p, got):
        import torch
        st, ids = b.state, b.ids
        x, y = b.xh.clone(), list(b.yh)                                   # the kept shares
        senders = [sorted(g) for g in got]
        for s in range(max(map(len, senders), default=0)):                # x^{k+1} = sum_j P^k_ij x_j^{k+1/2}, w
            ns = [n for n, js in enumerate(senders) if len(js) > s]       # alike: arrivals in sender order
            if len(ns) == len(b):
                x.add_(torch.stack([got[n][js[s]].x for n, js in enumerate(senders)]) if len(b) > 1 else
                       got[0][senders[0][s]].x)
            else:
                at = torch.tensor(ns, device=x.device)
                x.index_copy_(0, at, x.index_select(0, at).add_(torch.stack([got[n][senders[n][s]].x for n in ns])))
            for n in ns:
                y[n] += got[n][senders[n][s]].y
        sel = slice(ids[0], ids[0] + 1) if len(b) == 1 else b.index()
        w = torch.tensor(y, dtype=x.dtype, device=x.device)
        st["numer"][sel] = x
        st["weight"][sel] = w
        for i, v in zip(ids, y, strict=True):
            st["w"][i] = v
        b.set_params(x / w[:, None])                                      # z^{k+1} = x / w

    def check(self, sim, p):
        """Before the run: K, K* and sigma_i need valid parameters (eqs. (11), (12))."""
        plan(sim.agents[0], p)


def _by(values: list) -> dict:
    """Positions grouped by value, in order of first appearance."""
    out: dict = {}
    for n, v in enumerate(values):
        out.setdefault(v, []).append(n)
    return out


@register("privsgp_vr", PrivSGPParams)
class PrivSGPVR(PushSumSGP):
    """PrivSGP-VR (Zhu, Huang, Wang, Xu, IJCAI 2024, Algorithm 1): a SAGA variance-reduced stochastic
    gradient with Gaussian noise, then push-sum over a directed, possibly time-varying graph."""

    vr = True


@register("privsgp", PrivSGPParams)
class PrivSGP(PushSumSGP):
    """PrivSGP (Zhu, Huang, Wang, Xu, IJCAI 2024, Algorithm 2): PrivSGP-VR without variance reduction, the
    noisy stochastic gradient itself (eq. (4)), then push-sum."""

    vr = False


@register("dp2_sgd", PrivSGPParams)
class DP2SGD(SyncKernel):
    """DP^2-SGD [reconstructed]: x_i^{k+1} = sum_j W_ij x_j^k - gamma (grad f_i(x_i^k; B) + N(0, sigma^2 I))
    on a fixed undirected graph (use a symmetric mixing), same K and sigma_i as PrivSGP-VR."""

    pattern = SyncRounds(tag="model")
    reads = PushSumSGP.reads
    per_row = frozenset({"step"})  # the noisy gradients ``local`` hands to ``combine``

    def init(self, agents, p):
        J = min(len(part) for part in agents[0].partition)
        return {"plan": [plan(a, p, J) for a in agents]}

    def horizon(self, p, state):
        return state["plan"][0].K

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch, p.G if p.clip else None)          # per-sample clipped to G, averaged

    def local(self, b, p):
        plans = [b.state["plan"][i] for i in b.ids]
        b.step = b.privatize(b.g, [pl.sigma for pl in plans], [p.sens_mult * p.G / p.batch] * len(b),
                             [min(1.0, p.batch / len(a.rows)) for a in b.agents])   # grad + N(0, sigma_i^2 I)
        b.send(b.x)                                                           # x_i^k (post-processing)

    def combine(self, b, p, got):
        lr = b.state["plan"][b.ids[0]].lr
        b.mix_into_params(b.x, got, step=b.step, lr=lr)   # sum_j W_ij x_j^k - gamma g~ (out of budget: no step)

    def check(self, sim, p):
        plan(sim.agents[0], p)


@register("adp2_sgd", PrivSGPParams)
def adp2_sgd(agent, p: PrivSGPParams):
    """A(DP)^2SGD [reconstructed]: AD-PSGD (Lian et al. 2018, Alg. 1) with the gradient perturbed:
    (a) read x_i, (b) g = grad f_i(x_i; B) + N(0, sigma^2 I) (stale by averagings others make meanwhile),
    (c) average atomically with a random neighbour, (d) x_i -= gamma g. Each agent stops after K
    of its own activations (asynchronous: use any activation)."""
    return _adp2_sgd(agent, p, plan(agent, p))


def _adp2_sgd(agent, p: PrivSGPParams, pl: Plan):
    clip = p.G if p.clip else None
    q = min(1.0, p.batch / len(agent.rows))
    pg = PairwiseGossip(agent, timeout=p.round_timeout)
    rng = agent.rng()
    for _ in range(pl.K):
        yield agent.wake()
        g = yield agent.gradient(batch=p.batch, params=agent.params, clip=clip)           # (a), (b)
        noisy = agent.privatize(g, sigma=pl.sigma, sensitivity=p.sens_mult * p.G / p.batch, q=q,
                                what="gradient")
        yield from pg.exchange(pg.random_neighbor(rng))                                     # (c)
        if noisy is not None:
            agent.params = agent.params - pl.lr * noisy                                     # (d)
    yield from finish(agent)
