"""DP-CGA: Cross-Gradient Aggregation with Gaussian noise on the cross-gradients (a baseline of PDSL).

Esfandiari et al., "Cross-Gradient Aggregation for Decentralized Learning from Non-IID Data"
(ICML 2021), Algorithm 1, with the DP recipe of PDSL (Wang, Yuan, Wang, Li, "PDSL"): the same exchange as PDSL
(models out, clipped noisy cross-gradients ghat_ji back; ``pdsl.cross_gradients``), then per layer
(each parameter tensor, as the reference code ``Optimizers/CGA.py``) the GEM-style projection of the
own w_ii-weighted gradient g_s onto {g : G g >= 0}, G = the w_ij-weighted cross-gradients as rows,
through its dual (Lopez-Paz & Ranzato 2017, eqs. 10-11):

    v* = argmin_{v >= margin} 1/2 v^T (G G^T + eps I) v + (G g_s)^T v,     g~ = g_s + G^T v*

then m <- mu m + g~ and x_i <- sum_j w_ij x_j - gamma (g~ + mu m) (Alg. 1 lines 9-10: Nesterov-like,
consensus on the models received this round). The bound-constrained QP is solved exactly by
scipy.optimize.lsq_linear (BVLS) on its Cholesky form 1/2 ||L^T v + L^-1 c||^2; if it fails the
previous v is reused (the reference code's fallback). Defaults: margin 0.5, eps 1e-12 (reference
code), mu = alpha of PDSL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numpy as np

from netsim.algorithms.pdsl import (
    DPGradientParams,
    check_setting,
    cross_gradients,
    resolve_sigma,
)
from netsim.algorithms.registry import register
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


@register("dp_cga", DPCGAParams, check=check_setting)  # undirected graph, before the run
def dp_cga(agent, p: DPCGAParams):
    import torch
    i = agent.id
    sigma = resolve_sigma(agent, p)
    m_all = agent.shared_state("cga.m")
    slices = parameter_slices(agent.model)
    last_v: dict[int, np.ndarray] = {}
    k = 0
    while True:
        yield agent.wake()
        x = agent.params
        xi = agent.sample_rows(p.batch)
        models: dict[int, torch.Tensor] = {}
        own, xgrads = yield from cross_gradients(agent, p, x, xi, sigma, k, "cga", models=models)
        m = m_all[i].clone()
        if own is not None:
            g = agent.self_weight * own
            peers = sorted(xgrads)
            if peers:
                G = torch.stack([agent.weights[j] * xgrads[j] for j in peers])
                g = project(G, g, slices, p.margin, p.qp_eps, last_v)
            m = p.momentum * m + g
            step = g + p.momentum * m
        else:
            step = torch.zeros_like(x)
        m_all[i] = m
        agent.mix_into_params(x, models, step=step, lr=p.lr)  # params = mix(x, models) - lr step, batched
        k += 1



def project(G: torch.Tensor, g: torch.Tensor, slices: list[slice], margin: float, eps: float,
            last_v: dict[int, np.ndarray]) -> torch.Tensor:
    """g~ = g + G^T v* layer by layer (float64 solve); a failed layer reuses its previous v."""
    import torch
    out = g.clone()
    for li, s in enumerate(slices):
        Gl = G[:, s].double().cpu().numpy()
        gl = g[s].double().cpu().numpy()
        try:
            v = project_dual(Gl, gl, margin, eps)
            last_v[li] = v
        except (ArithmeticError, np.linalg.LinAlgError, ValueError):
            v = last_v.get(li)
            if v is None or len(v) != len(Gl):
                continue
        out[s] = torch.as_tensor(gl + Gl.T @ v, dtype=g.dtype, device=g.device)
    return out
