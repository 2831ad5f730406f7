"""Pairwise network DP from the run that happened: what observer v learns about victim u's data.

Threat model (pairwise network DP: Cyffers & Bellet, "Privacy Amplification by Decentralization", AISTATS
2022; Cyffers, Even, Bellet, Massoulie, "Muffliato: Peer-to-Peer Privacy Amplification for Decentralized
Optimization and Averaging", NeurIPS 2022): an honest-but-curious agent v sees the messages delivered to it
(late ones included), with their senders and rounds, its own states and injections, and the common initial
model; it knows the algorithm, the mixing weights and everyone's gradients except for the victim's
contribution (the worst case of these analyses: the two neighbouring runs differ only through u's clipped
gradients). Dropped messages are not seen.

Exact computation for linear Gaussian algorithms (``LINEAR``): every message is a linear function of the
injected releases r_s = g_s + n_s, n_s ~ N(0, sigma_s^2 I), one slot s per release of the run. Whitening
each slot (h_s = r_s / sigma_s) makes the view y = M h, M the observer's observation matrix with the
columns of its own (known) releases removed; since h is an isotropic Gaussian, P h (P the orthogonal
projector onto the row space of M) is a sufficient statistic and the view is one Gaussian mechanism. The
victim's slots S_u, each shifted by at most Delta_s / sigma_s in whitened units, give the Gram matrix
K = D P[S_u, S_u] D (D = diag(Delta_s / sigma_s)); the Gaussian-DP mu (Dong, Roth, Su, "Gaussian
Differential Privacy", JRSS-B 2022) is sqrt(sup 1^T (K o G) 1) over the Gram matrices G of unit vectors:
sqrt(1^T K 1) when K has no negative entry (``exact``: equal gradient differences attain it), and the
matrix-factorisation bound sqrt(sum |K|) otherwise (``mf-bound``; Bellet, Cyffers, Frey, Gaudel, Lereverend,
Taiani, "Unified Privacy Guarantees for Decentralized Learning via Matrix Factorization", ICLR 2026, whose
sensitivity over the victim's participations it is). epsilon at the run's delta from mu (Dong et al.,
Corollary 2.13). The model dimension does not enter: the mixing acts on every coordinate alike.

The mixing weights are the ones applied, read from the run's mixing record (``RUN/mixing.csv``,
netsim/privacy/views.py: ``privacy.record = "mixing"``); the message of round r from j is j's value before
its mixing step r (both linear algorithms broadcast that value, then mix).

Subsampling (a record enters release s with probability q_s, Poisson sampling, as the per-agent figures take
it) is credited where it composes exactly: when K is diagonal (the victim's slots reach the view along
orthogonal directions: a single release, or releases the view never combines) the view is one independent
Gaussian mechanism per slot, of whitened sensitivity sqrt(K_ss), each amplified by its own sampling:
dp-accounting's ``PoissonSampledDpEvent(q_s, GaussianDpEvent(1 / sqrt(K_ss)))``, composed by its RDP
accountant (``exact, subsampled``; the PLD accountant takes some 0.5 s an event, and each pair's events are
its own). Where the view combines the victim's slots, the subsampled mixture is no event an accountant
composes; the view's figure is then the plain Gaussian one. Every pair figure is also at most the victim's
releases seen directly (post-processing): the per-agent figure, subsampling credited (``local
(post-processing)``); a pair's epsilon is the smallest of these valid figures.

Muffliato's own pairwise bound (its theorem on gossip averaging, as restated by the matrix-factorisation
paper): each message the observer receives, at gossip step s from in-neighbour w, treated as an independent
Gaussian mechanism of sensitivity (W^s)_{wu} Delta and noise sigma ||(W^s)_w||, composed over the messages:
mu_bound^2 = (Delta/sigma)^2 sum_{s<K} sum_{w in N(v)} (W^s)_{wu}^2 / ||(W^s)_w||^2 for one release per agent
(``muffliato_bound``). Over several outer rounds the same per-message composition is applied to the run's
own messages, whose values carry every earlier round (``per_message_bound``). It is reported for a fixed graph
with reliable gossip only, and is *not* an upper bound on the exact view: messages carrying the same
injections without fresh noise can be combined (the output flags ``bound_below_exact``).

Cost: the linear system has one column per release (agents x rounds); each observer's view is one SVD of a
(messages received) x (releases) matrix. ``EXACT_LIMIT`` releases at most (a few thousand: well under a
minute on two cores); larger runs are refused with the limit named.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np

from netsim.errors import InputError

PAIRWISE_FILE = "pairwise.csv"
#: most releases (columns of the linear system) the exact computation takes
EXACT_LIMIT = 6000
#: most bytes the observers' views (messages received x releases, float64) may take together
VIEW_BYTES_LIMIT = 2 * 1024**3
CSV_COLUMNS = ("victim", "observer", "hops", "mu", "epsilon", "delta", "method", "subsampling", "mu_bound",
               "epsilon_bound", "bound_below_exact", "mu_local", "epsilon_local")
#: the methods of the figures that credit subsampling: the view's independent subsampled releases; the
#: victim's releases seen directly
SUBSAMPLED = "exact, subsampled"
LOCAL = "local (post-processing)"


@attrs.frozen
class LinearForm:
    """How a linear Gaussian algorithm's releases and mixing steps make its messages.

    ``release_at``: ``now``, a release enters the agent's value when it is made (x <- x - lr r: Muffliato's
    local step before gossip), or ``step``, it enters in the agent's next mixing step as its gradient step
    (x <- sum_j W_ij x_j - lr r: DP-D-PSGD). ``tag``: the tag of the model messages."""

    name: str
    release_at: Literal["now", "step"]
    tag: str
    paper: str


LINEAR: dict[str, LinearForm] = {
    "muffliato": LinearForm("muffliato", "now", "muff",
                            'Cyffers, Even, Bellet, Massoulie, "Muffliato" (NeurIPS 2022), Algorithm 2'),
    "dp_dpsgd": LinearForm("dp_dpsgd", "step", "model",
                           'Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms?" '
                           "(NeurIPS 2017), Algorithm 1 with a privatized gradient"),
}


def gdp_delta(mu: float, eps: float) -> float:
    """delta(eps) of a mu-GDP mechanism (Dong, Roth, Su, Corollary 2.13)."""
    from scipy.special import log_ndtr, ndtr

    if mu <= 0:
        return 0.0
    a = float(ndtr(-eps / mu + mu / 2))
    b = math.exp(eps + float(log_ndtr(-eps / mu - mu / 2)))
    return max(0.0, a - b)


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon with delta(epsilon) <= delta for a mu-GDP mechanism (0 for mu = 0, inf for
    mu = inf)."""
    from scipy.optimize import brentq

    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if mu <= 0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gdp_delta(mu, hi) > delta:
        hi *= 2
    return float(brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12))


@attrs.frozen
class VictimView:
    """What one observer's view says about one victim: Gaussian-DP ``mu`` and how it was obtained (``method``);
    ``separate``: where the victim's slots reach the view along orthogonal directions (the Gram matrix K is
    diagonal, e.g. a single release), each slot's whitened sensitivity sqrt(K_ss): the view is then one
    independent Gaussian mechanism per release, which subsampling amplifies exactly (else None)."""

    mu: float
    method: str
    separate: np.ndarray | None = None


def victim_mu(basis: np.ndarray, scale: np.ndarray) -> VictimView:
    """The view of one victim from the rows of an orthonormal basis of the view's row space at the
    victim's slots (``basis``: rank x T) and their whitened sensitivities Delta_s / sigma_s (``scale``)."""
    B = basis * scale
    K = B.T @ B
    d = np.clip(np.diag(K), 0.0, None)
    top = float(np.abs(K).max(initial=0.0))
    off = K - np.diag(np.diag(K))
    separate = np.sqrt(d) if float(np.abs(off).max(initial=0.0)) <= 1e-9 * max(top, 1e-300) else None
    if K.shape[0] == 1:
        return VictimView(math.sqrt(float(d[0])), "exact", separate)
    if float(K.min(initial=0.0)) >= -1e-12 * max(top, 1e-300):
        return VictimView(math.sqrt(max(0.0, float(K.sum()))), "exact", separate)
    return VictimView(math.sqrt(float(np.abs(K).sum())), "mf-bound")


def row_space(M: np.ndarray) -> np.ndarray:
    """An orthonormal basis (rank x S) of the row space of M."""
    if M.size == 0 or not M.any():
        return np.zeros((0, M.shape[1]))
    _, s, vt = np.linalg.svd(M, full_matrices=False)
    tol = s[0] * max(M.shape) * np.finfo(float).eps * 8
    return vt[: int((s > tol).sum())]


def exact_mu(M: np.ndarray, slots: dict[int, np.ndarray], scale: np.ndarray, observer: int,
             victims: Sequence[int]) -> dict[int, VictimView]:
    """{victim: its view} for one observer's view ``M`` (messages x slots, in noise-std units; the
    observer's own slots are known to it and left out here)."""
    M = M.copy()
    M[:, slots.get(observer, [])] = 0.0
    V = row_space(M)
    out = {}
    for u in victims:
        idx = slots.get(u, np.zeros(0, dtype=np.int64))
        if u == observer or not len(idx):
            out[u] = VictimView(0.0 if u != observer else math.nan, "exact", np.zeros(len(idx)))
            continue
        out[u] = victim_mu(V[:, idx], scale[idx])
    return out


def local_mu(ratios: np.ndarray) -> float:
    """Gaussian-DP of a victim's releases seen directly (the plain mechanisms, no subsampling), from their
    Delta_s / sigma_s (inf for a noiseless one)."""
    return math.sqrt(float(np.sum(np.square(ratios))))


def capped_mu(view: VictimView, ratios: np.ndarray, noiseless: bool) -> tuple[float, str, float]:
    """(mu, method, mu_local) of a pair from ``exact_mu``'s view of the victim and its Delta_s / sigma_s, no
    subsampling credited: infinite when a release of the run is noiseless, never above the victim's releases
    seen directly (post-processing)."""
    mu, method = view.mu, view.method
    if noiseless:
        mu, method = math.inf, "noiseless release"
    mu_local = local_mu(ratios)
    if mu > mu_local:  # a bound above the releases themselves: the view is their post-processing
        mu, method = mu_local, LOCAL
    return mu, method, mu_local


def subsampled_epsilon(sens: np.ndarray, rates: Sequence[float], delta: float, accountant: str = "rdp") -> float:
    """epsilon(delta) of independent Gaussian mechanisms of whitened sensitivities ``sens`` (noise multiplier
    1 / sens), the victim's record entering the s-th with probability ``rates[s]`` (Poisson sampling): each
    dp-accounting's ``PoissonSampledDpEvent(q, GaussianDpEvent(1 / sens))``, composed by the registered
    ``accountant`` as the per-agent figures are (netsim/privacy/accountants.py)."""
    from netsim.privacy.accountants import base_event, events_epsilon

    groups = [(base_event("gaussian", 1.0 / float(c), float(q)), 1) for c, q in zip(sens, rates, strict=True)
              if c > 0]
    return events_epsilon(groups, delta, accountant) if groups else 0.0


def per_message_bound(view: np.ndarray, idx: np.ndarray, scale: np.ndarray) -> float:
    """Muffliato's per-message composition on the run's own messages: each row of ``view`` (one message, all
    slots, the observer's own included, in noise-std units) a Gaussian mechanism of noise ||row|| and
    sensitivity sum_s |row_s| Delta_s / sigma_s over the victim's slots ``idx``; the mu of their composition.
    On a fixed graph with one release per agent this is ``muffliato_bound``; over several outer rounds it
    carries each round's value into the next (the states are not reset between rounds)."""
    if not len(view) or not len(idx):
        return 0.0
    sens = np.abs(view[:, idx]) @ scale[idx]
    norm2 = np.einsum("ij,ij->i", view, view)
    ok = norm2 > 0
    return math.sqrt(float((sens[ok] ** 2 / norm2[ok]).sum()))


def muffliato_bound(W: np.ndarray, K: int, u: int, v: int, in_nbrs: Sequence[int],
                    ratios: Sequence[float]) -> float:
    """Muffliato's per-message pairwise bound mu_{u->v} (module docstring) on a fixed mixing matrix ``W``
    with ``K`` gossip steps per outer round, ``ratios``: Delta / sigma of each of the victim's releases."""
    per = 0.0
    P = np.eye(W.shape[0])
    for _ in range(K):
        for w in in_nbrs:
            row = P[w]
            nrm = float(row @ row)
            if nrm > 0:
                per += float(row[u]) ** 2 / nrm
        P = W @ P
    return math.sqrt(per * sum(r * r for r in ratios))


# --- the linear system of a run ---------------------------------------------------------------------------


@attrs.frozen
class LinearRun:
    """A run's linear system: the observation rows of each observer (over all release slots)."""

    n: int
    slots: dict[int, np.ndarray]  # agent -> its slot indices (release order)
    scale: np.ndarray  # per slot: Delta_s / sigma_s (inf for a noiseless release)
    views: dict[int, np.ndarray]  # observer -> (messages received x slots), in noise-std units
    lossless: bool  # every mixing step used every in-neighbour's message
    received: dict[int, list[tuple[int, int]]] = attrs.field(factory=dict)  # observer -> (sender, round) per row


def build_linear_run(n: int, form: LinearForm, releases: dict[int, list], mixing, delivered,
                     sends: dict[tuple[int, int], float], observers: Sequence[int], lr: float | None,
                     in_nbrs: dict[int, list[int]], source: str = "mixing.csv",
                     chebyshev: tuple[int, float] | None = None, unit: np.ndarray | None = None) -> LinearRun:
    """Play the run's linear system from its releases, its mixing record and its deliveries.

    ``releases``: agent -> list of Release records (trace order); ``mixing``: a MixingRecord;
    ``delivered``: (receiver, sender, round) of every delivered message of the form's tag; ``sends``:
    (sender, round) -> send time; ``lr``: the constant step size of ``release_at = "now"``; ``chebyshev``:
    (K, lambda) of Muffliato's accelerated gossip, x <- w_s (mix(x) - x_prev) + x_prev at the steps s > 0
    of every K (Cyffers et al., Algorithm 1's recursion, as netsim's muffliato plays it); ``unit``: what one unit of
    a slot's column is (default: the release's noise std, so columns are in noise-std units; ones: in the
    release's own units, the coefficients of the released values)."""
    offsets, total = {}, 0
    slots: dict[int, np.ndarray] = {}
    for a in range(n):
        k = len(releases.get(a, []))
        offsets[a] = total
        slots[a] = np.arange(total, total + k, dtype=np.int64)
        total += k
    S = total
    sigma = np.zeros(S)
    scale = np.zeros(S)
    rel_t = np.zeros(S)
    for a, rs in releases.items():
        for k, r in enumerate(rs):
            s = offsets[a] + k
            sigma[s], rel_t[s] = r.scale, r.t
            scale[s] = r.sensitivity / r.scale if r.scale > 0 else math.inf
    if unit is not None:
        sigma = np.asarray(unit, dtype=np.float64)
    # mixing steps: agent -> step -> (self weight, {src: weight}, released, lr)
    steps: dict[int, dict[int, list]] = defaultdict(dict)
    for a, k, rel, src, w, slr in zip(mixing.agent.tolist(), mixing.step.tolist(), mixing.released.tolist(),
                                      mixing.src.tolist(), mixing.weight.tolist(), mixing.lr.tolist(),
                                      strict=True):
        if a >= n or src >= n or a < 0 or src < 0:
            raise InputError(source, f"agent {a} or sender {src} outside the run's {n} agents")
        st = steps[a].get(k)
        if st is None:
            st = steps[a][k] = [0.0, {}, rel, slr]
        if src == a:
            st[0] = w
        else:
            st[1][src] = w
    got = set(delivered)
    lossless = True
    for a, ks in steps.items():
        have = len(releases.get(a, []))
        for k, (_, ws, rel, _) in ks.items():
            if rel > have:
                raise InputError(source, f"agent {a}'s mixing step {k} follows {rel} releases; the trace has {have}")
            for src in ws:
                if (a, src, k) not in got:
                    raise InputError(source, f"agent {a}'s mixing step {k} used a message from {src} that the "
                                             "trace does not deliver: the record is not this run's")
            if set(ws) != set(in_nbrs.get(a, ())):
                lossless = False
    by_round: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for v, j, r in delivered:
        if v in observers:
            by_round[r].append((v, j))
    last = max([max(ks) for ks in steps.values() if ks] + list(by_round) + [-1])
    X = np.zeros((n, S))
    prev = np.zeros((n, S)) if chebyshev is not None else None  # the accelerated recursion's x^{k-1}
    wk = np.ones(n)
    applied = np.zeros(n, dtype=np.int64)  # releases already in each agent's value
    rows: dict[int, list[np.ndarray]] = {v: [] for v in observers}
    received: dict[int, list[tuple[int, int]]] = {v: [] for v in observers}
    for r in range(last + 1):
        if form.release_at == "now":
            for a in range(n):
                st = steps[a].get(r) if a in steps else None
                if st is not None:
                    upto = st[2]
                else:  # no mixing step r (the run ended): the releases made by the broadcast of round r
                    t_send = sends.get((a, r))
                    rs = releases.get(a, [])
                    upto = applied[a] if t_send is None else sum(1 for x in rs if x.t <= t_send)
                for k in range(applied[a], upto):
                    s = offsets[a] + k
                    X[a, s] -= lr * sigma[s]
                applied[a] = max(applied[a], upto)
        P = X.copy()  # the round-r messages: every agent's value before its mixing step r
        for v, j in by_round.get(r, ()):
            rows[v].append(P[j])
            received[v].append((j, r))
        for a in range(n):
            st = steps[a].get(r) if a in steps else None
            if st is None:
                continue
            sw, ws, rel, slr = st
            x = sw * P[a]
            for j, w in ws.items():
                x = x + w * P[j]
            if form.release_at == "step":
                for k in range(applied[a], rel):
                    s = offsets[a] + k
                    x[s] -= slr * sigma[s]
                applied[a] = max(applied[a], rel)
            if prev is not None and r % chebyshev[0] > 0:
                lam2 = chebyshev[1] ** 2
                wk[a] = 2.0 / (2.0 - lam2) if r % chebyshev[0] == 1 else 1.0 / (1.0 - lam2 * wk[a] / 4.0)
                x = wk[a] * (x - prev[a]) + prev[a]
            if prev is not None:
                prev[a] = P[a]
            X[a] = x
    views = {}
    for v in observers:
        views[v] = np.array(rows[v]) if rows[v] else np.zeros((0, S))
    return LinearRun(n, slots, scale, views, lossless, received)


# --- the report -------------------------------------------------------------------------------------------


def _parse_agents(text: str | None, n: int, key: str) -> list[int]:
    if text is None:
        return list(range(n))
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                out += range(a, b + 1)
            elif part:
                out.append(int(part))
        except ValueError:
            raise InputError(key, f"must be agent ids or ranges like 0,3,5-7, got {text!r}") from None
    bad = [a for a in out if not 0 <= a < n]
    if bad or not out:
        raise InputError(key, f"agent ids must be in 0..{n - 1}, got {text!r}")
    return sorted(set(out))


@attrs.frozen
class RunInputs:
    """What the exact linear view of a run is built from, read and checked once (``run_inputs``)."""

    n: int
    form: LinearForm
    accelerated: bool
    releases: dict[int, list]  # agent -> its Release records, trace order
    n_slots: int
    gated: int  # releases an event trigger decided from unreleased data
    delivered: list[tuple[int, int, int]]  # (receiver, sender, round) of the form's delivered messages
    sends: dict[tuple[int, int], float]
    graph: Any
    W: Any
    in_nbrs: dict[int, list[int]]
    lr: float
    mixing: Any
    mixing_path: Path
    chebyshev: tuple[int, float] | None

    def linear_run(self, observers: Sequence[int], unit: np.ndarray | None = None) -> LinearRun:
        """The run's linear system with the views of ``observers`` (columns in noise-std units, or ``unit``)."""
        return build_linear_run(self.n, self.form, self.releases, self.mixing, self.delivered, self.sends, observers,
                                self.lr, self.in_nbrs, str(self.mixing_path), self.chebyshev, unit)

    def hops(self) -> dict[int, dict[int, int]]:
        import networkx as nx

        return dict(nx.all_pairs_shortest_path_length(self.graph.to_undirected(as_view=True)))


def run_inputs(folder: Path, trace, sc, flag: str = "--pairwise") -> RunInputs:
    """Read and check what the exact view of a run needs: a linear Gaussian algorithm, a complete trace, the
    mixing record, Gaussian releases within ``EXACT_LIMIT``. Raises InputError (key ``flag``) with the reason."""
    import pyarrow.compute as pc

    from netsim.privacy.ledger import decided_by_data, releases_from_table
    from netsim.privacy.views import MIXING_FILE, read_mixing
    from netsim.sim.streams import Streams
    from netsim.sim.topology import weighted_graph

    if sc is None:
        raise InputError(flag, "the trace holds no scenario: the algorithm and graph are unknown")
    alg = sc.algorithm.name
    form = LINEAR.get(alg)
    if form is None:
        raise InputError(flag, f"algorithm {alg!r} is not a linear Gaussian algorithm netsim can account "
                               f"pairwise (exact only for: {', '.join(LINEAR)}); no pair figure is given")
    params = dict(sc.algorithm.params)
    accelerated = alg == "muffliato" and params.get("acceleration", "none") != "none"
    if not trace.complete:
        raise InputError(flag, "the trace is incomplete (cut or crashed run): pairwise figures need the "
                               "whole run; the figures are unknown", str(folder))
    path = folder / MIXING_FILE
    if not path.is_file():
        raise InputError(flag, f"{path} is missing: pairwise accounting needs the mixing weights the run "
                               "applied; rerun with privacy.record = \"mixing\" "
                               "(--set 'privacy.record=\"mixing\"')")
    n = sc.agents.count
    rel = releases_from_table(trace.table, str(folder))
    mechs = {r.mechanism for rs in rel.values() for r in rs}
    if mechs - {"gaussian"}:
        raise InputError(flag, f"releases by {sorted(mechs - {'gaussian'})}: the exact view is computed "
                               "for Gaussian releases only")
    n_slots = sum(len(rs) for rs in rel.values())
    if n_slots > EXACT_LIMIT:
        raise InputError(flag, f"{n_slots} releases: the exact computation takes at most {EXACT_LIMIT} "
                               "(one column per release); run fewer rounds or agents")
    gated = sum(decided_by_data(r) for rs in rel.values() for r in rs)
    tab = trace.table
    msgs = tab.filter(pc.equal(tab["tag"], form.tag))
    kind = msgs["kind"].to_pylist()
    a_, p_, r_, t_ = (msgs[c].to_pylist() for c in ("agent", "peer", "round", "t"))
    delivered = [(a, p, r) for k, a, p, r in zip(kind, a_, p_, r_, strict=True) if k == "deliver"]
    sends: dict[tuple[int, int], float] = {}
    for k, a, r, t in zip(kind, a_, r_, t_, strict=True):
        if k == "send":
            sends.setdefault((a, r), t)
    try:
        g, W = weighted_graph(sc.topology, n, Streams(sc.run.seed).seed_for("topology"))
    except (InputError, OSError, ValueError) as e:
        raise InputError(flag, f"cannot rebuild the run's graph: {e}") from None
    in_nbrs = {i: sorted(j for j in g.predecessors(i) if j != i) for i in range(n)}
    lr = float(params.get("lr", 0.001 if alg == "muffliato" else 0.1))
    mixing = read_mixing(path)
    cheb = None
    if accelerated:  # K from the run (mixing steps per activation), lambda from the run's mixing matrix
        from netsim.sim.topology import spectral_gap

        acts = tab.filter(pc.equal(tab["kind"], "activate"))["agent"].to_numpy()
        ks = {(int(np.unique(mixing.step[mixing.agent == a]).size), int((acts == a).sum())) for a in range(n)}
        per = {m // k for m, k in ks if k and m % k == 0}
        if len(per) != 1 or any(not k or m % k for m, k in ks):
            raise InputError(flag, "muffliato with Chebyshev acceleration: the agents' gossip steps per "
                                   "activation differ, so the recursion's steps cannot be placed")
        cheb = (per.pop(), 1.0 - (spectral_gap(W) or 0.0))
    return RunInputs(n, form, accelerated, rel, n_slots, gated, delivered, sends, g, W, in_nbrs, lr, mixing, path,
                     cheb)


def pairwise_report(folder: Path, trace, sc, delta: float, victims: str | None = None,
                    observers: str | None = None, plot: bool = True, accountant: str = "rdp",
                    per_agent: dict[int, float | None] | None = None) -> dict[str, Any]:
    """Compute every (victim, observer) pair's figures, write ``pairwise.csv`` (and the plots), and return
    the ``pairwise`` section of privacy.json. Raises InputError with the reason where the run's pairs
    cannot be accounted. ``per_agent``: each agent's per-agent epsilon at ``delta`` (the report's recommended
    figure, by ``accountant``; computed here when not given): what its releases seen directly reveal."""
    inp = run_inputs(folder, trace, sc)
    n, form, alg, n_slots, gated = inp.n, inp.form, sc.algorithm.name, inp.n_slots, inp.gated
    accelerated, delivered, rel = inp.accelerated, inp.delivered, inp.releases
    vs = _parse_agents(victims, n, "--victims")
    os_ = _parse_agents(observers, n, "--observers")
    chosen = set(os_)
    need = 8 * n_slots * sum(1 for v, _, _ in delivered if v in chosen)
    if need > VIEW_BYTES_LIMIT:
        raise InputError("--observers", f"the chosen observers' views would take {need / 1024**3:.1f} GiB (messages "
                                        f"received x {n_slots} releases); at most {VIEW_BYTES_LIMIT / 1024**3:.0f} "
                                        "GiB: choose fewer observers (--observers 0,3,5-7)")
    lin = inp.linear_run(os_)
    fixed = sc.topology.dynamic is None and lin.lossless and form.name == "muffliato" and not accelerated
    hops = inp.hops()
    noiseless = bool(np.isinf(lin.scale).any())
    from threadpoolctl import threadpool_limits  # (scikit-learn's dependency)

    scale = np.where(np.isinf(lin.scale), 0.0, lin.scale)
    if per_agent is None:
        from netsim.privacy.accountants import epsilon

        per_agent = {u: epsilon(rel.get(u, []), delta, accountant, "observed") for u in vs}
    local = {u: local_epsilon(local_mu(lin.scale[lin.slots[u]]), [r.q for r in rel.get(u, [])], delta,
                              per_agent.get(u)) for u in vs}
    rows = []
    for v in os_:
        with threadpool_limits(1):  # one SVD per observer, a few hundred rows: BLAS threads only contend (60x)
            per = exact_mu(lin.views[v], lin.slots, scale, v, vs)
        for u in vs:
            if u == v:
                continue
            mu, method, mu_local = capped_mu(per[u], lin.scale[lin.slots[u]], noiseless)
            eps, method, credited = pair_epsilon(per[u], (mu, method, mu_local), local[u],
                                                 [r.q for r in rel.get(u, [])], delta, noiseless)
            eps_local = local[u][0]
            mu_b = per_message_bound(lin.views[v], lin.slots[u], scale) if fixed else None
            if gated:
                method = "not a guarantee"
            row = {"victim": u, "observer": v, "hops": hops.get(u, {}).get(v), "mu": mu,
                   "epsilon": eps, "delta": delta, "method": method,
                   "mu_bound": mu_b, "epsilon_bound": None if mu_b is None else gdp_epsilon(mu_b, delta),
                   "bound_below_exact": None if mu_b is None else bool(mu_b < mu * (1 - 1e-9)),
                   "mu_local": mu_local, "epsilon_local": eps_local, "subsampling": credited}
            rows.append(row)
    write_csv(rows, folder / PAIRWISE_FILE)
    by_hops = summarise_by_hops(rows)
    below = sum(1 for r in rows if r["bound_below_exact"])
    section: dict[str, Any] = {
        "file": PAIRWISE_FILE, "algorithm": alg, "form": form.paper, "delta": delta,
        "victims": vs, "observers": os_, "releases": n_slots, "pairs": len(rows),
        "status": "not a guarantee" if gated else "guarantee",
        "bound": ("Muffliato's per-message pairwise bound (fixed graph, reliable gossip)" if fixed else None),
        "bound_note": None if fixed else _why_no_bound(form, sc, lin),
        "bound_below_exact": below,
        "by_hops": by_hops,
        "methods": sorted({r["method"] for r in rows}),
        "explain": ("mu: Gaussian-DP of everything the observer saw (delivered messages, its own releases, the "
                    "common initial model) about the victim's clipped gradients, mixing weights as applied, no "
                    "subsampling credited; epsilon: the smallest of the pair's valid figures, named by method: "
                    "exact: the view as one Gaussian mechanism (single release, or the matrix-factorisation "
                    "sensitivity attained by equal gradient differences); mf-bound: sum of |Gram| entries; "
                    f"{SUBSAMPLED}: the victim's releases reach the view as independent Gaussian mechanisms, each "
                    "Poisson-subsampled at its q, composed by the RDP accountant; "
                    f"{LOCAL}: the victim's releases seen directly (mu_local; epsilon_local: the per-agent "
                    f"{accountant.upper()} figure where q < 1)"),
        "credits": credits_line(rows, accountant, any(r.q < 1 for rs in rel.values() for r in rs)),
    }
    if gated:
        section["note"] = (f"NOT a guarantee: {gated} release(s) were decided by an event trigger from unreleased "
                           "data; the pair figures compose them as a fixed sequence")
    if plot and rows:
        from netsim.privacy.pairwise_plots import plot_pairwise

        section["plots"] = [p.name for p in plot_pairwise(rows, n, folder)]
    return section


def local_epsilon(mu_local: float, rates: Sequence[float], delta: float,
                  per_agent: float | None) -> tuple[float, bool]:
    """(epsilon_local, subsampling credited) of one victim's releases seen directly, ``mu_local`` their plain
    Gaussian-DP (``local_mu``): the smaller of its conversion and, where a record enters a release with
    probability q < 1 (``rates``), the per-agent figure ``per_agent`` (the releases composed at their q; None:
    not computable)."""
    eps = gdp_epsilon(mu_local, delta)
    if not any(q < 1 for q in rates) or per_agent is None or per_agent >= eps:
        return eps, False
    return per_agent, True


def pair_epsilon(view: VictimView, capped: tuple[float, str, float], local: tuple[float, bool],
                 rates: Sequence[float], delta: float, noiseless: bool = False) -> tuple[float, str, bool]:
    """(epsilon, method, subsampling credited) of a pair: the smallest of the valid figures, each a guarantee
    on its own: the view without subsampling, ``capped`` (``capped_mu``: ``exact``, ``mf-bound``, or the
    victim's releases when smaller); where the victim's releases reach the view as independent mechanisms
    (``view.separate``) and some q < 1, their Poisson-subsampled composition (``exact, subsampled``); and the
    victim's releases themselves, ``local`` (``local_epsilon``), subsampling credited as the per-agent figures
    credit it (``local (post-processing)``)."""
    mu, method, _ = capped
    eps_local, credited = local
    figures = [(gdp_epsilon(mu, delta), method, False)]
    if not noiseless and view.separate is not None and len(view.separate) and any(q < 1 for q in rates):
        figures.append((subsampled_epsilon(view.separate, rates, delta), SUBSAMPLED, True))
    figures.append((eps_local, LOCAL, credited))
    return min(figures, key=lambda f: f[0])


def credits_line(rows: list[dict[str, Any]], accountant: str, subsampled: bool) -> str:
    """What the pair figures credit, in one line (the pairwise table's caption); ``subsampled``: some release
    has q < 1."""
    if not subsampled:
        return "credits: no subsampling to credit (every release has q = 1)"
    n = len(rows)
    sub = sum(1 for r in rows if r["method"] == SUBSAMPLED)
    loc = sum(1 for r in rows if r["method"] == LOCAL and r["subsampling"])
    return (f"credits: subsampling (q) where it composes exactly: {sub} of {n} pairs as the view's independent "
            f"Poisson-subsampled mechanisms ({SUBSAMPLED}, RDP), {loc} through the victim's own releases as the "
            f"per-agent table composes them ({LOCAL}, {accountant.upper()}); the other {n - sub - loc}: the view "
            "without it is smaller, or no q to credit; Muffliato's bound credits none")


def _why_no_bound(form: LinearForm, sc, lin: LinearRun) -> str:
    if form.name != "muffliato":
        return f"no published pairwise bound for {form.name}"
    if sc.algorithm.params.get("acceleration", "none") != "none":
        return "Chebyshev acceleration: Muffliato's per-message bound is stated for plain gossip W^s"
    if sc.topology.dynamic is not None:
        return "time-varying graph: Muffliato's bound assumes a fixed graph"
    if not lin.lossless:
        return "messages were lost or late: Muffliato's bound assumes reliable synchronous gossip"
    return "the gossip steps per activation differ between agents: Muffliato's bound assumes K steps per round"


def summarise_by_hops(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per distance: pairs, min/median/max epsilon (exact), max bound epsilon, and the local-DP epsilon."""
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[r["hops"]].append(r)
    out = []
    for h in sorted(groups, key=lambda x: (x is None, x)):
        eps = sorted(r["epsilon"] for r in groups[h])
        bnd = [r["epsilon_bound"] for r in groups[h] if r["epsilon_bound"] is not None]
        out.append({"hops": h, "pairs": len(eps), "epsilon_min": eps[0], "epsilon_median": float(np.median(eps)),
                    "epsilon_max": eps[-1], "epsilon_bound_max": max(bnd) if bnd else None,
                    "epsilon_local_max": max(r["epsilon_local"] for r in groups[h]),
                    "bound_below_exact": sum(1 for r in groups[h] if r["bound_below_exact"])})
    return out


def write_csv(rows: list[dict[str, Any]], path: Path, columns: Sequence[str] = CSV_COLUMNS) -> Path:
    """``rows`` as a CSV of ``columns`` (floats exactly, ``None`` empty), written under a temporary name and
    renamed in: pairwise.csv, and the attack's and the audit's files."""
    import csv

    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow(["" if r[c] is None else (repr(r[c]) if isinstance(r[c], float) else r[c]) for c in columns])
    tmp.replace(path)
    return path


def pairwise_lines(section: dict[str, Any], folder: str) -> list[str]:
    """The terminal summary of a pairwise section: one line per distance, numbers in full (%.6g)."""

    def f(x):
        return "-" if x is None else "inf" if not math.isfinite(x) else f"{x:.6g}"

    out = [f"pairwise ({section['algorithm']}, delta = {section['delta']:g}, {section['pairs']} pairs, "
           f"{section['releases']} releases; methods: {', '.join(section['methods'])})"
           + ("" if section["status"] == "guarantee" else " NOT A GUARANTEE"),
           "what an observer's view reveals about a victim (eps: the pair's smallest valid figure; local DP: the "
           "victim's releases seen directly)"]
    if section.get("credits"):
        out.append(section["credits"])
    head = ("hops", "pairs", "eps min", "eps median", "eps max", "bound max", "local DP", "bound<exact")
    table = [head] + [(str(r["hops"]), str(r["pairs"]), f(r["epsilon_min"]), f(r["epsilon_median"]),
                       f(r["epsilon_max"]), f(r["epsilon_bound_max"]), f(r["epsilon_local_max"]),
                       str(r["bound_below_exact"])) for r in section["by_hops"]]
    widths = [max(len(row[k]) for row in table) for k in range(len(head))]
    out += ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in table]
    if section.get("bound") is None:
        out.append(f"no bound column: {section['bound_note']}")
    elif section["bound_below_exact"]:
        out.append(f"! Muffliato's bound is below the exact figure for {section['bound_below_exact']} pair(s): "
                   "the per-message bound is not an upper bound on what the observer can combine")
    if section.get("note"):
        out.append("! " + section["note"])
    out.append(f"wrote {folder}/{section['file']}" + (f", {', '.join(section.get('plots', []))}"
                                                     if section.get("plots") else ""))
    return out
