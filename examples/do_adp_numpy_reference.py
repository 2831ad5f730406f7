"""A separate, vectorised numpy implementation of DO-ADP on the cheapest scenario's datasets, for checking
netsim's seed spread and means (docs/reproductions/do-adp.md, "Seed spread").

Huo, Liu, Ding, Johansson, Shi, "Decentralized Optimization with Amplified Differential Privacy via Efficient
Communication" (arXiv 2506.07102), Algorithm 1 in the matrix form of App. C, all agents in lock-step:
    M <- (clip(G) + Theta) eta + beta M,   X <- X - alpha M eta + gamma (W Xhat - Xhat),
    Xhat <- Xhat + TopK(X - Xhat) eta,
with one uniformly drawn sample per active agent, coordinates clipped to +-G/sqrt(d) (the l2 term inside the
clip, as Assumption 2 reads), sigma from eq. (7), W = 1/7 on the ring +-1, 2, 3. It shares only the data
(``compute.data.load_dataset``) and eq. (7) with netsim. f* by L-BFGS in float64.

    python examples/do_adp_numpy_reference.py 12          # datasets 0..11, one noise stream each
    python examples/do_adp_numpy_reference.py 9 4         # datasets 0..8, four noise streams each
    python examples/do_adp_numpy_reference.py 12 1 intercept   # with an unpenalised intercept (d = 51):
                                                               # clipped and noised, k = ceil(0.3 * 51) = 16
"""

from __future__ import annotations

import math
import sys

import numpy as np
from scipy.optimize import minimize

from netsim.compute.data import load_dataset
from netsim.privacy import closed_forms as cf
from netsim.scenario.load import load_scenario
from netsim.sim.streams import Streams

CONFIGS = ((1.0, 1.0), (0.8, 1.0), (1.0, 0.3), (0.8, 0.3))


def objective(A: np.ndarray, b: np.ndarray, lam, x: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean logistic loss + lam/2 ||x||^2; ``lam`` a float or a per-coordinate vector (0 on an intercept)."""
    z = -b * (A @ x)
    s = 1.0 / (1.0 + np.exp(-z))
    return float(np.logaddexp(0, z).mean() + 0.5 * (lam * x) @ x), -(A * (b * s)[:, None]).mean(0) + lam * x


def f_star(A: np.ndarray, b: np.ndarray, lam) -> float:
    res = minimize(lambda x: objective(A, b, lam, x), np.zeros(A.shape[1]), jac=True, method="L-BFGS-B",
                   options={"gtol": 1e-12, "maxiter": 5000})
    return float(res.fun)


def do_adp(A, b, parts, p, kd, sigma, seed, T=6000, alpha=0.03, beta=0.15, gamma=0.05, G=1.0, lam=1e-3):
    """Final x_bar_T of one run."""
    n, d = len(parts), A.shape[1]
    k = min(d, math.ceil(kd * d - 1e-9))
    rng = np.random.default_rng(seed)
    W = np.zeros((n, n))
    for i in range(n):
        for s in range(-3, 4):
            W[i, (i + s) % n] = 1 / 7
    P = np.stack(parts)
    x, xh, m = np.zeros((n, d)), np.zeros((n, d)), np.zeros((n, d))
    c = G / np.sqrt(d)
    for _ in range(T):
        on = (rng.random(n) < p)[:, None]
        cons = W @ xh - xh                                    # copies at the start of the round
        j = P[np.arange(n), rng.integers(P.shape[1], size=n)]
        a, bb = A[j], b[j]
        g = np.clip(-(bb / (1 + np.exp(bb * np.sum(a * x, 1))))[:, None] * a + lam * x, -c, c)
        m = np.where(on, g + sigma * rng.normal(size=(n, d)) + beta * m, beta * m)        # (5a)
        x = x - alpha * np.where(on, m, 0) + gamma * cons                                  # (5b)
        diff = x - xh
        if k < d:                                                                          # (5c)
            idx = np.argpartition(-np.abs(diff), k - 1, axis=1)[:, :k]
            diff = _keep(diff, idx)
        xh = xh + np.where(on, diff, 0)                                                    # (5d)
    return x.mean(0)


def _keep(v: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Top-k: v's entries at idx, zeros elsewhere (no rescaling)."""
    out = np.zeros_like(v)
    np.put_along_axis(out, idx, np.take_along_axis(v, idx, 1), 1)
    return out


def main(datasets: int, streams: int, intercept: bool = False) -> None:
    sc = load_scenario("scenarios/do_adp_cheapest.toml")
    out: dict = {}
    for ds in range(datasets):
        data = load_dataset(sc.data, sc.agents.count, Streams(ds))
        A, b = data.X.astype(np.float64), 2.0 * data.y - 1
        lam = np.full(A.shape[1] + intercept, sc.model.l2)
        if intercept:
            A = np.concatenate([A, np.ones((len(A), 1))], 1)
            lam[-1] = 0.0
        fs = f_star(A, b, lam)
        for p, kd in CONFIGS:
            sigma = cf.do_adp_theorem1_sigma(1.0, 1e-5, len(data.parts[0]), 6000, 1.0, kd, p, strict=False).sigma
            for s in range(streams):
                xb = do_adp(A, b, data.parts, p, kd, sigma, 1000 + 100 * ds + s, lam=lam)
                out.setdefault((p, kd), []).append(objective(A, b, lam, xb)[0] - fs)
    for (p, kd), v in out.items():
        print(f"(p, k/d) = ({p}, {kd}): n = {len(v)}, f(x_bar_T) - f* = {np.mean(v):.3f} +- {np.std(v, ddof=1):.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12, int(sys.argv[2]) if len(sys.argv) > 2 else 1,
         len(sys.argv) > 3 and sys.argv[3] == "intercept")
