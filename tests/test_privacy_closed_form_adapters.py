"""The registered closed forms are thin adapters over the tested library functions: the same numbers, the
same validity conditions (DO-ADP's Lemma 5 condition eps'_t <= 0.9 included)."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from netsim.privacy import closed_forms as cf
from netsim.scenario.schema import PrivacySpec
from netsim.trace.events import Release
from tests.conftest import BASE, merge


def releases(n: int, sens: float, sigma: float, q: float, p: float = 1.0, skipped: int = 0) -> list[Release]:
    return [Release(float(t), 0, -1, t, 5, "gaussian", "gradient", sigma, sens, q, p, skipped) for t in range(n)]


@pytest.mark.parametrize("sigma, T, p, skipped", [(30.0, 50, 1.0, 0), (12.0, 20, 0.5, 1)])
def test_do_adp_registered_form_is_the_library_function(sigma, T, p, skipped):
    q_paper, batch, G = 200, 4, 0.5  # Delta = 2 G / B ('full' sensitivity), rate p B / q
    D = cf.do_adp_sensitivity(G, 1.0, "full", batch)
    rs = releases(T, D, sigma, batch / q_paper, p, skipped)
    got = cf.lookup("do_adp").evaluate(rs, PrivacySpec(delta0=1e-5), 1e-5)
    ticks = T * (1 + skipped)
    paper = cf.do_adp_epsilon(sigma, 1e-5, q_paper, ticks, G, 1.0, p, batch, sens="full", strict=False)
    cons = cf.do_adp_epsilon(sigma, 1e-5, q_paper, ticks, G, 1.0, p, batch, amp="exact", sens="full",
                             activation="observed", steps_observed=T, delta_hat=1e-5, strict=False)
    assert got["paper"] == pytest.approx(paper.epsilon, rel=1e-12)
    assert got["delta_paper"] == pytest.approx(paper.delta_hat, rel=1e-12)
    assert got["conservative"] == pytest.approx(cons.epsilon, rel=1e-12)
    assert got["violations"] == sorted(paper.violations)


def test_do_adp_reports_lemma_5s_condition():
    # one release, eps'_t = 2 q eps_t = 0.95: delta_hat = 0.95 is valid, but Lemma 5 needs eps'_t <= 0.9
    eps_t = 0.95 / (2 * 0.1)
    sigma = 0.1 * math.sqrt(2 * math.log(1.25 / 1e-5)) / eps_t
    got = cf.do_adp_releases([(0.1, sigma, 1.0, 0.1, 0)], 1e-5, 1e-5)
    assert any("eps'_t = 0.95 > 0.9" in v for v in got["violations"]), got["violations"]


def test_netsim_privacy_on_a_do_adp_run_says_when_eps_t_exceeds_0_9(tmp_path):
    from netsim.api import run
    from netsim.cli import app
    from netsim.scenario import scenario_from_dict

    sc = merge(BASE, {"run": {"seed": 1, "rounds": 1}, "agents": {"count": 4},
                      "data": {"kind": "synthetic", "samples": 500, "features": 5},
                      "algorithm": {"name": "dp_dpsgd", "lr": 0.1, "batch": 10, "clip": 1.0, "sigma": 0.102,
                                    "round_timeout": 0.2},
                      "privacy": {"closed_form": "do_adp"}})
    run(scenario_from_dict(sc), out=tmp_path)
    r = CliRunner().invoke(app, ["privacy", str(tmp_path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "amplified eps'_t = 0.95 > 0.9 (Lemma 5 needs <= 0.9)" in r.output
    assert r.output.count(" ! ") >= 4  # every agent's paper figure is marked
    strict = CliRunner().invoke(app, ["privacy", str(tmp_path), "--strict"])
    assert strict.exit_code == 2 and "0.9" in strict.output


def test_privsgp_vr_registered_form_is_the_library_function():
    K, J, G, sigma = 300, 50, 2.0, 1.5
    rs = releases(K, 3 * G, sigma, 1.0 / J)  # the recorded sensitivity is the paper's 3 G, q = 1 / J
    got = cf.lookup("privsgp_vr").evaluate(rs, PrivacySpec(closed_form="privsgp_vr"), 1e-5)
    assert got["paper"] == pytest.approx(cf.privsgp_vr_epsilon(sigma, K, 1e-5, J, G), rel=1e-12)
