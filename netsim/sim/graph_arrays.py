"""The mixing weights and spectral gap with numpy only, and the fixed topologies as edge arrays.

``netsim validate`` reports the gap of a ring, torus, grid, complete, star or exponential graph without
importing networkx and scipy (together ~0.25 s, half its budget); ``sim/topology.py`` builds the run's graph
with networkx and its sparse matrix from the same weights (``edge_weights``) and gap (``dense_gap``), and
tests/test_validate_lean.py keeps ``fixed_edges`` equal to its graphs edge for edge and ``dense_mixing``
equal to its matrix bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from netsim.errors import InputError

DENSE_GAP_MAX = 400  # agents up to which the gap is an eigenvalue solve of the dense matrix


def grid_shape(n: int, rows: int | None, kind: str = "grid") -> tuple[int, int]:
    """(rows, cols) of a torus or grid of n agents: ``topology.rows``, else the squarest factorisation. A prime
    count has none but 1 x n: refused, not silently built as a line (a ring for a torus); ``rows = 1`` asks for
    that shape on purpose."""
    if rows is None:
        rows = max(r for r in range(1, int(math.isqrt(n)) + 1) if n % r == 0)
        if rows == 1 and n > 1:
            shape = "line" if kind == "grid" else "ring"
            near = [c for c in (n - 1, n + 1, n + 2) if c >= 4 and any(c % r == 0 for r in range(2, math.isqrt(c) + 1))]
            raise InputError("topology.kind", f"a {kind!r} of {n} agents would be a single {shape} ({n} is prime: "
                                              f"no rows x columns both >= 2); allowed: an agents.count with a "
                                              f"factor >= 2 (such as {' or '.join(map(str, near[:2]))}), or "
                                              f"topology.rows = 1 for a {shape} on purpose")
    if n % rows:
        raise InputError("topology.rows", f"{rows} rows do not divide {n} agents")
    return rows, n // rows


def fixed_edges(spec, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(u, v) of every directed edge u -> v of a fixed (unrandomised, file-free) topology, undirected ones both
    ways, in no particular order; None for the kinds (and the small sizes with self-loops or merged edges)
    only ``topology.build_graph`` builds."""
    k = spec.kind
    pairs: set[tuple[int, int]] = set()
    both = not spec.directed
    if k == "ring" and n >= 3:
        pairs = {(i, (i + 1) % n) for i in range(n)}
    elif k == "exponential" and n >= 3:
        hops = [2**i for i in range(int(math.log2(n - 1)) + 1)]
        pairs = {(i, (i + h) % n) for i in range(n) for h in hops if (i + h) % n != i}
    elif k in ("torus", "grid") and n >= 3:
        rows, cols = grid_shape(n, spec.rows, k)
        if k == "torus" and min(rows, cols) < 3:
            return None
        wrap = k == "torus"
        for r in range(rows):
            for c in range(cols):
                if c + 1 < cols or wrap:
                    pairs.add((r * cols + c, r * cols + (c + 1) % cols))
                if r + 1 < rows or wrap:
                    pairs.add((r * cols + c, ((r + 1) % rows) * cols + c))
        both = True
    elif k == "complete" and n >= 2:
        pairs = {(i, j) for i in range(n) for j in range(i + 1, n)}
        both = True
    elif k == "star" and n >= 2:
        pairs = {(0, j) for j in range(1, n)}
        both = True
    else:
        return None
    if both:
        pairs |= {(b, a) for a, b in pairs}
    e = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    return e[:, 0], e[:, 1]


def edge_weights(indeg: np.ndarray, outdeg: np.ndarray, u: np.ndarray, v: np.ndarray, kind: str) -> np.ndarray:
    """The weight W[v, u] of each edge u -> v (``topology.mixing``)."""
    if kind == "metropolis_hastings":
        return 1.0 / (1 + np.maximum(indeg[u], indeg[v]))
    if kind == "uniform":
        return 1.0 / (indeg[v] + 1)
    if kind == "max_degree":
        return np.full(len(u), 1.0 / (indeg.max() + 1))
    if kind == "column_stochastic":
        return 1.0 / (outdeg[u] + 1)
    raise InputError("topology.mixing", f"unknown mixing {kind!r}")


def dense_mixing(n: int, u: np.ndarray, v: np.ndarray, kind: str) -> np.ndarray:
    """The mixing matrix as a dense array: ``topology.mixing_matrix``'s, value for value (the diagonal sums
    each row's weights in column order, as its sparse row sum does)."""
    indeg = np.bincount(v, minlength=n).astype(float)
    outdeg = np.bincount(u, minlength=n).astype(float)
    w = edge_weights(indeg, outdeg, u, v, kind)
    W = np.zeros((n, n))
    W[v, u] = w
    if kind == "column_stochastic":
        diag = 1.0 / (outdeg + 1)
    else:
        order = np.lexsort((u, v))
        rows, starts = np.unique(v[order], return_index=True)
        off = np.zeros(n)
        if len(order):
            off[rows] = np.add.reduceat(w[order], starts)
        diag = 1.0 - off
    W[np.arange(n), np.arange(n)] = diag
    return W


def dense_gap(W: np.ndarray) -> float:
    """1 - |lambda_2(W)| of a dense matrix (eigvalsh when W is symmetric)."""
    if W.shape[0] == 1:
        return 1.0
    lam = np.linalg.eigvalsh(W) if abs(W - W.T).max() <= 1e-12 else np.linalg.eigvals(W)
    lam = np.sort(np.abs(lam))[::-1]
    return float(1.0 - lam[1])


def spans(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The indices ``first[i]``, ..., ``first[i] + count[i] - 1``, i after i: the entries of CSR slices (each sender's
    out-links, each barrier's senders) as one index array."""
    return np.repeat(first - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
