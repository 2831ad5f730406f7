"""Topologies as weighted networkx DiGraphs (BlueFog style) and their mixing matrices.

``W[i, j]`` is the weight agent i gives to the value it holds of agent j (j = i: its own), so a
gossip step is ``x_i <- sum_j W[i, j] x_j``. Row-stochastic matrices average; column-stochastic ones
(push-sum) conserve mass: agent j splits its value over its out-neighbours and itself.
"""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import numpy as np
from scipy import sparse

from netsim.errors import InputError
from netsim.scenario.schema import TopologySpec
from netsim.sim.graph_arrays import DENSE_GAP_MAX, dense_gap, edge_weights, fixed_edges, grid_shape


def _read_edges(path: str, n: int) -> nx.DiGraph:
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise InputError("topology.path", f"cannot read edges file {path!r}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InputError("topology.path", f"edges file {path!r} is not UTF-8 text: {e.reason} at byte {e.start}") \
            from None
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for lineno, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].replace(",", " ").strip()
        if not line:
            continue
        parts = line.split()
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            u, v = int(parts[0]), int(parts[1])
            w = float(parts[2]) if len(parts) == 3 else 1.0
        except ValueError:
            raise InputError("topology.path", f"{path}:{lineno}: expected 'src dst [weight]', got {line!r}") from None
        if not (0 <= u < n and 0 <= v < n) or u == v:
            raise InputError("topology.path", f"{path}:{lineno}: agent ids must be distinct and in [0, {n - 1}]")
        g.add_edge(u, v, weight=w)
    return g


def _numbers(values) -> list[float]:
    out: list[float] = []
    for v in values:
        if isinstance(v, list | tuple):
            out += _numbers(v)
        elif isinstance(v, dict):
            out += _numbers(v.values())
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out.append(v)
    return out


GENERATOR_MODULES = ("networkx.generators.", "networkx.algorithms.bipartite.generators")


def _networkx_graph(spec: TopologySpec, n: int, seed: int) -> nx.Graph:
    """``kind = "networkx"``: a networkx graph generator (``networkx.generators``, the bipartite generators) by
    name with the scenario's arguments (only those functions: a name is never resolved elsewhere); nodes
    relabelled 0..n-1 in sorted order."""
    import inspect

    name = spec.generator or ""
    fn = getattr(nx, name, None) if not name.startswith("_") else None
    module = getattr(fn, "__module__", "") or ""
    if not (inspect.isfunction(fn) and module.startswith(GENERATOR_MODULES)):
        raise InputError("topology.generator", f"{name!r} is not a graph generator of networkx.generators "
                                               "(e.g. 'complete_bipartite_graph', 'watts_strogatz_graph', "
                                               "'barabasi_albert_graph', 'hypercube_graph')")
    kwargs = dict(spec.kwargs or {})
    big = [v for v in _numbers([*(spec.args or ()), *(v for k, v in kwargs.items() if k != "seed")]) if abs(v) > n]
    if big:  # every size argument of a graph on n nodes is at most n; a larger one would build a bigger graph
        raise InputError("topology.args", f"networkx.{name}: numbers larger than agents.count ({n}) are refused, "
                                          f"got {big[0]}")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "seed" in params and "seed" not in kwargs:
        kwargs["seed"] = seed % 2**31
    try:
        g = fn(*(spec.args or ()), **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure of a user-chosen generator is an input error
        raise InputError("topology.args", f"networkx.{name}{tuple(spec.args or ())} failed: "
                                          f"{type(e).__name__}: {e}") from None
    if not isinstance(g, nx.Graph) or g.is_multigraph():
        raise InputError("topology.generator", f"networkx.{name} did not return a simple graph")
    if g.number_of_nodes() != n:
        raise InputError("topology.args", f"networkx.{name} made {g.number_of_nodes()} nodes; agents.count is {n}")
    try:
        order = sorted(g.nodes)
    except TypeError:
        order = list(g.nodes)
    g = nx.relabel_nodes(g, {v: i for i, v in enumerate(order)})
    g.remove_edges_from(list(nx.selfloop_edges(g)))
    if spec.directed and not g.is_directed():
        g = nx.DiGraph(g)
    if not spec.directed and g.is_directed():
        g = g.to_undirected()
    return g


def build_graph(spec: TopologySpec, n: int, seed: int) -> nx.DiGraph:
    """The communication graph: edge u -> v means u can send to v. Undirected kinds get both ways."""
    k = spec.kind
    if k == "ring":
        g = nx.cycle_graph(n, create_using=nx.DiGraph if spec.directed else nx.Graph)
    elif k in ("torus", "grid"):
        rows, cols = grid_shape(n, spec.rows, k)
        g = nx.grid_2d_graph(rows, cols, periodic=(k == "torus"))
        g = nx.relabel_nodes(g, {(r, c): r * cols + c for r, c in g.nodes})
    elif k == "complete":
        g = nx.complete_graph(n)
    elif k == "star":
        g = nx.star_graph(n - 1)
    elif k == "erdos_renyi":
        rng = np.random.default_rng(seed)
        for _ in range(100):
            g = nx.gnp_random_graph(n, spec.p, seed=int(rng.integers(2**31)), directed=spec.directed)
            if (nx.is_strongly_connected(g) if spec.directed else nx.is_connected(g)):
                break
        else:
            raise InputError("topology.p", f"{spec.p} gives no connected graph on {n} agents in 100 draws; raise p")
    elif k == "random_regular":
        if spec.degree >= n or (n * spec.degree) % 2:
            raise InputError("topology.degree", f"need degree < count and degree*count even; got {spec.degree}, {n}")
        g = nx.random_regular_graph(spec.degree, n, seed=seed % 2**31)
    elif k == "exponential":
        g = nx.DiGraph() if spec.directed else nx.Graph()
        g.add_nodes_from(range(n))
        hops = [2**i for i in range(int(math.log2(n - 1)) + 1)] if n > 1 else []
        g.add_edges_from((i, (i + h) % n) for i in range(n) for h in hops if (i + h) % n != i)
    elif k == "networkx":
        g = _networkx_graph(spec, n, seed)
    elif k == "edges_file":
        g = _read_edges(spec.path, n)  # type: ignore[arg-type]
        if not spec.directed:
            g = nx.DiGraph(g.to_undirected())
    else:  # pragma: no cover - schema forbids it
        raise InputError("topology.kind", f"unknown topology {k!r}")
    g = nx.DiGraph(g)
    connected = nx.is_strongly_connected(g) if n > 1 else True
    if not connected:
        raise InputError("topology", f"{k} graph on {n} agents is not (strongly) connected")
    return g


def mixing_matrix(g: nx.DiGraph, kind: str) -> sparse.csr_matrix:
    """Sparse mixing matrix for ``g`` (edge u -> v: v receives from u, so W[v, u] may be > 0)."""
    n = g.number_of_nodes()
    indeg = np.array([g.in_degree(i) for i in range(n)], dtype=float)
    outdeg = np.array([g.out_degree(i) for i in range(n)], dtype=float)
    edges = np.array(list(g.edges), dtype=np.int64).reshape(-1, 2)
    return mixing_of_edges(n, edges[:, 0], edges[:, 1], kind, indeg, outdeg)


def mixing_of_edges(n: int, u: np.ndarray, v: np.ndarray, kind: str, indeg: np.ndarray | None = None,
                    outdeg: np.ndarray | None = None) -> sparse.csr_matrix:
    """``mixing_matrix`` of the graph with edges u -> v (in any order: the matrix is canonical CSR, its rows summed
    in column order)."""
    if indeg is None or outdeg is None:
        indeg = np.bincount(v, minlength=n).astype(float)
        outdeg = np.bincount(u, minlength=n).astype(float)
    w = edge_weights(indeg, outdeg, u, v, kind)
    off = sparse.csr_matrix((w, (v, u)), shape=(n, n))
    if kind == "column_stochastic":
        diag = 1.0 / (outdeg + 1)
    else:
        diag = 1.0 - np.asarray(off.sum(axis=1)).ravel()
    return (off + sparse.diags(diag)).tocsr()


def spectral_gap(W: sparse.spmatrix | np.ndarray) -> float | None:
    """1 - |lambda_2(W)| (second-largest eigenvalue modulus); None when it cannot be computed cheaply.

    Small graphs: dense solver (eigvalsh when W is symmetric). Larger circulant ones (W[i, j] depends on
    (j - i) mod n only: rings, circulant and exponential graphs) in closed form, lambda_k = sum_t c_t
    exp(2 pi i t k / n) over the row's offsets t (Gray, "Toeplitz and Circulant Matrices", Sec. 3.1), for any
    n while n x (entries per row) stays under 2 * 10^7.
    Other larger ones: ARPACK on the sparse matrix (a dense solve costs 5-12 s of setup at 1000 agents
    here), then the dense solver up to 2000 agents when ARPACK does not converge.
    """
    n = W.shape[0]
    if n == 1:
        return 1.0
    Ws = sparse.csr_matrix(W)
    if n <= DENSE_GAP_MAX:
        return dense_gap(Ws.toarray())
    symmetric = abs(Ws - Ws.T).max() <= 1e-12

    def dense() -> np.ndarray:
        d = Ws.toarray()
        return np.linalg.eigvalsh(d) if symmetric else np.linalg.eigvals(d)

    if (circ := _circulant_row(Ws)) is not None:
        t, c = circ
        k = np.arange(n)[:, None]
        if symmetric:  # real: 1 - lambda_k = sum_t c_t (1 - cos(2 pi t k / n)) + 1 - sum_t c_t, kept as it is
            # (lambda_k itself rounds to 1 within 1e-16: a ring of 10^5 has a gap of 1.3e-9), then 1 - |lambda_k|
            drop = (2.0 * c * np.sin(np.pi * ((t * k) % n) / n) ** 2).sum(axis=1) + (1.0 - c.sum())
            return float(np.sort(np.where(drop <= 1.0, drop, 2.0 - drop))[1])
        else:
            lam = (c * np.exp(2j * np.pi * ((t * k) % n) / n)).sum(axis=1)
    else:
        from scipy.sparse.linalg import ArpackNoConvergence, eigs, eigsh

        try:
            # 300 restarts: tori, grids, expanders of 10k converge in < 200; a ring of > 2000 never does. Beyond
            # 20,000 agents an expander's clustered spectrum needs a wider Krylov space: a random 4-regular graph
            # of 10^5 does not converge in 300 restarts of the default (97 s), and does with 40 vectors (6 s).
            wide = {"ncv": 40, "tol": 1e-10} if n > 20_000 else {}
            if symmetric:
                lam = eigsh(Ws, k=3, which="LM", return_eigenvectors=False, maxiter=300, **wide)
            else:
                lam = eigs(Ws, k=2, which="LM", return_eigenvectors=False, maxiter=300)
        except ArpackNoConvergence:
            if n > 2000:
                return None
            lam = dense()
    lam = np.sort(np.abs(lam))[::-1]
    return float(1.0 - lam[1])


def _circulant_row(W: sparse.csr_matrix) -> tuple[np.ndarray, np.ndarray] | None:
    """(offsets t, values c) of row 0 when every row i holds the same values at the same offsets (j - i) mod n,
    else None."""
    n = W.shape[0]
    counts = np.diff(W.indptr)
    m = int(counts[0])
    if m == 0 or (counts != m).any() or n * m > 2 * 10**7:  # dense rows of a large graph: ARPACK instead
        return None
    offsets = (W.indices.reshape(n, m) - np.arange(n)[:, None]) % n
    order = np.argsort(offsets, axis=1, kind="stable")
    offsets = np.take_along_axis(offsets, order, axis=1)
    values = np.take_along_axis(W.data.reshape(n, m), order, axis=1)
    if (offsets != offsets[0]).any() or (values != values[0]).any():
        return None
    return offsets[0].astype(np.float64), values[0]


class Topology:
    """A run's static communication graph as arrays: each agent's sorted out- and in-neighbours and the mixing matrix
    ``W``. The networkx graph (``weighted_graph``'s, ``weight`` edges) is built on first use of ``graph`` only: a
    fixed topology's arrays come from ``graph_arrays.fixed_edges`` (the same edges, so the same ``W``), and a run
    that reads no graph (the synchronous drivers, the agents' neighbour lists) never pays for one (a ring of 10^6
    agents: ~1 KiB an agent and a minute of set-up)."""

    def __init__(self, spec: TopologySpec, n: int, seed: int):
        self.spec, self.n, self.seed = spec, n, seed
        self._graph: nx.DiGraph | None = None
        edges = fixed_edges(spec, n)
        if edges is None:
            self._graph, self.W = weighted_graph(spec, n, seed)
            e = np.array(list(self._graph.edges), dtype=np.int64).reshape(-1, 2)
            edges = e[:, 0], e[:, 1]
        else:
            self.W = mixing_of_edges(n, *edges, spec.mixing_kind)
        u, v = edges
        self.edges = len(u)
        self._out = _adjacency(n, u, v)
        self._in = _adjacency(n, v, u)

    @property
    def graph(self) -> nx.DiGraph:
        """The networkx DiGraph with ``weight`` edge attributes (built now if not yet: ``weighted_graph``)."""
        if self._graph is None:
            self._graph, _ = weighted_graph(self.spec, self.n, self.seed)
        return self._graph

    def neighbors(self, i: int) -> list[int]:
        """Agent i's out-neighbours, sorted (``sorted(graph.successors(i))``)."""
        ptr, to = self._out
        return to[ptr[i]:ptr[i + 1]].tolist()

    def in_neighbors(self, i: int) -> list[int]:
        """Agent i's in-neighbours, sorted (``sorted(graph.predecessors(i))``)."""
        ptr, fr = self._in
        return fr[ptr[i]:ptr[i + 1]].tolist()

    def edge_array(self) -> np.ndarray:
        """Every edge u -> v as rows (u, v), sorted."""
        ptr, to = self._out
        return np.column_stack([np.repeat(np.arange(self.n, dtype=np.int64), np.diff(ptr)), to])


def _adjacency(n: int, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pointers, targets): b of the edges a -> b grouped by a, each group sorted."""
    order = np.lexsort((b, a))
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(a, minlength=n), out=ptr[1:])
    return ptr, np.ascontiguousarray(b[order], dtype=np.int64)


def weighted_graph(spec: TopologySpec, n: int, seed: int) -> tuple[nx.DiGraph, sparse.csr_matrix]:
    """Graph with the mixing weights as edge attribute ``weight`` (w on u -> v is W[v, u])."""
    g = build_graph(spec, n, seed)
    W = mixing_matrix(g, spec.mixing_kind)
    coo = W.tocoo()
    nx.set_edge_attributes(g, {(int(c), int(r)): float(x) for r, c, x in zip(coo.row, coo.col, coo.data)
                               if r != c}, "weight")
    return g, W
