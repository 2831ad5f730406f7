"""The registry plugins in examples/plugins/ run end to end through the CLI's --plugin (in a subprocess:
a plugin's registrations are process-wide, and the other tests see only the built-in ones). Commands without
--plugin run in-process (``cli``); a test that needs a plugin's functions imports it with ``_plugin_module``, which
takes its registrations back."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from netsim.cli import app
from netsim.privacy.ledger import releases_from_table
from netsim.trace.io import read_trace

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "examples" / "plugins"


def netsim(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "netsim", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def cli(*args) -> Result:
    """A command without --plugin, in this process (run from the repository root, as ``netsim``'s)."""
    with contextlib.chdir(ROOT):
        return CliRunner().invoke(app, [str(a) for a in args])


def test_event_kind_plugin_records_its_events_in_the_trace(tmp_path):
    out = tmp_path / "run"
    r = netsim("run", "scenarios/quickstart.toml", "--plugin", PLUGINS / "disagreement_event.py",
               "--set", "algorithm.name=dpsgd_disagreement", "--set", "agents.count=4", "--set", "run.until=5",
               "--set", "network.loss=0.0", "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    t = read_trace(out).table.to_pandas()
    d = t[t["kind"] == "disagreement"]
    assert len(d) > 40 and set(d["agent"]) == {0, 1, 2, 3}
    for _, rows in d.groupby("agent"):
        assert list(rows["round"]) == list(range(len(rows)))  # one per round, in order
    assert (d["size"] == 2).all()  # a lossless ring: both neighbours' models arrive every round
    assert (d[d["round"] == 0]["value"] == 0).all()  # every agent starts from the same model
    assert (d[d["round"] > 2]["value"] > 0).all() and np.isfinite(d["value"]).all()
    assert d[["peer", "msg"]].eq(-1).all().all() and (d["tag"] == "").all()  # unused columns at defaults
    # the same run without the event: the algorithm's other events are exactly D-PSGD's
    base = tmp_path / "base"
    assert cli("run", "scenarios/quickstart.toml", "--set", "agents.count=4", "--set", "run.until=5",
               "--set", "network.loss=0.0", "--out", base, "-q").exit_code == 0
    b = read_trace(base).table.to_pandas()
    assert t[t["kind"] != "disagreement"].reset_index(drop=True).equals(b)
    # the timeline draws the kind with the glyph the class gives, once the plugin is loaded
    r = netsim("timeline", out, "--plugin", PLUGINS / "disagreement_event.py", "--kinds", "disagreement",
               "--width", "80", "--no-summary")
    assert r.returncode == 0, r.stderr
    lanes = [line for line in r.stdout.splitlines() if line.strip()[:1].isdigit() and "|" in line]
    assert len(lanes) == 4 and all(set(line.split("|")[1]) <= {" ", "d"} and "d" in line for line in lanes)
    assert "legend: d disagreement" in r.stdout
    r = cli("timeline", out, "--kinds", "disagreement")
    assert r.exit_code == 2 and "--kinds: unknown kind(s) disagreement" in r.output


def test_event_kind_plugin_is_needed_to_run_its_algorithm(tmp_path):
    r = cli("run", "scenarios/quickstart.toml", "--set", "algorithm.name=dpsgd_disagreement",
            "--out", tmp_path / "x", "-q")
    assert r.exit_code == 2 and "algorithm.name: unknown algorithm 'dpsgd_disagreement'" in r.stderr
    assert r.stderr.count("\n") == 1 and not (tmp_path / "x").exists()


def test_accountant_plugin_adds_an_accountant_and_a_closed_form(tmp_path):
    out, plugin = tmp_path / "run", PLUGINS / "zcdp_accountant.py"
    r = netsim("run", "scenarios/privacy_activation.toml", "--plugin", plugin, "--set", "privacy.closed_form=zcdp",
               "--set", "agents.count=4", "--set", "run.until=3", "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    r = netsim("privacy", out, "--plugin", plugin, "--accountant", "zcdp", "--no-pld")
    assert r.returncode == 0, r.stderr
    assert "zcdp_observed: the registered accountant 'zcdp': zero-concentrated DP, Bun, Steinke" in r.stdout
    rep = json.loads((out / "privacy.json").read_text())
    assert rep["closed_form"] == "zcdp" and rep["closed_form_paper"].startswith("Bun, Steinke")
    rel = releases_from_table(read_trace(out).table)
    delta = rep["delta"]
    for row in rep["agents"]:
        rho = sum(1 / (2 * (x.scale / x.sensitivity) ** 2) for x in rel[row["agent"]])  # Prop. 1.6, Lemma 1.7
        want = rho + 2 * math.sqrt(rho * math.log(1 / delta))  # Prop. 1.3
        assert row["releases"] > 0
        assert math.isclose(row["zcdp_observed"], want, rel_tol=1e-12)
        assert math.isclose(row["closed_form"]["paper"], want, rel_tol=1e-12)
        assert row["zcdp_observed"] > row["rdp_observed"]  # sampling not credited: looser than RDP


def test_unregistered_closed_form_or_accountant_is_one_line_exit_2(tmp_path):
    r = cli("run", "scenarios/privacy_activation.toml", "--set", "privacy.closed_form=zcdp",
            "--out", tmp_path / "x", "-q")
    assert r.exit_code == 2 and not (tmp_path / "x").exists()
    assert r.stderr == ("error: scenarios/privacy_activation.toml: privacy.closed_form: unknown closed form 'zcdp'; "
                        "registered: none, do_adp, ldp_online, pdsl, privsgp_vr (a plugin's needs --plugin)\n")
    out = tmp_path / "run"
    assert cli("run", "scenarios/privacy_activation.toml", "--set", "agents.count=2", "--set", "run.until=1",
               "--out", out, "-q").exit_code == 0
    r = cli("privacy", out, "--accountant", "zcdp", "--no-pld")
    assert r.exit_code == 2 and "--accountant: unknown accountant 'zcdp'; registered: rdp, pld" in r.output


def test_a_plugin_taking_a_registered_name_is_refused_in_one_line(tmp_path):
    plugin = tmp_path / "clash.py"
    plugin.write_text('from netsim.privacy.closed_forms import register_closed_form\n\n\n'
                      '@register_closed_form("do_adp", "someone else")\n'
                      'def mine(releases, spec, delta):\n    return {}\n')
    r = netsim("validate", "scenarios/quickstart.toml", "--plugin", plugin)
    assert r.returncode == 2
    assert r.stderr == (f"error: --plugin: {plugin}:4: ValueError: closed form 'do_adp' is already registered by "
                        "netsim.privacy.report\n")


def test_algorithm_plugin_uses_recv_gather_spawn_and_state(tmp_path):
    """The one-file algorithm plugin runs through --plugin; its pulls show in the trace and the summary."""
    out = tmp_path / "run"
    r = netsim("run", "scenarios/quickstart.toml", "--plugin", PLUGINS / "pull_repair_momentum.py",
               "--set", 'algorithm={name="pull_repair_momentum"}', "--set", "agents.count=6",
               "--set", "run.until=8", "--set", "network.loss=0.3", "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    t = read_trace(out).table.to_pandas()
    sends = t[t["kind"] == "send"]
    # every pull request is a traced message; a repair needs a reply that was delivered
    assert s["pull_requests"] == (sends["tag"] == "pull.req").sum() > 0
    replies = t[(t["kind"] == "deliver") & (t["tag"] == "pull.rep")]
    assert 0 < s["pull_repaired"] <= len(replies)
    # a pull per in-neighbour missing when the round's gather timed out (a timeout event's value: missing
    # count); pulls are one after another, so the run's end may cut an agent's last ones (at most 2 each)
    missing = t[t["kind"] == "timeout"]["value"].sum()
    assert missing - 2 * 6 <= s["pull_requests"] <= missing
    assert s["accuracy"] > 0.8
    # without losses and with a generous timeout nothing is missing, so nothing is pulled
    out2 = tmp_path / "lossless"
    r = netsim("run", "scenarios/quickstart.toml", "--plugin", PLUGINS / "pull_repair_momentum.py",
               "--set", 'algorithm={name="pull_repair_momentum", round_timeout=5.0}', "--set", "agents.count=6",
               "--set", "run.until=8", "--set", "network.loss=0.0", "--out", out2, "-q")
    assert r.returncode == 0, r.stderr
    s2 = json.loads((out2 / "summary.json").read_text())
    assert "pull_requests" not in s2 and s2["accuracy"] > 0.8


def _registries() -> list[dict]:
    """Every registry a plugin can add a name to (what ``--plugin`` fills)."""
    from netsim.algorithms import registry
    from netsim.compute import data, model_registry
    from netsim.privacy import accountants, closed_forms, mechanisms
    from netsim.sim import activation, network
    from netsim.trace import events

    return [registry.REGISTRY, registry.SOURCES, registry.FIXED_TOPOLOGY, model_registry.MODELS,
            model_registry.MODEL_PARAMS, data.DATASETS, data.DATASET_PARAMS, activation.SCHEDULES,
            network.LINK_MODELS, closed_forms.CLOSED_FORMS, mechanisms.MECHANISMS, accountants.ACCOUNTANTS,
            accountants.ACCOUNTANT_DOCS, events._REGISTRY]


def _plugin_module(name: str):
    """The plugin's module, imported here for its functions; what its import registered taken back (the registries
    as they were), so that no later test in this process sees a plugin's names without ``--plugin``."""
    import importlib.util

    saved = [(r, dict(r)) for r in _registries()]
    try:
        spec = importlib.util.spec_from_file_location(f"plugin_{name}", PLUGINS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for r, was in saved:
            r.clear()
            r.update(was)
    return mod


def test_importing_a_plugin_here_leaves_no_name_registered():
    before = [dict(r) for r in _registries()]
    _plugin_module("discrete_gaussian")
    _plugin_module("planar_links")
    assert [dict(r) for r in _registries()] == before


def test_link_model_plugin_decides_every_message(tmp_path):
    """network.model = "planar": every delay is the chord's propagation plus the transmission on the link."""
    out = tmp_path / "run"
    r = netsim("run", "scenarios/quickstart.toml", "--plugin", PLUGINS / "planar_links.py", "--set",
               "network.model=planar", "--set", "agents.count=6", "--set", "run.until=5", "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    delay_between = _plugin_module("planar_links").delay_between
    t = read_trace(out).table.to_pandas()
    assert (t["kind"] == "drop").sum() == 0               # the scenario's 5% loss no longer applies
    sends = t[t["kind"] == "send"]
    assert len(sends) > 100
    bw = 1.0e6
    first = set()
    for _, s in sends.iterrows():
        tx = s["value"] - delay_between(int(s["agent"]), int(s["peer"]), 6)
        assert tx >= s["size"] / bw - 1e-12               # queued behind earlier messages on the link, or not
        if (s["agent"], s["peer"]) not in first:          # a link's first message waits for nothing
            first.add((s["agent"], s["peer"]))
            assert math.isclose(tx, s["size"] / bw, rel_tol=0, abs_tol=1e-12)
    # the scenario names the model; without the plugin it is one line, exit 2, and nothing is written
    r = netsim("run", "scenarios/quickstart.toml", "--set", "network.model=planar", "--out", tmp_path / "no", "-q")
    assert r.returncode == 2 and not (tmp_path / "no").exists()
    assert r.stderr.strip() == ("error: scenarios/quickstart.toml: network.model: unknown link model 'planar'; "
                                "registered: none (a plugin's needs --plugin)")


def test_activation_schedule_plugin_drives_the_agents(tmp_path):
    """agents.activation.schedule = "weibull2": Weibull(2) gaps at the table's rate, from each agent's own
    activation stream (the first activation, never missed, is exactly the first draw)."""
    from netsim.sim.streams import Streams

    mod = _plugin_module("weibull_activation")
    g = np.random.default_rng(0)
    s = mod.WeibullRenewal(4.0, g, 0.0)
    times = [s.next(0.0)]
    for _ in range(20000):
        times.append(s.next(times[-1]))
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(0.25, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(0.5227, abs=0.02)   # Weibull(2); Poisson would be 1
    out = tmp_path / "run"
    r = netsim("run", "scenarios/quickstart.toml", "--plugin", PLUGINS / "weibull_activation.py",
               "--set", 'agents.activation={kind="poisson", rate=4.0, schedule="weibull2"}',
               "--set", 'agents.clock_offset={kind="constant", value=0.0}',
               "--set", "agents.count=4", "--set", "run.until=5", "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    t = read_trace(out).table.to_pandas()
    act = t[t["kind"] == "activate"]
    for i, rows in act.groupby("agent"):
        rng = Streams(7).rng("activation", int(i))
        scale = 1.0 / (4.0 * math.gamma(1.5))
        assert rows["value"].iloc[0] == scale * rng.weibull(2.0)
        assert rows["value"].is_monotonic_increasing and len(rows) > 5



def test_mechanism_plugin_is_accounted_through_its_own_dp_event(tmp_path):
    """The discrete Gaussian (examples/plugins/discrete_gaussian.py) is composed as its own zCDP event: RDP's
    figure is that of ZCDpEvent(Delta^2 / (2 sigma^2)) per release; PLD, which has no zCDP, refuses."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    out, plugin = tmp_path / "run", PLUGINS / "discrete_gaussian.py"
    r = netsim("run", "scenarios/quickstart.toml", "--plugin", plugin, "--set", "algorithm.name=dg_sgd_gossip",
               "--set", "agents.count=4", "--set", "run.until=3", "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    r = netsim("privacy", out, "--plugin", plugin, "--no-pld")
    assert r.returncode == 0, r.stderr + r.stdout
    rep = json.loads((out / "privacy.json").read_text())
    assert list(rep["events"]["mechanisms"]) == ["discrete_gaussian"]
    t = read_trace(out).table.to_pandas()  # read here without the plugin: its mechanism is not registered
    rel = t[t.kind == "release"]
    for row in rep["agents"]:
        rs = rel[rel.agent == row["agent"]]
        assert row["releases"] == len(rs) > 0 and set(rs.tag.str.split(" ").str[0]) == {"discrete_gaussian"}
        acc = RdpAccountant()
        for sigma, tag in zip(rs.value, rs.tag, strict=True):
            sens = float(tag.split(" s=")[1].split(" ")[0])
            acc.compose(dp_accounting.ZCDpEvent(sens ** 2 / (2 * sigma ** 2)))
        assert math.isclose(row["rdp_observed"], acc.get_epsilon(rep["delta"]), rel_tol=1e-9)
    pld = netsim("privacy", out, "--plugin", plugin, "--pld")
    assert pld.returncode == 2 and "the pld accountant does not support" in pld.stdout + pld.stderr
    assert "ZCDpEvent" in pld.stdout + pld.stderr
    # without the plugin the mechanism is unknown: one line naming it and --plugin, exit 2
    r = netsim("privacy", out, "--no-pld")
    assert r.returncode == 2 and "discrete_gaussian" in r.stdout + r.stderr and "--plugin" in r.stdout + r.stderr


def test_discrete_gaussian_draws_are_integer_with_the_right_variance():
    import torch

    mod = _plugin_module("discrete_gaussian")
    g = torch.Generator().manual_seed(3)
    x = torch.zeros(200_000, dtype=torch.float64)
    y = mod.release(g, x, 2.0)
    assert torch.equal(y, torch.round(y))
    # the discrete Gaussian's variance at sigma = 2 is sigma^2 within 1e-6 (Canonne et al., Fact 19 and Cor. 9)
    assert abs(float(y.var()) - 4.0) < 0.05 and abs(float(y.mean())) < 0.02
