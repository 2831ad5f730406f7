"""DO-ADP and its baselines (docs/reproductions/do-adp.md).

Huo, Liu, Ding, Johansson, Shi, "Decentralized Optimization with Amplified Differential Privacy via
Efficient Communication" (arXiv 2506.07102), Algorithm 1 with eq. (5), round t at agent i:
    eta_{i,t} ~ Bern(p)                          (the scenario's Bernoulli activation; inactive = asleep)
    cons_i = sum_j w_ij (xhat_j - xhat_i)        (public copies at the START of round t)
    active:   m <- clip(g) + N(0, sigma^2 I) + beta m                      (5a)
              x <- x - alpha m + gamma cons_i                              (5b)
              s = TopK(x - xhat_i); send s to all neighbours; xhat_i += s   (5c)
    inactive: m <- beta m;  x <- x + gamma cons_i  (Alg. 1, lines 11-12; no gradient, noise or send)
    all:      xhat_j += s_j for every neighbour j that sent in round t      (5d)
The gradient is clipped coordinate-wise to +-G/sqrt(d) (Assumption 2; this gives the top-k sensitivity
2G sqrt(k/d) of eq. (6)). sigma is given, or calibrated from epsilon by Theorem 1, eq. (7)
(``netsim.privacy.closed_forms.do_adp_theorem1_sigma``). The CHOCO machinery is ``comm.PublicCopies``
with the ``comm.Compressor`` top-k (Koloskova et al. 2019), no extra error-feedback buffer: the residual
x - xhat is the memory.

Execution (a round kernel of the ticked-rounds pattern, rounds/ticks.py, so both engines run it and
``--engine windowed`` plays it as lookahead windows). The scenario's Bernoulli activation wakes an agent only
on its active ticks; the rounds it slept through are replayed when it wakes (their consensus steps and
momentum decay, with the copies as they were then: neighbours' messages are bucketed by round and applied in
round order). A message that arrives after its round was replayed is late: it is dropped and counted
(``do_adp_late``), and that replica then differs from the sender's (the paper assumes reliable,
round-synchronous links, Sec. II). Silence is read as inactivity. The agent finishes after ``rounds`` ticks (T).

Privacy. Each active round releases the noisy gradient through ``Agent.privatize`` with sampling rate
B/q and the scenario's activation p (the ledger). Recorded sensitivity: ``sensitivity = "topk"`` is the
paper's Delta = 2G sqrt(k/d) (replace-one, eq. 6) with the integer k actually kept (``k_rounding``);
``"full"`` is 2G (the conservative reading: the top-k support is data dependent and never privatised).
``[privacy] closed_form = "do_adp"`` reports the paper's epsilon (Lemmas 1, 4, 5) and the conservative one;
dp-accounting's RDP/PLD give the rigorous numbers.

Baselines (the paper gives no update rules; all **[reconstructed]** from the cited works): ``dpdo`` (Huang, Mitra,
Vaidya 2015: Laplace-perturbed states, geometric schedules), ``dp_dda`` (Liu, Johansson, Shi 2024:
node-sampled private dual averaging) and ``cpgt`` (Xie, Yi, Wang, Cao, Ren 2023: compressed gradient
tracking with Laplace-perturbed public copies of x and y).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import attrs

from netsim.algorithms.registry import register
from netsim.comm.compression import PUBLIC_COPIES, Compressor, KRounding, PublicCopyRows, kept_count
from netsim.errors import InputError
from netsim.privacy import closed_forms as cf
from netsim.rounds import SyncKernel, SyncRounds
from netsim.rounds.kernel import GradientRequest
from netsim.rounds.ticks import TickKernel, Ticks
from netsim.scenario.schema import PrivacySpec
from netsim.scenario.structure import at_least, field, fraction, nonneg, positive

if TYPE_CHECKING:
    import torch


def _opt_pos(v: float | None) -> str | None:
    return None if v is None or v > 0 else f"must be > 0, got {v}"


def _opt_nonneg(v: float | None) -> str | None:
    return None if v is None or v >= 0 else f"must be >= 0, got {v}"


def finish(agent):
    """End this agent's program after its own round count (an algorithm-defined horizon): trace the
    Finish and let the run stop when every agent is done, as ``Agent.wake`` does at ``run.rounds``."""
    yield agent.finish()


def activation_p(agent) -> float:
    return agent.activation_probability


def privacy_spec(agent) -> PrivacySpec:
    return agent.scenario.privacy or PrivacySpec()


def tick_of(agent, at: float) -> int:
    """0-based round index of the activation tick at local time ``at`` (ticks are at multiples of the
    period, the first at 1 period)."""
    return agent.tick(at) - 1


# --------------------------------------------------------------------------------------------------
@attrs.frozen
class DOADPParams:
    rounds: int = field(6000, check=at_least(1), doc="T: rounds (activation ticks); the agent stops after T")
    lr: float = field(0.03, check=nonneg, doc="alpha, SGD step size")
    beta: float = field(0.15, check=lambda v: None if 0 <= v < 1 else f"must be in [0, 1), got {v}",
                        doc="momentum beta")
    gamma: float = field(0.05, check=fraction, doc="consensus step size gamma")
    ratio: float = field(1.0, check=fraction, doc="k/d of the top-k sparsifier (1 = dense messages)")
    k_rounding: KRounding = field("ceil", doc="k = ratio * d rounded: ceil, floor or round (half up)")
    batch: int = field(1, check=at_least(0), doc="B samples per gradient (paper: 1; 0 = full local batch)")
    clip: float = field(1.0, check=nonneg, doc="G: coordinates clipped to +-G/sqrt(d) (0 = no clipping)")
    clip_kind: Literal["coordinate", "l2"] = field("coordinate", doc="coordinate (paper, A2) or l2 norm G")
    sigma: float | None = field(None, check=_opt_nonneg, doc="noise std (overrides epsilon)")
    epsilon: float | None = field(None, check=_opt_pos, doc="target epsilon: sigma from eq. (7)")
    noise_scaling: Literal["p2k_over_d", "pk_over_d"] = field(
        "p2k_over_d", doc="eq. (7) as printed (p^2 k/d), or p k/d (the Fig. 3 text's 'noise reduced by 24%')")
    sensitivity: Literal["topk", "full"] = field("topk", doc="recorded sensitivity: 2G sqrt(k/d) or 2G")


def _eq7_sigma(agent, p: DOADPParams | DPDDAParams, k_over_d: float, p_act: float, batch: int = 1,
              noise_scaling: str = "p2k_over_d") -> float:
    """p.sigma if given (e.g. the non-private reference, sigma = 0), else Theorem 1's eq. (7) for p.epsilon
    over p.rounds with clip G = p.clip (DO-ADP and DP-DDA)."""
    if p.sigma is not None:
        return p.sigma
    if p.epsilon is None:
        raise InputError("algorithm.epsilon", "give epsilon (eq. (7) calibration) or sigma")
    if p.clip <= 0:
        raise InputError("algorithm.clip", "eq. (7) needs a clip bound G > 0")
    try:
        return cf.do_adp_theorem1_sigma(p.epsilon, privacy_spec(agent).delta0, len(agent.rows), p.rounds,
                                         p.clip, k_over_d, p_act, batch, noise_scaling, strict=False).sigma
    except cf.ClosedFormError as e:
        raise InputError("algorithm.epsilon", e.message) from None


@register("do_adp", DOADPParams, fixed_topology=PUBLIC_COPIES)
class DOADP(TickKernel):
    """DO-ADP (Huo, Liu, Ding, Johansson, Shi, Algorithm 1 with eq. (5)): agents active with probability p
    take a clipped, noised momentum step and send a top-k compressed difference to public copies; privacy is
    amplified by the activation and the compression (Theorem 1).

    A kernel of the ticked-rounds pattern (rounds/ticks.py: the activation, the rounds slept through, the
    messages bucketed by round, the release, the finish at T), so ``--engine windowed`` plays it as lookahead
    windows. Its state: the public copies (``comm.PublicCopyRows``), the momentum rows and each agent's release."""

    pattern = Ticks(tag="do_adp", late="do_adp_late")
    reads = frozenset(f.name for f in attrs.fields(DOADPParams))

    def check(self, sim, p: DOADPParams) -> None:
        """Before the run: ticks to count rounds by, and eq. (7)'s calibration (every agent's sigma)."""
        for a in sim.loop.agents:
            if a.activation_period is None:  # its schedule has no ticks (Poisson, or a plugin's without a period)
                raise InputError("agents.activation.kind", "do_adp runs in rounds: use 'bernoulli' or 'periodic'")
        for a in sim.loop.agents:
            _release(a, p)

    def init(self, agents, p: DOADPParams) -> _State:
        comps = [Compressor("none" if kd >= 1 else "topk", p.ratio, rounding=p.k_rounding)
                 for kd in (realised_k_over_d(a.params.numel(), p.ratio, p.k_rounding) for a in agents)]
        return _State(PublicCopyRows(agents, comps, p.gamma), agents[0].shared_state("do_adp_momentum"), {})

    def request(self, state: _State, p: DOADPParams) -> GradientRequest:
        """B samples, the per-sample gradients clipped to +-G/sqrt(d) (or to L2 norm G)."""
        d = state.m.shape[1]
        clip = None if p.clip == 0 else p.clip / math.sqrt(d) if p.clip_kind == "coordinate" else p.clip
        return GradientRequest.of(p.batch, clip, p.clip_kind)

    def horizon(self, p: DOADPParams) -> int:
        return p.rounds

    def noise(self, state: _State, agent, p: DOADPParams) -> tuple[float, float, float]:
        r = state.release.get(agent.id)
        if r is None:
            r = state.release[agent.id] = _release(agent, p)
        return r

    def copies(self, state: _State) -> PublicCopyRows:
        return state.pc

    def sleep(self, b, p: DOADPParams) -> None:
        """An inactive round (Alg. 1, lines 11-12): m <- beta m; x <- x + gamma sum_j w_ij (xhat_j - xhat_i)."""
        st, idx = b.state, b.index()
        st.m.index_copy_(0, idx, st.m.index_select(0, idx).mul_(p.beta))
        b.x = _consensus(st.pc, b.agents, b.x)

    def step(self, b, p: DOADPParams, noisy):
        """An active round with the noisy gradients g + theta (5a-5c); the copies as at the start of the round."""
        st, idx = b.state, b.index()
        m = st.m.index_select(0, idx).mul_(p.beta).add_(noisy)             # (5a)
        st.m.index_copy_(0, idx, m)
        b.x = _consensus(st.pc, b.agents, b.x) - p.lr * m                  # (5b)
        return st.pc.delta(b.agents, b.x)                                  # (5c), own copies updated


@attrs.frozen
class _State:
    pc: PublicCopyRows
    m: torch.Tensor  # the momentum rows, in the bank (checkpoints)
    release: dict[int, tuple[float, float, float]]  # each agent's (sigma, sensitivity, q), made when first asked


def _release(agent, p: DOADPParams) -> tuple[float, float, float]:
    """The agent's gradient release: sigma (given, or eq. (7)), the recorded sensitivity (eq. (6) or 2G) and the
    sampling rate B/q."""
    kd = realised_k_over_d(agent.params.numel(), p.ratio, p.k_rounding)
    B = p.batch or len(agent.rows)
    sigma = _eq7_sigma(agent, p, kd, activation_p(agent), B, p.noise_scaling)
    G = p.clip
    return sigma, cf.do_adp_sensitivity(G if G > 0 else 1.0, kd, p.sensitivity, B), min(1.0, B / len(agent.rows))


def _consensus(pc: PublicCopyRows, agents, x):
    """x + gamma sum_j w_ij (xhat_j - xhat_i) of each row, in ``compute.mixing``'s operations."""
    from netsim.compute.mixing import evaluate

    return evaluate(pc.consensus(agents, x), x.dtype)[1]


def realised_k_over_d(d: int, ratio: float, rounding: str) -> float:
    """The realised k/d of top-k with k = ratio * d rounded to an integer (eqs. (6), (7) take this k)."""
    return kept_count(d, ratio, rounding) / d


# --------------------------------------------------------------------------------------------------
@attrs.frozen
class DPDOParams:
    epsilon: float = field(0.01, check=positive, doc="total pure epsilon (Laplace, basic composition)")
    lr: float = field(0.03, check=positive, doc="c: step a_t = c rho_s^t")
    rho_s: float = field(0.999, check=fraction, doc="step decay rho_s")
    rho_n: float = field(0.9995, check=fraction, doc="noise decay rho_n > rho_s")
    clip: float = field(1.0, check=positive, doc="C: coordinates clipped to +-C/sqrt(d)")
    batch: int = field(1, check=at_least(1), doc="samples per stochastic gradient")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for neighbours each round")


@register("dpdo", DPDOParams)
class DPDO(SyncKernel):
    """DPDO [reconstructed] (Huang, Mitra, Vaidya 2015): broadcast y = x + Lap(b_t),
    v_i = sum_j w_ij y_j (own y included), x = v - a_t grad(v). a_t = c rho_s^t, b_t = 2 C sqrt(d) c
    rho_n^t / (eps (rho_n - rho_s)); the release's L1 sensitivity is 2 C sqrt(d) a_t, so
    the per-round epsilons sum to rho_n eps < eps (Huang et al.'s own constant may differ by rho_n).

    Round t of agent i as barrier rounds whose gradient comes after the exchange, at the mixed point
    (``combine`` yields it): an agent whose budget cap is reached sends nothing more and takes its step
    from its own state (y = x, nothing received)."""

    pattern = SyncRounds(tag="model")
    reads = frozenset({"epsilon", "lr", "rho_s", "rho_n", "clip", "batch"})
    per_row = frozenset({"y"})  # each agent's released state, from local to combine

    def init(self, agents, p):
        return {"spent": set()}  # agents out of budget: they exchange nothing more

    def check(self, sim, p):
        if not p.rho_s < p.rho_n:
            raise InputError("algorithm.rho_n", f"needs rho_s < rho_n, got {p.rho_s} >= {p.rho_n}")

    def local(self, b, p):
        d, B = b.x.shape[1], len(b)
        a_t = p.lr * p.rho_s**b.k
        b_t = 2 * p.clip * math.sqrt(d) * p.lr * p.rho_n**b.k / (p.epsilon * (p.rho_n - p.rho_s))
        y = b.privatize(b.x, [b_t] * B, [2 * p.clip * math.sqrt(d) * a_t] * B, [1.0] * B, what="state",
                        mechanism="laplace")                         # y_i = x_i + Lap(b_t)
        out = b.refused(y)
        if out:                                                      # budget cap: nothing more leaves the agent
            b.state["spent"].update(out)
            y = [x if r is None else r for x, r in zip(b.x.unbind(0), y, strict=True)]
        b.y = b.stack(y)
        b.send(b.y)

    def combine(self, b, p, got):
        d = b.x.shape[1]
        a_t = p.lr * p.rho_s**b.k
        v = b.mix(b.y, got)                                          # v_i = sum_j w_ij y_j
        g = yield b.gradients(v, b.sample_rows(p.batch), clip=p.clip / math.sqrt(d), clip_kind="coordinate")
        b.set_params(v - a_t * g)                                    # x_i = v_i - a_t grad f_i(v_i)

    def refusal(self, sim, path):
        from netsim.rounds.windowed import budget_cap_refusal

        return budget_cap_refusal(sim)  # an agent out of budget leaves the round's exchange

    def __call__(self, agent, p):
        """The events engine's program; under a budget cap, that of the variant whose agents out of budget
        exchange nothing more (its own routes: asked each round, which the windows need not pay for)."""
        kernel = self if privacy_spec(agent).epsilon_cap is None else _CAPPED
        return self.pattern.program(kernel, agent, p)


class _DPDOCapped(DPDO):
    """DPDO under a budget cap (events engine only): an agent out of budget sends nothing and waits for no one."""

    def routes(self, b, p):
        if b.agents[0].id in b.state["spent"]:
            return [], []                                            # no exchange: v = y = x
        return None


_CAPPED = _DPDOCapped()


# --------------------------------------------------------------------------------------------------
@attrs.frozen
class DPDDAParams:
    rounds: int = field(6000, check=at_least(1), doc="T (for the eq. (7) calibration)")
    sample_p: float = field(0.24, check=fraction, doc="p_s: probability an agent uses a gradient this round")
    kappa0: float = field(30.0, check=positive, doc="kappa_t = kappa0 sqrt(t+1) (proximal weight)")
    lam: float = field(0.0, check=nonneg, doc="h(x) = lam/2 ||x||^2 (A_t = t+1)")
    clip: float = field(1.0, check=positive, doc="G: coordinates clipped to +-G/sqrt(d)")
    sigma: float | None = field(None, check=_opt_nonneg, doc="noise std; default eq. (7) with k = d, p = p_s")
    epsilon: float | None = field(None, check=_opt_pos, doc="target epsilon for the calibration")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for neighbours each round")


def dp_dda_sigma(agent, p: DPDDAParams) -> float:
    """The noise std of agent's releases: p.sigma, else eq. (7) with k = d at p = max(1/2, p_s), scaled down to p_s
    below 1/2 (eq. (7) needs p >= 1/2: p^2 becomes p_s^2)."""
    sigma = _eq7_sigma(agent, p, 1.0, max(0.5, p.sample_p))  # k = d
    if p.sigma is None and p.sample_p < 0.5:
        sigma *= p.sample_p / 0.5
    return sigma


@register("dp_dda", DPDDAParams)
class DPDDA(SyncKernel):
    """DP-DDA [reconstructed] (Liu, Johansson, Shi, Automatica 2024): each round an agent
    is sampled with probability p_s and perturbs one single-sample gradient (else g = 0); dual averaging
    z_{t+1} = sum_j w_ij z_j + g, x_{t+1} = -z_{t+1} / (A_t lam + kappa_t). Every agent sends its dense z
    every round (100% communication). Releases are recorded at rate B/q (the sampling is visible in z:
    no amplification credited).

    Round t of agent i as barrier rounds: the sampling draw at activation, z_t sent at once (it does not depend
    on g_t), then after the exchange the sampled agent's gradient at x_t (the same point and value as before
    it: ``combine`` yields it), its release, and the update. The agent finishes after ``rounds`` rounds (T)."""

    pattern = SyncRounds(tag="model")
    reads = frozenset({"rounds", "sample_p", "kappa0", "lam", "clip", "sigma", "epsilon"})
    per_row = frozenset({"z", "sampled"})  # each agent's z_t as sent, and whether it is sampled this round

    def init(self, agents, p):  # z_i of every agent (the bank's rows) and each one's noise std
        return {"z": agents[0].shared_state("dp_dda_dual"), "sigma": {a.id: dp_dda_sigma(a, p) for a in agents}}

    def check(self, sim, p):
        for a in sim.loop.agents:  # the calibration's checks, before the run
            dp_dda_sigma(a, p)

    def horizon(self, p, state):
        return p.rounds                                                  # T rounds, then the agent finishes

    def local(self, b, p):
        b.sampled = [a.rng().random() < p.sample_p for a in b.agents]   # node sampling, p_s
        z = b.state["z"]                                                 # z_t (a copy)
        b.z = z[b.agents[0].id].unsqueeze(0).clone() if len(b) == 1 else z.index_select(0, b.index())
        b.send(b.z)

    def combine(self, b, p, got):
        import torch

        d, k = b.x.shape[1], b.k
        g = torch.zeros_like(b.x)
        ns = [n for n, s in enumerate(b.sampled) if s]
        if ns:
            rows = [a.sample_rows(1) if s else None for a, s in zip(b.agents, b.sampled, strict=True)]
            raw = yield b.gradients(b.x, rows, clip=p.clip / math.sqrt(d), clip_kind="coordinate")  # at x_t
            part = b.part(ns)
            sig = [b.state["sigma"][a.id] for a in part.agents]
            noisy = part.privatize(raw[ns] if len(ns) < len(b) else raw, sig, [2 * p.clip] * len(ns),
                                   [1.0 / len(a.rows) for a in part.agents], what="gradient")
            for n, r in zip(ns, noisy, strict=True):
                if r is not None:                                         # (else budget cap: g = 0)
                    g[n] = r
        z = b.mix(b.z, got) + g                                           # z_{t+1} = sum_j w_ij z_j + g
        if len(b) == 1:
            b.state["z"][b.agents[0].id].copy_(z[0])
        else:
            b.state["z"].index_copy_(0, b.index(), z)
        b.set_params(-z / ((k + 1) * p.lam + p.kappa0 * math.sqrt(k + 1)))  # x_{t+1}

    def refusal(self, sim, path):
        from netsim.rounds.windowed import budget_cap_refusal

        return budget_cap_refusal(sim)


# --------------------------------------------------------------------------------------------------
@attrs.frozen
class CPGTParams:
    rounds: int = field(6000, check=at_least(1), doc="T: rounds; the agent stops after T (and eps is split over T)")
    lr: float = field(0.03, check=positive, doc="eta: gradient-tracking step (default: eta = alpha)")
    gamma: float = field(0.05, check=fraction, doc="consensus step size on the public copies")
    ratio: float = field(0.12, check=fraction, doc="k/d of the top-k sparsifier, per variable (paper: 0.12 x 2 = 24%)")
    k_rounding: KRounding = field("ceil", doc="k = ratio * d rounded: ceil, floor or round (half up)")
    batch: int = field(1, check=at_least(0), doc="samples per stochastic gradient (0 = full local batch)")
    clip: float = field(1.0, check=nonneg, doc="C: coordinates clipped to +-C/sqrt(d) (0 = no clipping)")
    epsilon: float | None = field(0.01, check=_opt_pos, doc="total pure epsilon (Laplace, basic composition)")
    sigma: float | None = field(None, check=_opt_nonneg, doc="fixed Laplace scale on x and y (overrides epsilon)")
    round_timeout: float = field(1.0, check=positive, doc="seconds to wait for neighbours each round")


@register("cpgt", CPGTParams, fixed_topology=PUBLIC_COPIES)
class CPGT(SyncKernel):
    """CPGT [reconstructed] (Xie, Yi, Wang, Cao, Ren 2023, "Compressed differentially private distributed
    optimization with linear convergence"). Gradient tracking
    with x and the tracker y both exchanged as CHOCO compressed differences against public copies:
        xhat += C(x + xi^x - xhat),  yhat += C(y + xi^y - yhat)      (Laplace xi, then top-k)
        x_{t+1} = x_t + gamma sum_j w_ij (xhat_j - xhat_i) - eta y_t
        y_{t+1} = y_t + gamma sum_j w_ij (yhat_j - yhat_i) + g(x_{t+1}) - g(x_t),   y_0 = g(x_0).
    The copies are refreshed at the start of round t from (x_t, y_t), which is an end-of-round
    refresh of round t-1 plus one initial exchange of (x_0, y_0). gamma = 1, k = d, no noise: x_hat = x,
    y_hat = y, i.e. plain gradient tracking x_{t+1} = W x_t - eta y_t (DIGing; Nedic, Olshevsky, Shi 2017).

    Calibration [reconstructed] (the DO-ADP paper does not give CPGT's noise schedule): pure eps by
    basic composition over the 2T Laplace releases, each spending eps / (2T). Replace-one adjacency, a
    clipped gradient moves by at most 2 C sqrt(d) in L1. Given the same released copies, y_t - y'_t =
    g_t - g'_t (telescoping with y_0 = g_0), so Delta^y = 2 C sqrt(d); x_t - x'_t = -eta sum_{s<t}
    (g_s - g'_s), so Delta^x_t = 2 C sqrt(d) eta max(t, 1). The Laplace scale is b = Delta 2T / eps per
    release; the x noise grows linearly in t because the step is constant. No amplification (q = 1).

    Round t of agent i as barrier rounds: g(x_0) before round 0's releases (``first_gradient``), the two releases
    and the two compressed differences sent at once (tags ``cpgt_x`` then ``cpgt_y``, one exchange of two messages
    gathered tag by tag), then after the exchange the update of x, the gradient g(x_{t+1}) at the new point
    (``combine`` yields it) and the tracker's update. An agent whose budget cap is reached sends nothing more and
    mixes what still arrives. The agent finishes after ``rounds`` rounds (T)."""

    pattern = SyncRounds(tag="cpgt_x", more=("cpgt_y",))
    reads = frozenset({"rounds", "lr", "gamma", "ratio", "k_rounding", "batch", "clip", "epsilon", "sigma"})
    first_gradient = True  # y_0 = g(x_0)

    def check(self, sim, p: CPGTParams) -> None:
        if p.sigma is None and p.epsilon is None:
            raise InputError("algorithm.epsilon", "give epsilon (pure-DP calibration) or sigma")
        if p.sigma is None and p.clip <= 0:
            raise InputError("algorithm.clip", "the epsilon calibration needs a clip bound C > 0")

    def init(self, agents, p: CPGTParams) -> _CPGTState:
        comps = [Compressor("none" if p.ratio >= 1 else "topk", p.ratio, rounding=p.k_rounding)] * len(agents)
        a0 = agents[0]
        return _CPGTState(PublicCopyRows(agents, comps, p.gamma, name="cpgt.x"),
                          PublicCopyRows(agents, comps, p.gamma, name="cpgt.y"),
                          a0.shared_state("cpgt_tracker"), a0.shared_state("cpgt_gradient"))

    def _clip(self, p: CPGTParams, d: int) -> float | None:
        return None if p.clip == 0 else p.clip / math.sqrt(d)  # coordinates to +-C/sqrt(d)

    def gradient(self, p: CPGTParams, state: _CPGTState, i: int) -> GradientRequest:
        return GradientRequest.of(p.batch, self._clip(p, state.y.shape[1]), "coordinate")  # g(x_0), round 0

    def horizon(self, p: CPGTParams, state) -> int:
        return p.rounds

    def refusal(self, sim, path):
        from netsim.rounds.windowed import budget_cap_refusal

        return budget_cap_refusal(sim)  # an agent out of budget sends nothing more

    def local(self, b, p: CPGTParams) -> None:
        st, idx, B = b.state, b.index(), len(b)
        if b.g is not None:                                              # y_0 = g(x_0)
            st.y.index_copy_(0, idx, b.g)
            st.g.index_copy_(0, idx, b.g)
        bx, dx, by, dy = cpgt_scales(p, b.x.shape[1], b.k)
        xs = b.privatize(b.x, [bx] * B, [dx] * B, [1.0] * B, what="state", mechanism="laplace")     # x + xi^x
        ys = b.privatize(st.y.index_select(0, idx), [by] * B, [dy] * B, [1.0] * B, what="tracker",
                         mechanism="laplace")                                                     # y + xi^y
        out = set(b.refused(xs)) | set(b.refused(ys))
        if not out:
            qx, zx = st.px.delta(b.agents, b.stack(xs))                 # xhat += C(x + xi^x - xhat)
            qy, zy = st.py.delta(b.agents, b.stack(ys))                 # yhat += C(y + xi^y - yhat)
            b.send(qx, zx)
            b.send(qy, zy, message=1)
            return
        # budget cap (events engine): nothing more leaves those agents, their own copies stay
        ns = [n for n, a in enumerate(b.agents) if a.id not in out]
        sends: list[list] = [[None] * B, [None] * B]
        sizes: list[list[int]] = [[0] * B, [0] * B]
        if ns:
            part = b.part(ns)
            for m, (pc, rel) in enumerate(((st.px, xs), (st.py, ys))):
                q, z = pc.delta(part.agents, b.stack([rel[n] for n in ns]))
                for n, qn, zn in zip(ns, q.unbind(0), z, strict=True):
                    sends[m][n], sizes[m][n] = qn, zn
        b.send(sends[0], sizes[0])
        b.send(sends[1], sizes[1], message=1)

    def combine(self, b, p: CPGTParams, got):
        st, idx = b.state, b.index()
        stats = b.agents[0].stats
        for pc, arrived in ((st.px, got[0]), (st.py, got[1])):
            stats.add("cpgt_missing", sum(len(a.in_neighbors) - len(g) for a, g in zip(b.agents, arrived,
                                                                                          strict=True)))
            pc.receive(b.agents, arrived)                               # xhat_j += q_j, yhat_j += q_j
        y = st.y.index_select(0, idx)
        x_new = _consensus(st.px, b.agents, b.x) - p.lr * y             # x_{t+1} = x_t + gamma sum (..) - eta y_t
        g = yield b.gradients(x_new, b.sample_rows(p.batch), clip=self._clip(p, b.x.shape[1]),
                              clip_kind="coordinate")                   # g(x_{t+1})
        st.y.index_copy_(0, idx, _consensus(st.py, b.agents, y) + g - st.g.index_select(0, idx))  # y_{t+1}
        st.g.index_copy_(0, idx, g)
        b.set_params(x_new)


@attrs.frozen
class _CPGTState:
    px: PublicCopyRows  # the public copies of x
    py: PublicCopyRows  # ... and of the tracker y
    y: torch.Tensor  # the trackers y_t (bank rows: checkpoints)
    g: torch.Tensor  # each agent's last gradient g(x_t)


def cpgt_scales(p: CPGTParams, d: int, t: int) -> tuple[float, float, float, float]:
    """(b^x_t, Delta^x_t, b^y_t, Delta^y_t): Laplace scales and L1 sensitivities of round t's releases."""
    unit = 2 * (p.clip if p.clip > 0 else 1.0) * math.sqrt(d)
    dx, dy = unit * p.lr * max(t, 1), unit
    if p.sigma is not None:
        return p.sigma, dx, p.sigma, dy
    share = p.epsilon / (2 * p.rounds)
    return dx / share, dx, dy / share, dy
