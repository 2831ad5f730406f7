"""Canary audit of a run: an empirical lower bound on epsilon for each (victim, observer) pair, beside the accounted
pairwise epsilon it tests.

The run inserts canaries (``privacy.audit``; netsim/privacy/payloads.py): m per victim, each included with
probability 1/2, each in its own model coordinate (Dirac canaries, which barely interfere: Keinan, Shenfeld,
Ligett, "How Well Can Differential Privacy Be Audited in One Run?", NeurIPS 2025; in a linear Gaussian algorithm
they do not interfere at all). The auditor is the observer v, scoring from its own view only: the model payloads
delivered to it, its own releases, the common initial model, and the linear form of its messages (the mixing
record). Other agents' gradients are unknown to it and enter its scores as noise.

**Scores.** In canary coordinate c the observer's residual e_c (payloads minus the initial model and its own
releases' part) is M (g_c + n_c + b_c Delta), M its knowledge matrix over the other agents' releases (release
units), n_c ~ N(0, diag sigma_s^2), b_c the canary's inclusion bit and Delta the declared sensitivities of the
victim's releases. Whitening by the noise covariance Sigma = M diag(sigma^2) M^T gives the matched filter
(the likelihood-ratio test of the accounted model; El Mrini et al.'s generalised least squares applied to the
canary): score_c = a^T Sigma^+ e_c / sqrt(a^T Sigma^+ a), a = M[:, victim] Delta, distributed N(0, 1) out and
N(mu, 1) in when the accounting is right, mu the pair's exact Gaussian-DP figure (netsim/privacy/pairwise.py).

**Bounds**, each at confidence 1 - beta/2, so that their maximum, ``epsilon_lower``, holds at the stated confidence
1 - beta:

- ``epsilon_one_run``: Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023),
  Theorem 3.1 with its approximate-DP term: guess "in" for the k+ highest scores and "out" for the k- lowest,
  abstain otherwise; if the mechanism is (epsilon, delta)-DP in each canary, the number of correct guesses v among
  r guesses satisfies P[correct >= v] <= P[Binomial(r, p) >= v] + 2 m delta alpha, p = e^epsilon / (1 + e^epsilon),
  alpha = max_{i=1..v} P[v > Binomial(r, p) >= v - i] / i. The bound is the largest epsilon this rejects at
  level beta/2, over a fixed grid of (k+, k-) chosen before the scores are seen (Bonferroni over the grid). It
  assumes nothing about the mechanism, and is loose for Gaussian mechanisms (a few tenths of the true epsilon at
  delta = 1e-5, whatever m).
- ``epsilon_gdp``: Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini, Terzis, "Tight Auditing of
  Differentially Private Machine Learning" (USENIX Security 2023), Section 4: the claim under test is the accounted
  one, mu-Gaussian-DP (Dong, Roth, Su, "Gaussian Differential Privacy", Definition 2.6), which bounds every test's
  false-negative rate by Phi(Phi^-1(1 - FPR) - mu); Clopper-Pearson upper bounds on the FPR and FNR of the
  threshold test at each of a fixed grid of thresholds (Bonferroni over them) give mu_lower =
  max_t Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub), and epsilon_gdp = epsilon(mu_lower, delta) (Dong et al., Corollary
  2.13). It treats the canaries as independent trials, which Dirac canaries in disjoint coordinates of a
  linear algorithm are (their noises are independent); it tests the accounted claim exactly, so it is tight.

``flag = violated`` when epsilon_lower > epsilon_upper, the accounted pairwise epsilon at the run's delta of the claim
the canaries test: the observer's view of the victim's releases as ``--pairwise`` accounts it without subsampling
(``capped_mu``: pairwise.csv's ``mu``). The canaries join every release of the victim, not a batch drawn at the
release's q, so the pairwise ``epsilon`` that credits q (``exact, subsampled``) is no claim about them: scored
against it, a correct run's canaries would be flagged once there are enough of them. An
epsilon_lower is what this attack achieved from the observer's view, not a guarantee: a larger true epsilon is
always possible. Canaries from several runs of one scenario (different seeds) can be pooled (``audit``): the
bounds then count every run's canaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from netsim.errors import InputError

AUDIT_FILE = "audit.csv"
CSV_COLUMNS = ("victim", "observer", "hops", "epsilon_lower", "epsilon_upper", "confidence", "canaries", "runs",
               "flag", "epsilon_one_run", "epsilon_gdp", "mu_lower", "mu_upper", "epsilon_agent", "delta", "kind")
#: guesses of the one-run bound, as fractions of the canaries: k+ (top scores guessed in) and k- (bottom, out)
GUESS_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
#: thresholds of the Gaussian-DP bound, in units of the score's modelled noise (out-canaries ~ N(0, 1))
THRESHOLDS = tuple(np.round(np.arange(-1.0, 6.01, 0.25), 2))


# --- Steinke, Nasr, Jagielski: one run -------------------------------------------------------------------------


def one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P-value of >= v correct guesses among r (m canaries) if the mechanism is (eps, delta)-DP in each canary
    (Steinke et al., Theorem 3.1): P[Binomial(r, p) >= v] + 2 m delta alpha, p = e^eps / (1 + e^eps)."""
    from scipy.special import expit
    from scipy.stats import binom

    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    p = float(expit(eps))
    beta = float(binom.sf(v - 1, r, p))
    if delta == 0 or v == 0:
        return min(1.0, beta)
    i = np.arange(1, v + 1)
    alpha = float(np.max((binom.sf(v - i - 1, r, p) - beta) / i))  # P[v > W >= v - i] / i
    return min(1.0, beta + 2.0 * m * delta * alpha)


def one_run_epsilon(m: int, r: int, v: int, beta: float, delta: float) -> float:
    """The largest epsilon whose (epsilon, delta)-DP claim ``r`` guesses with ``v`` correct reject at level ``beta``
    (0 when none is rejected)."""
    from scipy.optimize import brentq

    if r == 0 or one_run_p_value(m, r, v, 0.0, delta) > beta:
        return 0.0
    hi = 1.0
    while one_run_p_value(m, r, v, hi, delta) <= beta:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    return float(brentq(lambda e: one_run_p_value(m, r, v, e, delta) - beta, 0.0, hi, xtol=1e-9))


def guess_counts(scores: np.ndarray, bits: np.ndarray, k_plus: int, k_minus: int) -> tuple[int, int]:
    """(r, v): guess in for the k+ highest scores, out for the k- lowest (ties broken by index), abstain on the
    rest; v the correct guesses."""
    order = np.argsort(-scores, kind="stable")
    k_minus = min(k_minus, len(scores) - k_plus)
    top, bottom = order[:k_plus], order[len(scores) - k_minus:] if k_minus > 0 else order[:0]
    return k_plus + k_minus, int(bits[top].sum() + (~bits[bottom]).sum())


def audit_one_run(scores: np.ndarray, bits: np.ndarray, delta: float, beta: float) -> float:
    """Steinke et al.'s bound, the best over the (k+, k-) grid, each at beta / |grid|."""
    m = len(scores)
    ks = sorted({max(1, int(round(f * m))) for f in GUESS_FRACTIONS})
    grid = [(kp, km) for kp in ks for km in (0, *ks) if kp + km <= m]
    best = 0.0
    for kp, km in grid:
        r, v = guess_counts(scores, bits, kp, km)
        best = max(best, one_run_epsilon(m, r, v, beta / len(grid), delta))
    return best


# --- Nasr et al.: Gaussian DP from the threshold tests ---------------------------------------------------------


def clopper_pearson_upper(k: int, n: int, beta: float) -> float:
    """One-sided upper confidence bound at level 1 - beta on a binomial rate from k successes in n trials."""
    from scipy.stats import beta as beta_dist

    if n == 0 or k >= n:
        return 1.0
    return float(beta_dist.ppf(1.0 - beta, k + 1, n - k))


def audit_gdp(scores: np.ndarray, bits: np.ndarray, beta: float) -> float:
    """mu_lower: max over the fixed thresholds of Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub), each bound at level
    beta / (2 |thresholds|); 0 when no threshold separates."""
    from scipy.stats import norm

    ins, outs = scores[bits], scores[~bits]
    b = beta / (2 * len(THRESHOLDS))
    best = 0.0
    for t in THRESHOLDS:
        fpr = clopper_pearson_upper(int((outs >= t).sum()), len(outs), b)
        fnr = clopper_pearson_upper(int((ins < t).sum()), len(ins), b)
        if fpr < 1.0 and fnr < 1.0:
            best = max(best, float(norm.isf(fpr) - norm.ppf(fnr)))
    return best


# --- the observer's scores ---------------------------------------------------------------------------------------


def canary_scores(M: np.ndarray, e: np.ndarray, sigma: np.ndarray, a: np.ndarray) -> np.ndarray | None:
    """The matched filter's score of each canary coordinate: ``M`` the knowledge matrix over the releases the
    observer does not know (messages x releases), ``e`` the residual at the canary coordinates (messages x m),
    ``sigma`` the releases' noise std, ``a`` the victim's canary signature (messages). None when the view holds
    no trace of the victim."""
    if not len(M):
        return None
    Mw = M * sigma
    U, s, _ = np.linalg.svd(Mw, full_matrices=False)
    keep = s > s[0] * max(Mw.shape) * np.finfo(float).eps * 8 if len(s) else s > 0
    U, s = U[:, keep], s[keep]
    aw = (U.T @ a) / s
    norm = float(np.linalg.norm(aw))
    if norm <= 1e-12:
        return None
    return (aw / norm) @ ((U.T @ e) / s[:, None])


def pair_scores(lin, vals, canaries, u: int, v: int, sigma: np.ndarray, sens: np.ndarray) -> np.ndarray | None:
    """Scores of victim u's canaries from observer v's view (``lin``: the linear run in release units; ``vals``:
    the payload record lined up with it, attack._RunValues)."""
    rows = lin.views[v]
    own = lin.slots.get(v, np.zeros(0, dtype=np.int64))
    coords = canaries.coords[canaries.row[u]]
    y = vals.received_rows(v, lin.received[v])[:, coords] - vals.x0[coords]
    if len(own):
        y = y - rows[:, own] @ vals.released[own][:, coords]
    others = np.setdiff1d(np.arange(rows.shape[1]), own)
    a = rows[:, lin.slots[u]] @ sens[lin.slots[u]]
    return canary_scores(rows[:, others], y, sigma[others], a)


# --- the report --------------------------------------------------------------------------------------------------


def audit(run_folders: Sequence[str | Path], observers: str | None = None) -> list[dict[str, Any]]:
    """Audit rows (``CSV_COLUMNS``) of every audited victim and observer, pooling the canaries of ``run_folders``
    (runs of one scenario, seeds apart). Every check first: raises InputError, writing nothing."""
    from netsim.privacy.accountants import epsilon as agent_epsilon
    from netsim.privacy.attack import _payloads, load_run
    from netsim.privacy.pairwise import _parse_agents, capped_mu, exact_mu, gdp_epsilon, run_inputs

    runs = []
    for folder in run_folders:
        folder, trace, sc = load_run(folder, "--audit")
        if not trace.complete:
            raise InputError("--audit", "the trace is incomplete (cut or crashed run): the audit needs the whole "
                                        "run", str(folder))
        spec = sc.privacy.audit if sc.privacy is not None else None
        if spec is None:
            raise InputError("--audit", "the run inserted no canaries: audit a run whose scenario sets "
                                        "[privacy.audit] (victims, canaries, kind) and privacy.record = \"payloads\"",
                             str(folder))
        inp = run_inputs(folder, trace, sc, "--audit")
        vals = _payloads(folder, inp)
        if vals is None or vals.pay.canaries is None:
            raise InputError("--audit", "payloads.npz with the canaries is missing: the run must record its payloads "
                                        "(privacy.record = \"payloads\")", str(folder))
        sigma = np.array([r.scale for a in range(inp.n) for r in inp.releases.get(a, [])], dtype=np.float64)
        if not (sigma > 0).all():
            raise InputError("--audit", "a release without noise: its epsilon is infinite, there is nothing to audit",
                             str(folder))
        runs.append((folder, sc, inp, vals, sigma))
    first = runs[0][1]
    for folder, sc, *_ in runs[1:]:
        a, b = dict(first.algorithm.params), dict(sc.algorithm.params)
        if (sc.agents.count, sc.algorithm.name, a, sc.privacy.audit) != (first.agents.count, first.algorithm.name, b,
                                                                         first.privacy.audit):
            raise InputError("--audit", "runs pooled in one audit must be of one scenario (seeds apart)", str(folder))
    n, spec, delta = first.agents.count, first.privacy.audit, first.privacy.delta
    obs = _parse_agents(observers, n, "--observers")
    beta = 1.0 - spec.confidence
    pooled: dict[tuple[int, int], list] = {}
    for _, _, inp, vals, sigma in runs:
        lin = inp.linear_run(obs, unit=np.ones(inp.n_slots))
        linw = inp.linear_run(obs)
        sens = np.array([r.sensitivity for a in range(inp.n) for r in inp.releases.get(a, [])], dtype=np.float64)
        hops = inp.hops()
        can = vals.pay.canaries
        for v in obs:
            victims = [u for u in can.victims if u != v]
            exact = exact_mu(linw.views[v], linw.slots, linw.scale, v, victims)
            for u in victims:
                # the view without subsampling credit: a canary is in every release, not drawn at q
                mu_up, _, _ = capped_mu(exact[u], linw.scale[linw.slots[u]], False)
                sc_ = pair_scores(lin, vals, can, u, v, sigma, sens)
                bits = can.bits[can.row[u]]
                p = pooled.setdefault((u, v), [[], [], 0.0, hops.get(u, {}).get(v), 0.0])
                p[0].append(np.zeros(len(bits)) if sc_ is None else sc_)
                p[1].append(bits)
                p[2] = max(p[2], mu_up)
                p[4] = max(p[4], agent_epsilon(inp.releases.get(u, []), delta, "rdp", "observed") or 0.0)
    rows = []
    for (u, v), (scores, bits, mu_up, h, eps_agent) in sorted(pooled.items()):
        s, b = np.concatenate(scores), np.concatenate(bits)
        eps_1 = audit_one_run(s, b, delta, beta / 2)
        mu_lo = audit_gdp(s, b, beta / 2)
        eps_g = gdp_epsilon(mu_lo, delta)
        lower, upper = max(eps_1, eps_g), gdp_epsilon(mu_up, delta)
        rows.append({"victim": u, "observer": v, "hops": h, "epsilon_lower": lower, "epsilon_upper": upper,
                     "confidence": spec.confidence, "canaries": int(len(s)), "runs": len(runs),
                     "flag": "violated" if lower > upper else "", "epsilon_one_run": eps_1, "epsilon_gdp": eps_g,
                     "mu_lower": mu_lo, "mu_upper": mu_up, "epsilon_agent": eps_agent, "delta": delta,
                     "kind": spec.kind})
    return rows


def audit_report(run_folder: str | Path, observers: str | None = None, plot: bool = True) -> dict[str, Any]:
    """``netsim privacy RUN --audit``: the rows (``audit``), then ``audit.csv`` and ``audit.png`` in the run
    folder. Returns a summary with the rows."""
    rows = audit([run_folder], observers)
    folder = Path(run_folder)
    return write_audit(folder.parent if folder.is_file() else folder, rows, plot)


def write_audit(folder: Path, rows: list[dict[str, Any]], plot: bool = True) -> dict[str, Any]:
    """Write ``audit.csv`` (and ``audit.png``); the summary ``audit_lines`` prints."""
    from netsim.privacy.pairwise import write_csv

    write_csv(rows, folder / AUDIT_FILE, CSV_COLUMNS)
    out: dict[str, Any] = {"rows": rows, "file": AUDIT_FILE, "violated": sum(1 for r in rows if r["flag"])}
    if plot and rows:
        from netsim.privacy.attack_plots import plot_audit

        out["plots"] = [p.name for p in plot_audit(rows, folder)]
    return out


def audit_lines(out: dict[str, Any], folder: str) -> list[str]:
    """The terminal summary: per distance, the audited pairs' epsilon_lower beside epsilon_upper, and violations."""
    rows = out["rows"]
    if not rows:
        return ["audit: no (victim, observer) pair to audit", f"wrote {folder}/{out['file']}"]
    r0 = rows[0]
    lines = [f"canary audit ({r0['kind']} canaries, {r0['canaries']} per victim over {r0['runs']} run(s), "
             f"confidence {r0['confidence']:g}, delta {r0['delta']:g}): epsilon_lower is what the audit achieved "
             "from the observer's view, not a guarantee"]
    by: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["hops"], []).append(r)

    def f(x):
        return "inf" if not math.isfinite(x) else f"{x:.4g}"

    head = ("hops", "pairs", "eps_lower median", "eps_upper median", "lower/upper min", "lower/upper max",
            "violated")
    table = [head]
    for h in sorted(by, key=lambda x: (x is None, x)):
        rs = by[h]
        ratios = [r["epsilon_lower"] / r["epsilon_upper"] for r in rs if 0 < r["epsilon_upper"] < math.inf]
        table.append((str(h), str(len(rs)), f(float(np.median([r["epsilon_lower"] for r in rs]))),
                      f(float(np.median([r["epsilon_upper"] for r in rs]))),
                      f"{min(ratios):.3g}" if ratios else "-", f"{max(ratios):.3g}" if ratios else "-",
                      str(sum(1 for r in rs if r["flag"]))))
    widths = [max(len(r[k]) for r in table) for k in range(len(head))]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    if out["violated"]:
        lines.append(f"! VIOLATED: for {out['violated']} pair(s) the audit proves more leakage than the accounted "
                     "epsilon allows (flag=violated in the csv): the accounting or the implementation is wrong")
    else:
        lines.append("no violation: every audited pair's epsilon_lower <= epsilon_upper")
    lines.append(f"wrote {folder}/{out['file']}" + (f", {', '.join(out['plots'])}" if out.get("plots") else ""))
    return lines
