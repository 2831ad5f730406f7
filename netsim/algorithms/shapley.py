"""Shapley values of a small cooperative game, and PDSL's normalisation and weighting.

Wang, Yuan, Wang, Li, "PDSL: Privacy-Preserved Decentralized Stochastic Learning with Heterogeneous
Data Distribution", Sec. III-B: players are agent i's closed neighbourhood M_i, a
coalition S is worth v(S) = validation accuracy of the averaged candidate model x_{i,S} (eqs. 16-17),
v(empty) = 0 (Definition 3).

- ``exact_shapley``: eq. (18), phi_j = sum_{S not containing j} |S|! (n-|S|-1)! / n! [v(S+j) - v(S)]
  (2^n - 1 coalitions; the default for n <= 8, no variance).
- ``mc_shapley``: Algorithm 2 / eq. (26), the mean over R permutations of each player's marginal
  contribution to its predecessors. Permutations share prefixes, so the coalitions are collected
  first and deduplicated (the coalition cache), then valued in ONE call of the utility: the caller
  batches all their forward passes. ``stratified`` permutations are cyclic shifts of random ones so
  each player comes first equally often (with v(empty) = 0 the first player's marginal is
  ~the whole accuracy).
- ``minmax``: eq. (19) with a guard (all phi equal -> uniform).
- ``pdsl_weights``: eq. (20), pi_ij = phi_hat_ij / (w_ij sum_k phi_hat_ik); optional share floor
  and the ablation without the division by w.

Coalitions are bit masks over player indices 0..n-1 (bit j = player j). Pure numpy; no torch, no
simulator: the utility is any callable ``list[int] -> sequence of float``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

Utility = Callable[[list[int]], Sequence[float]]


def members(mask: int) -> list[int]:
    """Player indices in a coalition bit mask, ascending."""
    return [j for j in range(mask.bit_length()) if mask >> j & 1]


def all_coalitions(n: int) -> list[int]:
    """Every non-empty coalition of n players (1 .. 2^n - 1)."""
    return list(range(1, 1 << n))


def exact_shapley(n: int, v: Callable[[int], float], v_empty: float = 0.0) -> np.ndarray:
    """Eq. (18): exact Shapley values from v over all coalitions (v(0) = ``v_empty``)."""
    fact = [math.factorial(k) for k in range(n + 1)]
    val = lambda m: v_empty if m == 0 else v(m)  # noqa: E731
    phi = np.zeros(n)
    for j in range(n):
        bit = 1 << j
        for s in range(1 << n):
            if s & bit:
                continue
            k = s.bit_count()
            phi[j] += fact[k] * fact[n - k - 1] / fact[n] * (val(s | bit) - val(s))
    return phi


def permutations(n: int, R: int, rng: np.random.Generator, stratified: bool = True) -> np.ndarray:
    """(R, n) player orders. Stratified: blocks of n cyclic shifts of one random permutation, so every
    player is first (and at every position) equally often when n divides R."""
    if not stratified:
        return np.stack([rng.permutation(n) for _ in range(R)]) if R else np.zeros((0, n), dtype=int)
    out = []
    while len(out) < R:
        base = rng.permutation(n)
        out.extend(np.roll(base, -s) for s in range(n))
    return np.stack(out[:R]) if R else np.zeros((0, n), dtype=int)


def prefix_coalitions(perms: np.ndarray) -> list[int]:
    """The distinct non-empty prefixes of the permutations (what Algorithm 2 values), in first-seen order."""
    seen: dict[int, None] = {}
    for p in perms:
        m = 0
        for j in p:
            m |= 1 << int(j)
            seen.setdefault(m, None)
    return list(seen)


def mc_shapley(perms: np.ndarray, v: Callable[[int], float], v_empty: float = 0.0) -> np.ndarray:
    """Algorithm 2 / eq. (26): phi_j = (1/R) sum_r [v(Z_j^r + j) - v(Z_j^r)], Z_j^r = j's predecessors."""
    R, n = perms.shape
    phi = np.zeros(n)
    for p in perms:
        m, prev = 0, v_empty
        for j in p:
            m |= 1 << int(j)
            cur = v(m)
            phi[j] += cur - prev
            prev = cur
    return phi / max(R, 1)


def plan(n: int, *, exact_max: int = 8, R: int | None = None, rng: np.random.Generator | None = None,
         stratified: bool = True) -> tuple[list[int], np.ndarray | None]:
    """The coalitions to value (deduplicated: the coalition cache) and the permutations (None: exact).
    Exact if n <= ``exact_max``, else R permutations (default 2n)."""
    if n <= exact_max:
        return all_coalitions(n), None
    if rng is None:
        raise ValueError("Monte-Carlo Shapley needs an rng")
    perms = permutations(n, R if R is not None else 2 * n, rng, stratified)
    return prefix_coalitions(perms), perms


def from_values(n: int, perms: np.ndarray | None, v: Callable[[int], float],
                v_empty: float = 0.0) -> np.ndarray:
    """Shapley values from the coalition values of a ``plan``: eq. (18) or eq. (26)."""
    return exact_shapley(n, v, v_empty) if perms is None else mc_shapley(perms, v, v_empty)


def shapley(n: int, utility: Utility, *, exact_max: int = 8, R: int | None = None,
            rng: np.random.Generator | None = None, stratified: bool = True,
            v_empty: float = 0.0) -> tuple[np.ndarray, dict[int, float]]:
    """Shapley values of n players; ``utility`` is called ONCE with every coalition needed
    (deduplicated), so its forward passes can be batched. Returns (phi, the coalition values)."""
    masks, perms = plan(n, exact_max=exact_max, R=R, rng=rng, stratified=stratified)
    vals = dict(zip(masks, (float(x) for x in utility(masks)), strict=True))
    return from_values(n, perms, vals.__getitem__, v_empty), vals


def minmax(phi: Iterable[float], guard: float = 1e-12) -> np.ndarray:
    """Eq. (19): (phi - min) / (max - min); all equal (max - min < guard) -> all ones."""
    phi = np.asarray(phi, dtype=float)
    span = phi.max() - phi.min()
    if span < guard:
        return np.ones_like(phi)
    return (phi - phi.min()) / span


def pdsl_weights(phi_hat: np.ndarray, omega: np.ndarray, divide_by_omega: bool = True,
                 share_floor: float = 0.0) -> np.ndarray:
    """Eq. (20): pi_j = s_j / w_j with shares s = phi_hat / sum(phi_hat), optionally mixed with uniform
    shares (1 - f) s + f / n. Without the division pi = s sums to 1."""
    s = phi_hat / phi_hat.sum()
    if share_floor:
        s = (1.0 - share_floor) * s + share_floor / len(s)
    return s / omega if divide_by_omega else s
