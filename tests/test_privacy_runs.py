"""Privacy in whole runs: DP-D-PSGD, amplification by random activation (Huo et al., DO-ADP), local-DP Laplace
messages (Chen & Wang), determinism, the ``netsim privacy`` command and bad privacy parameters."""

from __future__ import annotations

import json
import math

import attrs
import dp_accounting
import pytest
import tomli_w
import torch
from dp_accounting.rdp import RdpAccountant
from typer.testing import CliRunner

from netsim.algorithms.registry import register
from netsim.api import run
from netsim.cli import app
from netsim.privacy.accountants import epsilon
from netsim.privacy.ledger import releases_from_table
from netsim.privacy.report import privacy_report
from netsim.scenario import scenario_from_dict
from netsim.scenario.structure import field
from netsim.trace.io import read_trace
from tests.conftest import BASE, merge

Z = 6.0  # noise multiplier: large enough for DO-ADP's per-step bound (eps_t = 4.845 / z < 1)


def dp_scenario(p: float, seed: int = 3, **privacy) -> dict:
    act = {"kind": "bernoulli", "period": 0.5, "p": p}
    return merge(BASE, {
        "run": {"seed": seed, "until": 15.0},
        "agents": {"count": 6, "activation": act},
        "data": {"samples": 1200, "features": 5},
        "algorithm": {"name": "dp_dpsgd", "lr": 0.3, "batch": 8, "round_timeout": 0.2, "clip": 1.0,
                      "noise_multiplier": Z},
        "privacy": {"closed_form": "do_adp", **privacy},
    })


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for p in (1.0, 0.5):
        folder = tmp_path_factory.mktemp(f"p{p}")
        res = run(scenario_from_dict(dp_scenario(p)), out=folder)
        out[p] = (folder, res, privacy_report(folder, pld=False, plot=False))
    return out


def test_dp_dpsgd_records_one_release_per_gradient_step(runs):
    folder, res, _ = runs[1.0]
    t = read_trace(folder).table
    kinds = t["kind"].to_pylist()
    rel = releases_from_table(t)
    # every finished gradient is released once (gradients still computing at the end are not)
    assert sum(len(v) for v in rel.values()) == kinds.count("release") == kinds.count("compute_end")
    r = rel[0][0]
    assert r.mechanism == "gaussian" and r.what == "gradient" and r.peer == -1
    assert r.size == 6  # 5 features + bias
    assert math.isclose(r.sensitivity, 1.0 / 8) and math.isclose(r.scale, Z / 8)
    assert math.isclose(r.q, 8 / 160)  # 1200 samples, 20 % test, 6 agents
    assert res.summary["accuracy"] > 0.6  # it still learns


def test_same_seed_same_trace_bytes(runs, tmp_path):
    folder, _, _ = runs[1.0]
    run(scenario_from_dict(dp_scenario(1.0)), out=tmp_path)
    assert (tmp_path / "trace.arrows").read_bytes() == (folder / "trace.arrows").read_bytes()


def test_noise_really_enters_the_model(runs, tmp_path):
    quiet = dp_scenario(1.0)
    quiet["algorithm"]["noise_multiplier"] = 0.0
    res0 = run(scenario_from_dict(quiet), out=tmp_path)
    assert res0.summary["consensus"] != runs[1.0][1].summary["consensus"]
    assert epsilon(releases_from_table(read_trace(tmp_path).table)[0], 1e-5) == math.inf


def test_random_activation_amplifies_privacy(runs):
    """DO-ADP (Huo et al.): with the same noise, p < 1 gives a smaller epsilon than p = 1 -- by fewer releases
    (observed, visible activation) and, under the paper's hidden-activation model, by subsampling at
    rate p q over every tick (amplified)."""
    full, half = runs[1.0][2], runs[0.5][2]
    worst = lambda rep, k: max(a[k] for a in rep["agents"])  # noqa: E731
    assert worst(full, "rdp_observed") == worst(full, "rdp_amplified")  # p = 1: nothing to amplify
    assert worst(half, "rdp_amplified") < worst(half, "rdp_observed") < worst(full, "rdp_observed")
    assert worst(half, "rdp_amplified") < 0.8 * worst(full, "rdp_amplified")
    for a in half["agents"]:  # ticks include the inactive ones; each release is one active tick
        assert a["ticks"] > a["releases"]
    # the paper's own closed form agrees on the direction
    paper = lambda rep: max(a["closed_form"]["paper"] for a in rep["agents"])  # noqa: E731
    assert paper(half) < paper(full)
    assert "observed" in half["explain"] and "amplified" in half["explain"]


def test_amplified_mode_equals_the_library_on_ticks(runs):
    folder, _, rep = runs[0.5]
    rel = releases_from_table(read_trace(folder).table)
    for a in rep["agents"]:
        ticks = sum(1 + r.skipped for r in rel[a["agent"]])
        acc = RdpAccountant().compose(
            dp_accounting.PoissonSampledDpEvent(0.5 * 8 / 160, dp_accounting.GaussianDpEvent(Z)), ticks)
        assert math.isclose(a["rdp_amplified"], acc.get_epsilon(1e-5), rel_tol=1e-6)


# --- local DP: Laplace on messages, growing noise (Chen & Wang) -------------------------------------------
@attrs.frozen
class LDPParams:
    varsigma: float = field(0.1)


@register("test_privacy_ldp", LDPParams)
def ldp(agent, p: LDPParams):
    """Each round, send a Laplace-noised state to one neighbour with rho_t = (t+1)^varsigma."""
    t = 0
    while True:
        yield agent.wake()
        j = agent.neighbors[t % len(agent.neighbors)]
        y = agent.privatize(agent.params, sigma=(t + 1) ** p.varsigma, sensitivity=0.5 / (t + 1),
                            mechanism="laplace", what="message", to=j)
        yield agent.send(j, y, tag="ldp")
        t += 1


def test_laplace_messages_are_ledgered_per_recipient(tmp_path):
    sc = merge(BASE, {"run": {"seed": 2, "until": 6.0}, "agents": {"count": 4},
                      "algorithm": {"name": "test_privacy_ldp"}, "privacy": {"closed_form": "ldp_online"}})
    run(scenario_from_dict(sc), out=tmp_path)
    rel = releases_from_table(read_trace(tmp_path).table)
    rs = rel[1]
    assert {r.peer for r in rs} == {0, 2}
    assert all(r.what == "message" and r.mechanism == "laplace" for r in rs)
    rep = privacy_report(tmp_path, pld=False, plot=False)
    lemma2 = sum(0.5 / (t + 1) / (t + 1) ** 0.1 for t in range(len(rs)))
    assert math.isclose(rep["agents"][1]["closed_form"]["paper"], lemma2, rel_tol=1e-12)
    acc = RdpAccountant()
    for r in rs:
        acc.compose(dp_accounting.LaplaceDpEvent(r.scale / r.sensitivity))
    assert math.isclose(rep["agents"][1]["rdp_observed"], acc.get_epsilon(1e-5), rel_tol=1e-6)
    assert rep["agents"][1]["rdp_observed"] < lemma2  # RDP composition beats basic composition


# --- the command line ---------------------------------------------------------------------------------------
runner = CliRunner()


def test_privacy_command_prints_and_writes(runs):
    folder = runs[0.5][0]
    r = runner.invoke(app, ["privacy", str(folder), "--pld"])
    assert r.exit_code == 0, r.output
    assert "worst agent: " in r.output and "\n  RDP observed: " in r.output and "\n  RDP amplified: " in r.output
    rep = json.loads((folder / "privacy.json").read_text())
    assert len(rep["agents"]) == 6 and rep["agents"][0]["pld_observed"] > 0
    assert rep["agents"][0]["pld_observed"] <= rep["agents"][0]["rdp_observed"] * 1.001  # PLD is tighter
    assert (folder / "privacy.png").stat().st_size > 1000


@pytest.mark.parametrize("args, needle", [
    (["--delta", "1.5"], "--delta: must be in (0, 1)"),
    (["--delta", "0"], "--delta: must be in (0, 1)"),
    (["--accounting", "hopeful"], "--accounting: must be 'observed' or 'amplified'"),
])
def test_privacy_command_bad_arguments(runs, args, needle):
    r = runner.invoke(app, ["privacy", str(runs[1.0][0]), "--no-pld", *args])
    assert r.exit_code == 2 and needle in r.output and r.output.count("\n") == 1, r.output


def test_privacy_command_missing_run(tmp_path):
    r = runner.invoke(app, ["privacy", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "trace not found" in r.output and r.output.count("\n") == 1


def test_closed_form_condition_violated_exits_2(tmp_path):
    # DO-ADP's per-step bound needs eps_t < 1; with z = 1 it is 4.8: reported, and with --strict exit 2
    sc = dp_scenario(1.0)
    sc["algorithm"]["noise_multiplier"] = 3.0
    sc["run"]["until"] = 2.0
    run(scenario_from_dict(sc), out=tmp_path)
    r = runner.invoke(app, ["privacy", str(tmp_path), "--no-pld"])
    assert r.exit_code == 0
    assert "Efficient Communication\" (closed_form = 'do_adp') violated: eps_t = 1.615 >= 1" in r.output
    r = runner.invoke(app, ["privacy", str(tmp_path), "--no-pld", "--strict"])
    assert r.exit_code == 2 and r.output.startswith("error: closed form do_adp: agent 0: eps_t")
    assert r.output.count("\n") == 1
    # Chen & Wang's Lemma 2 composes Laplace releases; Gaussian ones cannot be read by it: the form's columns
    # are blank with the reason, the accountants' figures stand; --strict refuses in one line
    sc["privacy"]["closed_form"] = "ldp_online"
    run(scenario_from_dict(sc), out=tmp_path / "b")
    r = runner.invoke(app, ["privacy", str(tmp_path / "b"), "--no-pld"])
    assert r.exit_code == 0, r.output
    assert ("- paper and conservative blank for agents 0-5 (closed_form = 'ldp_online' does not apply): agent 0: "
            "Lemma 2 composes Laplace releases; this agent released ['gaussian']") in r.output
    r = runner.invoke(app, ["privacy", str(tmp_path / "b"), "--no-pld", "--strict"])
    assert r.exit_code == 2 and r.output.startswith("error: closed form ldp_online: agent 0: Lemma 2 composes")
    assert r.output.count("\n") == 1


def test_a_vacuous_closed_form_blanks_its_column_and_the_report_stands(tmp_path):
    """DO-ADP's paper figure takes delta_hat = sqrt(S); once S > 1 the bound says nothing (delta_hat > 1). Its
    column is then blank with the reason, its plot curve stops there; the table, the accountants' epsilon and
    the conservative figure stand (exit 0); --strict refuses in one line."""
    from netsim.privacy import closed_forms as cf
    from netsim.privacy.report import epsilon_series

    sc = dp_scenario(1.0)
    sc["algorithm"]["batch"] = 80  # q = 1/2 (160 training rows): S grows by (2 q eps_t)^2 = 0.65 per release
    sc["run"]["until"] = 3.0
    res = run(scenario_from_dict(sc), out=tmp_path)
    assert res.summary["privacy_closed_form_blank"].startswith("agent 0: delta_hat = sqrt(S) = ")
    assert "privacy_closed_form_epsilon_max" not in res.summary
    r = runner.invoke(app, ["privacy", str(tmp_path), "--no-pld"])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "privacy.json").read_text())
    rel = releases_from_table(read_trace(tmp_path).table)
    for row in rep["agents"]:
        rs = rel[row["agent"]]
        assert {(x.p, x.q) for x in rs} == {(1.0, 0.5)}
        eps_t = math.sqrt(2 * math.log(1.25e5)) / Z  # Lemma 1 at delta0 = 1e-5; Lemma 4 linear at rate p q
        assert math.sqrt(len(rs) * (2 * 0.5 * eps_t) ** 2) > 1 and f"{math.sqrt(len(rs)) * eps_t:.4g}" in row[
            "closed_form"]["blank"]
        f = row["closed_form"]
        assert f["paper"] is None and f["blank"].endswith("is not in (0, 1]: the paper's bound is vacuous")
        assert f["conservative"] == pytest.approx(cf.do_adp_releases(
            [(x.sensitivity, x.scale, x.p, x.q, x.skipped) for x in rs], 1e-5, 1e-5)["conservative"])
        assert row["epsilon"] == pytest.approx(epsilon(rs, 1e-5, "rdp", "observed"))  # the accountant stands
    assert rep["closed_form_blank"] == [{"columns": ["paper"], "agents": list(range(6)),
                                         "reason": rep["agents"][0]["closed_form"]["blank"]}]
    line = next(x for x in r.output.splitlines() if x.startswith("- paper blank"))
    assert line.startswith("- paper blank for agents 0-5 (closed_form = 'do_adp' does not apply): agent 0: "
                           "delta_hat = sqrt(S) = ")
    assert "worst agent: " in r.output and "epsilon over time" in r.output
    series = epsilon_series(rel, 1e-5, "observed", scenario_from_dict(sc).privacy)["closed"]
    assert series["paper"][-1] is None and series["blank"]["reason"].endswith("vacuous")
    assert (tmp_path / "privacy.png").stat().st_size > 1000
    r = runner.invoke(app, ["privacy", str(tmp_path), "--no-pld", "--strict"])
    assert r.exit_code == 2 and r.output.startswith("error: closed form do_adp: agent 0: delta_hat = sqrt(S)")
    assert r.output.count("\n") == 1


@pytest.mark.parametrize("patch, needle", [
    ({"privacy": {"delta": 1.0}}, "privacy.delta: must be in (0, 1), got 1.0"),
    ({"privacy": {"delta": 0.0}}, "privacy.delta: must be in (0, 1), got 0.0"),
    ({"privacy": {"epsilon_cap": 0.0}}, "privacy.epsilon_cap: must be > 0"),
    ({"privacy": {"epsilon_cap": -2.0}}, "privacy.epsilon_cap: must be > 0"),
    ({"privacy": {"accounting": "hopeful"}}, "privacy.accounting: got 'hopeful'"),
    ({"privacy": {"closed_form": "seed002"}},
     "privacy.closed_form: unknown closed form 'seed002'; registered: none, do_adp, ldp_online, pdsl, privsgp_vr"),
    ({"algorithm": {"name": "dp_dpsgd", "noise_multiplier": -1.0}},
     "algorithm.noise_multiplier: must be >= 0"),
    ({"algorithm": {"name": "dp_dpsgd", "clip": 0.0}}, "algorithm.clip: must be > 0"),
])
def test_bad_privacy_parameters_are_one_line_exit_2(tmp_path, patch, needle):
    f = tmp_path / "bad.toml"
    f.write_text(tomli_w.dumps(merge(dp_scenario(0.5), patch)))
    r = runner.invoke(app, ["validate", str(f)])
    assert r.exit_code == 2, r.output
    assert needle in r.output and str(f) in r.output and r.output.count("\n") == 1, r.output


def test_privatize_rejects_negative_noise_and_leaves_global_rng_alone(tmp_path):
    from netsim.api import prepare
    from netsim.privacy.mechanisms import PrivacyError

    sim = prepare(scenario_from_dict(dp_scenario(1.0)))
    a = sim.agents[0]
    state = torch.random.get_rng_state()
    y = a.privatize(torch.zeros(4), sigma=1.0, sensitivity=1.0)
    assert y is not None and y.abs().sum() > 0 and torch.equal(torch.random.get_rng_state(), state)
    with pytest.raises(PrivacyError, match="sigma"):
        a.privatize(torch.zeros(4), sigma=-1.0, sensitivity=1.0)
    assert len(a.ledger.releases) == 1  # the refused call left no ledger entry
