"""DP-CGA: Cross-Gradient Aggregation with Gaussian noise on the cross-gradients (a baseline of PDSL).

Esfandiari et al., "Cross-Gradient Aggregation for Decentralized Learning from Non-IID Data"
(ICML 2021), Algorithm 1, with the DP recipe of PDSL (Wang, Yuan, Wang, Li, "PDSL"): the same exchange as PDSL
(models out, clipped noisy cross-gradients ghat_ji back), then per layer
(each parameter tensor, as the reference code ``Optimizers/CGA.py``) the GEM-style projection of the
own w_ii-weighted gradient g_s onto {g : G g >= 0}, G = the w_ij-weighted cross-gradients as rows,
through its dual (Lopez-Paz & Ranzato 2017, eqs. 10-11):

    v* = argmin_{v >= margin} 1/2 v^T (G G^T + eps I) v + (G g_s)^T v,     g~ = g_s + G^T v*

then m <- mu m + g~ and x_i <- sum_j w_ij x_j - gamma (g~ + mu m) (Alg. 1 lines 9-10: Nesterov-like,
consensus on the models received this round). The bound-constrained QP is solved exactly by
scipy.optimize.lsq_linear (BVLS) on its Cholesky form 1/2 ||L^T v + L^-1 c||^2; if it fails the
previous v is reused (the reference code's fallback). Defaults: margin 0.5, eps 1e-12 (reference
code), mu = alpha of PDSL.

As barrier rounds (``SyncRounds``, two exchanges a round): round k of agent i

  A  send x_i to every neighbour (exchange 2k); barrier
  B  xi <- B rows of D_i; g_ii = grad F_i(x_i; xi) (eq. 9 of PDSL), clipped (eq. 10) and noised (eq. 11); then for
     each received x_j (sorted j) g_ij = grad F_i(x_j; xi) (eq. 12), clipped (eq. 13), noised (eq. 14): one
     gradient after the other, each its own release; send ghat_ij back to j (exchange 2k + 1); barrier
  C  the projection, momentum and mix above, on the models of A

Each of B's gradients is a wave of every agent's (one batched call, in both engines). Over a lossy or late network
a missing model means no cross-gradient for its sender, and a missing reply leaves its row out of G.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numpy as np

from netsim.algorithms.pdsl import (
    DPGradientParams,
    check_setting,
    cross_gradients,
    regular_graph_refusal,
    resolve_sigma,
    seconds,
)
from netsim.algorithms.registry import register
from netsim.rounds import SyncKernel, SyncRounds
from netsim.scenario.structure import field, nonneg, positive

if TYPE_CHECKING:
    import torch


def parameter_slices(model) -> list[slice]:
    """One slice of the flat row per parameter tensor (weight, bias, ...), in row order."""
    if hasattr(model, "numels"):  # TorchModel
        sizes = list(model.numels)
    elif hasattr(model, "slices"):  # MLP: weight (o*i) then bias (o) per layer
        sizes = [n for w0, b0, o, _ in model.slices for n in (b0 - w0, o * model.bias) if n]
    else:
        return [slice(0, model.size if hasattr(model, "size") else None)]
    out, a = [], 0
    for n in sizes:
        out.append(slice(a, a + n))
        a += n
    return out


def project_dual(G: np.ndarray, g: np.ndarray, margin: float = 0.5, eps: float = 1e-12) -> np.ndarray:
    """v* = argmin_{v >= margin} 1/2 v^T (G G^T + eps I) v + (G g)^T v (GEM's dual; CGA per layer)."""
    from scipy.linalg import cho_factor, solve_triangular
    from scipy.optimize import lsq_linear

    P = G @ G.T
    P = 0.5 * (P + P.T) + eps * np.eye(len(P))
    c = G @ g
    L = cho_factor(P, lower=True)[0]
    L = np.tril(L)
    b = -solve_triangular(L, c, lower=True)
    res = lsq_linear(L.T, b, bounds=(margin, np.inf), method="bvls")
    if not res.success:
        raise ArithmeticError("CGA QP did not converge")
    return res.x


@attrs.frozen
class DPCGAParams(DPGradientParams):
    lr: float = field(0.001, check=positive, doc="gamma")
    momentum: float = field(0.5, check=lambda v: None if 0 <= v < 1 else "must be in [0, 1)",
                            doc="mu (default: alpha of PDSL; reference code 0.95)")
    margin: float = field(0.5, check=nonneg, doc="lower bound on the dual variables (reference code)")
    qp_eps: float = field(1e-12, check=nonneg, doc="ridge on G G^T (reference code)")
    round_timeout: float = field(1.0, check=positive, doc="seconds each phase waits for neighbours")


@register("dp_cga", DPCGAParams)
class DPCGA(SyncKernel):
    """DP-CGA's round as barrier rounds of two exchanges (see the module docstring): the models out at the
    activation; after that barrier the gradients (own, then one cross-gradient per model received, each a wave of
    every agent's, clipped and noised as its own release) and the replies, one to each neighbour; after the second
    barrier the projection, momentum and mix. State: every agent's momentum m (a row of the parameter bank) and the
    last dual solution v of each layer (the reference code's fallback)."""

    pattern = SyncRounds(tag="cga")
    per_row = frozenset({"models", "own"})  # phase A's models received, ghat_ii
    reads = frozenset({"lr", "momentum", "margin", "qp_eps", "clip", "clip_mode", "calibration", "sigma", "epsilon",
                       "delta", "sigma_per_eps", "phi_min", "batch"})

    def init(self, agents, p):
        a = agents[0]  # sigma is the run's (the calibration's, the mixing matrix's), not an agent's
        return {"sigma": resolve_sigma(a, p), "m": a.shared_state("cga.m"), "slices": parameter_slices(a.model),
                "last_v": {}}

    def check(self, sim, p):
        check_setting(sim, p)  # undirected graph, before the run

    def refusal(self, sim, path):
        return regular_graph_refusal(sim)

    def exchanges(self, p, state):
        return 2  # the models out (phase A), the cross-gradients back (phase B)

    def between(self, sim, p):  # g_ii, then one g_ij per model received
        return seconds(sim, 1 + max(len(a.in_neighbors) for a in sim.agents), 0)

    def local(self, b, p):
        b.send(b.x)                                                        # phase A: x_i to every neighbour

    def combine(self, b, p, got):
        if b.s == 0:
            b.models = got
            return cross_gradients(b, p, got)                             # phase B
        self._step(b, p, got)
        return None

    def _step(self, b, p, xgrads):
        """g~ = g_s + G^T v* per layer (G: the w_ij-weighted cross-gradients received), m <- mu m + g~ and
        x_i <- sum_j w_ij x_j - gamma (g~ + mu m) (Alg. 1 lines 9-10), the models of phase A mixed. Agent by agent
        (each row's few operations stay in cache; a batch's (B, P) temporaries cost more than they save)."""
        import torch

        st = b.state
        m_all, last_v = st["m"], st["last_v"]
        steps = []
        for n, a in enumerate(b.agents):
            own = b.own[n]
            if own is None:  # budget cap reached: no step this round
                steps.append(torch.zeros_like(b.x[n]))
                continue
            g = a.self_weight * own
            peers = sorted(xgrads[n])
            if peers:
                G = torch.stack([a.weights[j] * xgrads[n][j] for j in peers])
                g = project(G, g, st["slices"], p.margin, p.qp_eps, last_v.setdefault(a.id, {}))
            m = p.momentum * m_all[a.id] + g                                   # m <- mu m + g~
            m_all[a.id] = m
            steps.append(g + p.momentum * m)                                   # g~ + mu m
        b.mix_into_params(b.x, b.models, step=steps, lr=p.lr)  # params = mix(x, models) - lr step, batched


def project(G: torch.Tensor, g: torch.Tensor, slices: list[slice], margin: float, eps: float,
            last_v: dict[int, tuple]) -> torch.Tensor:
    """g~ = g + G^T v* layer by layer (float64 solve); a failed layer reuses its previous v (``last_v``: the agent's
    {layer: v}, as floats)."""
    import torch
    out = g.clone()
    for li, s in enumerate(slices):
        Gl = G[:, s].double().cpu().numpy()
        gl = g[s].double().cpu().numpy()
        try:
            v = project_dual(Gl, gl, margin, eps)
            last_v[li] = tuple(v.tolist())  # (plain floats: a checkpoint keeps them)
        except (ArithmeticError, np.linalg.LinAlgError, ValueError):
            kept = last_v.get(li)
            if kept is None or len(kept) != len(Gl):
                continue
            v = np.array(kept)
        out[s] = torch.as_tensor(gl + Gl.T @ v, dtype=g.dtype, device=g.device)
    return out
