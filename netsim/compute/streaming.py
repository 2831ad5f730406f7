"""Streaming data for online learners and the moving target theta*_t they track (Z. Chen and Y. Wang,
"Locally differentially private distributed online learning with guaranteed optimality", Sec. II-A).

Each agent acquires ``per_round`` new samples per step, drawn i.i.d. with replacement from its own
partition (the i.i.d. model of Assumption 3) from its own named stream ``("data_stream", i)``, and
appends them to an append-only history D_t^i. The time-varying ERM objective (eq. 2) is

    F_t(theta) = (1/m) sum_i f_t^i(theta),   f_t^i = mean loss over D_t^i  (+ the model's L2 term)

and theta*_t its minimiser. ``tracking_metrics`` evaluates the learners against theta*_t (Remark 1):
mean_i ||theta_i - theta*_t||^2, ||mean_i theta_i - theta*_t|| (Table I) and the instantaneous regret
mean_i F_t(theta_i) - F_t(theta*_t). The oracle is a warm-started damped Newton solver on the pooled,
weighted history, exact to a gradient norm of 1e-10; it knows the binary logistic
model's loss (netsim's ``logistic``: with ``model.bias`` an unpenalised intercept, last in the parameter
row; without it exactly the d feature weights, as Chen & Wang's Experiment A defines the model).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from netsim.errors import InputError

if TYPE_CHECKING:
    import torch


class HistoryStream:
    """One agent's data stream and its append-only history of training-row indices."""

    def __init__(self, pool: np.ndarray, rng: np.random.Generator, per_round: int = 1):
        if len(pool) == 0:
            raise ValueError("an agent without training rows cannot stream data")
        self.pool, self.rng, self.per_round = pool, rng, int(per_round)
        self._buf = np.zeros(max(64, 4 * self.per_round), dtype=np.int64)  # zeros: two equal streams compare equal
        self.n = 0

    def next(self) -> np.ndarray:
        """Acquire xi_t (``per_round`` rows) and append it to the history; returns the new rows."""
        if self.per_round == 1 and self.n < len(self._buf):  # one row: numpy's scalar draw, the same bits, 4x cheaper
            i = self.rng.integers(0, len(self.pool))
            self._buf[self.n] = self.pool[i]
            self.n += 1
            return self.pool[i:i + 1]
        new = self.pool[self.rng.integers(0, len(self.pool), self.per_round)]
        if self.n + len(new) > len(self._buf):
            grown = np.zeros(2 * (self.n + len(new)), dtype=np.int64)
            grown[:self.n] = self._buf[:self.n]
            self._buf = grown  # earlier views stay valid: rows are only ever appended
        self._buf[self.n:self.n + len(new)] = new
        self.n += len(new)
        return new

    @property
    def history(self) -> np.ndarray:
        """D_t^i as row indices (a view; never modified afterwards)."""
        return self._buf[:self.n]

    def restore(self, rows: list) -> None:
        """A fresh stream's history set to ``rows`` (a checkpoint's ``history``; its generator stands where it stood
        there, put back with the run's streams); ValueError unless they are rows of its pool."""
        if self.n:
            raise ValueError("a stream's history is restored before it acquires anything")
        if not (isinstance(rows, list) and all(type(r) is int for r in rows)):
            raise ValueError("a stream's history is a list of row indices")
        got = np.asarray(rows, dtype=np.int64)
        if len(got) and not np.isin(got, self.pool).all():
            raise ValueError("a stream's history names rows outside its part")
        self._buf = np.zeros(max(len(self._buf), 2 * len(got)), dtype=np.int64)
        self._buf[:len(got)] = got
        self.n = len(got)


class DataStreams:
    """The run's data streams by owner id (a per-run service: online learners open theirs, the
    ``tracking`` metric reads every history)."""

    def __init__(self) -> None:
        self.streams: dict[int, HistoryStream] = {}

    def open(self, owner: int, pool: np.ndarray, rng: np.random.Generator, per_round: int = 1) -> HistoryStream:
        """``owner``'s stream, created on first use over its rows ``pool`` with its own generator."""
        s = self.streams.get(owner)
        if s is None:
            s = self.streams[owner] = HistoryStream(pool, rng, per_round)
        return s

    def histories(self) -> list[np.ndarray]:
        return [s.history for s in self.streams.values()]


def check_tracking(kind: str) -> None:
    """'tracking' needs a model whose ERM the oracle can solve."""
    if kind != "logistic":
        raise InputError("evaluation.metrics", "'tracking' (distance to theta*_t) needs model.kind = "
                                               f"'logistic' (convex ERM oracle), got {kind!r}")


class TrackingOracle:
    """theta*_t of the pooled histories for netsim's binary logistic model, warm-started Newton.
    ``bias``: the model's unpenalised intercept (last coordinate), or none (exactly d parameters)."""

    def __init__(self, X: np.ndarray, y: np.ndarray, l2: float, m: int, bias: bool = True):
        X = X.astype(np.float64)
        self.Xt = np.hstack([X, np.ones((len(X), 1))]) if bias else X  # [x, 1]: the bias column
        self.y = y.astype(np.float64)
        self.m = m
        self.reg = np.full(self.Xt.shape[1], float(l2))
        if bias:
            self.reg[-1] = 0.0  # the model does not penalise the bias
        self.theta = np.zeros(self.Xt.shape[1])
        self.newton_steps = 0

    def held(self) -> dict:
        """The solver's warm start (what the next ``solve`` starts from: it moves the last bits of every later
        theta*_t) and its step count, as JSON data: what a checkpoint keeps so a resumed run tracks the same way."""
        return {"theta": self.theta.tolist(), "newton_steps": self.newton_steps}

    def take(self, held: dict) -> None:
        """``held``'s warm start back in place; ValueError where it is not this oracle's."""
        theta = held.get("theta") if isinstance(held, dict) else None
        steps = held.get("newton_steps") if isinstance(held, dict) else None
        if not (isinstance(theta, list) and len(theta) == len(self.theta) and all(type(v) is float for v in theta)
                and np.isfinite(theta).all() and type(steps) is int and steps >= 0):
            raise ValueError(f"tracking: not a warm start of {len(self.theta)} finite numbers and a step count")
        self.theta = np.array(theta, dtype=np.float64)
        self.newton_steps = steps

    def weights(self, histories: list[np.ndarray]) -> np.ndarray:
        """Row weights of F_t: each non-empty history contributes (1/m') count / |D_i|."""
        live = [h for h in histories if len(h)]
        w = np.zeros(len(self.y))
        for h in live:
            w += np.bincount(h, minlength=len(self.y)) / (len(h) * len(live))
        return w

    def value(self, theta: np.ndarray, rows: np.ndarray, w: np.ndarray) -> np.ndarray:
        """F_t at each row of ``theta`` (R, P)."""
        z = self.Xt[rows] @ np.atleast_2d(theta).T  # (n, R)
        loss = np.logaddexp(0.0, z) - self.y[rows, None] * z
        return w @ loss + 0.5 * ((np.atleast_2d(theta) ** 2) * self.reg).sum(1)

    def solve(self, rows: np.ndarray, w: np.ndarray, tol: float = 1e-10, max_steps: int = 100) -> np.ndarray:
        X, y = self.Xt[rows], self.y[rows]
        th = self.theta.copy()
        f = self.value(th, rows, w)[0]
        for _ in range(max_steps):
            s = 1.0 / (1.0 + np.exp(-(X @ th)))
            g = X.T @ (w * (s - y)) + self.reg * th
            if np.linalg.norm(g) <= tol:
                break
            H = (X.T * (w * s * (1 - s))) @ X + np.diag(self.reg) + 1e-12 * np.eye(len(th))
            step = np.linalg.solve(H, g)
            a = 1.0
            while True:  # backtracking (Armijo): Newton from a far warm start can overshoot
                cand = th - a * step
                fc = self.value(cand, rows, w)[0]
                if fc <= f - 1e-4 * a * (g @ step) or a < 1e-8:
                    break
                a /= 2
            th, f = cand, fc
            self.newton_steps += 1
        self.theta = th
        return th


def tracking_metrics(streams: DataStreams | None, oracle: Callable[[], TrackingOracle],
                     bank: torch.Tensor) -> dict[str, float]:
    """tracking_mse = mean_i ||theta_i - theta*_t||^2, tracking_avg = ||theta_bar - theta*_t||,
    regret = mean_i F_t(theta_i) - F_t(theta*_t); NaN before any agent has streamed data."""
    import torch
    keys = ("tracking_mse", "tracking_avg", "regret")
    hist = streams.histories() if streams is not None else []
    if not any(len(h) for h in hist):
        return dict.fromkeys(keys, math.nan)
    oracle = oracle()  # made on first use (it stacks the training rows)
    w = oracle.weights(hist)
    rows = np.flatnonzero(w)
    from threadpoolctl import threadpool_limits  # (scikit-learn's dependency)

    with threadpool_limits(1):  # small dense solves: threads only contend on a shared machine (10x)
        star = oracle.solve(rows, w[rows])
    W = bank.detach().to("cpu", torch.float64).numpy()
    if W.shape[1] != oracle.Xt.shape[1]:
        raise InputError("evaluation.metrics", f"'tracking': the model has {W.shape[1]} parameters, the "
                                               f"oracle's logistic model {oracle.Xt.shape[1]}")
    F = oracle.value(W, rows, w[rows])
    f_star = oracle.value(star, rows, w[rows])[0]
    return {"tracking_mse": float(((W - star) ** 2).sum(1).mean()),
            "tracking_avg": float(np.linalg.norm(W.mean(0) - star)),
            "regret": float(F.mean() - f_star)}
