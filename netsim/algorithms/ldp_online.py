"""Z. Chen and Y. Wang, "Locally differentially private distributed online learning with guaranteed
optimality" (arXiv 2306.14094), Algorithm 1, and the three baselines the paper compares it with:
S. Pu, A. Olshevsky and I. C. Paschalidis, "A sharp estimate on the transient time of distributed
stochastic gradient descent" (IEEE TAC 2021) [55]; C. Li, P. Zhou, L. Xiong, Q. Wang and T. Wang,
"Differentially private distributed online learning" (IEEE TKDE 2018) [45]; Z. Huang, S. Mitra and
N. Vaidya, "Differentially private distributed optimization" (ICDCN 2015) [30].

Every learner acquires ``per_round`` new samples per step from its own data stream
(netsim.compute.streaming) and broadcasts a Laplace-noised copy of its state, a release recorded in
the privacy ledger (``Agent.privatize(mechanism="laplace", to=-1)``: one draw per step, shared by all
outgoing copies) with its L1 sensitivity Delta_t, so ``netsim privacy`` composes exactly the paper's
Lemma 2 bound eps_i = sum_t Delta_t / rho_t from the run's own releases. Schedules are indexed by the
learner's own step count t (so they also make sense under asynchronous activation).

- ``ldp_online`` (Algorithm 1): d_t = history-averaged gradient over D_t (step 2),
  y_t = theta_t + Lap(rho_t), rho_t = (sigma/sqrt 2)(t+1)^varsigma_i (steps 3-4, A4),
  theta_{t+1} = Proj(theta_t + gamma_t sum_j w_ij (y_t^j - theta_t) - lambda_t d_t) (steps 6-7),
  lambda_t = lambda_0/(t+1)^v, gamma_t = gamma_0/(t+1)^u. Delta_t = sqrt(n) Phi_t with the
  sensitivity recursion of Thm 5 (eq. 22) Phi_{t+1} = (1 - w_ii gamma_t + L lambda_t)^+ Phi_t
  + C lambda_t/(t+1), with the self-weight w_ii this step actually had (missing neighbours shrink it).
- ``ldp_dsgd`` (B1, Pu et al. [55] as the paper compares it): gamma_t = 1, the current sample's
  gradient, Alg 1's noise and stepsize. Delta_t = sqrt(n) Psi_t, Psi_{t+1} = max(a_t Psi_t, C lambda_t)
  (the worst single-sample position; = sqrt(n) C lambda_{t-1} on the paper's ring).
- ``dola`` (B2, Li et al. [45], Alg. 1): b_t = sum_j A_ij (w_t^j + noise_j) with A = I + W and the
  node's own noisy copy; w_{t+1} = Proj(b_t - alpha grad l(b_t, xi_t)), alpha_s = alpha0/(s+1), the
  index s of the step taken at step t being ``step_index``: "t+1" (DOLA's Algorithm 1 writes
  alpha_{t+1}; the default) or "t"; noise Lap(noise0/(t+1)). The release of w_t records
  Delta_t = sqrt(n) C alpha_s of the step that produced it (b_{t-1} is post-processing of releases, so
  only xi_{t-1} moves w_t): sqrt(n) C alpha_t with "t+1", sqrt(n) C alpha_{t-1} with "t".
- ``pdop`` (B3, Huang et al. [30]): y = x + Lap(M p^t); v = sum_j A_ij y_j;
  x_{t+1} = Proj(v - gamma_t grad l(v, xi_t)); Delta_t = sqrt(n) C gamma_{t-1}.

Rounds: ``exchange="sync"`` broadcasts then waits for the step's messages with ``round_timeout``; a
missing neighbour's term is skipped (Alg 1: y_j taken as theta_i; baselines: its weight stays on the
own noisy copy). ``exchange="async"`` never waits: it mixes with the latest copy heard from each
neighbour (received values are fixed external input in Def. 2, so the accounting is unchanged).
Round 0's state theta_0 is data independent (Delta_0 = 0, D6): its noise is drawn from the same
generator but it is not a ledger release (Lemma 2 sums from t = 1); theta_0 itself is drawn at the
learner's first step.

All four are written once as barrier-round kernels (``OnlineLearner``: each step's rows for every learner of a
batch; releases through ``Batch.privatize`` with the Laplace mechanism), which both engines run; with
``exchange="async"`` the same steps run as each learner's barrier-free loop on the events engine. ``ldp_online`` and
``ldp_dsgd`` take their gradient before the exchange (in ``local``); ``dola`` and ``pdop`` (``MixedPointLearner``)
take it at the mixed point, after the exchange (``combine`` yields it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import attrs
import numpy as np

from netsim.algorithms.registry import register
from netsim.comm.patterns import drain
from netsim.compute.streaming import DataStreams, HistoryStream
from netsim.errors import InputError
from netsim.rounds import Batch, SyncKernel, SyncRounds
from netsim.rounds.kernel import drive
from netsim.scenario.structure import at_least, field, nonneg, positive
from netsim.sim.streams import register_purpose

if TYPE_CHECKING:
    import torch

TAG = "ldp"
register_purpose("data_stream", 71)  # each learner's online data stream (its historical code)


def _open_unit(v: float) -> str | None:
    return None if 0 < v < 1 else f"must be in (0, 1), got {v}"


@attrs.frozen
class Common:
    """Parameters every method of the family shares (defaults: the paper's mushrooms run, Sec. VII-A)."""

    w: float = field(0.3, check=positive, doc="coupling weight w_ij of each neighbour (paper: 0.3, ring)")
    radius: float = field(1e5, check=positive, doc="Theta = L2 ball of this radius (projection, D9)")
    per_round: int = field(1, check=at_least(1), doc="N_i: samples acquired per step (M2)")
    C: float = field(2 * math.sqrt(21), check=positive,
                     doc="A5 bound on ||grad l(.,xi) - grad l(.,xi')|| (mushrooms, no intercept: every row has "
                         "21 ones, so 2 sqrt 21; with an intercept 2 sqrt 22)")
    clip: bool = field(False, doc="clip per-sample gradients to C/2 (enforces A5 for any data)")
    L_acc: float = field(0.0, check=nonneg, doc="L in the sensitivity recursion (0: the shape of the paper's "
                                                "budget curves; the true L makes eq. 22 vacuous)")
    init: Literal["normal", "model"] = field("normal", doc="theta_0 ~ N(0, init_std^2 I) per learner (D5)")
    init_std: float = field(1.0, check=positive)
    exchange: Literal["sync", "async"] = field("sync", doc="barrier per step, or mix the latest copies")
    round_timeout: float = field(1.0, check=positive, doc="sync: seconds to wait for neighbours")


@attrs.frozen
class LDPOnlineParams(Common):
    lam0: float = field(1.0, check=positive, doc="lambda_0: lambda_t = lambda_0/(t+1)^v")
    v: float = field(0.77, check=_open_unit, doc="stepsize exponent (mushrooms 0.77)")
    gam0: float = field(1.0, check=positive, doc="gamma_0: gamma_t = gamma_0/(t+1)^u")
    u: float = field(0.65, check=lambda x: None if 0 <= x < 1 else f"must be in [0, 1), got {x}",
                     doc="coupling exponent (mushrooms 0.65; 0 = no coupling decay)")
    sigma: float = field(math.sqrt(2), check=positive, doc="sigma^i: rho_t = (sigma/sqrt 2)(t+1)^varsigma_i")
    varsigma0: float = field(0.1, check=nonneg, doc="varsigma_i = varsigma0 + varsigma_step (i + index_base)")
    varsigma_step: float = field(0.01, check=nonneg)
    index_base: int = field(0, check=nonneg, doc="learner index base in varsigma_i (D1: 0; paper literal 1)")
    noise: bool = field(True, doc="False: no Laplace noise and no releases (the noise-free method)")
    check_conditions: bool = field(True, doc="refuse schedules violating A4, eq. (4)")


@attrs.frozen
class DSGDParams(LDPOnlineParams):
    """B1: Alg 1's stepsize and noise, gamma_t = 1, current-sample gradient."""


@attrs.frozen
class DOLAParams(Common):
    alpha0: float = field(1.0, check=positive, doc="alpha_s = alpha0/(s+1) (DOLA's strongly convex step)")
    step_index: Literal["t+1", "t"] = field(
        "t+1", doc="the stepsize index at step t: 't+1' w_{t+1} = Proj(b_t - alpha_{t+1} grad), as DOLA's "
                   "Algorithm 1 writes it (first step alpha0/2); 't' alpha_t (first step alpha0)")
    noise0: float = field(0.35, check=nonneg, doc="Laplace scale noise0/(t+1) (paper's MNIST 0.07/0.2)")


@attrs.frozen
class PDOPParams(Common):
    c: float = field(1.0, check=positive, doc="stepsize constant")
    step: Literal["polynomial", "geometric"] = field(
        "polynomial", doc="gamma_t = c/(t+1)^q_exp, or c q^t as in [30] (B3: Fig. 1(c) needs polynomial)")
    q: float = field(0.95, check=_open_unit, doc="geometric stepsize ratio (q < p)")
    q_exp: float = field(0.77, check=positive, doc="polynomial stepsize exponent")
    M: float = field(0.5, check=nonneg, doc="Laplace scale M p^t (paper's MNIST 0.5 * 0.98^t)")
    p: float = field(0.98, check=_open_unit)


# --- shared pieces --------------------------------------------------------------------------------
def project(x: torch.Tensor, radius: float) -> torch.Tensor:
    """Euclidean projection onto the ball ||x|| <= radius (step 7)."""
    import torch
    nrm = float(torch.linalg.vector_norm(x))
    return x * (radius / nrm) if nrm > radius else x


def stream_of(agent, per_round: int = 1) -> HistoryStream:
    """The agent's data stream (its own ``data_stream`` random stream), in the run's ``DataStreams``."""
    return agent.service(DataStreams).open(agent.id, agent.rows, agent.rng("data_stream"), per_round)


def varsigma(agent, p: LDPOnlineParams) -> float:
    return p.varsigma0 + p.varsigma_step * (agent.id + p.index_base)


def check_schedule(sim, p: LDPOnlineParams) -> None:
    """A4 and eq. (4) for every learner's exponent (run before the simulation starts, as
    ``program.check``); the key names the parameter to change."""
    if not p.check_conditions:
        return
    m = sim.scenario.agents.count
    top = p.varsigma0 + p.varsigma_step * (m - 1 + p.index_base)
    if not 0.5 < p.u < p.v < 1:
        raise InputError("algorithm.u", f"need 1/2 < u < v < 1 (Thm 1), got u={p.u}, v={p.v}")
    if not (0 < p.varsigma0 + p.varsigma_step * p.index_base and top < 0.5 and top + 0.5 < p.u):
        raise InputError("algorithm.varsigma0", f"need 0 < varsigma_i < 1/2 and max_i varsigma_i + 1/2 < u "
                                                f"(A4, eq. 4): max varsigma_i = {top:g}, u = {p.u:g} "
                                                "(set check_conditions = false to run anyway)")


def release_rows(b, x: torch.Tensor, scales: list[float], sens: list[float]) -> torch.Tensor | list:
    """``release`` for every agent of a batch at its step ``b.k`` (rows; None where a budget cap refused): y = x +
    Lap(scale), a public ledger release for k >= 1 (one draw per learner and step, shared by its copies); step 0's state
    is data independent, so its noise is drawn but not released (D6, Lemma 2 sums from t = 1)."""
    if b.k == 0 or all(s <= 0 for s in sens):
        return x if all(c <= 0 for c in scales) else b.add_noise(x, scales, "laplace")
    if any(s <= 0 for s in sens):
        raise ValueError("a batch whose learners release and do not release in one step")
    return b.privatize(x, scales, sens, [1.0] * len(b), what="model", mechanism="laplace")


def coupling_rows(theta: torch.Tensor, got, w: float, start: torch.Tensor | None = None) -> torch.Tensor:
    """start + sum_j w (y^j - theta) of each row over the copies it received (start: zeros, or e.g. theta itself for
    sum_j A_ij y_j with A = I + W), in sender order (a missing neighbour's term is skipped, its weight staying on the
    own row): row by row the float operations of one learner's sum. Each slot s (every row's s-th sender) is one
    operation over the rows that have one; a windowed driver's arrivals are read as arrays (``by_sender``)."""
    import torch

    out = torch.zeros_like(theta) if start is None else start.clone()
    slots = by_sender(got)
    if slots is None:  # the copies as dicts (the events engine's batch of one)
        order = [sorted(g) for g in got]
        slots = []
        for s in range(max(map(len, order), default=0)):
            ns = [n for n, o in enumerate(order) if len(o) > s]
            slots.append((ns, torch.stack([got[n][order[n][s]] for n in ns])))
    for ns, ys in slots:
        if len(ns) == len(theta):
            out.add_(ys - theta, alpha=w)
        else:
            at = torch.as_tensor(ns, device=theta.device)
            out.index_copy_(0, at, out.index_select(0, at).add_(ys - theta.index_select(0, at), alpha=w))
    return out


def by_sender(got) -> list | None:
    """A windowed driver's ``got`` (``rounds.kernel.Arrivals`` whose payloads are one tensor) as slots: slot s = (the
    rows that received an s-th copy, ascending; those copies, each row's from its s-th sender in increasing sender
    id), what the dicts give in that order, without a dict per learner. None for dicts."""
    order = _sender_order(got)
    if order is None:
        return None

    sent = got.sent
    return [(recv, sent.index_select(0, send.to(sent.device))) for recv, send in order[4]]


def received(got) -> list[int]:
    """How many copies each learner of a batch received (its senders)."""
    order = _sender_order(got)
    return [len(g) for g in got] if order is None else order[2].tolist()


def _sender_order(got) -> tuple | None:
    """(receiver, sender position, copies per receiver, slot, and per slot its receivers and their senders' positions
    as a tensor) of each delivery of an ``Arrivals`` whose payloads are one tensor, by receiver, then sender id; None
    for dicts, or where a sender's copy arrived twice (its dict keeps one). A driver that hands over the same delivery
    arrays round after round (a static exchange) gets the order of the round before (``_ORDER``)."""
    from netsim.rounds.kernel import Arrivals

    if not isinstance(got, Arrivals) or got.sent is None:
        return None
    recv, send = got.recv, got.send
    kept = _ORDER[0]
    if kept is not None and kept[0] is recv and kept[1] is send and kept[2] == got.ids and kept[3] == len(got):
        return kept[4]
    import torch

    src = np.asarray(got.ids, dtype=np.int64)[send]
    by = np.lexsort((src, recv))
    r, s, src = recv[by], send[by], src[by]
    if len(r) > 1 and ((r[1:] == r[:-1]) & (src[1:] == src[:-1])).any():
        return None
    counts = np.bincount(r, minlength=len(got))
    slot = np.arange(len(r)) - (np.cumsum(counts) - counts)[r]
    slots = [(r[slot == k], torch.from_numpy(s[slot == k])) for k in range(int(counts.max(initial=0)))]
    order = (r, s, counts, slot, slots)
    if not (recv.flags.writeable or send.flags.writeable):  # (arrays never written: a driver's, kept across rounds)
        _ORDER[0] = (recv, send, list(got.ids), len(got), order)
    return order


_ORDER: list = [None]  # the last (recv, send, ids, receivers, order) of ``_sender_order`` on arrays never written


def project_rows(x: torch.Tensor, radius: float) -> torch.Tensor:
    """``project`` of each row (step 7). The batch's norms, computed at once, only screen: a row near or past the
    radius is decided and scaled by its own norm, as one learner's projection."""
    import torch

    near = (torch.linalg.vector_norm(x, dim=1) > radius * (1 - 1e-3)).nonzero().flatten().tolist()
    out = x
    for n in near:
        r = x[n]
        row = project(r, radius)
        if row is not r:
            out = x.clone() if out is x else out
            out[n] = row
    return out


class OnlineLearner(SyncKernel):
    """What Algorithm 1 and DSGD share: each learner's data stream, its noisy broadcast of the state and the projected
    update, in barrier rounds (``exchange = "sync"``) or on the latest copies (``"async"``, the events engine)."""

    pattern = SyncRounds(tag=TAG)
    reads = frozenset(f.name for f in attrs.fields(LDPOnlineParams)) - {"round_timeout"}
    per_row = frozenset({"d"})  # each learner's gradient, from ``local`` to ``combine``

    def init(self, agents, p):
        """Each learner's stream (opened in agent order: the ``tracking`` metric pools them in that order) and its
        sensitivity state (Phi_t, or Psi_t)."""
        return {"streams": [stream_of(a, p.per_round) for a in agents], "sens": [0.0] * len(agents)}

    def check(self, sim, p):
        check_schedule(sim, p)

    def rows(self, stream: HistoryStream) -> np.ndarray:
        """Step 1-2: acquire xi_t; the rows the step's gradient is taken on."""
        raise NotImplementedError

    def begin(self, b, p):
        """Step 0: theta_0^i ~ N(0, init_std^2 I), each learner's own draw (D5), or the model's."""
        if b.k == 0 and p.init == "normal":
            b.x = initial_rows(b, p)
            b.set_params(b.x)

    def local(self, b, p):
        st = b.state
        self.begin(b, p)
        rows = [self.rows(st["streams"][a.id]) for a in b.agents]
        b.d = yield b.gradients(b.x, rows, *((p.C / 2, "l2") if p.clip else ()))  # 2: grad at theta_t
        if not p.noise:
            b.send(b.x.clone())
            return
        n = b.x.shape[1]  # 3: y_t = theta_t + Lap(rho_t), rho_t = sigma / sqrt(2) (t+1)^varsigma_i (eq. 3)
        y = release_rows(b, b.x, [p.sigma / math.sqrt(2) * (b.k + 1) ** varsigma(a, p) for a in b.agents],
                         [math.sqrt(n) * st["sens"][a.id] for a in b.agents])
        b.send(y)  # 4 (a learner out of budget sends nothing: ``routes``)

    def routes(self, b, p):
        return ([], None) if b.out[0] is None else None

    def save_state(self, state):
        """A windowed checkpoint's part (``RoundKernel.save_state``): each learner's history D_t^i as row indices and
        its sensitivity. Each stream's generator is one of the run's streams, which the checkpoint keeps."""
        return {"histories": [s.history.tolist() for s in state["streams"]], "sens": list(state["sens"])}

    def load_state(self, state, saved):
        streams, sens = state["streams"], state["sens"]
        if not (isinstance(saved, dict) and set(saved) == {"histories", "sens"}
                and isinstance(saved["histories"], list) and len(saved["histories"]) == len(streams)
                and isinstance(saved["sens"], list) and len(saved["sens"]) == len(sens)
                and all(type(v) in (int, float) and math.isfinite(v) and v >= 0 for v in saved["sens"])):
            raise ValueError("kernel: not each learner's history and sensitivity")
        for stream, rows in zip(streams, saved["histories"], strict=True):
            stream.restore(rows)
        sens[:] = [float(v) for v in saved["sens"]]

    def refusal(self, sim, path):
        from netsim.rounds.windowed import budget_cap_refusal

        p, sc = sim.params, sim.world.scenario
        if p.exchange == "async":
            return ("exchange 'async' mixes the latest copies with no barrier: only barrier rounds (exchange 'sync') "
                    "have a fast path — set algorithm.exchange = \"sync\"")
        if "tracking" in sc.evaluation.metrics and sc.evaluation.every < sc.agents.activation.period:
            return ("the 'tracking' metric with evaluations closer than a round: a round's data streams advance "
                    "together in the windows — set evaluation.every >= agents.activation.period")
        return budget_cap_refusal(sim)

    def __call__(self, agent, p):
        """Barrier rounds (the pattern's program), or with ``exchange = "async"`` each step on the latest copies."""
        return self.pattern.program(self, agent, p) if p.exchange == "sync" else self.latest_copies(agent, p)

    def latest_copies(self, agent, p):
        """``exchange = "async"``: each step broadcasts, then mixes the latest copy heard from each neighbour (received
        values are fixed external input in Def. 2, so the accounting is unchanged); the same steps as the rounds."""
        state = self.state_of(agent, p)
        b = Batch([agent], 0, None, None, state)
        copies: dict[int, torch.Tensor] = {}
        heard: dict[int, int] = {}
        k = 0
        while True:
            yield agent.wake()
            b.renew(k, agent.params, None)
            local = self.local(b, p)
            if local is not None:  # a gradient before the exchange (Algorithm 1, DSGD)
                yield from drive(agent, local)
            if b.out[0] is not None:
                yield agent.broadcast(b.out[0], tag=TAG, round=k)
            for m in drain(agent, TAG):
                if m.round >= heard.get(m.src, -1):
                    heard[m.src], copies[m.src] = m.round, m.payload
            after = self.combine(b, p, [dict(copies)])
            if after is not None:  # the gradient at the mixed point (DOLA, PDOP)
                yield from drive(agent, after)
            k += 1


def initial_rows(b, p: Common) -> torch.Tensor:
    """theta_0 of each learner of a batch: N(0, init_std^2 I) from its ``algorithm`` stream (D5)."""
    import torch

    z = np.stack([a.rng("algorithm").normal(0.0, p.init_std, b.x.shape[1]) for a in b.agents])
    return torch.as_tensor(z, dtype=b.x.dtype, device=b.x.device)


# --- Algorithm 1 ------------------------------------------------------------------------------------
@register("ldp_online", LDPOnlineParams)
class LDPOnline(OnlineLearner):
    """Locally private distributed online learning (Chen and Wang, Algorithm 1): each step, a
    history-averaged gradient, a Laplace-noised broadcast of the state, a projected consensus and gradient
    step (steps 1-7; eqs. 3-4 schedules, Thm 5 eq. 22 sensitivity)."""

    def rows(self, stream):
        stream.next()                                                          # 1: xi_t into D_t
        return stream.history                                                  # 2: f_t's gradient over D_t

    def combine(self, b, p, got):
        k = b.k
        lam, gam = p.lam0 / (k + 1) ** p.v, p.gam0 / (k + 1) ** p.u
        b.set_params(project_rows(b.x + gam * coupling_rows(b.x, got, p.w) - lam * b.d, p.radius))  # 5-7
        sens = b.state["sens"]  # Phi_t: L2 gap after one differing sample (Thm 5 proof)
        for a, m in zip(b.agents, received(got), strict=True):
            w_ii = p.w * m  # |w_ii| this step: a missing neighbour's term was skipped
            sens[a.id] = max(0.0, 1 - w_ii * gam + p.L_acc * lam) * sens[a.id] + p.C * lam / (k + 1)  # eq. (22)


@register("ldp_dsgd", DSGDParams)
class LDPDSGD(OnlineLearner):
    """DSGD (Pu, Olshevsky, Paschalidis, IEEE TAC 2021; Chen and Wang's baseline B1, ref. [55]) with
    Laplace-noised states: the Laplacian form of Alg. 1 with gamma_t = 1 and the newest sample's gradient."""

    def rows(self, stream):
        return stream.next()  # the newest sample only

    def combine(self, b, p, got):
        lam = p.lam0 / (b.k + 1) ** p.v
        b.set_params(project_rows(b.x + coupling_rows(b.x, got, p.w) - lam * b.d, p.radius))
        sens = b.state["sens"]  # Psi_t: the worst gap over the position of the differing sample
        for a, m in zip(b.agents, received(got), strict=True):
            c = max(0.0, 1 - p.w * m + p.L_acc * lam)
            sens[a.id] = max(c * sens[a.id], p.C * lam)


class MixedPointLearner(OnlineLearner):
    """What DOLA and PDOP share: each step acquires xi_t and releases its state y_t = x_t + Lap(scale_t) (``local``),
    mixes the noisy copies v_t = sum_j A_ij y_t^j with A = I + W, its own noisy copy included (a missing neighbour's
    weight stays on it), and takes a projected step on the newest sample's gradient at the mixed point
    x_{t+1} = Proj(v_t - a_t grad l(v_t, xi_t)) (``combine``, its gradient asked after the exchange). The release of
    x_t records the L1 sensitivity sqrt(n) C a_{t-1} of the step that produced it (v_{t-1} is post-processing of
    releases, so only xi_{t-1} moves x_t)."""

    per_row = frozenset({"y", "new"})  # each learner's noisy copy and newest sample, from ``local`` to ``combine``

    def check(self, sim, p):
        """No schedule conditions (those of A4 are Algorithm 1's)."""

    def scale(self, p, k: int) -> float:
        """The Laplace scale of step k's release."""
        raise NotImplementedError

    def step(self, p, k: int) -> float:
        """a_k, the stepsize of step k."""
        raise NotImplementedError

    def local(self, b, p):
        st = b.state
        self.begin(b, p)
        b.new = [st["streams"][a.id].next() for a in b.agents]  # acquire xi_t
        k, n, B = b.k, b.x.shape[1], len(b)
        sens = math.sqrt(n) * p.C * self.step(p, k - 1) if k else 0.0  # the step that made x_k
        y = release_rows(b, b.x, [self.scale(p, k)] * B, [sens] * B)  # y_t = x_t + Lap(scale_t)
        # a learner out of budget sends nothing (``routes``) and mixes its own clean state
        b.y = y if not isinstance(y, list) else b.stack([x if r is None else r for x, r in zip(b.x.unbind(0), y,
                                                                                                strict=True)])
        b.send(y)

    def combine(self, b, p, got):
        v = coupling_rows(b.y, got, p.w, start=b.y)  # v_t = sum_j A_ij y_t^j, A = I + W
        g = yield b.gradients(v, b.new, *((p.C / 2, "l2") if p.clip else ()))  # grad l(v_t, xi_t)
        b.set_params(project_rows(v - self.step(p, b.k) * g, p.radius))  # x_{t+1} = Proj(v_t - a_t grad)


def dola_step_shift(p: DOLAParams) -> int:
    """1 when step t uses alpha_{t+1} (DOLA's Algorithm 1), 0 when it uses alpha_t."""
    return 1 if p.step_index == "t+1" else 0


def dola_alpha(p: DOLAParams, s: int) -> float:
    """alpha_s = alpha0 / (s + 1), s >= 0."""
    return p.alpha0 / (s + 1)


@register("dola", DOLAParams)
class DOLA(MixedPointLearner):
    """DOLA (Li, Zhou, Xiong, Wang, Wang, "Differentially private distributed online learning", IEEE TKDE
    2018, Alg. 1; Chen and Wang's baseline B2, ref. [45]): mix the noisy states, b_t = sum_j A_ij (w_t^j +
    noise_j), then a projected gradient step at the mixed point, w_{t+1} = Proj(b_t - alpha_{t+1} grad l(b_t, xi_t))
    (step_index "t+1"; "t": alpha_t); noise Lap(noise0/(t+1))."""

    reads = frozenset(f.name for f in attrs.fields(DOLAParams)) - {"round_timeout"}

    def scale(self, p, k):
        return p.noise0 / (k + 1)

    def step(self, p, k):
        return dola_alpha(p, k + dola_step_shift(p))  # alpha_{t+1} or alpha_t


@register("pdop", PDOPParams)
class PDOP(MixedPointLearner):
    """PDOP (Huang, Mitra, Vaidya, "Differentially private distributed optimization", ICDCN 2015; Chen and
    Wang's baseline B3, ref. [30]): y = x + Lap(M p^t); v = sum_j A_ij y_j; x_{t+1} = Proj(v - gamma_t grad l(v,
    xi_t)), gamma_t = c/(t+1)^q_exp or c q^t."""

    reads = frozenset(f.name for f in attrs.fields(PDOPParams)) - {"round_timeout"}

    def scale(self, p, k):
        return p.M * p.p ** k

    def step(self, p, k):
        return p.c / (k + 1) ** p.q_exp if p.step == "polynomial" else p.c * p.q ** k
