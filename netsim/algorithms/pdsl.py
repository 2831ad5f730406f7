"""PDSL: privacy-preserved decentralized stochastic learning with Shapley-weighted cross-gradients.

Wang, Yuan, Wang, Li, "PDSL: Privacy-Preserved Decentralized Stochastic Learning with Heterogeneous Data
Distribution", Algorithm 1 with Algorithm 2 (equation numbers below are the paper's).
One synchronous round of agent i (three barrier-separated communication phases):

  0  xi <- B rows of D_i, reused for every gradient of the round;
     g_ii = grad F_i(x_i; xi), clipped to C (eq. 10), + N(0, sigma^2 I) (eq. 11)
  A  send x_i to every neighbour                                                  (model broadcast)
  B  for each received x_j: g_ij = grad F_i(x_j; xi) (eq. 12), clipped (eq. 13), noised with a fresh
     draw (eq. 14), sent back to j                                         (cross-gradient reply)
  C  candidates x_{i,j} = x_i - gamma ghat_ji (eq. 15); Shapley values of M_i with v(S) = validation
     accuracy of x_{i,S} = x_i - gamma mean_{j in S} ghat_ji (eqs. 16-18, 26; netsim.algorithms.shapley);
     min-max normalisation (eq. 19); pi_ij = phi_hat_ij / (w_ij sum_k phi_hat_ik) (eq. 20);
     gbar = sum_j pi_ij ghat_ji (eq. 21); u_hat = alpha u + gbar (eq. 22); x_hat = x - gamma u_hat (eq. 23)
  D  send (u_hat, x_hat); u = sum_j w_ij u_hat_j (eq. 24), x = sum_j w_ij x_hat_j (eq. 25)

Noise is added exactly where the paper puts it: on the own gradient and on every outgoing
cross-gradient (each an ``Agent.privatize`` release: a ``release`` event); models and momenta are
post-processing. All coalition models of all agents that reach phase C together are valued in ONE
batched ``model.evaluate`` call (``CoalitionValues`` through ``Agent.lookahead``, the same lookahead as
the gradient service).

Choices the paper leaves open are parameters: exact Shapley up to 8 players, else R = 2|M_i|
stratified permutations; v(empty) = 0 or the accuracy of x_i; all-equal phi -> uniform; share floor;
divide by w or not; utility accuracy or -loss; sigma by ``fixed_sigma`` (default, sigma_per_eps C /
epsilon), ``per_message_gaussian`` or ``theorem1`` (eq. 27). Over a lossy or late network (which the
paper does not consider) a player whose cross-gradient missed the barrier is dropped from the round's
game; with none left the agent only gossips.

As barrier rounds (``SyncRounds``, three exchanges a round, messages tagged ``pdsl`` and numbered 3k + s): A at the
activation; after its barrier B's gradients one after the other (g_ii, then g_ij for each received x_j, sorted j,
each noised as it completes: its own release), each a wave of every agent's gradients (one batched call in both
engines), and the replies; after B's barrier C's Shapley time (``shapley_cost`` draws of ``agents.compute_time``,
a ``compute_start`` / ``compute_end``), with every agent's coalition models valued in one batched call; then D.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Literal

import attrs
import numpy as np

from netsim.algorithms.registry import register
from netsim.algorithms.shapley import from_values, members, minmax, pdsl_weights, plan
from netsim.errors import InputError
from netsim.rounds import SyncKernel, SyncRounds
from netsim.scenario.structure import at_least, field, nonneg, positive
from netsim.sim.streams import register_purpose
from netsim.trace.events import EventRow, register_event_kind

if TYPE_CHECKING:
    import torch

register_purpose("shapley", 81)  # Monte-Carlo Shapley permutations and evaluation times (historical code)


@register_event_kind
@attrs.frozen(slots=True)
class ShapleyWeight(EventRow):
    """Agent i's weight for player ``peer`` in round ``round``: ``value`` = pi_ij (eq. 20 of Wang et al.,
    PDSL), ``tag`` = ``"phi=<Shapley value> hat=<min-max normalised>"`` (floats as repr)."""

    kind = "shapley"
    t: float
    agent: int
    peer: int
    round: int
    value: float
    phi: float
    phi_hat: float
    tag: str = attrs.field(default=attrs.Factory(lambda e: f"phi={e.phi!r} hat={e.phi_hat!r}", takes_self=True))

    @classmethod
    def from_row(cls, t: float, agent: int, peer: int, round: int, size: int, value: float,
                 tag: str) -> ShapleyWeight:
        f = dict(x.split("=", 1) for x in tag.split(" "))
        return cls(float(t), int(agent), int(peer), int(round), float(value), float(f["phi"]), float(f["hat"]))


def _unit(v: float) -> str | None:
    return None if 0 <= v < 1 else f"must be in [0, 1), got {v}"


def _share(v: float | None) -> str | None:
    return None if v is None or 0 < v <= 1 else f"must be in (0, 1], got {v}"


@attrs.frozen
class DPGradientParams:
    """The DP recipe shared by PDSL and its baselines (same C and sigma for every method)."""

    clip: float = field(1.0, check=positive, doc="C: L2 clipping bound")
    clip_mode: Literal["batch", "per_example"] = field(
        "batch", doc="batch: the mini-batch gradient clipped as one vector (eqs. 10, 13; sensitivity 2C); "
                     "per_example: mean of per-example clipped gradients (sensitivity C/B)")
    calibration: Literal["fixed_sigma", "per_message_gaussian", "theorem1"] = field(
        "fixed_sigma", doc="how sigma is chosen")
    sigma: float | None = field(None, check=lambda v: None if v is None or v >= 0 else "must be >= 0",
                                doc="fixed_sigma: noise std per coordinate (default sigma_per_eps C / eps)")
    epsilon: float = field(0.3, check=positive, doc="privacy budget label / per-round target")
    delta: float = field(1e-5, check=lambda v: None if 0 < v < 1 else f"must be in (0, 1), got {v}")
    sigma_per_eps: float = field(0.003, check=positive, doc="fixed_sigma heuristic, not DP calibration")
    phi_min: float | None = field(None, check=_share,
                                  doc="theorem1: smallest normalised share (default 1/|M_i|)")
    batch: int = field(250, check=at_least(1), doc="B: mini-batch size")


def resolve_sigma(agent, p: DPGradientParams) -> float:
    """Noise std per coordinate for the scenario's calibration mode."""
    from netsim.privacy import closed_forms as cf

    if p.calibration == "fixed_sigma":
        return p.sigma if p.sigma is not None else p.sigma_per_eps * p.clip / p.epsilon
    if p.calibration == "per_message_gaussian":
        B = p.batch if p.clip_mode == "per_example" else None
        return cf.pdsl_per_message_sigma(p.epsilon, p.delta, p.clip, B)
    W = agent.mixing_matrix.toarray()
    bound = cf.pdsl_theorem1_sigma(W, p.epsilon, p.delta, p.clip, p.phi_min, strict=False)
    return p.clip * bound.sigma_over_C


def cross_gradients(b, p: DPGradientParams, models) -> Generator:
    """Phases 0 and B of PDSL's Algorithm 1 (also DP-CGA's exchange), after the barrier of phase A (``models[n]``: the
    {j: x_j} that reached agent n): g_ii on one mini-batch xi, then g_ij at each received x_j (sorted j) on the same
    xi, one gradient after the other, each clipped and noised as it completes (its own release); then each ghat_ij is
    sent back to its j (the round's next exchange). Each gradient is a wave of every agent's (one batched call). Keeps
    ``b.own``, each agent's ghat_ii (None once its budget cap is reached)."""
    import torch

    sigma = b.state["sigma"]
    clip = p.clip if p.clip_mode == "per_example" else None
    xi = b.sample_rows(p.batch)                                        # line 1: one mini-batch for the round
    g = yield b.gradients(b.x, xi, clip=clip)                          # eq. (9): g_ii = grad F_i(x_i; xi)
    b.own = release_gradients(b, p, g, sigma, "gradient")              # eqs. (10), (11)
    peers = [sorted(m) for m in models]
    replies: list[dict] = [{} for _ in b.agents]
    for s in range(max(map(len, peers), default=0)):
        on = [n for n, ps in enumerate(peers) if s < len(ps)]
        at = torch.stack([models[n][ps[s]] if s < len(ps) else b.x[n] for n, ps in enumerate(peers)])
        g = yield b.gradients(at, [r if s < len(ps) else None for r, ps in zip(xi, peers, strict=True)],
                              clip=clip)                               # eq. (12): g_ij = grad F_i(x_j; xi)
        noisy = release_gradients(b.part(on), p, g if len(on) == len(b) else g[on], sigma, "cross_gradient",
                                  to=[peers[n][s] for n in on])        # eqs. (13), (14)
        for n, r in zip(on, noisy, strict=True):
            if r is not None:
                replies[n][peers[n][s]] = r
    b.send(replies)                                                    # phase B: each ghat_ij back to its j


def release_gradients(b, p: DPGradientParams, g: torch.Tensor, sigma: float, what: str,
                      to: list[int] | None = None) -> list:
    """The DP recipe over a batch's rows: each clipped (batch mode, eqs. 10/13) and noised, one ledger release
    each (to agent ``to[n]``, else public); None for an agent whose budget cap is reached."""
    if p.clip_mode == "batch":
        g, sens = b.clip(g, p.clip), 2.0 * p.clip
    else:
        sens = p.clip / p.batch
    q = [min(1.0, p.batch / len(a.rows)) for a in b.agents]
    return b.privatize(g, [sigma] * len(b), [sens] * len(b), q, what=what, to=to)


def seconds(sim, computes: float, latencies: int) -> float:
    """``SyncKernel.between`` of a round with ``computes`` compute times and ``latencies`` exchanges between its first
    barrier and its last sends (a nominal positive value where they are not constant: the windows refuse those)."""
    sc = sim.world.scenario
    ct, lat = sc.agents.compute_time, sc.network.latency
    return computes * (float(ct.value) if ct.kind == "constant" else 1.0) + \
        latencies * (float(lat.value) if lat.kind == "constant" else 1.0)


def regular_graph_refusal(sim) -> str | None:
    """PDSL's and DP-CGA's ``refusal``: agents of different degrees take different numbers of cross-gradients, so
    their replies leave at different times; an agent out of budget sends no reply."""
    from netsim.rounds.windowed import budget_cap_refusal

    if len({len(a.in_neighbors) for a in sim.agents}) > 1:
        return (f"{sim.world.scenario.algorithm.name} on a graph whose degrees differ: agents take different numbers "
                "of cross-gradients, so their replies leave at different times — use a regular graph (ring, "
                "complete, torus)")
    return budget_cap_refusal(sim)


# -- batched coalition evaluation -----------------------------------------------------------------
class CoalitionValues:
    """Validation loss/accuracy of many candidate models from many agents in one ``model.evaluate``:
    the ``evaluate`` of the run's ``pdsl.coalitions`` lookahead service (``Agent.lookahead``), so agents
    of a synchronous round share one batched forward pass."""

    def __init__(self, model, validation: tuple[torch.Tensor, torch.Tensor] | None):
        if validation is None:
            raise InputError("data.validation", "PDSL needs a validation set: set data.validation "
                                                "(test rows held out, e.g. 2000)")
        self.model = model
        self.validation = validation
        self.X = self.y = None  # the validation rows, labels as int64 (made at the first evaluation)
        self.calls = 0   # batched evaluations
        self.models = 0  # candidate models valued

    def __call__(self, items: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        import torch
        if self.X is None:
            self.X, self.y = self.validation[0], self.validation[1].long()
        W = torch.cat(items)
        if getattr(self.model, "loop_on_cpu", False) and W.device.type == "cpu":
            # conv models on CPU: vmap over weights is slower than a loop (measured, small CNN, 70
            # models x 500 images: 9.2 s batched vs 3.3 s looped); on a GPU one batched call
            parts = [self.model.evaluate(W[r:r + 1], self.X, self.y) for r in range(W.shape[0])]
            loss, acc = torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts])
        else:
            loss, acc = self.model.evaluate(W, self.X, self.y)
        out, k = [], 0
        for w in items:
            n = w.shape[0]
            out.append((loss[k:k + n], acc[k:k + n]))
            k += n
        self.calls += 1
        self.models += k
        return out


def coalition_service(agent):
    """The run's batched coalition evaluator (one per run, shared by every agent)."""
    return agent.lookahead("pdsl.coalitions", CoalitionValues(agent.model, agent.validation_set))


# -- PDSL ------------------------------------------------------------------------------------------
@attrs.frozen
class PDSLParams(DPGradientParams):
    lr: float = field(0.001, check=positive, doc="gamma (MNIST 0.001, CIFAR-10 0.01)")
    momentum: float = field(0.5, check=_unit, doc="alpha (MNIST 0.5, CIFAR-10 0.7)")
    round_timeout: float = field(1.0, check=positive, doc="seconds each phase waits for neighbours")
    exact_max: int = field(8, check=at_least(0), doc="exact Shapley (eq. 18) up to this many players")
    permutations: int | None = field(None, check=lambda v: None if v is None or v >= 1 else "must be >= 1",
                                     doc="R for Monte-Carlo Shapley (default 2 |M_i|)")
    sampling: Literal["stratified", "plain"] = field("stratified", doc="Monte-Carlo permutations")
    v_empty: Literal["zero", "prev_model_acc"] = field("zero", doc="v(empty): 0 (Def. 3) or utility of x_i")
    utility: Literal["val_acc", "neg_val_loss"] = field("val_acc", doc="v(S) (eq. 16)")
    divide_by_omega: bool = field(True, doc="pi = share / w_ij (eq. 20); false: plain shares")
    share_floor: float = field(0.0, check=_unit, doc="mix uniform shares into the Shapley shares")
    shapley_cost: float = field(1.0, check=nonneg, doc="Shapley time in draws of agents.compute_time")
    round_from: Literal["count", "clock"] = field(
        "count", doc="round tag: rounds run so far, or the activation tick (local time / period): with "
                     "random activation an agent that skipped a tick stays in step with its neighbours")


def check_setting(sim, params, validation: bool = False) -> None:
    """Before the run (Simulation's ``program.check`` hook, for PDSL and its baselines): undirected
    graph, validation set."""
    if validation and sim.X_val is None:
        raise InputError("data.validation", "PDSL needs a validation set: set data.validation "
                                            "(test rows held out, e.g. 2000)")
    for a in sim.agents:
        if sorted(a.neighbors) != sorted(a.in_neighbors):
            raise InputError("topology.directed", "PDSL and its baselines need an undirected graph, symmetric W "
                                                  "(the paper assumes a symmetric, doubly stochastic W)")


@register("pdsl", PDSLParams)
class PDSL(SyncKernel):
    """PDSL's round as barrier rounds of three exchanges (see the module docstring): the models out (A); after that
    barrier the own and cross-gradients, the replies back (B); after the second, the Shapley weights, each agent's
    coalition models valued in one batched request of every agent's (C), and (u_hat, x_hat) out; after the third, the
    mix (D). State: every agent's momentum u (a row of the parameter bank)."""

    pattern = SyncRounds(tag="pdsl")
    per_row = frozenset({"own", "u", "xh"})  # ghat_ii, u_hat, x_hat
    reads = frozenset({"lr", "momentum", "exact_max", "permutations", "sampling", "v_empty", "utility",
                       "divide_by_omega", "share_floor", "shapley_cost", "round_from", "clip", "clip_mode",
                       "calibration", "sigma", "epsilon", "delta", "sigma_per_eps", "phi_min", "batch"})

    def init(self, agents, p):
        a = agents[0]  # sigma is the run's (the calibration's, the mixing matrix's), not an agent's
        return {"sigma": resolve_sigma(a, p), "u": a.shared_state("pdsl.u"), "service": coalition_service(a)}

    def check(self, sim, p):
        check_setting(sim, p, validation=True)  # undirected graph, a validation set, before the run

    def refusal(self, sim, path):
        return regular_graph_refusal(sim)

    def exchanges(self, p, state):
        return 3  # A: models out; B: cross-gradients back; D: (u_hat, x_hat) out

    def between(self, sim, p):  # B's 1 + |N_i| gradients, its exchange, C's Shapley time
        deg = max(len(a.in_neighbors) for a in sim.agents)
        return seconds(sim, 1 + deg + p.shapley_cost, 1)

    def local(self, b, p):
        if p.round_from == "clock":  # the activation tick: an agent that skipped one stays in step
            ticks = {a.tick() for a in b.agents}
            if len(ticks) > 1:
                raise RuntimeError("pdsl: agents of one batch at different ticks")
            b.k = ticks.pop()
        b.send(b.x)                                                        # phase A: x_i to every neighbour

    def combine(self, b, p, got):
        if b.s == 0:
            return cross_gradients(b, p, got)                             # phase B
        if b.s == 1:
            return self._weigh(b, p, got)                                 # phase C
        us = [{j: m[0] for j, m in g.items()} for g in got]               # phase D
        u = b.mix(b.u, us)                                                 # eq. (24)
        st = b.state["u"]
        if len(b) == 1:
            st[b.agents[0].id] = u[0]
        else:
            st.index_copy_(0, b.index(), u)
        b.mix_into_params(b.xh, [{j: m[1] for j, m in g.items()} for g in got])  # eq. (25), batched
        return None

    def _weigh(self, b, p, xgrads):
        """Phase C: each agent's players (itself first, then the replies that arrived), their coalition models
        valued in one request to the batched service (every agent's at once), then eqs. (18)-(23); sends
        (u_hat, x_hat)."""
        import torch

        st = b.state
        U = st["u"]
        plans: list = []
        for n, a in enumerate(b.agents):
            own = b.own[n]
            peers = sorted(xgrads[n])
            players = ([a.id] if own is not None else []) + peers
            if not players:
                plans.append(None)
                continue
            G = torch.stack(([own] if own is not None else []) + [xgrads[n][j] for j in peers])
            omega = np.array([a.self_weight if j == a.id else a.weights[j] for j in players])
            ct = shapley_time(a)() * p.shapley_cost
            plans.append((players, G, omega, ct, *coalitions(p, b.x[n], G, a.rng("shapley", 1))))
        got = yield b.requests(st["service"], [None if q is None else q[5] for q in plans],
                               [0.0 if q is None else q[3] for q in plans])
        us, xs = [], []
        for n, a in enumerate(b.agents):
            u, x = U[a.id].clone(), b.x[n]
            q = plans[n]
            if q is not None:
                players, G, omega, _, masks, _, perms = q
                pi, phi, phi_hat = weights(p, got[n], masks, perms, omega)           # eqs. (18)-(20)
                t = b.now(n)
                for j, v, v_hat, w in zip(players, phi, phi_hat, pi, strict=True):
                    b.emit(n, ShapleyWeight(t, a.id, j, b.k, float(w), float(v), float(v_hat)))
                gbar = torch.as_tensor(pi, dtype=G.dtype, device=G.device) @ G        # eq. (21)
                u = p.momentum * u + gbar                                              # eq. (22)
                x = x - p.lr * u                                                       # eq. (23)
            us.append(u)
            xs.append(x)
        b.u, b.xh = torch.stack(us), torch.stack(xs)
        b.send(torch.stack([b.u, b.xh], dim=1))                           # phase D: (u_hat_i, x_hat_i) out


def shapley_time(agent):
    """Agent's sampler of its Shapley computation's time (``agents.compute_time`` draws from its own stream)."""
    return agent.service(("pdsl.shapley_time", agent.id), lambda: agent.compute_time_draws("shapley", 0))


def coalitions(p: PDSLParams, x: torch.Tensor, G: torch.Tensor, rng: np.random.Generator) -> tuple:
    """Eqs. (15)-(17): the coalitions to value (exact or Monte-Carlo, ``shapley.plan``) and their candidate models
    x_{i,S} = x_i - gamma mean_{j in S} ghat_ji (and x_i itself for v(empty) = its utility). Returns (masks, the
    models as rows, the permutations)."""
    import torch

    n = G.shape[0]
    masks, perms = plan(n, exact_max=p.exact_max, R=p.permutations, rng=rng, stratified=p.sampling == "stratified")
    M = torch.zeros(len(masks), n, dtype=G.dtype, device=G.device)
    for r, m in enumerate(masks):
        idx = members(m)
        M[r, idx] = 1.0 / len(idx)
    W = x.unsqueeze(0) - p.lr * (M @ G)                                     # eq. (17): x_{i,S}
    if p.v_empty == "prev_model_acc":
        W = torch.cat([W, x.unsqueeze(0)])
    return masks, W, perms


def weights(p: PDSLParams, valued: tuple, masks: list[int], perms, omega: np.ndarray) -> tuple:
    """Eqs. (18)-(20) from the coalition models' (loss, accuracy): Shapley values, min-max normalised, divided by w.
    Returns (pi, phi, phi_hat)."""
    loss, acc = valued
    vals = (acc if p.utility == "val_acc" else -loss).tolist()
    v0 = vals.pop() if p.v_empty == "prev_model_acc" else 0.0
    table = dict(zip(masks, vals, strict=True))
    phi = from_values(len(omega), perms, table.__getitem__, v0)             # eq. (18) or (26)
    phi_hat = minmax(phi)                                                   # eq. (19)
    return pdsl_weights(phi_hat, omega, p.divide_by_omega, p.share_floor), phi, phi_hat  # eq. (20)
