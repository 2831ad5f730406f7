"""Privacy outputs that say what netsim really knows: a run without DP releases is not private (epsilon is
infinite, never 0), the recommended epsilon comes first with its assumptions and every column is explained,
releases an event trigger decided from unreleased data are marked as not a guarantee, the trace file is
accepted as the run, and epsilon is reported over time."""

from __future__ import annotations

import json
import math

import attrs
import dp_accounting
import pytest
from typer.testing import CliRunner

from netsim.algorithms.registry import register
from netsim.api import run
from netsim.cli import app
from netsim.comm.triggers import EventTrigger
from netsim.privacy.ledger import TRIGGERED, releases_from_table
from netsim.privacy.report import NOT_PRIVATE, PAPERS, privacy_report
from netsim.scenario import scenario_from_dict
from netsim.scenario.load import load_scenario
from netsim.scenario.structure import field
from netsim.trace.io import read_trace
from tests.conftest import BASE, merge

runner = CliRunner()


def strict_json(path):
    """privacy.json must be standard JSON: no Infinity or NaN."""
    def bad(c):
        raise AssertionError(f"non-standard JSON constant {c} in {path}")
    return json.loads(path.read_text(), parse_constant=bad)


def library_epsilon(releases, delta: float) -> float:
    """dp-accounting's RDP epsilon of the releases, composed one by one, observed accounting."""
    acc = dp_accounting.rdp.RdpAccountant()
    for r in releases:
        ev = dp_accounting.GaussianDpEvent(r.scale / r.sensitivity)
        acc.compose(ev if r.q >= 1 else dp_accounting.PoissonSampledDpEvent(r.q, ev))
    return acc.get_epsilon(delta)


# --- a run without releases is not private --------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plain")
    run(scenario_from_dict(merge(BASE, {"run": {"until": 4.0}})), out=folder)  # plain D-PSGD: raw models
    return folder


def test_non_private_run_says_so_and_never_reports_epsilon_zero(plain):
    r = runner.invoke(app, ["privacy", str(plain)])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == (
        "no DP releases recorded: this run is not differentially private (epsilon = infinity)")
    assert "epsilon 0" not in r.output and " 0 │" not in r.output
    rep = strict_json(plain / "privacy.json")
    assert rep["private"] is False and rep["guarantee"] is False and rep["status"] == "not private"
    assert rep["message"] == NOT_PRIVATE
    assert rep["worst_epsilon"] is None and rep["recommended"]["epsilon"] is None
    assert rep["recommended"]["epsilon_infinite"] is True
    for a in rep["agents"]:
        assert a["releases"] == 0 and a["rdp_observed"] is None and a["epsilon"] is None
        assert a["epsilon_infinite"] is True
    # and the run's own summary claims no privacy
    s = json.loads((plain / "summary.json").read_text())
    assert not any(k.startswith("privacy_") for k in s)


def test_a_release_without_noise_is_infinite_epsilon(tmp_path):
    sc = merge(BASE, {"run": {"until": 3.0}, "agents": {"count": 4},
                      "algorithm": {"name": "dp_dpsgd", "lr": 0.3, "batch": 8, "round_timeout": 0.2,
                                    "noise_multiplier": 0.0}})
    run(scenario_from_dict(sc), out=tmp_path)
    r = runner.invoke(app, ["privacy", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "worst agent: 0 (epsilon inf, RDP, observed accounting, delta 1e-05)" in r.output
    rep = strict_json(tmp_path / "privacy.json")
    assert rep["private"] is True and rep["agents"][0]["releases"] > 0
    assert all(a["epsilon"] is None and a["epsilon_infinite"] for a in rep["agents"])
    assert rep["recommended"]["epsilon_infinite"] is True


# --- RUN/trace.arrows ----------------------------------------------------------------------------------------
def test_privacy_accepts_the_trace_file_and_writes_beside_it(plain):
    (plain / "privacy.json").unlink(missing_ok=True)
    r = runner.invoke(app, ["privacy", str(plain / "trace.arrows")])
    assert r.exit_code == 0, r.output
    assert f"wrote {plain}/privacy.json" in r.output
    assert strict_json(plain / "privacy.json")["status"] == "not private"


def test_privacy_refuses_another_file_in_one_line(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    r = runner.invoke(app, ["privacy", str(f)])
    assert r.exit_code == 2 and r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    assert not (tmp_path / "privacy.json").exists()


# --- the recommended epsilon first, with its assumptions; papers named; every column explained -----------------
@pytest.fixture(scope="module")
def activation(tmp_path_factory):
    folder = tmp_path_factory.mktemp("activation")
    sc = load_scenario("scenarios/privacy_activation.toml", {"run.until": 6.0})
    run(sc, out=folder)
    return folder


def test_privacy_activation_table_names_the_recommended_epsilon_first(activation):
    r = runner.invoke(app, ["privacy", str(activation)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    out = r.output
    header = next(line for line in out.splitlines() if line.split()[:2] == ["agent", "epsilon"])
    rep = strict_json(activation / "privacy.json")
    from netsim.cli import PRIVACY_HEADS, _privacy_columns

    shown = [PRIVACY_HEADS[c] for c in _privacy_columns(rep)]
    assert header.split() == [h.split()[-1] for h in ["agent", *shown]]  # second words under the first
    assert "recommended: RDP observed" in out
    assert "epsilon is a differential-privacy guarantee of each agent's data under the assumptions" in out
    assert "assumptions of the recommended epsilon:" in out
    assert "adding or removing one record" in out and "fixed in advance" in out
    # the paper by authors and title, not by an internal number alone
    assert 'Huo, Liu, Ding, Johansson, Shi, "Decentralized Optimization with Amplified Privacy via Efficient ' \
           'Communication"' in out
    assert "seed 003" not in out and "seed003" not in out
    # every column of the table is explained
    explained = [line.split(":", 1)[0].strip() for line in out.split("columns:\n", 1)[1].splitlines()
                 if line.startswith("  ")]
    for c in shown:
        assert c in explained, (c, explained)
    assert list(rep["columns"])[0] == "epsilon" and rep["status"] == "guarantee" and rep["guarantee"] is True
    assert rep["closed_form_paper"] == PAPERS["do_adp"]
    # the recommended figure is dp-accounting's RDP epsilon of the releases, composed one by one
    rel = releases_from_table(read_trace(activation).table)
    for a in rep["agents"][:4]:
        assert math.isclose(a["epsilon"], library_epsilon(rel[a["agent"]], 1e-5), rel_tol=1e-6)
    worst = max(rep["agents"], key=lambda a: a["epsilon"])
    assert rep["recommended"]["worst_agent"] == worst["agent"]
    assert f"worst agent: {worst['agent']} (epsilon {worst['epsilon']:.4g}, RDP" in out


def test_closed_forms_answer_to_the_name_of_their_method(activation):
    a = privacy_report(activation, pld=False, plot=False)
    sc = load_scenario("scenarios/privacy_activation.toml", {"privacy.closed_form": "do_adp"})
    assert sc.privacy.closed_form == "do_adp"
    rel = releases_from_table(read_trace(activation).table)
    from netsim.privacy.report import closed_form
    for row in a["agents"][:3]:
        assert closed_form("do_adp", rel[row["agent"]], sc.privacy, 1e-5) == row["closed_form"]


def test_pld_becomes_the_recommended_figure_when_computed(activation):
    rep = privacy_report(activation, pld=True, plot=False)
    assert rep["recommended"]["accountant"] == "pld"
    for a in rep["agents"][:2]:
        assert a["epsilon"] == a["pld_observed"] <= a["rdp_observed"] * 1.001


# --- epsilon over time -----------------------------------------------------------------------------------------
def test_epsilon_over_time_at_each_evaluation(activation):
    rep = strict_json(activation / "privacy.json")
    t = read_trace(activation).table
    evals = sorted({x for x, k in zip(t["t"].to_pylist(), t["kind"].to_pylist(), strict=True) if k == "eval"})
    ot = rep["over_time"]
    assert [p["t"] for p in ot] == evals and len(ot) >= 3
    rel = releases_from_table(t)
    for p in ot:
        upto = {i: [r for r in rs if r.t <= p["t"]] for i, rs in rel.items()}
        eps = [library_epsilon(rs, 1e-5) if rs else 0.0 for rs in upto.values()]
        assert math.isclose(p["epsilon_max"], max(eps), rel_tol=1e-6, abs_tol=1e-12)
        assert math.isclose(p["epsilon_mean"], sum(eps) / len(eps), rel_tol=1e-6, abs_tol=1e-12)
        assert p["releases"] == sum(map(len, upto.values()))
    assert [p["epsilon_max"] for p in ot] == sorted(p["epsilon_max"] for p in ot)
    r = runner.invoke(app, ["privacy", str(activation)], env={"COLUMNS": "200"})
    assert "epsilon over time (RDP observed, at the evaluations):" in r.output
    last = ot[-1]
    assert f"t = {last['t']:>9.4g} s   worst {last['epsilon_max']:.4g}" in r.output


# --- releases an event trigger decides from unreleased data ----------------------------------------------------
def et_scenario(lazy: bool) -> dict:
    return merge(BASE, {"run": {"until": 5.0}, "agents": {"count": 4},
                        "algorithm": {"name": "event_triggered", "lr": 0.5, "batch": 16, "threshold": 0.3,
                                      "noise_multiplier": 2.0, "clip": 1.0, "lazy": lazy}})


@pytest.mark.parametrize("lazy", [False, True])
def test_event_triggered_private_run_says_what_it_is(tmp_path, lazy):
    res = run(scenario_from_dict(et_scenario(lazy)), out=tmp_path)
    rel = releases_from_table(read_trace(tmp_path).table)
    r = runner.invoke(app, ["privacy", str(tmp_path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    rep = strict_json(tmp_path / "privacy.json")
    assert rep["private"] is True
    if not lazy:  # the model trigger reads only values computed from released gradients: post-processing
        assert rep["guarantee"] is True and rep["status"] == "guarantee"
        assert all(a["data_dependent_releases"] == 0 for a in rep["agents"])
        assert "privacy_guarantee" not in res.summary
        assert "NOT" not in r.output
        return
    # LAG: every release after the first is decided by the trigger from the raw gradient
    for a in rep["agents"]:
        assert a["data_dependent_releases"] == a["releases"] - 1 > 0
        assert all(x.what == "gradient" + TRIGGERED for x in rel[a["agent"]][1:])
    n = sum(a["releases"] - 1 for a in rep["agents"])
    assert rep["guarantee"] is False and rep["status"] == "not a guarantee"
    assert rep["message"].startswith(f"NOT a guarantee: {n} release(s) of 4 agent(s) were decided by an event "
                                     "trigger from unreleased data")
    assert f"! NOT a guarantee: {n} release(s)" in r.output
    assert "privacy · delta = 1e-05 · recommended: RDP observed · NOT A GUARANTEE\n" in r.output
    assert res.summary["privacy_guarantee"] is False
    assert res.summary["privacy_note"].startswith("NOT a guarantee")
    from rich.console import Console

    from netsim.cli import _summary_table

    con = Console(width=200, record=True)
    con.print(_summary_table(res.summary))
    assert "worst agent epsilon (RDP): NOT a guarantee, trigger-decided releases" in con.export_text()


@attrs.frozen
class GateParams:
    noise_first: bool = field(False)


@register("test_trigger_then_privatize", GateParams)
def gate(agent, p: GateParams):
    """Releases the model with noise: after the trigger decides (data-dependent), or before it reads the
    noisy value (post-processing)."""
    trig = EventTrigger(agent, kind="absolute", threshold=0.0)
    while True:
        yield agent.wake()
        x = agent.params + 0.1 * agent.round
        if p.noise_first:
            y = agent.privatize(x, sigma=1.0, sensitivity=0.1, what="model")
            if trig.due(agent.neighbors[0], y, agent.round):
                yield agent.send(agent.neighbors[0], y, tag="m")
        elif trig.due(agent.neighbors[0], x, agent.round):
            y = agent.privatize(x, sigma=1.0, sensitivity=0.1, what="model")
            yield agent.send(agent.neighbors[0], y, tag="m")


@pytest.mark.parametrize("noise_first", [False, True])
def test_only_releases_after_a_trigger_decision_are_marked(tmp_path, noise_first):
    sc = merge(BASE, {"run": {"until": 3.0}, "agents": {"count": 3},
                      "algorithm": {"name": "test_trigger_then_privatize", "noise_first": noise_first}})
    run(scenario_from_dict(sc), out=tmp_path)
    rep = privacy_report(tmp_path, pld=False, plot=False)
    rel = releases_from_table(read_trace(tmp_path).table)
    whats = {r.what for rs in rel.values() for r in rs}
    assert whats == ({"model"} if noise_first else {"model" + TRIGGERED})
    assert rep["guarantee"] is noise_first


def test_privacy_table_fits_80_columns_with_words_spelled_out(activation):
    """At 80 columns: no line of the table wider, no cut number, no cryptic abbreviation."""
    r = runner.invoke(app, ["privacy", str(activation), "--pld"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    top = next(k for k, line in enumerate(lines) if line.split()[:2] == ["agent", "epsilon"])
    table = lines[top - 1: top + 2 + 6]
    assert max(len(line.rstrip()) for line in table) <= 80
    assert "…" not in r.output and "rel." not in r.output and "conserv." not in r.output
    assert lines[0] == "privacy · delta = 1e-05 · recommended: PLD observed"  # a line, never wrapped by rich
    rep = strict_json(activation / "privacy.json")
    first = rep["agents"][0]
    row = lines[top + 2].split()
    assert row[:3] == ["0", f"{first['epsilon']:.4g}", str(first["releases"])]
