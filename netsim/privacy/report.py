"""``netsim privacy RUN``: per-agent epsilon(delta) from a run's trace (its releases), by dp-accounting's
RDP and PLD accountants and, where the scenario names one, by the seed paper's own closed form.

Both accounting modes are reported for agents with random activation: ``observed`` (activation is
visible, so no amplification: the conservative number) and ``amplified`` (seed 003's hidden
activation: each tick is a subsampled run of the mechanism at rate p*q).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomllib

from netsim.errors import InputError
from netsim.privacy import closed_forms as cf
from netsim.privacy.accountants import epsilon, epsilon_curve, finite_or_none
from netsim.privacy.ledger import exhausted_from_table, releases_from_table
from netsim.scenario.schema import PrivacySpec, Scenario
from netsim.trace.events import Release

REPORT_FILE = "privacy.json"
PLOT_FILE = "privacy.png"


def closed_form(name: str, releases: Sequence[Release], spec: PrivacySpec, delta: float) -> dict[str, Any]:
    """The seed paper's own number(s) for one agent's releases; ``violations`` lists the paper's
    validity conditions that do not hold. Raises ClosedFormError if the form cannot apply at all."""
    if not releases:
        return {"paper": 0.0, "conservative": 0.0, "violations": []}
    mechs = {r.mechanism for r in releases}
    if name == "seed001":
        if mechs != {"laplace"}:
            raise cf.ClosedFormError(name, "Lemma 2 composes Laplace releases; "
                                           f"this agent released {sorted(mechs)}")
        eps = cf.laplace_basic_composition([r.sensitivity for r in releases], [r.scale for r in releases])
        return {"paper": eps, "conservative": eps, "violations": [],
                "note": "Lemma 2: sum_t Delta_t / rho_t (pure LDP, delta = 0)"}
    if mechs != {"gaussian"}:
        raise cf.ClosedFormError(name, f"needs Gaussian releases; this agent released {sorted(mechs)}")
    if any(r.scale <= 0 for r in releases):
        raise cf.ClosedFormError(name, "a release without noise (sigma = 0) has no finite epsilon")
    if name == "seed000":
        per = [cf.pdsl_per_round(r.sensitivity, r.scale, spec.delta0, 1, strict=False) for r in releases]
        worst = max(p.eps_round for p in per)
        v = sorted({m for p in per for m in p.violations})
        return {"paper": worst, "conservative": sum(p.eps_round for p in per),
                "delta_conservative": min(1.0, len(per) * spec.delta0), "violations": v,
                "note": f"Thm 1: per-round (eps, {spec.delta0:g})-DP; conservative = basic composition over "
                        f"{len(per)} releases"}
    if name == "seed003":
        root = math.sqrt(2 * math.log(1.25 / spec.delta0))
        S_paper = S_obs = 0.0
        v: set[str] = set()
        for r in releases:
            eps_t = r.sensitivity * root / r.scale
            lin, exact = cf.seed003_linear_amplification(eps_t, r.p * r.q), cf.seed003_exact_amplification(eps_t, r.q)
            S_paper += (1 + r.skipped) * lin * lin  # x * x: inf for a huge eps_t, where x ** 2 raises
            S_obs += exact * exact
            if eps_t >= 1:
                v.add(f"eps_t = {eps_t:.4g} >= 1: classical Gaussian bound invalid")
            if r.p < 0.5:
                v.add(f"p = {r.p} < 1/2 (the paper requires p >= 1/2)")
        dh = math.sqrt(S_paper)
        if not 0 < dh <= 1:
            raise cf.ClosedFormError(name, f"delta_hat = sqrt(S) = {dh:.4g} is not in (0, 1]: "
                                           "the bound is vacuous")
        return {"paper": cf.kov_composition(S_paper, dh), "delta_paper": dh,
                "conservative": cf.kov_composition(S_obs, delta), "delta_conservative": delta,
                "violations": sorted(v),
                "note": "paper: Lemmas 1, 4 (linear, rate p q, every tick), 5 at delta_hat = sqrt(S); "
                        "conservative: exact amplification at rate q over observed releases, "
                        "delta_hat = delta"}
    if name == "seed004":
        zs = {(r.scale / r.sensitivity, r.q) for r in releases}
        if len(zs) > 1:
            raise cf.ClosedFormError(name, "eq. (11) assumes one noise multiplier and sampling rate; "
                                           f"this agent used {len(zs)} different ones")
        (z, q), = zs
        K = len(releases)
        eps = spec.c2 * q * math.sqrt(K * math.log(1 / delta)) / z
        return {"paper": eps, "conservative": None,
                "violations": list(cf.seed004_validity(eps, K, round(1 / q), None)),
                "note": f"eq. (11) inverted with c2 = {spec.c2}; "
                        "the accountants' numbers are the rigorous ones"}
    raise cf.ClosedFormError(name, "unknown closed form (allowed: seed000, seed001, seed003, seed004)")


def scenario_of(trace) -> Scenario | None:
    from netsim.scenario.load import scenario_from_dict

    text = trace.scenario_text
    if not text:
        return None
    return scenario_from_dict(tomllib.loads(text), "trace metadata")


def privacy_report(run: str | Path, delta: float | None = None, accounting: str | None = None,
                   pld: bool = True, strict: bool = False, plot: bool = True) -> dict[str, Any]:
    """Compute (and write ``privacy.json`` / ``privacy.png`` into the run folder) the per-agent report."""
    from netsim.trace.io import read_trace

    folder = Path(run)
    trace = read_trace(folder)
    sc = scenario_of(trace)
    spec = (sc.privacy if sc is not None else None) or PrivacySpec()
    delta = spec.delta if delta is None else delta
    if not 0 < delta < 1:
        raise InputError("--delta", f"must be in (0, 1), got {delta!r}")
    mode = accounting or spec.accounting
    if mode not in ("observed", "amplified"):
        raise InputError("--accounting", f"must be 'observed' or 'amplified', got {mode!r}")
    rel = releases_from_table(trace.table, str(folder))
    n = sc.agents.count if sc is not None else (max(rel) + 1 if rel else 0)
    exhausted = exhausted_from_table(trace.table)
    rows = []
    for i in range(n):
        rs = rel.get(i, [])
        row: dict[str, Any] = {
            "agent": i, "releases": len(rs),
            "ticks": sum(1 + r.skipped for r in rs),
            "rdp_observed": finite_or_none(epsilon(rs, delta, "rdp", "observed")),
            "rdp_amplified": finite_or_none(epsilon(rs, delta, "rdp", "amplified")),
            "exhausted_at": exhausted.get(i),
        }
        if pld:
            row[f"pld_{mode}"] = finite_or_none(epsilon(rs, delta, "pld", mode))
        if spec.closed_form != "none":
            try:
                form = closed_form(spec.closed_form, rs, spec, delta)
            except (OverflowError, ZeroDivisionError) as e:  # recorded values far outside the form's range
                raise cf.ClosedFormError(spec.closed_form, f"agent {i}: cannot be evaluated ({e})") from None
            if strict and form["violations"]:
                raise cf.ClosedFormError(spec.closed_form, f"agent {i}: " + "; ".join(form["violations"]))
            row["closed_form"] = form
        rows.append(row)
    key = f"rdp_{mode}"
    worst = max(rows, key=lambda r: -1 if r[key] is None else r[key], default=None)
    report = {
        "delta": delta, "accounting": mode, "closed_form": spec.closed_form,
        "epsilon_cap": spec.epsilon_cap, "agents": rows,
        "worst_agent": None if worst is None else worst["agent"],
        "worst_epsilon": None if worst is None else worst[key],
        "trace_complete": trace.complete,
        "explain": ("observed: each release at its data-sampling rate q (activation is visible: no "
                    "amplification); amplified: seed 003's hidden activation, every activation tick a run of "
                    "the mechanism at rate p*q (Lemma 4). Accountants: dp-accounting RDP and PLD, "
                    "add-or-remove-one adjacency."),
    }
    import json

    (folder / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    if plot:
        plot_epsilon(rel, delta, mode, folder / PLOT_FILE)
    return report


def plot_epsilon(rel: dict[int, list[Release]], delta: float, mode: str, path: Path) -> Path | None:
    """RDP epsilon(delta) of every agent against simulated time."""
    if not rel:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for i in sorted(rel):
        t, e = epsilon_curve(rel[i], delta, mode)
        ax.plot(t, e, lw=1.2, label=f"agent {i}" if len(rel) <= 10 else None)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(f"epsilon (RDP, delta={delta:g}, {mode})")
    ax.grid(alpha=0.3)
    if len(rel) <= 10:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_summary(sim) -> dict[str, Any]:
    """The run summary's privacy fields: worst agent's RDP epsilon (at privacy.delta, in the scenario's
    accounting mode); empty when no agent released anything."""
    from netsim.privacy.ledger import release_logs

    rel = release_logs(sim)  # compact logs: composed run by run, no record per release is built
    if not rel:
        return {}
    spec = sim.scenario.privacy or PrivacySpec()
    eps = {i: epsilon(rs, spec.delta, "rdp", spec.accounting) for i, rs in rel.items()}
    worst = max(eps, key=lambda i: -1.0 if eps[i] is None else eps[i])
    return {"privacy_epsilon_max": eps[worst], "privacy_worst_agent": worst, "privacy_delta": spec.delta,
            "privacy_releases": sum(len(rs) for rs in rel.values()),
            "privacy_exhausted": sum(bool(getattr(a, "_privacy", None) and a._privacy.exhausted)
                                     for a in sim.agents)}
