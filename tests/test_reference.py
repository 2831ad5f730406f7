"""The scenario reference (netsim keys, docs/scenario-reference.md), netsim algorithms NAME, netsim --version,
and the resolved scenario text leaving out defaults that do not apply."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from typer.testing import CliRunner

from netsim.cli import app
from netsim.scenario import load_scenario, scenario_from_dict, to_toml
from tests.conftest import BASE, ROOT, merge

runner = CliRunner()


def test_the_reference_page_is_generated_from_the_schema_and_up_to_date():
    from netsim.scenario.reference import markdown

    page = (ROOT / "docs" / "scenario-reference.md").read_text()
    assert page == markdown(), "regenerate: netsim keys --markdown > docs/scenario-reference.md"
    res = runner.invoke(app, ["keys", "--markdown"])
    assert res.exit_code == 0 and res.output == page


def test_every_schema_key_is_in_the_reference_with_a_description():
    import attrs

    from netsim.scenario.reference import sections
    from netsim.scenario.schema import DataSpec, NetworkSpec

    secs = sections()
    keys = {r["key"]: r for rows in secs.values() for r in rows}
    for cls, section in ((DataSpec, "data"), (NetworkSpec, "network")):
        for f in attrs.fields(cls):
            assert f"{section}.{f.name if f.name != 'params' else '<parameter>'}" in keys
    assert all(r["doc"] for rows in secs.values() for r in rows), [r["key"] for rows in secs.values()
                                                                      for r in rows if not r["doc"]]
    samples = keys["data.samples"]
    assert samples["type"] == "integer" and samples["default"] == "2000" and "must be >= 2" in samples["allowed"]
    assert samples["applies"] == "only when kind = 'synthetic'"
    assert "'csv', 'parquet'" in keys["evaluation.format"]["allowed"]
    assert keys["agents.activation.period"]["allowed"] == "must be in [1e-09, 1e+09] s"
    assert keys["agents.count"]["default"] == "required"


def test_netsim_keys_prints_one_section_or_refuses_an_unknown_one():
    res = runner.invoke(app, ["keys", "network"])
    assert res.exit_code == 0
    assert "network.loss  (number, default 0.0)" in res.output and "allowed: must be in [0, 1)" in res.output
    assert "agents.count" not in res.output
    res = runner.invoke(app, ["keys", "netwrk"])
    assert res.exit_code == 2 and res.stderr.startswith("error: keys: unknown section 'netwrk'; allowed: ")


def test_netsim_algorithms_name_describes_paper_and_parameters():
    res = runner.invoke(app, ["algorithms", "dpsgd"])
    assert res.exit_code == 0
    out = res.output
    assert out.startswith("dpsgd: D-PSGD (Lian et al. 2017): synchronous rounds")
    assert "\nD-PSGD in synchronous rounds." in out
    assert "Lian et al." in out and "Algorithm 1: x_i^{k+1}" in out and "source: netsim/algorithms/dpsgd.py" in out
    assert "round_timeout  (number, default 1.0)\n      must be > 0\n      seconds to wait for neighbours" in out
    res = runner.invoke(app, ["algorithms", "dpsgdd"])
    assert res.exit_code == 2 and "unknown algorithm 'dpsgdd'" in res.stderr
    assert "\ndpsgd            D-PSGD (Lian et al. 2017)" in runner.invoke(app, ["algorithms"]).output


def test_version():
    from netsim import __version__

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output == f"netsim {__version__}\n"


def test_resolved_text_leaves_out_defaults_that_do_not_apply(tmp_path):
    lib = scenario_from_dict(merge(BASE, {"data": {"kind": "libsvm", "path": "x.svm"},
                                          "agents": {"activation": {"kind": "poisson", "rate": 2.0}}}))
    data = tomllib.loads(to_toml(lib))
    assert not {"samples", "features", "generator", "noise", "alpha", "shards", "share"} & set(data["data"])
    assert data["agents"]["activation"] == {"kind": "poisson", "rate": 2.0}
    assert "init" not in data["model"] and "hidden" not in data["model"]
    assert scenario_from_dict(data) == lib  # the text still loads back to the same scenario
    syn = tomllib.loads(to_toml(scenario_from_dict(merge(BASE, {"data": {"partition": "shards"}}))))
    assert syn["data"]["samples"] == 800 and syn["data"]["shards"] == 2 and "alpha" not in syn["data"]
    # a changed value that does not apply is kept: the text must reproduce the scenario exactly
    odd = scenario_from_dict(merge(BASE, {"data": {"kind": "libsvm", "path": "x.svm", "samples": 5}}))
    assert tomllib.loads(to_toml(odd))["data"]["samples"] == 5


SCENARIOS = sorted(p for p in (ROOT / "scenarios").glob("*.toml") if "scenario" not in tomllib.loads(p.read_text()))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)  # sweep files (a 'scenario' key) excluded
def test_every_shipped_scenario_round_trips_through_its_resolved_text(path: Path):
    sc = load_scenario(path)
    text = to_toml(sc)
    again = scenario_from_dict(tomllib.loads(text))
    assert again == sc and to_toml(again) == text
