"""The canary audit (netsim/privacy/audit.py): Steinke et al.'s one-run statistic against the paper's formula
computed directly (exact binomial sums) and by simulation of an epsilon-DP mechanism, the Gaussian-DP bound by
simulation, and on runs: correct Muffliato and DP-D-PSGD are never flagged and a 1-hop observer's bound reaches
half the accounted epsilon; five planted privacy bugs are each flagged ``violated``."""

from __future__ import annotations

import csv
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from netsim.cli import app
from netsim.privacy import audit as A
from tests.conftest import BASE, merge

runner = CliRunner()
CANARIES = 2000  # per victim, one run: the audit's figures below are for these canaries, confidence 0.95


# --- the statistics ---------------------------------------------------------------------------------------------


def tail(r: int, v: int, p: Fraction) -> Fraction:
    """P[Binomial(r, p) >= v], exactly."""
    return sum((math.comb(r, k) * p**k * (1 - p) ** (r - k) for k in range(max(v, 0), r + 1)), Fraction(0))


def paper_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Steinke et al., Theorem 3.1 written out: P[W >= v] + 2 m delta max_i P[v > W >= v - i] / i, W ~ Bin(r, p)."""
    p = Fraction(math.exp(eps) / (1 + math.exp(eps)))
    beta = tail(r, v, p)
    alpha = max((tail(r, v - i, p) - beta) / i for i in range(1, v + 1)) if v else Fraction(0)
    return min(1.0, float(beta + 2 * m * Fraction(delta) * alpha))


@pytest.mark.parametrize("m, r, v, eps, delta", [
    (100, 20, 15, 0.5, 0.0), (100, 20, 15, 0.5, 1e-5), (1000, 60, 50, 1.0, 1e-5), (1000, 60, 50, 1.0, 1e-3),
    (50, 50, 50, 2.0, 1e-6), (200, 10, 3, 0.0, 1e-2), (500, 100, 80, 1.5, 0.0),
])
def test_one_run_p_value_is_the_papers_formula(m, r, v, eps, delta):
    assert A.one_run_p_value(m, r, v, eps, delta) == pytest.approx(paper_p_value(m, r, v, eps, delta), rel=1e-9,
                                                                   abs=1e-15)


@pytest.mark.parametrize("r", [10, 50, 200])
def test_all_guesses_right_gives_the_closed_form(r):
    # delta = 0, v = r: p^r = beta, so epsilon = logit(beta^(1/r))
    beta = 0.05
    q = beta ** (1 / r)
    assert A.one_run_epsilon(10 * r, r, r, beta, 0.0) == pytest.approx(math.log(q / (1 - q)), rel=1e-7)
    assert A.one_run_epsilon(10 * r, r, r // 2, beta, 0.0) == 0.0  # chance: nothing rejected


def test_the_one_run_bound_holds_for_an_epsilon_dp_mechanism():
    """Randomized response with epsilon = 1 (each canary's bit flipped with probability 1 / (1 + e)): the bound at
    confidence 0.95 exceeds 1 in at most 5% of runs, and reaches a fair part of it."""
    rng = np.random.default_rng(0)
    eps, m, over, got = 1.0, 200, 0, []
    for _ in range(100):
        bits = rng.random(m) < 0.5
        keep = rng.random(m) < math.exp(eps) / (1 + math.exp(eps))
        scores = np.where(keep, bits, ~bits).astype(float) + 1e-3 * rng.random(m)  # the output, ties broken
        e = A.audit_one_run(scores, bits, 0.0, 0.05)
        over += e > eps
        got.append(e)
    assert over <= 5
    assert np.median(got) > 0.3


def test_the_gaussian_dp_bound_holds_and_is_tight_for_a_gaussian_mechanism():
    rng = np.random.default_rng(1)
    mu, m = 1.0, 2000
    lows = []
    for _ in range(60):
        bits = rng.random(m) < 0.5
        lows.append(A.audit_gdp(rng.normal(size=m) + mu * bits, bits, 0.05))
    assert max(lows) <= mu  # Bonferroni over the thresholds: well inside 5%
    assert min(lows) > 0.6 * mu


def test_clopper_pearson_is_scipys_exact_interval():
    from scipy.stats import binomtest

    for k, n in [(0, 10), (3, 10), (40, 1000), (999, 1000)]:
        want = binomtest(k, n, alternative="less").proportion_ci(0.99).high
        assert A.clopper_pearson_upper(k, n, 0.01) == pytest.approx(want, rel=1e-9)


# --- runs ---------------------------------------------------------------------------------------------------------


def audit_scenario(alg: str, kind: str) -> dict:
    """A ring of 5, victim 0 with CANARIES canaries in a model of 2001 coordinates; Delta / sigma = 1 per release.
    Muffliato: one release, two gossip steps (every agent sees it exactly); DP-D-PSGD (per-example clipping,
    noise multiplier 1): two rounds, the first release reaches the neighbours."""
    if alg == "muffliato":
        a = {"name": "muffliato", "lr": 0.1, "batch": 16, "clip": 1.0, "clip_mode": "batch", "sigma": 2.0,
             "gossip_steps": 2, "round_timeout": 0.2}
        rounds = 1
    else:
        a = {"name": "dp_dpsgd", "lr": 0.1, "batch": 16, "clip": 1.0, "noise_multiplier": 1.0, "round_timeout": 0.2}
        rounds = 2
    return merge(BASE, {"run": {"seed": 7, "rounds": rounds}, "agents": {"count": 5}, "topology": {"kind": "ring"},
                        "data": {"kind": "synthetic", "samples": 200, "features": CANARIES},
                        "algorithm": a, "evaluation": {"every": 100.0},
                        "privacy": {"record": "payloads",
                                    "audit": {"victims": [0], "canaries": CANARIES, "kind": kind}}})


def run_audit(folder, sc: dict) -> list[dict]:
    from netsim.api import run
    from netsim.scenario import scenario_from_dict

    run(scenario_from_dict(sc), out=folder)
    return A.audit([folder])


@pytest.mark.parametrize("alg, kind", [("muffliato", "gradient"), ("dp_dpsgd", "input")])
def test_correct_code_is_never_flagged_and_a_neighbour_reaches_half_the_accounted_epsilon(tmp_path, alg, kind):
    rows = run_audit(tmp_path, audit_scenario(alg, kind))
    assert {(r["victim"], r["observer"]) for r in rows} == {(0, v) for v in range(1, 5)}
    for r in rows:
        assert r["epsilon_lower"] <= r["epsilon_upper"] and not r["flag"], r
        assert r["confidence"] == 0.95 and r["canaries"] == CANARIES and r["runs"] == 1
        assert r["epsilon_lower"] == max(r["epsilon_one_run"], r["epsilon_gdp"])
    for r in (r for r in rows if r["hops"] == 1):  # the neighbour sees the release directly: mu = Delta / sigma
        assert r["mu_upper"] == pytest.approx(1.0, rel=1e-9)
        assert r["epsilon_lower"] >= 0.5 * r["epsilon_upper"], r


def test_the_audit_tests_the_view_without_subsampling_credit(tmp_path):
    """The canaries join every release of the victim (not a batch drawn at q = 16/32), so the claim they test is
    the pair's view as a plain Gaussian mechanism: epsilon_upper is --pairwise's mu at delta, while pairwise.csv's
    epsilon credits q (the single release reaches every observer as one Poisson-subsampled Gaussian). A correct
    run's scores, N(mu, 1) in and N(0, 1) out, prove more than the credited figure once there are enough canaries
    (simulated here, 100,000 of them): scored against it, correct code would be flagged."""
    from netsim.privacy.attack import load_run
    from netsim.privacy.pairwise import gdp_epsilon, pairwise_report

    rows = run_audit(tmp_path, audit_scenario("muffliato", "gradient"))
    folder, trace, sc = load_run(tmp_path, "--audit")
    pairwise_report(folder, trace, sc, sc.privacy.delta, victims="0", plot=False)
    with (tmp_path / "pairwise.csv").open() as f:
        pairs = {(int(r["victim"]), int(r["observer"])): r for r in csv.DictReader(f)}
    credited = {}
    for r in rows:
        p = pairs[r["victim"], r["observer"]]
        assert r["mu_upper"] == pytest.approx(float(p["mu"]), rel=1e-12)
        assert r["epsilon_upper"] == pytest.approx(gdp_epsilon(float(p["mu"]), r["delta"]), rel=1e-12)
        assert p["method"] == "exact, subsampled" and p["subsampling"] == "True", p
        credited[r["hops"]] = float(p["epsilon"])
        assert credited[r["hops"]] < 0.95 * r["epsilon_upper"], (p, r)
        assert not r["flag"]
    rng = np.random.default_rng(3)
    m = 100_000
    bits = rng.random(m) < 0.5
    mu = next(r["mu_upper"] for r in rows if r["hops"] == 1)
    lower = gdp_epsilon(A.audit_gdp(rng.normal(size=m) + mu * bits, bits, 0.025), rows[0]["delta"])
    assert credited[1] < lower <= gdp_epsilon(mu, rows[0]["delta"])


def _noise_halved(mp):
    import netsim.compute.noise as cn
    from netsim.privacy.mechanisms import NoiseSource

    add, rows = NoiseSource.add, cn.gaussian_noise_rows
    mp.setattr(NoiseSource, "add", lambda self, mech, x, s: add(self, mech, x, s / 2))
    mp.setattr(cn, "gaussian_noise_rows", lambda shape, sig, gens, dtype=torch.float32:
               rows(shape, [s / 2 for s in sig], gens, dtype))


def _noise_on_the_wrong_tensor(mp):
    import netsim.compute.noise as cn
    from netsim.privacy.mechanisms import NoiseSource

    add, rows = NoiseSource.add, cn.gaussian_noise_rows

    def add_to_a_copy(self, mech, x, s):
        add(self, mech, torch.zeros_like(x), s)  # drawn and added, but to a scratch tensor
        return x.clone()

    mp.setattr(NoiseSource, "add", add_to_a_copy)
    mp.setattr(cn, "gaussian_noise_rows", lambda shape, sig, gens, dtype=torch.float32:
               rows(shape, sig, gens, dtype) * 0.0)


def _release_missing_from_the_ledger(mp):
    """Each step uses four noisy copies of the gradient (local steps, say); the ledger records the first only."""
    from netsim.rounds.kernel import Batch

    privatize, gen = Batch.privatize, torch.Generator().manual_seed(1)

    def leaky(self, g, sigma, sens, q, what="gradient"):
        out = privatize(self, g, sigma, sens, q, what)
        return [None if o is None else o + sum(g[n] + sigma[n] * torch.randn(g.shape[1:], generator=gen, dtype=g.dtype)
                                               for _ in range(3)) for n, o in enumerate(out)]

    mp.setattr(Batch, "privatize", leaky)


def _sensitivity_under_declared(mp):
    import netsim.algorithms.dp_dpsgd as dpd

    sens = dpd.sensitivity
    mp.setattr(dpd, "sensitivity", lambda p, dim: sens(p, dim) / 2)  # C / (2B) declared, C / B true


def _clipping_skipped(mp):
    import netsim.algorithms.dp_dpsgd as dpd
    from netsim.rounds import GradientRequest

    mp.setattr(dpd.DPDPSGD, "gradient", lambda self, p, state, i: GradientRequest.of(p.batch))  # no per-example clip


@pytest.mark.parametrize("bug, alg, kind", [
    (_noise_halved, "muffliato", "gradient"),
    (_noise_on_the_wrong_tensor, "muffliato", "gradient"),
    (_release_missing_from_the_ledger, "dp_dpsgd", "input"),
    (_sensitivity_under_declared, "dp_dpsgd", "input"),
    (_clipping_skipped, "dp_dpsgd", "input"),
])
def test_a_planted_privacy_bug_is_flagged_violated(tmp_path, monkeypatch, bug, alg, kind):
    bug(monkeypatch)
    from netsim.api import run
    from netsim.scenario import scenario_from_dict

    run(scenario_from_dict(audit_scenario(alg, kind)), out=tmp_path)
    monkeypatch.undo()  # the audit itself runs on correct code
    rows = A.audit([tmp_path])
    flagged = [r for r in rows if r["flag"] == "violated"]
    assert all(r["epsilon_lower"] > r["epsilon_upper"] for r in flagged)
    assert any(r["hops"] == 1 for r in flagged)  # at least the neighbours, who see the release directly


def test_cli_audit_writes_csv_and_plot(tmp_path):
    sc = audit_scenario("muffliato", "gradient")
    sc["data"]["features"] = 400
    sc["privacy"]["audit"]["canaries"] = 400
    from netsim.api import run
    from netsim.scenario import scenario_from_dict

    run(scenario_from_dict(sc), out=tmp_path)
    r = runner.invoke(app, ["privacy", str(tmp_path), "--audit", "--observers", "1,2"])
    assert r.exit_code == 0, r.output
    assert "no violation" in r.stdout and "not a guarantee" in r.stdout
    with (tmp_path / "audit.csv").open() as f:
        got = list(csv.DictReader(f))
    assert list(got[0])[:9] == ["victim", "observer", "hops", "epsilon_lower", "epsilon_upper", "confidence",
                                "canaries", "runs", "flag"]
    assert [(g["victim"], g["observer"]) for g in got] == [("0", "1"), ("0", "2")]
    assert (tmp_path / "audit.png").stat().st_size > 0


def test_audit_settings_are_checked_before_the_run(tmp_path):
    from netsim.api import prepare
    from netsim.errors import InputError
    from netsim.scenario import scenario_from_dict

    sc = audit_scenario("muffliato", "gradient")
    sc["privacy"]["audit"]["canaries"] = 5000  # more than the model's 2001 coordinates
    with pytest.raises(InputError, match="privacy.audit.canaries: 1 victim.*5000.*2001"):
        prepare(scenario_from_dict(sc))
    sc["privacy"]["audit"] = {"victims": [0, 9]}
    with pytest.raises(InputError, match="privacy.audit.victims: agent ids must be in 0..4"):
        prepare(scenario_from_dict(sc))
    sc["privacy"]["record"] = "mixing"
    with pytest.raises(InputError, match='privacy.record: privacy.audit scores .* set privacy.record = "payloads"'):
        scenario_from_dict(sc)
