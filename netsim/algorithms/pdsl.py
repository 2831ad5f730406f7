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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import attrs
import numpy as np
import simpy

from netsim.algorithms.registry import register
from netsim.algorithms.shapley import from_values, members, minmax, pdsl_weights, plan
from netsim.errors import InputError
from netsim.scenario.structure import at_least, field, nonneg, positive
from netsim.sim.services import Lookahead
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


def request_gradient(agent, p: DPGradientParams, params: torch.Tensor, rows: np.ndarray) -> simpy.Event:
    """The raw gradient (per_example: already the mean of clipped per-example gradients)."""
    if p.clip_mode == "per_example":
        return agent.gradient(params=params, rows=rows, clip=p.clip)
    return agent.gradient(params=params, rows=rows)


def release_gradient(agent, p: DPGradientParams, g: torch.Tensor, sigma: float, *, what: str = "gradient",
                     to: int = -1) -> torch.Tensor | None:
    """clip (batch mode, eq. 10/13) + N(0, sigma^2 I) (eq. 11/14) as one ledger release; None once the
    agent's budget cap is reached. Sensitivity is the add-or-remove one the accountants use."""
    from netsim.privacy.mechanisms import clip_l2

    if p.clip_mode == "batch":
        g, sens = clip_l2(g, p.clip), 2.0 * p.clip
    else:
        sens = p.clip / p.batch
    q = min(1.0, p.batch / len(agent.rows))
    return agent.privatize(g, sigma=sigma, sensitivity=sens, q=q, what=what, to=to)


def cross_gradients(agent, p: DPGradientParams, x: torch.Tensor, xi: np.ndarray, sigma: float, k: int,
                    tag: str, timeout: float | None = None, models: dict | None = None):
    """Phases 0, A, B of PDSL's Algorithm 1 (also DP-CGA's exchange). Returns (ghat_ii, {j: ghat_ji}):
    the own noisy gradient (eq. 11; None once the budget cap is reached) and the neighbours' noisy
    cross-gradients that arrived by the barrier. All gradients of the round use the same ``xi``
    and are requested at once (one batched call across the agents of the round). ``models``, if given,
    receives the neighbours' models x_j of phase A."""
    timeout = p.round_timeout if timeout is None else timeout
    yield agent.broadcast(x, tag=tag + ".model", round=k)                          # phase A
    got_models = yield agent.gather(tag=tag + ".model", round=k, timeout=timeout)
    if models is not None:
        models.update(got_models)
    models = got_models
    peers = sorted(models)
    evs = [request_gradient(agent, p, x, xi)] + [request_gradient(agent, p, models[j], xi) for j in peers]
    got = yield simpy.AllOf(agent.env, evs)                                        # eqs. (9), (12)
    own = release_gradient(agent, p, got[evs[0]], sigma, what="gradient")          # eqs. (10), (11)
    for j, ev in zip(peers, evs[1:], strict=True):
        reply = release_gradient(agent, p, got[ev], sigma, what="cross_gradient", to=j)  # eqs. (13), (14)
        if reply is not None:
            yield agent.send(j, reply, tag=tag + ".xgrad", round=k)               # phase B
    xgrads = yield agent.gather(tag=tag + ".xgrad", round=k, timeout=timeout)
    return own, xgrads


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


@register("pdsl", PDSLParams, check=lambda sim, params: check_setting(sim, params, validation=True))
def pdsl(agent, p: PDSLParams):
    """Returns the agent's program, sharing the simulation's coalition service."""
    return _pdsl(agent, p, coalition_service(agent))



def _pdsl(agent, p: PDSLParams, service: Lookahead):
    import torch
    i = agent.id
    sigma = resolve_sigma(agent, p)
    u_all = agent.shared_state("pdsl.u")                   # momentum buffers, u^[0] = 0
    shapley_time = agent.compute_time_draws("shapley", 0)
    perm_rng = agent.rng("shapley", 1)
    k = 0
    while True:
        yield agent.wake()
        if p.round_from == "clock":
            k = agent.tick()
        x = agent.params
        xi = agent.sample_rows(p.batch)                     # line 1: one mini-batch for the round
        own, xgrads = yield from cross_gradients(agent, p, x, xi, sigma, k, "pdsl")   # phases 0, A, B
        # phase C: Shapley weighting over the players that arrived (self first), momentum step
        players = ([i] if own is not None else []) + sorted(xgrads)
        u = u_all[i].clone()
        if players:
            G = torch.stack(([own] if own is not None else []) + [xgrads[j] for j in sorted(xgrads)])
            omega = np.array([agent.self_weight if j == i else agent.weights[j] for j in players])
            ct = shapley_time() * p.shapley_cost
            pi = yield from _weights(agent, p, service, x, G, omega, players, k, ct, perm_rng)
            gbar = torch.as_tensor(pi, dtype=G.dtype, device=G.device) @ G      # eq. (21)
            u = p.momentum * u + gbar                                          # eq. (22)
            x = x - p.lr * u                                                   # eq. (23)
        # phase D: gossip of momentum and model
        yield agent.broadcast(torch.stack([u, x]), tag="pdsl.mix", round=k)
        mix = yield agent.gather(tag="pdsl.mix", round=k, timeout=p.round_timeout)
        u_all[i] = agent.mix(u, {j: m[0] for j, m in mix.items()})             # eq. (24)
        agent.mix_into_params(x, {j: m[1] for j, m in mix.items()})            # eq. (25), batched
        k += 1


def _weights(agent, p: PDSLParams, service: Lookahead, x: torch.Tensor, G: torch.Tensor,
             omega: np.ndarray, players: list[int], k: int, ct: float, rng: np.random.Generator):
    """Eqs. (15)-(20): Shapley values of the players' candidate steps, normalised, divided by w.
    Every coalition model is valued in the agent's one request to the batched service."""
    import torch
    n = len(players)
    masks, perms = plan(n, exact_max=p.exact_max, R=p.permutations, rng=rng,
                        stratified=p.sampling == "stratified")
    M = torch.zeros(len(masks), n, dtype=G.dtype, device=G.device)
    for r, m in enumerate(masks):
        idx = members(m)
        M[r, idx] = 1.0 / len(idx)
    W = x.unsqueeze(0) - p.lr * (M @ G)                                     # eq. (17): x_{i,S}
    if p.v_empty == "prev_model_acc":
        W = torch.cat([W, x.unsqueeze(0)])
    loss, acc = yield service.request(agent.id, W, ct)
    vals = (acc if p.utility == "val_acc" else -loss).tolist()
    v0 = vals.pop() if p.v_empty == "prev_model_acc" else 0.0
    table = dict(zip(masks, vals, strict=True))
    phi = from_values(n, perms, table.__getitem__, v0)                      # eq. (18) or (26)
    phi_hat = minmax(phi)                                                   # eq. (19)
    pi = pdsl_weights(phi_hat, omega, p.divide_by_omega, p.share_floor)     # eq. (20)
    now = agent.env.now
    for j, a, b, c in zip(players, phi, phi_hat, pi, strict=True):
        agent.emit(ShapleyWeight(now, agent.id, j, k, float(c), float(a), float(b)))
    return pi
