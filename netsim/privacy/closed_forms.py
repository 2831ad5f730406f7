"""Papers' own privacy formulas, each with its conditions checked, and the registry of closed forms.

Every function checks the conditions its paper states. A violated *domain* condition (delta >= 1,
sigma <= 0, a divergent parameter) raises ``ClosedFormError`` (one line naming the condition; a calibration
exits 2 with it, ``netsim privacy`` blanks the form's figures with it and exits 2 only under ``--strict``).
A violated *validity* condition of the paper's theorem (e.g. the classical Gaussian bound
needs epsilon < 1; DO-ADP's T-condition) raises too when ``strict=True`` (default) and is otherwise
returned in the result's ``violations``, so a report shows it beside the number, never hides it.
Where a paper's claim is weaker than stated, both numbers are computed (``paper`` and
``conservative`` fields).

The papers: Wang, Yuan, Wang, Li, "PDSL: Privacy-Preserved Decentralized Stochastic Learning with
Heterogeneous Data Distribution" (``pdsl_*``); Chen, Wang, "Locally Differentially Private Distributed
Online Learning with Guaranteed Optimality" (``ldp_*``); Huo, Liu, Ding, Johansson, Shi, "Decentralized
Optimization with Amplified Privacy via Efficient Communication" (``do_adp_*``); Zhu, Huang, Wang, Xu,
"PrivSGP-VR: Differentially Private Variance-Reduced Stochastic Gradient Push with Tight Utility Bounds"
(``privsgp_vr_*``).

``[privacy] closed_form`` names a *registered* closed form (``register_closed_form``): a function from
one agent's releases to the paper's numbers. The four papers above register under ``pdsl``,
``ldp_online``, ``do_adp`` and ``privsgp_vr`` (``netsim.privacy.report``); a plugin can add its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from netsim.errors import InputError

E = math.e


class ClosedFormError(InputError):
    """A closed form's condition does not hold (printed as one line; exit 2)."""

    def __init__(self, name: str, message: str):
        super().__init__(f"closed form {name}", message)


def _need(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ClosedFormError(name, message)


def _validity(violations: list[str], strict: bool, name: str) -> tuple[str, ...]:
    if violations and strict:
        raise ClosedFormError(name, "; ".join(violations) + " (pass strict=False to report instead)")
    return tuple(violations)


def _delta_ok(delta: float, name: str, what: str = "delta") -> None:
    _need(0 < delta < 1, name, f"{what} must be in (0, 1), got {delta!r}")


# --- the classical Gaussian mechanism (Dwork & Roth 2014, Thm 3.22 / App. A) -------------------------
def gaussian_epsilon_classical(sensitivity: float, sigma: float, delta: float) -> float:
    """epsilon = Delta sqrt(2 ln(1.25/delta)) / sigma (valid as a DP bound only when it is < 1)."""
    _delta_ok(delta, "gaussian")
    _need(sigma > 0, "gaussian", f"sigma must be > 0, got {sigma!r}")
    _need(sensitivity > 0, "gaussian", f"sensitivity must be > 0, got {sensitivity!r}")
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / sigma


def gaussian_sigma_classical(sensitivity: float, eps: float, delta: float) -> float:
    """sigma = Delta sqrt(2 ln(1.25/delta)) / epsilon."""
    _delta_ok(delta, "gaussian")
    _need(eps > 0, "gaussian", f"epsilon must be > 0, got {eps!r}")
    _need(sensitivity > 0, "gaussian", f"sensitivity must be > 0, got {sensitivity!r}")
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / eps


# --- PDSL (Wang, Yuan, Wang, Li), per-round Gaussian calibration ----------------------------------------
@attrs.frozen
class PDSLSigma:
    sigma_over_C: float  # eq. (27): sigma / C
    worst_agent: int
    violations: tuple[str, ...]


def pdsl_theorem1_sigma(W: np.ndarray, eps: float, delta: float, C: float = 1.0,
                        phi_min: float | Sequence[float] | None = None, strict: bool = True) -> PDSLSigma:
    """PDSL, Theorem 1, eq. (27): the per-round sigma making PDSL (eps, delta)-DP in each round:

        sigma >= max_i 2C (1/w_min + sum_{j in M_i} 1/w_ij) sqrt(2 ln(1.25/delta))
                       / (phi_min eps sqrt(sum_{j in M_i} w_ij^-2))

    M_i = closed neighbourhood of i (W_ij > 0, i included), w_min = min over all i, j in M_i.
    ``phi_min``: smallest normalised Shapley share; default 1/|M_i| (the literal min-max
    normalisation gives 0 and an infinite sigma, which is an error here). Conditions: W symmetric and
    doubly stochastic with positive diagonal (sec. 4); the classical Gaussian bound needs eps < 1.
    No composition over rounds: the paper's guarantee is per round (sec. 3)."""
    name = "pdsl"
    W = np.asarray(W, dtype=float)
    _delta_ok(delta, name)
    _need(eps > 0, name, f"epsilon must be > 0, got {eps!r}")
    _need(C > 0, name, f"clip bound C must be > 0, got {C!r}")
    n = W.shape[0]
    _need(W.shape == (n, n), name, "W must be square")
    _need(np.allclose(W, W.T, atol=1e-12), name, "W must be symmetric (undirected graph, sec. 4)")
    _need(np.allclose(W.sum(1), 1, atol=1e-9) and (W >= -1e-15).all(), name, "W must be doubly stochastic")
    _need(bool((np.diag(W) > 0).all()), name, "W must have a positive diagonal (i in M_i)")
    masks = [W[i] > 0 for i in range(n)]
    w_min = min(W[i][m].min() for i, m in enumerate(masks))
    if phi_min is None:
        phis = [1.0 / m.sum() for m in masks]
    else:
        phis = list(phi_min) if isinstance(phi_min, Sequence) else [float(phi_min)] * n
    _need(min(phis) > 0, name, "phi_min must be > 0 (min-max normalised shares are 0: set a floor)")
    root = math.sqrt(2 * math.log(1.25 / delta))
    vals = [2 * C * (1 / w_min + (1 / W[i][m]).sum()) * root
            / (phis[i] * eps * math.sqrt((W[i][m] ** -2.0).sum()))
            for i, m in enumerate(masks)]
    worst = int(np.argmax(vals))
    v = [] if eps < 1 else [f"classical Gaussian bound needs epsilon < 1, got {eps!r}"]
    return PDSLSigma(float(vals[worst]) / C, worst, _validity(v, strict, name))


def pdsl_per_message_sigma(eps: float, delta: float, C: float = 1.0, batch: int | None = None) -> float:
    """PDSL calibration mode ``per_message_gaussian``: sigma = Delta sqrt(2 ln(1.25/delta)) / eps
    with Delta = 2C (batch clipping, replace-one) or 2C/B (per-example clipping of a batch mean)."""
    delta_q = 2 * C / batch if batch else 2 * C
    return gaussian_sigma_classical(delta_q, eps, delta)


@attrs.frozen
class PerRound:
    eps_round: float  # per-release epsilon (classical Gaussian bound), the paper's claim
    eps_basic: float  # basic composition over T rounds: T eps (with T delta)
    delta_basic: float
    violations: tuple[str, ...]


def pdsl_per_round(sensitivity: float, sigma: float, delta: float, rounds: int,
                   strict: bool = True) -> PerRound:
    """PDSL's guarantee from what happened: the per-release epsilon (paper, per round) and its
    basic composition over ``rounds`` (conservative; the RDP accountant's number is the tight one)."""
    e = gaussian_epsilon_classical(sensitivity, sigma, delta)
    v = [] if e < 1 else [f"per-release epsilon {e:.4g} >= 1: the classical Gaussian bound does not hold"]
    return PerRound(e, rounds * e, min(1.0, rounds * delta), _validity(v, strict, "pdsl"))


# --- LDP online learning with growing Laplace noise (Chen & Wang) ------------------------------------
@attrs.frozen
class LDPBudget:
    epsilon: float  # sum_t Delta_t / rho_t (Lemma 2)
    curve: np.ndarray  # cumulative budget after t = 1..T


def ldp_noise_scale(t: int | np.ndarray, sigma: float, varsigma: float):
    """rho_t = (sigma / sqrt 2) (t + 1)^varsigma (Laplace scale; variance (sigma^2)(t+1)^(2 varsigma))."""
    return sigma / math.sqrt(2) * (np.asarray(t, dtype=float) + 1) ** varsigma


def ldp_check(varsigma: float | Sequence[float], u: float, v: float, sigma: float = 1.0) -> None:
    """Chen & Wang, Assumption A4 and the stepsize conditions: varsigma^i in (0, 1/2),
    max_i varsigma^i + 1/2 < u < v < 1, and 1/2 < u."""
    name = "ldp_online"
    vs = [varsigma] if isinstance(varsigma, int | float) else list(varsigma)
    _need(sigma > 0, name, f"sigma must be > 0, got {sigma!r}")
    for s in vs:
        _need(0 < s < 0.5, name, f"varsigma must be in (0, 1/2), got {s!r} (A4)")
    _need(0.5 < u < v < 1, name, f"need 1/2 < u < v < 1, got u={u!r}, v={v!r} (Thm 1)")
    _need(max(vs) + 0.5 < u, name,
          f"need max_i varsigma^i + 1/2 < u, got {max(vs)!r} + 1/2 >= {u!r} "
          "(eq. 4, learners indexed 0..m-1)")


def ldp_budget(T: int, n: int, C: float, wbar: float, sigma: float, varsigma: float,
               lam0: float = 1.0, v: float = 0.77, gam0: float = 1.0, u: float = 0.65,
               L_acc: float = 0.0, mode: str = "recursion") -> LDPBudget:
    """Chen & Wang, Lemma 2 + the sensitivity recursion of Thm 5: eps_i(T) = sum_{t=1}^T sqrt(n) Phi_t / rho_t,

        Phi_{t+1} = max(0, 1 - wbar gamma_t + L_acc lambda_t) Phi_t + C lambda_t / (t + 1),  Phi_0 = 0

    (mode ``recursion``, eq. 22; by default L_acc = 0), or Phi_t = C lambda_t / ((t+1) wbar gamma_t)
    (mode ``asymptotic``), or mode ``dsgd``: the DSGD baseline with Delta_t = sqrt(n) C lambda_{t-1}
    (diverges). lambda_t = lam0/(t+1)^v, gamma_t = gam0/(t+1)^u. Finite as T -> inf iff
    1 + v - u + varsigma > 1 (eq. 25)."""
    ldp_check(varsigma, u, v, sigma)
    _need(T >= 1 and n >= 1 and C > 0 and wbar > 0, "ldp_online", "need T >= 1, n >= 1, C > 0, wbar > 0")
    _need(mode in ("recursion", "asymptotic", "dsgd"), "ldp_online",
          f"mode must be recursion, asymptotic or dsgd, got {mode!r}")
    t = np.arange(T + 1, dtype=float)
    lam = lam0 / (t + 1) ** v
    gam = gam0 / (t + 1) ** u
    if mode == "recursion":
        a = np.maximum(0.0, 1 - wbar * gam + L_acc * lam)
        b = C * lam / (t + 1)
        phi = np.empty(T + 1)
        p = 0.0
        phi[0] = 0.0
        for k in range(T):  # sequential by nature; T = 1e6 takes about a second
            p = a[k] * p + b[k]
            phi[k + 1] = p
        delta = math.sqrt(n) * phi[1:]
    elif mode == "asymptotic":
        delta = math.sqrt(n) * (C * lam / ((t + 1) * wbar * gam))[1:]
    else:
        delta = math.sqrt(n) * C * lam[:-1]
    curve = np.cumsum(delta / ldp_noise_scale(t[1:], sigma, varsigma))
    return LDPBudget(float(curve[-1]), curve)


def laplace_basic_composition(sensitivities: Sequence[float], scales: Sequence[float]) -> float:
    """Chen & Wang, Lemma 2: a sequence of Laplace releases with L1 sensitivity Delta_t and scale rho_t is
    (sum_t Delta_t / rho_t)-LDP (basic sequential composition of the Laplace mechanism)."""
    s = np.asarray(sensitivities, dtype=float)
    r = np.asarray(scales, dtype=float)
    _need(bool((r > 0).all()), "ldp_online", "every Laplace scale must be > 0")
    return float((s / r).sum())


# --- DO-ADP (Huo, Liu, Ding, Johansson, Shi), amplification by activation + top-k; Theorem 1--------------------
def do_adp_linear_amplification(eps_t: float, rate: float) -> float:
    """Lemma 4 as the paper uses it: eps' = 2 r eps_t (r = p/q)."""
    return 2 * rate * eps_t


def do_adp_exact_amplification(eps_t: float, rate: float) -> float:
    """Amplification by subsampling (Steinke 2022): eps' = ln(1 + r (e^eps_t - 1)); for eps_t > 700
    as eps_t + ln(r + (1 - r) e^-eps_t), the same number without overflowing e^eps_t."""
    if eps_t > 700:
        return eps_t + math.log(rate + (1 - rate) * math.exp(-eps_t))
    return math.log1p(rate * math.expm1(eps_t))


def kov_composition(S: float, delta_hat: float) -> float:
    """Lemma 5 (Kairouz-Oh-Viswanath, with sum eps_t tanh(eps_t/2) replaced by S = sum eps_t^2):
    eps~ = sqrt(2 S ln(e + sqrt(S)/delta_hat)) + S."""
    _need(0 < delta_hat <= 1, "do_adp", f"delta_hat must be in (0, 1], got {delta_hat!r}")
    return math.sqrt(2 * S * math.log(E + math.sqrt(S) / delta_hat)) + S


@attrs.frozen
class DoAdpEpsilon:
    eps_t: float  # per-step classical Gaussian epsilon
    eps_tp: float  # amplified per-step epsilon
    S: float  # sum of eps_tp^2 over the steps
    steps: int
    delta_hat: float
    epsilon: float  # eps~ at delta_hat (sqrt(S) by default: the paper's choice)
    delta: float  # corrected: 1 - (1 - delta_hat)(1 - r delta0)^steps
    delta_paper: float  # as the paper writes it: 1 - (1 - delta_hat)(1 - p delta0)^T
    epsilon_fixed: float  # eps~ at delta_hat = delta0 (reported next to the paper's choice)
    violations: tuple[str, ...]


def do_adp_sensitivity(G: float, k_over_d: float = 1.0, sens: str = "topk", batch: int = 1) -> float:
    """Eq. (6): Delta = 2G sqrt(k/d) with coordinate clipping to G/sqrt(d) and Top-k ('topk'), or 2G
    ('full', the conservative reading: the top-k support is data dependent); / B for a mean."""
    _need(G > 0 and 0 < k_over_d <= 1 and batch >= 1, "do_adp", "need G > 0, 0 < k/d <= 1, B >= 1")
    _need(sens in ("topk", "full"), "do_adp", f"sens must be 'topk' or 'full', got {sens!r}")
    return (2 * G * math.sqrt(k_over_d) if sens == "topk" else 2 * G) / batch


def do_adp_epsilon(sigma: float, delta0: float, q: int, T: int, G: float = 1.0, k_over_d: float = 1.0,
                    p: float = 1.0, batch: int = 1, amp: str = "paper_linear", sens: str = "topk",
                    activation: str = "amplify_p", steps_observed: int | None = None,
                    delta_hat: float | None = None, strict: bool = True) -> DoAdpEpsilon:
    """DO-ADP's accountant (Huo et al., Lemmas 1, 4 and 5).

    eps_t = Delta sqrt(2 ln(1.25/delta0)) / sigma; r = pB/q ('amplify_p', the paper) or B/q ('observed',
    visible activation: then steps = realised activations); eps'_t = 2 r eps_t (paper) or
    ln(1 + r(e^eps_t - 1)) (exact); S = steps eps'_t^2; eps~ = sqrt(2 S ln(e + sqrt(S)/delta_hat)) + S.
    Validity (reported, or raised when strict): eps_t < 1 (classical Gaussian bound), eps'_t <= 0.9
    (Lemma 5), p >= 1/2 (sec. III-C)."""
    name = "do_adp"
    _delta_ok(delta0, name, "delta0")
    _need(sigma > 0, name, f"sigma must be > 0, got {sigma!r}")
    _need(q >= 1 and T >= 1, name, f"need q >= 1 and T >= 1, got q={q!r}, T={T!r}")
    _need(0 < p <= 1, name, f"activation probability p must be in (0, 1], got {p!r}")
    _need(amp in ("paper_linear", "exact"), name, f"amp must be paper_linear or exact, got {amp!r}")
    _need(activation in ("amplify_p", "observed"), name,
          f"activation must be amplify_p or observed, got {activation!r}")
    D = do_adp_sensitivity(G, k_over_d, sens, batch)
    eps_t = D * math.sqrt(2 * math.log(1.25 / delta0)) / sigma
    r = p * batch / q if activation == "amplify_p" else batch / q
    _need(r <= 1, name, f"sampling rate must be <= 1, got {r!r} (B > q?)")
    eps_tp = (do_adp_linear_amplification(eps_t, r) if amp == "paper_linear"
              else do_adp_exact_amplification(eps_t, r))
    if activation == "amplify_p":
        steps = T
    else:
        _need(steps_observed is not None, name,
              "activation='observed' needs steps_observed (realised activations)")
        steps = int(steps_observed)  # type: ignore[arg-type]
    S = steps * eps_tp**2
    dh = math.sqrt(S) if delta_hat is None else delta_hat
    _need(0 < dh <= 1, name, f"delta_hat = {dh!r} is not in (0, 1] (S too large)")
    v = do_adp_conditions(eps_t, eps_tp, p)
    return DoAdpEpsilon(
        eps_t, eps_tp, S, steps, dh, kov_composition(S, dh),
        1 - (1 - dh) * (1 - r * delta0) ** steps,
        1 - (1 - dh) * (1 - p * delta0) ** T,
        kov_composition(S, delta0),
        _validity(v, strict, name),
    )


def do_adp_conditions(eps_t: float, eps_tp: float, p: float) -> list[str]:
    """DO-ADP's validity conditions on one step: eps_t < 1 (classical Gaussian bound), amplified
    eps'_t <= 0.9 (Lemma 5), p >= 1/2 (sec. III-C); the violated ones, as lines."""
    v = []
    if eps_t >= 1:
        v.append(f"eps_t = {eps_t:.4g} >= 1: classical Gaussian bound invalid")
    if eps_tp > 0.9:
        v.append(f"amplified eps'_t = {eps_tp:.4g} > 0.9 (Lemma 5 needs <= 0.9)")
    if p < 0.5:
        v.append(f"p = {p!r} < 1/2 (the paper requires p >= 1/2)")
    return v


def do_adp_releases(releases: Sequence[tuple[float, float, float, float, int]], delta0: float,
                    delta: float) -> dict[str, Any]:
    """``do_adp_epsilon`` over a recorded sequence of releases (sensitivity, sigma, p, q, skipped ticks),
    each at its own parameters: the paper's figure (Lemma 4 linear at rate p q for every activation tick,
    the skipped ones included, Lemma 5 at delta_hat = sqrt(S)) and the conservative one (exact
    amplification at rate q over the observed releases, delta_hat = delta). For one schedule it equals
    ``do_adp_epsilon(.., amp="paper_linear")`` and ``(.., amp="exact", activation="observed")``. Once
    sqrt(S) > 1 the paper's figure is vacuous: ``paper`` is None and ``blank`` says why (the conservative
    figure stands)."""
    name = "do_adp"
    _delta_ok(delta0, name, "delta0")
    _delta_ok(delta, name)
    root = math.sqrt(2 * math.log(1.25 / delta0))
    S_paper = S_obs = 0.0
    v: set[str] = set()
    for sens, sigma, p, q, skipped in releases:
        _need(sigma > 0, name, f"sigma must be > 0, got {sigma!r}")
        eps_t = sens * root / sigma
        lin, exact = do_adp_linear_amplification(eps_t, p * q), do_adp_exact_amplification(eps_t, q)
        S_paper += (1 + skipped) * lin * lin  # x * x: inf for a huge eps_t, where x ** 2 raises
        S_obs += exact * exact
        v.update(do_adp_conditions(eps_t, lin, p))
    dh = math.sqrt(S_paper)
    out = {"paper": None, "delta_paper": None,
           "conservative": kov_composition(S_obs, delta), "delta_conservative": delta,
           "violations": sorted(v),
           "note": "paper: Lemmas 1, 4 (linear, rate p q, every tick), 5 at delta_hat = sqrt(S); "
                   "conservative: exact amplification at rate q over observed releases, delta_hat = delta"}
    if 0 < dh <= 1:
        out.update(paper=kov_composition(S_paper, dh), delta_paper=dh)
    else:  # the paper's own choice of delta_hat makes its bound say nothing; the conservative one still holds
        shown = next(txt for k in range(4, 18) if float(txt := f"{dh:.{k}g}") > 1 or k == 17)  # never "= 1"
        out["blank"] = f"delta_hat = sqrt(S) = {shown} is not in (0, 1]: the paper's bound is vacuous"
    return out


@attrs.frozen
class DoAdpSigma:
    sigma: float
    violations: tuple[str, ...]


def do_adp_theorem1_sigma(eps: float, delta0: float, q: int, T: int, G: float = 1.0, k_over_d: float = 1.0,
                           p: float = 1.0, batch: int = 1, noise_scaling: str = "p2k_over_d",
                           strict: bool = True) -> DoAdpSigma:
    """DO-ADP, Theorem 1, eq. (7): sigma^2 = 160 (k/d) p^2 T ln(1.25/delta0) G^2 / (q^2 eps^2).

    Conditions: eps in (0, 1], delta0 in (0, 1), p in [1/2, 1] (domain: raised); T >= q^2 eps^2 / (4 p^2 B^2)
    (keeps eps_t^2 <= 1/5; reported or raised when strict: the paper's own experiments violate it).
    ``noise_scaling='pk_over_d'`` is the alternative reading of eq. (7) with sigma^2 linear in p."""
    name = "do_adp"
    _need(0 < eps <= 1, name, f"Theorem 1 needs epsilon in (0, 1], got {eps!r}")
    _delta_ok(delta0, name, "delta0")
    _need(0.5 <= p <= 1, name, f"Theorem 1 needs 1/2 <= p <= 1, got {p!r}")
    _need(q >= 1 and T >= 1 and G > 0 and 0 < k_over_d <= 1, name, "need q >= 1, T >= 1, G > 0, 0 < k/d <= 1")
    _need(noise_scaling in ("p2k_over_d", "pk_over_d"), name, f"unknown noise_scaling {noise_scaling!r}")
    pf = p**2 if noise_scaling == "p2k_over_d" else p
    s2 = 160 * k_over_d * pf * T * math.log(1.25 / delta0) * G**2 / (q**2 * eps**2)
    need_T = q**2 * eps**2 / (4 * p**2 * batch**2)
    v = [] if T >= need_T * (1 - 1e-12) else [f"T = {T} < q^2 eps^2 / (4 p^2 B^2) = {need_T:.6g} (Theorem 1)"]
    return DoAdpSigma(math.sqrt(s2), _validity(v, strict, name))


# --- PrivSGP-VR (Zhu, Huang, Wang, Xu; Theorem 2, Corollary 1) ---------------------------------------------------
def privsgp_vr_sigma(K: int, eps: float, delta: float, J: int, G: float, c2: float = 0.3724,
                  sens_mult: float = 3.0) -> float:
    """Eq. (11): sigma_i = sens_mult c_2 G sqrt(K ln(1/delta_i)) / (J eps_i) (paper: sens_mult = 3;
    replace-one neighbours strictly need 6). c_2 is never given: 0.3724 reproduces K* = 3120."""
    name = "privsgp_vr"
    _delta_ok(delta, name)
    _need(eps > 0 and K >= 1 and J >= 1 and G > 0 and c2 > 0, name,
          "need eps > 0, K >= 1, J >= 1, G > 0, c2 > 0")
    return sens_mult * c2 * G * math.sqrt(K * math.log(1 / delta)) / (J * eps)


def privsgp_vr_epsilon(sigma: float, K: int, delta: float, J: int, G: float, c2: float = 0.3724,
                    sens_mult: float = 3.0) -> float:
    """Eq. (11) solved for eps: the paper's epsilon of K releases with noise std sigma."""
    _need(sigma > 0, "privsgp_vr", f"sigma must be > 0, got {sigma!r}")
    return privsgp_vr_sigma(K, 1.0, delta, J, G, c2, sens_mult) / sigma


def privsgp_vr_A(F0: float, L: float, x0_sq: float, b2: float) -> float:
    """A := 13 F^0 + 6 L ||x^0||^2 + 18 L b^2 (Corollary 1)."""
    return 13 * F0 + 6 * L * x0_sq + 18 * L * b2


def _S(eps_list: Sequence[float], delta_list: Sequence[float]) -> float:
    _need(len(eps_list) == len(delta_list) and len(eps_list) > 0, "privsgp_vr", "need one (eps, delta) per node")
    for e, d in zip(eps_list, delta_list, strict=True):
        _need(e > 0, "privsgp_vr", f"epsilon must be > 0, got {e!r}")
        _delta_ok(d, "privsgp_vr")
    return sum(math.log(1 / d) / e**2 for e, d in zip(eps_list, delta_list, strict=True))


def privsgp_vr_k_star(A: float, J: int, L: float, d: int, G: float, eps_list: Sequence[float],
                   delta_list: Sequence[float], c2: float = 0.3724) -> float:
    """Eq. (12): K* = A J^2 n / (216 L d c_2^2 G^2 S), S = sum_i ln(1/delta_i)/eps_i^2 (n = len(eps_list))."""
    _need(A > 0 and L > 0 and d >= 1 and G > 0 and c2 > 0, "privsgp_vr", "need A, L, G, c2 > 0 and d >= 1")
    n = len(eps_list)
    return A * J**2 * n / (216 * L * d * c2**2 * G**2 * _S(eps_list, delta_list))


def privsgp_vr_utility(K: float, A: float, J: int, L: float, d: int, G: float, eps_list: Sequence[float],
                    delta_list: Sequence[float], c2: float = 0.3724) -> float:
    """Eq. (14): U(K) = A/sqrt(nK) + sqrt(K) (216 L d c_2^2 G^2 / (J^2 sqrt n)) (1/n) S."""
    n = len(eps_list)
    S = _S(eps_list, delta_list)
    return A / math.sqrt(n * K) + math.sqrt(K) * 216 * L * d * c2**2 * G**2 / (J**2 * math.sqrt(n)) * S / n


def privsgp_vr_validity(eps: float, K: int, J: int, c1: float | None) -> tuple[str, ...]:
    """Theorem 2 needs eps_i < c_1 K / J^2; c_1 is never given, so this is reported, never enforced."""
    if c1 is None:
        return (f"eps < c1 K / J^2 unchecked: c1 unknown (needs c1 > {eps * J**2 / K:.4g})",)
    return () if eps < c1 * K / J**2 else (f"eps = {eps!r} >= c1 K / J^2 = {c1 * K / J**2:.4g}",)


@attrs.frozen
class ClosedForm:
    """A registered closed form: ``evaluate(releases, spec, delta)`` gives one agent's numbers as a dict
    with ``paper``, ``conservative`` (or None), ``violations`` (list of str) and optionally ``note``,
    ``delta_paper``/``delta_conservative`` and ``blank`` (why a figure that is None does not apply, e.g. a
    vacuous bound); ``spec`` is the scenario's ``[privacy]`` section. Raising ``ClosedFormError`` says the
    form does not apply to these releases at all: the report blanks both figures with its message."""

    name: str
    paper: str  # authors, "title"
    evaluate: Callable[[Sequence[Any], Any, float], dict[str, Any]]


CLOSED_FORMS: dict[str, ClosedForm] = {}
#: old names of the closed forms (internal reproduction numbers); still accepted, with a note
DEPRECATED = {"seed000": "pdsl", "seed001": "ldp_online", "seed003": "do_adp", "seed004": "privsgp_vr"}


def register_closed_form(name: str, paper: str) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn(releases, spec, delta) -> dict`` as the closed form ``name`` (the method's
    name, as ``[privacy] closed_form`` will write it) of ``paper`` (authors, "title")."""
    if not name.isidentifier() or name == "none" or name in DEPRECATED:
        raise ValueError(f"closed form name must be an identifier other than 'none' and {sorted(DEPRECATED)}, "
                         f"got {name!r}")

    def deco(fn: Callable) -> Callable:
        _load_builtin()  # a plugin's name is checked against the built-in ones, whatever the import order
        have = CLOSED_FORMS.get(name)
        if have is not None and (have.evaluate.__module__, have.evaluate.__qualname__) != (fn.__module__,
                                                                                           fn.__qualname__):
            raise ValueError(f"closed form {name!r} is already registered by {have.evaluate.__module__}")
        CLOSED_FORMS[name] = ClosedForm(name, paper, fn)
        return fn

    return deco


def canonical(name: str) -> str:
    """The registered name a scenario's ``closed_form`` value stands for (old names mapped)."""
    return DEPRECATED.get(name, name)


def deprecation_note(name: str) -> str | None:
    """The one-line note for an old name, None for a current one."""
    new = DEPRECATED.get(name)
    if new is None:
        return None
    authors = CLOSED_FORMS[new].paper.split(' "')[0].rstrip(",")
    return f"privacy.closed_form = {name!r} is an old name of {new!r} ({authors}); write {new!r}"


def lookup(name: str) -> ClosedForm:
    """The closed form registered as ``name`` (or an old name of it); InputError on the key otherwise."""
    _load_builtin()
    form = CLOSED_FORMS.get(canonical(name))
    if form is None:
        raise InputError("privacy.closed_form", f"unknown closed form {name!r}; registered: none, "
                                                f"{', '.join(sorted(CLOSED_FORMS))} (a plugin's needs --plugin)")
    return form


def names() -> list[str]:
    _load_builtin()
    return sorted(CLOSED_FORMS)


def _load_builtin() -> None:
    from netsim.privacy import report  # noqa: F401 - registers the four papers' forms
