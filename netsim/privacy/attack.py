"""Reconstruction attack from a run's own messages: which releases a set of observers recovers exactly.

El Mrini, Cyffers, Bellet, "Privacy Attacks in Decentralized Learning" (ICML 2024), Section 3: a set A of
honest-but-curious agents stacks every message it received as a known linear function of the private values (the
*knowledge matrix*, their eq. (3) for gossip averaging and Section 3.2 for decentralized gradient descent, one
unknown per agent and step); a value is recovered exactly iff its unit vector lies in the row space of that matrix
(their Proposition 1), and where it does the attack solves the linear system for it. The paper assumes synchronous
rounds, a known fixed W, no loss and no noise. netsim builds the matrix from the run that happened: the messages
actually delivered to A (late ones included, lost ones not) and the weights actually applied, read from the
mixing record (netsim/privacy/views.py) by the pairwise view's code (netsim/privacy/pairwise.py:
``run_inputs``, ``build_linear_run``), so loss, staleness and asynchrony are in the matrix.

The unknowns are the run's releases (one per ``Agent.privatize`` call: the value an agent injected into its model
in a round, r_s = g_s + n_s); the observers know their own releases and the common initial model. For each other
agent's release s, ``x_uu`` = P[s, s], P the orthogonal projector onto the knowledge matrix's row space (release
units): 1 when the release is determined by the view (``reconstructed``), its squared cosine with the view
otherwise. With ``privacy.record = "payloads"`` the attack also runs on the values: it solves the knowledge
system for the releases by generalised least squares with the release noise's known covariance as the metric
(diag(sigma_s^2); the plain least-squares solution of minimum norm for noiseless runs), and ``error`` is the
relative L2 distance of the estimate to the victim's release before its noise (its clipped gradient, what the
attack is after). A reconstructed release of a noisy run is recovered with its noise: the error is then its
noise relative to its value.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from netsim.errors import InputError

ATTACK_FILE = "attack.csv"
CSV_COLUMNS = ("victim", "round", "reconstructed", "x_uu", "hops", "error", "observers")
#: x_uu at least 1 - TOL counts as exactly reconstructed (the projector's diagonal in floating point)
TOL = 1e-8


def parse_observer_sets(text: str | None, n: int) -> list[tuple[int, ...]]:
    """``--observers``: one set of agent ids (``0,3,5-7``); none: every agent alone."""
    from netsim.privacy.pairwise import _parse_agents

    if text is None:
        return [(a,) for a in range(n)]
    return [tuple(_parse_agents(text, n, "--observers"))]


def knowledge_basis(lin, observers: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(M, V): the observers' stacked knowledge matrix (messages x releases, release units, their own releases'
    columns zeroed: they know them) and an orthonormal basis of its row space."""
    from netsim.privacy.pairwise import row_space

    M = np.vstack([lin.views[a] for a in observers]) if observers else np.zeros((0, sum(map(len, lin.slots.values()))))
    M = M.copy()
    for a in observers:
        M[:, lin.slots.get(a, [])] = 0.0
    return M, row_space(M)


def projector_diagonal(V: np.ndarray) -> np.ndarray:
    """P[s, s] of the projector V^T V onto the row space."""
    return np.einsum("ij,ij->j", V, V) if V.size else np.zeros(V.shape[1])


def gls_estimate(M: np.ndarray, y: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Releases (slots x coordinates) from observations ``y = M r`` (messages x coordinates): generalised least
    squares with the release noise's covariance diag(sigma^2) as the metric, the solution of minimum
    sigma-weighted norm where the view does not determine every release (plain minimum norm when a release is
    noiseless)."""
    w = sigma if (sigma > 0).all() else np.ones_like(sigma)
    return w[:, None] * (np.linalg.pinv(M * w, rcond=1e-10) @ y)


def reconstruct(folder: Path, trace, sc, observer_sets: Sequence[Sequence[int]],
                rounds_seen: int | None = None, values: bool = True) -> list[dict[str, Any]]:
    """One row per (observer set, victim release): whether the set reconstructs it, x_uu, hops to the nearest
    observer, and with the payload record the estimate's relative error. ``rounds_seen``: only the messages of the
    first rounds (gossip steps) count (the papers' T); ``values``: use the payload record where there is one."""
    from netsim.privacy.pairwise import run_inputs

    inp = run_inputs(folder, trace, sc, "--attack")
    n = inp.n
    union = sorted({a for s in observer_sets for a in s})
    lin = inp.linear_run(union, unit=np.ones(inp.n_slots))
    if rounds_seen is not None:
        for a in union:
            keep = [i for i, (_, r) in enumerate(lin.received[a]) if r < rounds_seen]
            lin.views[a] = lin.views[a][keep]
            lin.received[a][:] = [lin.received[a][i] for i in keep]
    hops = inp.hops()
    pay = _payloads(folder, inp) if values else None
    sigma = np.array([r.scale for a in range(n) for r in inp.releases.get(a, [])], dtype=np.float64)
    rows = []
    for A in observer_sets:
        M, V = knowledge_basis(lin, A)
        diag = projector_diagonal(V)
        est = None
        if pay is not None and len(M):
            y = np.vstack([pay.received_rows(a, lin.received[a]) for a in A]) - pay.x0
            own = [s for a in A for s in lin.slots.get(a, [])]
            Mfull = np.vstack([lin.views[a] for a in A])
            if own:
                y = y - Mfull[:, own] @ pay.released[own]
            est = gls_estimate(M, y, sigma)
        label = ";".join(map(str, A))
        for u in range(n):
            if u in A:
                continue
            d = min((hops.get(u, {}).get(a, math.inf) for a in A), default=math.inf)
            for k, s in enumerate(lin.slots.get(u, [])):
                x = float(min(1.0, max(0.0, diag[s])))
                err = None
                if pay is not None:
                    g = pay.clean[s]
                    e = est[s] if est is not None else np.zeros_like(g)
                    norm = float(np.linalg.norm(g))
                    err = float(np.linalg.norm(e - g)) / norm if norm > 0 else None
                rows.append({"victim": u, "round": inp.releases[u][k].round, "reconstructed": int(x >= 1 - TOL),
                             "x_uu": x, "hops": None if math.isinf(d) else int(d), "error": err,
                             "observers": label})
    return rows


class _RunValues:
    """The payload record lined up with the linear system's slots and views."""

    def __init__(self, pay, inp):
        from netsim.privacy.payloads import Payloads

        self.pay: Payloads = pay
        self.x0 = pay.x0
        self.index = pay.received(inp.form.tag)
        order = [i for a in range(inp.n) for i in pay.releases_of(a)]
        self.clean = pay.release_clean[order]
        self.released = pay.release_value[order]

    def received_rows(self, v: int, keys: Sequence[tuple[int, int]]) -> np.ndarray:
        idx = [self.index[(v, j, r)] for j, r in keys]
        return self.pay.deliver_value[idx] if idx else np.zeros((0, len(self.x0)))


def _payloads(folder: Path, inp) -> _RunValues | None:
    """The run's payload record, checked against its trace; None when the run did not record payloads."""
    from netsim.privacy.payloads import PAYLOADS_FILE, read_payloads

    path = folder / PAYLOADS_FILE
    if not path.is_file():
        return None
    pay = read_payloads(path)
    for a in range(inp.n):
        have, want = len(pay.releases_of(a)), len(inp.releases.get(a, []))
        if have != want:
            raise InputError(PAYLOADS_FILE, f"agent {a} has {have} recorded release values, the trace {want} "
                                            "releases: the record is not this run's", str(path))
    if not pay.common_init:
        raise InputError(PAYLOADS_FILE, "the agents did not start from one common model: the attack assumes the "
                                        "observers know it", str(path))
    vals = _RunValues(pay, inp)
    missing = [k for k in inp.delivered if k not in vals.index]
    if missing:
        raise InputError(PAYLOADS_FILE, f"the delivered message {missing[0]} (receiver, sender, round) has no "
                                        "recorded payload: the record is not this run's", str(path))
    return vals


def load_run(run: str | Path, flag: str):
    """(folder, trace, scenario) of a run folder or its trace file; InputError when the trace has no scenario."""
    from netsim.privacy.report import scenario_of
    from netsim.trace.io import read_trace

    folder = Path(run)
    trace = read_trace(folder)
    if folder.is_file():
        folder = folder.parent
    sc = scenario_of(trace)
    if sc is None:
        raise InputError(flag, "the trace holds no scenario: the algorithm and graph are unknown", str(folder))
    return folder, trace, sc


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The fraction reconstructed over every row, per observer set, and per distance."""
    by_set: dict[str, list[int]] = defaultdict(list)
    by_hops: dict[Any, list[int]] = defaultdict(list)
    errs: dict[Any, list[float]] = defaultdict(list)
    for r in rows:
        by_set[r["observers"]].append(r["reconstructed"])
        by_hops[r["hops"]].append(r["reconstructed"])
        if r["error"] is not None:
            errs[r["hops"]].append(r["error"])
    frac = float(np.mean([r["reconstructed"] for r in rows])) if rows else 0.0
    return {"fraction_reconstructed": frac, "releases": len(rows),
            "by_observers": [{"observers": k, "fraction": float(np.mean(v)), "releases": len(v)}
                             for k, v in by_set.items()],
            "by_hops": [{"hops": h, "fraction": float(np.mean(by_hops[h])), "releases": len(by_hops[h]),
                         "median_error": float(np.median(errs[h])) if errs.get(h) else None}
                        for h in sorted(by_hops, key=lambda x: (x is None, x))],
            "values": any(r["error"] is not None for r in rows)}


ATTACKS = ("reconstruct",)


def attack_report(run_folder: str | Path, observers: str | None = None, plot: bool = True) -> dict[str, Any]:
    """``netsim privacy RUN --attack reconstruct``: every check first (nothing is written on bad input), then
    ``attack.csv`` and the plots. Returns the summary (``summarise``) with the files written."""
    folder, rows, sets = attack_rows(run_folder, observers)
    return write_attack(folder, rows, sets, plot)


def attack_rows(run_folder: str | Path, observers: str | None) -> tuple[Path, list[dict[str, Any]], list]:
    folder, trace, sc = load_run(run_folder, "--attack")
    sets = parse_observer_sets(observers, sc.agents.count)
    return folder, reconstruct(folder, trace, sc, sets), sets


def write_attack(folder: Path, rows: list[dict[str, Any]], sets: list, plot: bool = True) -> dict[str, Any]:
    out = summarise(rows)
    out["observer_sets"] = len(sets)
    out["file"] = ATTACK_FILE
    from netsim.privacy.pairwise import write_csv

    write_csv(rows, folder / ATTACK_FILE, CSV_COLUMNS)
    if plot and rows:
        from netsim.privacy.attack_plots import plot_attack

        out["plots"] = [p.name for p in plot_attack(rows, folder)]
    return out


def run_attacks(run_folder: str | Path, attack: str | None, audit: bool, observers: str | None) -> list[str]:
    """``netsim privacy RUN --attack reconstruct`` and/or ``--audit``: both computed (every check) before either
    writes; returns the lines to print."""
    from netsim.privacy import audit as audit_mod

    if attack is not None and attack not in ATTACKS:
        raise InputError("--attack", f"unknown attack {attack!r}; one of: {', '.join(ATTACKS)}")
    found = attack_rows(run_folder, observers) if attack is not None else None
    audited = audit_mod.audit([run_folder], observers) if audit else None
    folder = Path(run_folder)
    folder = folder.parent if folder.is_file() else folder
    lines: list[str] = []
    if found is not None:
        lines += attack_lines(write_attack(*found), str(folder))
    if audited is not None:
        lines += audit_mod.audit_lines(audit_mod.write_audit(folder, audited), str(folder))
    return lines


def attack_lines(out: dict[str, Any], folder: str) -> list[str]:
    """The terminal summary: the fraction reconstructed, then per distance."""
    done = round(out["fraction_reconstructed"] * out["releases"])
    lines = [f"reconstruction attack (El Mrini et al.): {done} of {out['releases']} victim releases reconstructed "
             f"exactly (fraction {out['fraction_reconstructed']:.4g}; {out['observer_sets']} observer set"
             f"{'s' if out['observer_sets'] != 1 else ''})"]
    head = ("hops", "releases", "fraction reconstructed") + (("median error",) if out["values"] else ())
    table = [head] + [(str(h["hops"]), str(h["releases"]), f"{h['fraction']:.4g}")
                      + ((("-" if h["median_error"] is None else f"{h['median_error']:.4g}"),) if out["values"] else ())
                      for h in out["by_hops"]]
    widths = [max(len(r[k]) for r in table) for k in range(len(head))]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    if not out["values"]:
        lines.append("no error column: the run did not record its payloads (privacy.record = \"payloads\")")
    lines.append(f"wrote {folder}/{out['file']}" + (f", {', '.join(out['plots'])}" if out.get("plots") else ""))
    return lines
