"""f* = min_x f(x) of a convex training objective, for the ``suboptimality`` metric f(x̄) - f*.

Solved once per (data, model) in float64 and cached on disk by a hash of the training rows and the model's
settings ($NETSIM_CACHE, default ~/.cache/netsim), so a sweep solves it once. Binary logistic regression:
Newton's method with backtracking (exact Hessian, P <= a few thousand); multinomial: L-BFGS (scipy). Both
stop at a gradient norm below ``tol`` and refuse to report an f* they did not reach.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from netsim.compute.models import MLP, LogisticRegression
from netsim.errors import InputError

TOL = 1e-9


def cache_dir() -> Path:
    return Path(os.environ.get("NETSIM_CACHE") or Path.home() / ".cache" / "netsim") / "fstar"


def _key(model, X: np.ndarray, y: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(X, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
    kind = "logistic" if isinstance(model, LogisticRegression) else "multinomial"
    h.update(json.dumps([kind, float(model.l2), bool(model.bias), X.shape, TOL]).encode())
    return h.hexdigest()


def optimum(model, X: np.ndarray, y: np.ndarray) -> float:
    """f* of ``model``'s training objective (mean loss + l2/2 ||weights||^2) on rows X, y; cached."""
    if not (isinstance(model, LogisticRegression) or (isinstance(model, MLP) and len(model.dims) == 2)):
        raise InputError("evaluation.metrics", "'suboptimality' needs a convex model (model.kind = 'logistic' "
                                               "or 'multinomial'): f* of a neural network is unknown")
    path = cache_dir() / f"{_key(model, X, y)}.json"
    try:
        return float(json.loads(path.read_text())["f_star"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    f_star, gnorm = solve(model, X, y)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"f_star": f_star, "grad_norm": gnorm}))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: solve again next time
    return f_star


def solve(model, X: np.ndarray, y: np.ndarray, tol: float = TOL) -> tuple[float, float]:
    """(f*, ||grad f(x*)||) in float64."""
    Xt = torch.as_tensor(np.asarray(X), dtype=torch.float64)
    yt = torch.as_tensor(np.asarray(y), dtype=torch.int64)
    if isinstance(model, LogisticRegression):
        return _newton(model, Xt, yt, tol)
    return _lbfgs(model, Xt, yt, tol)


def _unsolved(gnorm: float) -> InputError:
    return InputError("evaluation.metrics", f"'suboptimality': f* not reached (gradient norm {gnorm:.2e}); the "
                                            "objective may have no minimum (separable data without model.l2 > 0)")


def _newton(model: LogisticRegression, X: torch.Tensor, y: torch.Tensor, tol: float) -> tuple[float, float]:
    n, d = X.shape
    A = torch.cat([X, torch.ones(n, 1, dtype=X.dtype)], 1) if model.bias else X
    s = (2 * y - 1).to(X.dtype)
    reg = torch.full((A.shape[1],), model.l2, dtype=X.dtype)
    if model.bias:
        reg[-1] = 0.0

    def f(w):
        return float(torch.nn.functional.softplus(-s * (A @ w)).mean() + 0.5 * (reg * w * w).sum())

    w = torch.zeros(A.shape[1], dtype=X.dtype)
    for _ in range(200):
        z = A @ w
        p = torch.sigmoid(-s * z)  # d softplus(-s z)/dz = -s p
        g = A.T @ (-s * p) / n + reg * w
        gnorm = float(torch.linalg.vector_norm(g))
        if gnorm < tol:
            return f(w), gnorm
        h = p * (1 - p)
        H = (A.T * h) @ A / n + torch.diag(reg) + 1e-14 * torch.eye(A.shape[1], dtype=X.dtype)
        step = torch.linalg.lstsq(H, g.unsqueeze(1)).solution.squeeze(1)
        t, f0, slope = 1.0, f(w), float(g @ step)
        while f(w - t * step) > f0 - 1e-4 * t * slope and t > 1e-12:
            t *= 0.5
        w = w - t * step
    raise _unsolved(gnorm)


def _lbfgs(model: MLP, X: torch.Tensor, y: torch.Tensor, tol: float) -> tuple[float, float]:
    from scipy.optimize import minimize

    m64 = MLP(model.dims[0], model.dims[-1], (), model.l2, model.bias)

    def fg(w):
        W = torch.as_tensor(w, dtype=torch.float64).unsqueeze(0)
        loss, _ = m64.evaluate(W, X, y)
        g = m64.grad(W, X.unsqueeze(0), y.unsqueeze(0))[0]
        return float(loss[0]), g.numpy().astype(np.float64)

    res = minimize(fg, np.zeros(m64.size), jac=True, method="L-BFGS-B",
                   options={"gtol": tol, "ftol": 0.0, "maxiter": 20000, "maxcor": 30})
    gnorm = float(np.linalg.norm(fg(res.x)[1]))
    if gnorm >= max(tol, 1e-7):
        raise _unsolved(gnorm)
    return float(res.fun), gnorm
