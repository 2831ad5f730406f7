"""``netsim privacy RUN``: per-agent epsilon(delta) from a run's trace (its releases), by dp-accounting's
RDP and PLD accountants and, where the scenario names one, by a paper's own closed form.

The recommended figure (first column, ``epsilon``) is the accountant's in ``observed`` accounting: the
guarantee under ``ASSUMPTIONS``. A run without releases is reported as not private (epsilon infinite),
and a run whose releases an event trigger decided from unreleased data as not a guarantee. ``amplified``
accounting (the hidden activation of Huo, Liu, Ding, Johansson, Shi, "Decentralized Optimization with
Amplified Privacy via Efficient Communication": each tick a subsampled run of the mechanism at rate p*q)
is shown beside it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomllib

from netsim.errors import InputError
from netsim.privacy import closed_forms as cf
from netsim.privacy.accountants import ACCOUNTANT_DOCS, ACCOUNTANTS, epsilon, epsilon_curve, finite_or_none
from netsim.privacy.ledger import TRIGGERED, decided_by_data, exhausted_from_table, releases_from_table
from netsim.scenario.schema import PrivacySpec, Scenario
from netsim.trace.events import Release

REPORT_FILE = "privacy.json"
PLOT_FILE = "privacy.png"


#: the papers whose own privacy formulas the built-in closed forms are (authors, title)
PAPERS = {
    "pdsl": 'Wang, Yuan, Wang, Li, "PDSL: Privacy-Preserved Decentralized Stochastic Learning with '
            'Heterogeneous Data Distribution"',
    "ldp_online": 'Chen, Wang, "Locally Differentially Private Distributed Online Learning with Guaranteed '
                  'Optimality"',
    "do_adp": 'Huo, Liu, Ding, Johansson, Shi, "Decentralized Optimization with Amplified Privacy via '
              'Efficient Communication"',
    "privsgp_vr": 'Zhu, Huang, Wang, Xu, "PrivSGP-VR: Differentially Private Variance-Reduced Stochastic Gradient '
                  'Push with Tight Utility Bounds" (IJCAI 2024)',
}


def closed_form(name: str, releases: Sequence[Release], spec: PrivacySpec, delta: float) -> dict[str, Any]:
    """The paper's own number(s) for one agent's releases, by the closed form registered as ``name`` (or an
    old name of it); ``violations`` lists the paper's validity conditions that do not hold. A form that does
    not apply (its ``ClosedFormError``, a vacuous bound, recorded values far outside its range) leaves the
    figures it cannot give None and says why in ``blank``: the rest of a report stands without them."""
    form = cf.lookup(name)
    if not releases:
        return {"paper": 0.0, "conservative": 0.0, "violations": []}
    try:
        return form.evaluate(releases, spec, delta)
    except cf.ClosedFormError as e:
        why = e.message
    except (OverflowError, ZeroDivisionError, ValueError) as e:
        why = f"cannot be evaluated at the recorded values ({e})"
    return {"paper": None, "conservative": None, "violations": [], "blank": why}


def _gaussian_only(name: str, releases: Sequence[Release]) -> None:
    mechs = {r.mechanism for r in releases}
    if mechs != {"gaussian"}:
        raise cf.ClosedFormError(name, f"needs Gaussian releases; this agent released {sorted(mechs)}")
    if any(r.scale <= 0 for r in releases):
        raise cf.ClosedFormError(name, "a release without noise (sigma = 0) has no finite epsilon")


@cf.register_closed_form("ldp_online", PAPERS["ldp_online"])
def _ldp_online(releases: Sequence[Release], spec: PrivacySpec, delta: float) -> dict[str, Any]:
    mechs = {r.mechanism for r in releases}
    if mechs != {"laplace"}:
        raise cf.ClosedFormError("ldp_online", "Lemma 2 composes Laplace releases; "
                                               f"this agent released {sorted(mechs)}")
    eps = cf.laplace_basic_composition([r.sensitivity for r in releases], [r.scale for r in releases])
    return {"paper": eps, "conservative": eps, "violations": [],
            "note": "Lemma 2: sum_t Delta_t / rho_t (pure LDP, delta = 0)"}


@cf.register_closed_form("pdsl", PAPERS["pdsl"])
def _pdsl(releases: Sequence[Release], spec: PrivacySpec, delta: float) -> dict[str, Any]:
    _gaussian_only("pdsl", releases)
    per = [cf.pdsl_per_round(r.sensitivity, r.scale, spec.delta0, 1, strict=False) for r in releases]
    worst = max(p.eps_round for p in per)
    v = sorted({m for p in per for m in p.violations})
    return {"paper": worst, "conservative": sum(p.eps_round for p in per),
            "delta_paper": spec.delta0, "delta_conservative": min(1.0, len(per) * spec.delta0), "violations": v,
            "note": f"Thm 1: per-round (eps, {spec.delta0:g})-DP; conservative = basic composition over "
                    f"{len(per)} releases"}


@cf.register_closed_form("do_adp", PAPERS["do_adp"])
def _do_adp(releases: Sequence[Release], spec: PrivacySpec, delta: float) -> dict[str, Any]:
    _gaussian_only("do_adp", releases)
    return cf.do_adp_releases([(r.sensitivity, r.scale, r.p, r.q, r.skipped) for r in releases], spec.delta0, delta)


@cf.register_closed_form("privsgp_vr", PAPERS["privsgp_vr"])
def _privsgp_vr(releases: Sequence[Release], spec: PrivacySpec, delta: float) -> dict[str, Any]:
    _gaussian_only("privsgp_vr", releases)
    zs = {(r.scale, r.sensitivity, r.q) for r in releases}
    if len({(sig / sens, q) for sig, sens, q in zs}) > 1:
        raise cf.ClosedFormError("privsgp_vr", "eq. (11) assumes one noise multiplier and sampling rate; "
                                               f"this agent used {len(zs)} different ones")
    (sigma, sens, q), *_ = zs
    K = len(releases)
    # eq. (11) inverted: the recorded sensitivity stands for sens_mult G, and q for 1 / J
    eps = cf.privsgp_vr_epsilon(sigma, K, delta, 1.0 / q, sens, spec.c2, sens_mult=1.0)
    return {"paper": eps, "conservative": None,
            "violations": list(cf.privsgp_vr_validity(eps, K, round(1 / q), None)),
            "note": f"eq. (11) inverted with c2 = {spec.c2}; "
                    "the accountants' numbers are the rigorous ones"}


def scenario_of(trace) -> Scenario | None:
    from netsim.scenario.load import scenario_from_dict

    text = trace.scenario_text
    if not text:
        return None
    return scenario_from_dict(tomllib.loads(text), "trace metadata")


NOT_PRIVATE = "no DP releases recorded: this run is not differentially private (epsilon = infinity)"
UNKNOWN = ("unknown: the trace is cut (no end of run recorded) and holds no readable release, so whether this run "
           "is differentially private, and at which epsilon, cannot be told from it")
NOT_A_GUARANTEE = ("NOT a guarantee: {n} release(s) of {a} agent(s) were decided by an event trigger from "
                   "unreleased data (whether to release depended on the model or gradient values); the "
                   "accountants compose the releases as a fixed sequence, which does not bound the privacy loss "
                   "of a data-dependent schedule (the decision reads private data and leaks through which "
                   "releases happen; a private trigger, such as the sparse vector technique, would be needed)")

#: what the recommended epsilon assumes (printed under the table, stored in privacy.json)
ASSUMPTIONS = (
    "neighbouring datasets differ by adding or removing one record of the agent (dp-accounting's relation)",
    "each release's recorded sensitivity holds (per-example clipping bounds one record's contribution)",
    "a record enters a release independently with the recorded probability q (Poisson sampling; netsim draws "
    "fixed-size batches, the usual DP-SGD approximation; q = 1 assumes nothing)",
    "the sequence of releases is fixed in advance (no decision taken from unreleased data, such as an event "
    "trigger, chooses whether a release happens)",
    "everything else an agent sends is computed from its releases (post-processing); activation is visible "
    "(an inactive agent sends nothing), so random activation buys no amplification",
)


def columns(mode: str, pld: bool, closed: str, accountants: Sequence[str] = ()) -> dict[str, str]:
    """Every column of the table (key in privacy.json's agent rows: meaning), recommended figure first."""
    acc = "PLD" if pld else "RDP"
    out = {
        "epsilon": f"the recommended epsilon(delta): {acc} accountant, observed accounting, under the "
                   "assumptions listed; the rigorous guarantee when they hold",
        "releases": "noisy releases the agent made (Agent.privatize)",
        "ticks": "activation ticks the amplified accounting counts: releases plus ticks skipped while inactive",
        "rdp_observed": "dp-accounting's RDP accountant (Mironov, \"Renyi Differential Privacy\", CSF 2017), "
                        "each release at its sampling rate q",
        "rdp_amplified": "RDP with hidden activation (Huo et al., Lemma 4): every activation tick a run of the "
                         "mechanism at rate p*q; valid only if no one can see whether an agent was active",
    }
    if pld:
        out["pld_observed"] = ("dp-accounting's PLD accountant (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, "
                               "\"Connect the Dots: Tighter Discrete Approximations of Privacy Loss "
                               "Distributions\", PETS 2022), observed; tighter than RDP")
        if mode == "amplified":
            out["pld_amplified"] = "PLD with hidden activation (as rdp_amplified)"
    for name in accountants:
        out[f"{name}_observed"] = f"the registered accountant {name!r}: {ACCOUNTANT_DOCS.get(name, '')}, observed"
    if closed != "none":
        out["paper"] = (f"the closed form of {cf.lookup(closed).paper}, under that paper's own "
                        "assumptions; '!' marks a violated condition")
        out["conservative"] = "the same paper's formula with its optimistic steps replaced (see note)"
    out["exhausted_at"] = "simulated time at which the agent's budget cap stopped its releases"
    return out


def privacy_report(run: str | Path, delta: float | None = None, accounting: str | None = None,
                   pld: bool = True, strict: bool = False, plot: bool = True,
                   accountants: Sequence[str] = (), pairwise: bool = False, victims: str | None = None,
                   observers: str | None = None) -> dict[str, Any]:
    """Compute (and write ``privacy.json`` / ``privacy.png`` into the run folder) the per-agent report.
    ``run`` is a run folder or its trace file (the report goes beside the trace); ``accountants`` adds a
    column ``<name>_observed`` per registered accountant named (beyond RDP and PLD). ``pairwise``: also
    the (victim, observer) figures (netsim/privacy/pairwise.py; ``victims``/``observers``: "0,3,5-7"),
    written to ``pairwise.csv`` and privacy.json's ``pairwise`` section."""
    from netsim.trace.io import read_trace

    folder = Path(run)
    if folder.is_file():  # RUN/trace.arrows: read it, write the report into the folder that holds it
        trace = read_trace(folder)
        folder = folder.parent
    else:
        trace = read_trace(folder)
    sc = scenario_of(trace)
    spec = (sc.privacy if sc is not None else None) or PrivacySpec()
    delta = spec.delta if delta is None else delta
    if not 0 < delta < 1:
        raise InputError("--delta", f"must be in (0, 1), got {delta!r}")
    bad = [a for a in accountants if a not in ACCOUNTANTS]
    if bad:
        raise InputError("--accountant", f"unknown accountant {bad[0]!r}; registered: {', '.join(ACCOUNTANTS)} "
                                         "(a plugin's needs --plugin)")
    mode = accounting or spec.accounting
    if mode not in ("observed", "amplified"):
        raise InputError("--accounting", f"must be 'observed' or 'amplified', got {mode!r}")
    rel = releases_from_table(trace.table, str(folder))
    n = sc.agents.count if sc is not None else (max(rel) + 1 if rel else 0)
    exhausted = exhausted_from_table(trace.table)
    private = any(rel.values())
    rec = "pld_observed" if pld else "rdp_observed"
    events = events_section(rel, sc, ("pld" if pld else "rdp", *(["rdp"] if pld else []), *accountants))
    rows = []
    for i in range(n):
        rs = rel.get(i, [])
        row: dict[str, Any] = {"agent": i, "releases": len(rs), "ticks": sum(1 + r.skipped for r in rs)}
        if private:
            row["rdp_observed"] = finite_or_none(epsilon(rs, delta, "rdp", "observed"))
            row["rdp_amplified"] = finite_or_none(epsilon(rs, delta, "rdp", "amplified"))
            if pld:
                row["pld_observed"] = finite_or_none(epsilon(rs, delta, "pld", "observed"))
                if mode == "amplified":
                    row["pld_amplified"] = finite_or_none(epsilon(rs, delta, "pld", "amplified"))
            for name in accountants:
                row[f"{name}_observed"] = finite_or_none(epsilon(rs, delta, name, "observed"))
        else:  # nothing was released with noise: epsilon is infinite, not 0
            row["rdp_observed"] = row["rdp_amplified"] = None
        row["epsilon"] = row[rec] if private else None
        row["epsilon_infinite"] = not private or any(r.scale <= 0 for r in rs)
        row["data_dependent_releases"] = sum(decided_by_data(r) for r in rs)
        row["exhausted_at"] = exhausted.get(i)
        if spec.closed_form != "none" and private:
            form = closed_form(spec.closed_form, rs, spec, delta)
            if strict and (form["violations"] or form.get("blank")):
                raise cf.ClosedFormError(cf.canonical(spec.closed_form),
                                         f"agent {i}: " + "; ".join(form["violations"] or [form["blank"]]))
            row["closed_form"] = form
        rows.append(row)
    gated = [r for r in rows if r["data_dependent_releases"]]
    if not private and not trace.complete:  # a cut trace without releases says nothing about privacy
        status, message = "unknown", UNKNOWN
    elif not private:
        status, message = "not private", NOT_PRIVATE
    elif gated:
        status = "not a guarantee"
        message = NOT_A_GUARANTEE.format(n=sum(r["data_dependent_releases"] for r in gated), a=len(gated))
    else:
        status = "guarantee"
        message = ("epsilon is a differential-privacy guarantee of each agent's data under the assumptions "
                   "listed")
    key = f"rdp_{mode}"

    def worst_of(col):
        if not private:
            return None
        inf = [r for r in rows if r["epsilon_infinite"]]
        if inf:
            return inf[0]
        return max(rows, key=lambda r: -1 if r[col] is None else r[col], default=None)

    worst, worst_rec = worst_of(key), worst_of("epsilon")
    unknown = status == "unknown"
    if unknown:  # neither finite nor infinite: not known
        for r in rows:
            r["epsilon_infinite"] = None
    report = {
        "delta": delta, "accounting": mode, "closed_form": spec.closed_form,
        "closed_form_paper": None if spec.closed_form == "none" else cf.lookup(spec.closed_form).paper,
        "closed_form_blank": blanks(rows),
        "credits": credits(rel),
        "epsilon_cap": spec.epsilon_cap,
        "private": None if unknown else private,
        "guarantee": private and not gated,
        "status": status,
        "message": message,
        "recommended": {"column": "epsilon", "accountant": "pld" if pld else "rdp", "accounting": "observed",
                        "worst_agent": None if worst_rec is None else worst_rec["agent"],
                        "epsilon": None if worst_rec is None else worst_rec["epsilon"],
                        "epsilon_infinite": None if unknown else worst_rec is None or worst_rec["epsilon_infinite"],
                        "assumptions": list(ASSUMPTIONS)},
        "columns": columns(mode, pld, spec.closed_form, accountants),
        "agents": rows,
        "worst_agent": None if worst is None else worst["agent"],
        "worst_epsilon": None if worst is None else worst[key],
        "over_time": over_time(rel, eval_times(trace.table), delta) if private else [],
        "trace_complete": trace.complete,
        "events": events,
        "explain": ("observed: each release at its data-sampling rate q (activation is visible: no "
                    "amplification); amplified: hidden activation as in Huo et al., Lemma 4, every activation "
                    "tick a run of the mechanism at rate p*q. Accountants: dp-accounting RDP and PLD, "
                    "add-or-remove-one adjacency."),
    }
    import json

    if pairwise:
        from netsim.privacy.pairwise import pairwise_report

        report["pairwise"] = pairwise_report(folder, trace, sc, delta, victims, observers, plot,
                                             accountant="pld" if pld else "rdp",
                                             per_agent={r["agent"]: r["epsilon"] for r in rows})
    report["plot"] = PLOT_FILE if plot and plot_epsilon(rel, delta, mode, folder / PLOT_FILE, spec,
                                                        sc.name if sc is not None else folder.name) else None
    (folder / REPORT_FILE).write_text(json.dumps(_json_safe(report), indent=2, allow_nan=False) + "\n")
    return report


def credits(rel: dict[int, list[Release]]) -> str:
    """What the recommended per-agent figures credit, in one line (the table's caption)."""
    qs = {r.q for rs in rel.values() for r in rs}
    sub = (f"each release at its sampling rate q (subsampling credited, q = {min(qs):.4g}"
           + (f" to {max(qs):.4g})" if max(qs) > min(qs) else ")")) if qs and min(qs) < 1 else \
        "no subsampling to credit (q = 1)"
    return f"credits: {sub}; random activation not credited (observed accounting)"


def blanks(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The closed form's figures left blank, grouped by reason: [{"columns", "agents", "reason"}] with the
    reason of the first agent of each group (its numbers; the others' are in their rows' ``closed_form``)."""
    groups: dict[tuple[tuple[str, ...], str], dict[str, Any]] = {}
    for r in rows:
        f = r.get("closed_form")
        if not f or not f.get("blank"):
            continue
        cols = tuple(c for c in ("paper", "conservative") if f.get(c) is None)
        kind = re.sub(r"\d[\d.e+-]*", "#", f["blank"])  # the same reason at other numbers
        g = groups.setdefault((cols, kind), {"columns": list(cols), "agents": [], "reason": f["blank"]})
        g["agents"].append(r["agent"])
    return list(groups.values())


def events_section(rel: dict[int, list[Release]], sc: Scenario | None, accountants: Sequence[str]) -> dict[str, Any]:
    """privacy.json's ``events``: the neighbouring relation, the sampling scheme, each mechanism used (its own
    dp-accounting event), and the accountants that cannot compose the run's events. Raises InputError, before
    anything is written, when the recommended one (first in ``accountants``) cannot."""
    from netsim.privacy.accountants import NEIGHBOURING, SAMPLING, grouped_events, unsupported
    from netsim.privacy.mechanisms import get_mechanism

    drawn = sc.data.sampling.replace("_", " ") if sc is not None else "unknown"
    used = sorted({r.mechanism for rs in rel.values() for r in rs})
    distinct: dict[Any, int] = {}  # each distinct release event, and an agent that made it
    for i in sorted(rel):
        for ev, _ in grouped_events(rel[i]):
            distinct.setdefault(ev, i)
    why: dict[str, str] = {}
    for acc in dict.fromkeys(accountants):
        for ev, i in distinct.items():
            reason = unsupported(acc, ev)
            if reason:
                why[acc] = f"agent {i}: {reason}"
                break
    first = next(iter(accountants), None)
    if first in why:
        hint = "the PLD accountant (--pld) composes more events" if first == "rdp" else "try another accountant"
        raise InputError("--accountant", f"the recommended {first.upper()} figure cannot be computed: {why[first]}; "
                                         f"{hint}")
    return {"neighbouring_relation": NEIGHBOURING,
            "sampling": f"{SAMPLING}: each record enters a release independently with its recorded q (netsim draws "
                        f"fixed-size batches {drawn}; Poisson is the usual DP-SGD approximation of them)",
            "mechanisms": {m: get_mechanism(m).doc for m in used},
            "unsupported": why}


def _json_safe(x):
    """Standard JSON: a non-finite number (a closed form at an extreme recorded value) becomes null; the
    epsilon columns say infinite explicitly (``epsilon_infinite``)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    return x


def eval_times(table, points: int = 20) -> list[float]:
    """The run's evaluation times (at most ``points``, evenly chosen, the last kept); the trace's last
    time when it has no evaluation."""
    import pyarrow.compute as pc

    t = table.filter(pc.equal(table["kind"], "eval"))["t"].to_pylist()
    ts = sorted(set(t))
    if not ts:
        return [max(table["t"].to_pylist())] if table.num_rows else []
    if len(ts) > points:
        ts = [ts[round(k * (len(ts) - 1) / (points - 1))] for k in range(points)]
    return ts


def over_time(rel: dict[int, list[Release]], times: Sequence[float], delta: float) -> list[dict[str, Any]]:
    """Recommended-accounting (RDP, observed) epsilon(delta) at each time: the worst and the mean agent, and
    the releases so far. Agents that never release count with epsilon 0 in the mean."""
    from netsim.privacy.accountants import epsilon_at

    per = {i: epsilon_at(rs, times, delta) for i, rs in rel.items() if rs}
    n = max(1, len(per))
    out = []
    for k, t in enumerate(times):
        eps = [e[k][0] for e in per.values()]
        worst, mean = max(eps, default=0.0), sum(eps) / n
        out.append({"t": t, "epsilon_max": finite_or_none(worst), "epsilon_mean": finite_or_none(mean),
                    "releases": sum(e[k][1] for e in per.values())})  # None: infinite (a noiseless release)
    return out


def _short_paper(paper: str) -> str:
    """'Huo, Liu, Ding, ..., "Title"' -> 'Huo et al.' (a legend entry)."""
    authors = paper.split('"', 1)[0].strip().rstrip(",")
    names = [a.strip() for a in authors.split(",") if a.strip()]
    if not names:
        return paper[:40]
    return names[0] if len(names) == 1 else f"{names[0]} and {names[1]}" if len(names) == 2 else f"{names[0]} et al."


def epsilon_series(rel: dict[int, list[Release]], delta: float, mode: str, spec: PrivacySpec | None = None,
                   points: int = 40) -> dict[str, Any]:
    """What privacy.png draws: every agent's RDP epsilon(delta) after each release (``curves``), the worst
    agent (largest final epsilon; an infinite one counts as largest), and where the scenario names a closed
    form, that form for the worst agent's releases up to each of ``points`` of its releases (``closed``: t,
    paper, conservative (None where blank), the paper, the paper's own delta where its form sets one (the
    last, and the range), and ``blank``: where a figure first went blank and why); ``cap``: the budget cap,
    if any."""
    curves = {i: epsilon_curve(rs, delta, mode) for i, rs in sorted(rel.items()) if rs}

    def final(i: int) -> float:  # no point at all: the first release was already unsupported or noiseless
        e = curves[i][1]
        return e[-1] if e else math.inf

    worst = max(curves, key=final, default=None)
    closed = None
    name = spec.closed_form if spec is not None else "none"
    if worst is not None and name != "none":
        rs = rel[worst]
        m = min(points, len(rs))
        idx = sorted({round(k * (len(rs) - 1) / max(1, m - 1)) for k in range(m)})
        t, blank = [], None
        fig: dict[str, list] = {"paper": [], "conservative": []}
        own: dict[str, list] = {"paper": [], "conservative": []}  # the delta of each figure drawn
        for k in idx:
            form = closed_form(name, rs[:k + 1], spec, delta)  # a blank figure: no point there (None)
            t.append(rs[k].t)
            for c in fig:
                fig[c].append(form.get(c))
                if form.get(c) is not None:
                    own[c].append(form.get(f"delta_{c}", delta))
            if blank is None and form.get("blank"):
                blank = {"t": rs[k].t, "reason": form["blank"]}
        closed = {"name": name, "paper_name": cf.lookup(name).paper, "t": t, **fig,
                  "delta_paper": own["paper"][-1] if own["paper"] else None,
                  **{f"delta_{c}_range": (min(d), max(d)) if d else None for c, d in own.items()}, "blank": blank}
    return {"curves": curves, "worst": worst, "closed": closed, "delta": delta, "mode": mode,
            "cap": spec.epsilon_cap if spec is not None else None}


def epsilon_figure(series: dict[str, Any], title: str = ""):
    """The figure of ``epsilon_series``: every agent thin, the worst agent highlighted, the closed form
    (dashed: the paper's own figure; dotted: its conservative version) and the budget cap overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, worst = series["curves"], series["worst"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    alpha = max(0.15, min(0.8, 6 / max(1, len(curves))))
    first = True
    for i, (t, e) in curves.items():
        if i == worst:
            continue
        ax.plot(t, e, lw=0.9, color="tab:blue", alpha=alpha,
                label=f"other agents ({len(curves) - 1})" if first else None)
        first = False
    if worst is not None:
        t, e = curves[worst]
        end = f"{e[-1]:.3g}" if e else "inf"
        ax.plot(t, e, lw=2.2, color="tab:red", label=f"worst agent: {worst} (epsilon {end})")
    closed = series["closed"]
    elsewhere = []  # the curves drawn at another delta than the axis's

    def at(c: str, whose: str) -> str:
        rng = closed.get(f"delta_{c}_range")
        if rng is None or rng == (series["delta"], series["delta"]):
            return ""
        elsewhere.append({"paper": "dashed", "conservative": "dotted"}[c])
        return (f", at {whose} delta = {rng[0]:.2g}" if rng[0] == rng[1] else
                f", at {whose} delta ({rng[0]:.2g} to {rng[1]:.2g})")

    if closed is not None:
        who, own = _short_paper(closed["paper_name"]), at("paper", "the paper's own")
        if any(v is not None for v in closed["paper"]):
            ax.plot(closed["t"], [math.nan if v is None else v for v in closed["paper"]], lw=1.6, ls="--",
                    color="black", label=f"closed form ({who}), agent {worst}{own}")
        if any(v is not None for v in closed["conservative"]):
            ax.plot(closed["t"], [math.nan if v is None else v for v in closed["conservative"]], lw=1.2, ls=":",
                    color="black", label=f"the same, conservative{at('conservative', 'its')}")
        if closed.get("blank"):  # where the paper's figure stops applying, and why, on the figure itself
            b = closed["blank"]
            ax.axvline(b["t"], color="black", lw=0.6, ls=(0, (1, 3)))
            ax.text(0.99, 0.02, f"closed form blank from t = {b['t']:.3g} s: {b['reason']}", transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=6, wrap=True)
    if series["cap"] is not None:
        ax.axhline(series["cap"], color="grey", lw=1.0, ls="-.", label=f"budget cap {series['cap']:g}")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(f"epsilon at delta = {series['delta']:g}"
                  + (f"\n({' and '.join(elsewhere)}: at the delta in the legend)" if elsewhere else ""))
    head = f"{title}: " if title else ""
    ax.set_title(f"{head}privacy spent per agent\nRDP accountant, {series['mode']} accounting", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def plot_epsilon(rel: dict[int, list[Release]], delta: float, mode: str, path: Path,
                 spec: PrivacySpec | None = None, title: str = "") -> Path | None:
    """privacy.png: ``epsilon_figure`` of the run's releases."""
    if not rel:
        return None
    import matplotlib.pyplot as plt

    fig = epsilon_figure(epsilon_series(rel, delta, mode, spec), title)
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
    # releases an event trigger decided from unreleased data (their ``what`` carries the mark, kept in
    # the log's run-length specs): the number is then not a guarantee
    decided = sorted(i for i, log in rel.items() if any(sp[2].endswith(TRIGGERED) for sp in log.specs))
    out: dict[str, Any] = {}
    if decided:
        out = {"privacy_guarantee": False,
               "privacy_note": f"NOT a guarantee: releases of {len(decided)} agent(s) were decided by an event "
                               "trigger from unreleased data (netsim privacy RUN explains)"}
    out.update({"privacy_epsilon_max": eps[worst],
                "privacy_epsilon_method": f"RDP accountant (dp-accounting), {spec.accounting} accounting, worst agent, "
                                          "at privacy_delta; netsim privacy RUN gives PLD and every agent",
                "privacy_worst_agent": worst, "privacy_delta": spec.delta,
                "privacy_releases": sum(len(rs) for rs in rel.values()),
                "privacy_exhausted": sum(bool(a.existing_ledger and a.existing_ledger.exhausted)
                                         for a in sim.agents)})
    if spec.closed_form != "none":
        out.update(_closed_form_summary(rel, spec))
    return out


def _closed_form_summary(rel, spec: PrivacySpec) -> dict[str, Any]:
    """The paper's own figure of the worst agent (its closed form), named, beside the accountant's."""
    name = cf.canonical(spec.closed_form)
    out: dict[str, Any] = {"privacy_closed_form": name, "privacy_closed_form_paper": cf.lookup(name).paper}
    forms = {i: closed_form(name, rs, spec, spec.delta) for i, rs in rel.items()}
    blank = sorted(i for i, f in forms.items() if f.get("paper") is None)
    if blank:  # the paper's figure does not apply to some agents: no worst of it (the accountant's stands)
        out["privacy_closed_form_blank"] = f"agent {blank[0]}: {forms[blank[0]]['blank']}" + (
            f" ({len(blank)} agents)" if len(blank) > 1 else "")
        return out
    worst = max(forms, key=lambda i: forms[i]["paper"])
    f = forms[worst]
    out.update({"privacy_closed_form_epsilon_max": f.get("paper"), "privacy_closed_form_worst_agent": worst,
                "privacy_closed_form_method": f.get("note", ""),
                "privacy_closed_form_violations": sorted({v for g in forms.values() for v in g["violations"]})})
    if f.get("delta_paper") is not None:
        out["privacy_closed_form_delta"] = f["delta_paper"]
    return out
