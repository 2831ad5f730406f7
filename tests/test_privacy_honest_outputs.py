"""Privacy outputs that must not mislead: a cut trace is 'unknown', the table never cuts a number, the run
summary names the method of its epsilon and carries the paper's closed form beside it."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from netsim.api import run
from netsim.cli import app
from netsim.scenario import load_scenario

runner = CliRunner()


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dp")
    res = run(load_scenario("scenarios/privacy_activation.toml", {"run.until": 4.0}), out=folder)
    return folder, res


def test_a_cut_trace_without_readable_releases_is_unknown_not_non_private(dp_run, tmp_path):
    folder, _ = dp_run
    cut = tmp_path / "cut"
    shutil.copytree(folder, cut)
    for name in ("summary.json", "metrics.csv", "agent_metrics.csv", "plot.png", "agent_accuracy.png"):
        (cut / name).unlink(missing_ok=True)  # a killed run has none of these
    trace = cut / "trace.arrows"
    data = trace.read_bytes()
    trace.write_bytes(data[: len(data) // 2])  # a short run flushes its trace once, at the end: nothing readable
    r = runner.invoke(app, ["privacy", str(cut)])
    assert r.exit_code == 1, r.output
    assert "unknown" in r.output and "not differentially private" not in r.output
    assert "epsilon = infinity" not in r.output
    rep = json.loads((cut / "privacy.json").read_text())
    assert rep["status"] == "unknown" and rep["private"] is None
    assert rep["recommended"]["epsilon_infinite"] is None
    assert all(a["epsilon_infinite"] is None for a in rep["agents"])


@pytest.mark.parametrize("columns", ["40", "80"])
def test_the_per_agent_table_never_cuts_a_number(dp_run, columns):
    folder, _ = dp_run
    r = runner.invoke(app, ["privacy", str(folder), "--pld"], env={"COLUMNS": columns})
    assert r.exit_code == 0, r.output
    rep = json.loads((folder / "privacy.json").read_text())
    agents = {str(a["agent"]) for a in rep["agents"]}
    rows = [line for line in r.output.splitlines() if line.split()[:1] and line.split()[0] in agents
            and len(line.split()) > 3]  # the table's rows: the agent, then its figures
    assert len(rows) == len(rep["agents"])
    for line, a in zip(rows, rep["agents"], strict=True):
        cells = line.split()
        assert "…" not in line, line
        for key in ("epsilon", "rdp_observed", "rdp_amplified"):
            assert f"{a[key]:.4g}" in cells, (key, cells)


def test_summary_names_its_method_and_the_papers_closed_form(dp_run):
    folder, res = dp_run
    s = json.loads((folder / "summary.json").read_text())
    assert s["privacy_epsilon_method"].startswith("RDP accountant")
    assert s["privacy_closed_form"] == "do_adp" and "Huo" in s["privacy_closed_form_paper"]
    r = runner.invoke(app, ["privacy", str(folder)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    rep = json.loads((folder / "privacy.json").read_text())
    worst = max(rep["agents"], key=lambda a: a["closed_form"]["paper"])
    assert s["privacy_closed_form_epsilon_max"] == pytest.approx(worst["closed_form"]["paper"], rel=1e-12)
    assert s["privacy_closed_form_method"] == worst["closed_form"]["note"]


def test_a_cap_refuses_at_the_first_release_an_event_rdp_cannot_compose():
    from types import SimpleNamespace

    from netsim.privacy.ledger import AgentLedger
    from netsim.privacy.mechanisms import PrivacyError
    from netsim.sim.activation import Periodic

    agent = SimpleNamespace(id=0, schedule=Periodic(1.0, 0.0), activation_probability=1.0, local_time=lambda t: t)
    led = AgentLedger(agent, cap=1.0)
    with pytest.raises(PrivacyError, match="enforced with the RDP accountant.*PoissonSampledDpEvent.*Laplace"):
        led.record(5, 1.0, 1.0, "laplace", q=0.5)
    assert not led.releases  # nothing recorded


def test_privacy_json_names_relation_sampling_and_mechanisms(dp_run):
    folder, _ = dp_run
    r = runner.invoke(app, ["privacy", str(folder)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    ev = json.loads((folder / "privacy.json").read_text())["events"]
    assert ev["neighbouring_relation"] == "add_or_remove_one"
    assert ev["sampling"].startswith("poisson") and "with replacement" in ev["sampling"]
    assert list(ev["mechanisms"]) == ["gaussian"] and ev["unsupported"] == {}
