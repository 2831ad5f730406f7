"""Every class of bad scenario input: one line naming file and key path, exit 2, no traceback."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import tomli_w
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from netsim.cli import app
from netsim.errors import InputError
from netsim.scenario import load_scenario, scenario_from_dict, to_toml
from tests.conftest import BASE, merge

runner = CliRunner()


def write(tmp_path: Path, data: dict | str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else tomli_w.dumps(data))
    return p


CASES = [
    ({"agents": {"count": "many"}}, "agents.count", "expected an integer"),
    ({"agents": {"count": 1}}, "agents.count", "must be >= 2"),
    ({"agents": {"count": 2.5}}, "agents.count", "expected an integer"),
    ({"agents": {"colour": 1}}, "agents.colour", "unknown key"),
    ({"network": {"loss": 1.5}}, "network.loss", "must be in [0, 1)"),
    ({"network": {"loss": True}}, "network.loss", "expected a number"),
    ({"network": {"latency": {"kind": "gamma"}}}, "network.latency.kind", "allowed: 'constant'"),
    ({"network": {"latency": {"kind": "uniform", "low": 0.1}}}, "network.latency.high", "required for kind"),
    ({"network": {"latency": {"kind": "uniform", "low": 0.2, "high": 0.1}}}, "network.latency.high", ">= low"),
    ({"network": {"latency": {"kind": "normal", "mean": 0.1, "sigma": 0.1}}}, "network.latency", "negative"),
    ({"network": {"bandwidth": 0}}, "network.bandwidth", "must be > 0"),
    ({"topology": {"kind": "hypercube"}}, "topology.kind", "allowed: 'ring'"),
    ({"topology": {"kind": "edges_file"}}, "topology.path", "required"),
    ({"topology": {"kind": "edges_file", "path": "/nonexistent/edges.txt"}}, "topology.path", "cannot read"),
    ({"topology": {"kind": "random_regular", "degree": 3}, "agents": {"count": 7}}, "topology.degree", "even"),
    ({"topology": {"directed": True, "mixing": "metropolis_hastings"}}, "topology.mixing", "undirected"),
    ({"data": {"kind": "libsvm", "path": "nope.libsvm"}}, "data.path", "not found"),
    ({"data": {"partition": "random"}}, "data.partition", "allowed: 'iid', 'dirichlet_equal'"),
    ({"data": {"alpha": -1}}, "data.alpha", "must be > 0"),
    ({"run": {"until": -5}}, "run.until", "must be > 0"),
    ({"run": {"until": None, "rounds": None}}, "run.until", "run.rounds"),
    ({"run": {"device": "tpu"}}, "run.device", "allowed"),
    ({"algorithm": {"name": "sgd-magic"}}, "algorithm.name", "unknown algorithm"),
    ({"algorithm": {"name": "dpsgd", "lr": -1}}, "algorithm.lr", "must be >= 0"),
    ({"algorithm": {"name": "dpsgd", "momentum": 0.9}}, "algorithm.momentum", "unknown key"),
    ({"evaluation": {"metrics": ["loss", "f1"]}}, "evaluation.metrics[1]", "allowed"),
    ({"agents": {"stragglers": [0, 99]}}, "agents.stragglers", "agent ids"),
]


def _without_none(d: dict) -> dict:
    return {k: (_without_none(v) if isinstance(v, dict) else v) for k, v in d.items() if v is not None}


@pytest.mark.parametrize("extra,key,fragment", CASES)
def test_bad_input_one_line_exit_2(tmp_path, extra, key, fragment):
    data = _without_none(merge(BASE, extra))
    if "run" in extra and extra["run"].get("until", 1) is None:
        data["run"].pop("until", None)
    path = write(tmp_path, data)
    res = runner.invoke(app, ["validate", str(path)])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert "Traceback" not in res.output
    assert str(path) in lines[0] and key in lines[0] and fragment in lines[0], lines[0]


def test_missing_section_and_key(tmp_path):
    data = merge(BASE, {})
    del data["agents"]
    res = runner.invoke(app, ["validate", str(write(tmp_path, data))])
    assert res.exit_code == 2 and "agents: required key is missing" in res.output


def test_not_toml_and_missing_file(tmp_path):
    res = runner.invoke(app, ["validate", str(write(tmp_path, "[run\nseed = 1"))])
    assert res.exit_code == 2 and "not valid TOML" in res.output
    res = runner.invoke(app, ["validate", str(tmp_path / "absent.toml")])
    assert res.exit_code == 2 and "absent.toml: file not found" in res.output


def test_set_overrides_are_validated(tmp_path):
    path = write(tmp_path, BASE)
    res = runner.invoke(app, ["validate", str(path), "--set", "network.loss=2"])
    assert res.exit_code == 2 and "network.loss: must be in [0, 1)" in res.output
    res = runner.invoke(app, ["validate", str(path), "--set", "garbage"])
    assert res.exit_code == 2 and "--set" in res.output
    res = runner.invoke(app, ["validate", str(path), "--set", "agents.count=4"])
    assert res.exit_code == 0 and "4 agents" in res.output
    assert load_scenario(path, {"algorithm.lr": 0.25}).algorithm.params["lr"] == 0.25


def test_bad_run_writes_nothing(tmp_path):
    out = tmp_path / "out"
    path = write(tmp_path, merge(BASE, {"data": {"kind": "libsvm", "path": "missing.svm"}}))
    res = runner.invoke(app, ["run", str(path), "--out", str(out), "-q"])
    assert res.exit_code == 2 and not out.exists()


# Hypothesis: arbitrary mutations of a valid scenario either load or raise InputError (never anything else).
SCALARS = st.one_of(st.integers(-10, 10**6), st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.booleans(), st.text(string.ascii_letters, max_size=8), st.lists(st.integers(-2, 5), max_size=3))
KEYS = [("run", "seed"), ("run", "until"), ("run", "rounds"), ("agents", "count"), ("agents", "straggler_factor"),
        ("network", "loss"), ("network", "bandwidth"), ("topology", "kind"), ("topology", "degree"),
        ("topology", "p"), ("data", "samples"), ("data", "alpha"), ("data", "partition"),
        ("algorithm", "lr"), ("algorithm", "batch"), ("evaluation", "every"), ("agents", "bogus"),
        ("topology", "mixing"), ("model", "l2")]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(KEYS), SCALARS), min_size=1, max_size=3))
def test_fuzzed_scenarios_fail_cleanly(tmp_path, edits):
    data = merge(BASE, {})
    for (section, key), value in edits:
        data.setdefault(section, {})[key] = value
    path = tmp_path / "fuzz.toml"
    path.write_text(tomli_w.dumps(data))
    try:
        sc = load_scenario(path)
    except InputError as e:
        msg = str(e)
        assert msg.startswith(str(path)) and "\n" not in msg
        return
    # loaded: the resolved scenario.toml a run folder keeps reads back as the same scenario
    assert to_toml(scenario_from_dict(tomllib.loads(to_toml(sc)))) == to_toml(sc)
    from netsim.api import prepare

    small = sc.agents.count <= 64 and sc.data.samples <= 20000 and sc.data.samples >= sc.agents.count
    if small:
        try:
            prepare(sc)
        except InputError as e:
            assert "\n" not in str(e)
