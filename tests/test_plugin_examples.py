"""The registry plugins in examples/plugins/ run end to end through the CLI's --plugin (in a subprocess:
a plugin's registrations are process-wide, and the other tests see only the built-in ones)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from netsim.errors import InputError
from netsim.privacy.ledger import releases_from_table
from netsim.trace.io import read_trace

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "examples" / "plugins"


def netsim(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "netsim", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


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
    assert netsim("run", "scenarios/quickstart.toml", "--set", "agents.count=4", "--set", "run.until=5",
                  "--set", "network.loss=0.0", "--out", base, "-q").returncode == 0
    b = read_trace(base).table.to_pandas()
    assert t[t["kind"] != "disagreement"].reset_index(drop=True).equals(b)
    # the timeline draws the kind with the glyph the class gives, once the plugin is loaded
    r = netsim("timeline", out, "--plugin", PLUGINS / "disagreement_event.py", "--kinds", "disagreement",
               "--width", "80", "--no-summary")
    assert r.returncode == 0, r.stderr
    lanes = [line for line in r.stdout.splitlines() if line.strip()[:1].isdigit() and "|" in line]
    assert len(lanes) == 4 and all(set(line.split("|")[1]) <= {" ", "d"} and "d" in line for line in lanes)
    assert "legend: d disagreement" in r.stdout
    r = netsim("timeline", out, "--kinds", "disagreement")
    assert r.returncode == 2 and "--kinds: unknown kind(s) disagreement" in r.stdout + r.stderr


def test_event_kind_plugin_is_needed_to_run_its_algorithm(tmp_path):
    r = netsim("run", "scenarios/quickstart.toml", "--set", "algorithm.name=dpsgd_disagreement",
               "--out", tmp_path / "x", "-q")
    assert r.returncode == 2 and "algorithm.name: unknown algorithm 'dpsgd_disagreement'" in r.stderr
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
    r = netsim("run", "scenarios/privacy_activation.toml", "--set", "privacy.closed_form=zcdp",
               "--out", tmp_path / "x", "-q")
    assert r.returncode == 2 and not (tmp_path / "x").exists()
    assert r.stderr == ("error: scenarios/privacy_activation.toml: privacy.closed_form: unknown closed form 'zcdp'; "
                        "registered: none, do_adp, ldp_online, pdsl, privsgp_vr (a plugin's needs --plugin)\n")
    out = tmp_path / "run"
    assert netsim("run", "scenarios/privacy_activation.toml", "--set", "agents.count=2", "--set", "run.until=1",
                  "--out", out, "-q").returncode == 0
    r = netsim("privacy", out, "--accountant", "zcdp", "--no-pld")
    assert r.returncode == 2 and "--accountant: unknown accountant 'zcdp'; registered: rdp, pld" in r.stdout + r.stderr


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


def _plugin_module(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"plugin_{name}", PLUGINS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


@pytest.fixture
def own_registries(monkeypatch):
    """Model and dataset registries of this test only (a plugin module executed in-process registers into
    them, and is gone afterwards)."""
    from netsim.compute import data, models

    for mod, names in ((models, ("MODELS", "MODEL_PARAMS")), (data, ("DATASETS", "DATASET_PARAMS"))):
        for name in names:
            monkeypatch.setattr(mod, name, dict(getattr(mod, name)))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:  # --plugin files loaded here: a later load runs them again
        if name.startswith("netsim_plugin_"):
            del sys.modules[name]


def test_model_plugin_clips_per_example_exactly_by_book_keeping(own_registries):
    """The residual MLP is all Linear layers: L2 clipping goes by book-keeping, equal to clipping the
    per-sample gradients of nested vmap (float64)."""
    import torch

    from netsim.compute.models import TorchModel, build_model, clip_per_sample
    from netsim.scenario.schema import ModelSpec

    _plugin_module("residual_mlp")
    m = build_model(ModelSpec("residual_mlp", params={"width": 6, "depth": 2}), 5, 3)
    assert isinstance(m, TorchModel) and m.ghost_clipping and m.size == (5 * 6 + 6) + 2 * 2 * (36 + 6) + 6 * 3 + 3
    g = torch.Generator().manual_seed(0)
    W = m.init(4, torch.float64, torch.device("cpu"), seed=1) + 0.3 * torch.randn(4, m.size, generator=g,
                                                                                   dtype=torch.float64)
    X, y = torch.randn(4, 7, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (4, 7), generator=g)
    want = clip_per_sample(m.per_sample_grads(W, X, y), 0.5, "l2")
    assert torch.allclose(m.grad(W, X, y, clip=0.5), want, rtol=0, atol=1e-12)
    assert not torch.allclose(m.grad(W, X, y), want, atol=1e-3)  # the bound binds
    with pytest.raises(InputError, match="model.depth: must be in \\[0, 16\\], got 17"):
        build_model(ModelSpec("residual_mlp", params={"depth": 17}), 5, 3)


def make_devices(folder: Path) -> None:
    rng = np.random.default_rng(0)
    (folder / "devices").mkdir(parents=True)
    for k in range(5):
        X = rng.normal(size=(12 + 4 * k, 3))
        with open(folder / "devices" / f"phone{k}.csv", "w") as f:
            f.write("ax,ay,activity,az\n")
            f.writelines(f"{a:.4f},{b:.4f},{int(a + b > 0)},{c:.4f}\n" for a, b, c in X)
    (folder / "devices" / "notes.txt").write_text("not a device")


def test_model_and_dataset_plugins_run_dp_dpsgd_end_to_end(tmp_path, own_registries):
    """A scenario beside its device folder, run from the repository: the dataset plugin reads one CSV per
    device, partition = "groups" gives each agent whole devices, and the residual MLP trains under DP-D-PSGD
    with per-example clipping."""
    from typer.testing import CliRunner

    from netsim.algorithms import load_plugin
    from netsim.api import prepare
    from netsim.cli import app
    from netsim.scenario import load_scenario

    make_devices(tmp_path)
    scenario = tmp_path / "devices.toml"
    scenario.write_text(
        '[run]\nseed = 2\nuntil = 4.0\n[agents]\ncount = 2\n'
        '[algorithm]\nname = "dp_dpsgd"\nlr = 0.2\nbatch = 8\nclip = 0.5\nclip_mode = "per_example"\n'
        'noise_multiplier = 0.5\n'
        '[data]\nkind = "device_folder"\npath = "devices"\ntarget = "activity"\npartition = "groups"\n'
        '[model]\nkind = "residual_mlp"\nwidth = 8\ndepth = 1\n')
    out = tmp_path / "run"
    r = netsim("run", scenario, "--plugin", PLUGINS / "residual_mlp.py", "--plugin", PLUGINS / "device_folder.py",
               "--out", out, "-q")
    assert r.returncode == 0, r.stderr
    text = (out / "scenario.toml").read_text()
    assert f'path = "{tmp_path / "devices"}"' in text and 'target = "activity"' in text and "width = 8" in text
    metrics = (out / "metrics.csv").read_text().splitlines()
    assert len(metrics) >= 4 and "nan" not in "".join(metrics)
    rel = read_trace(out).table.to_pandas().query("kind == 'release'")
    assert len(rel) >= 6 and set(rel["agent"]) == {0, 1}
    # without the plugins the kinds are unknown: one line, exit 2, nothing written
    runner = CliRunner()
    res = runner.invoke(app, ["run", str(scenario), "--plugin", str(PLUGINS / "device_folder.py"),
                              "--out", str(tmp_path / "no"), "-q"])
    assert res.exit_code == 2 and not (tmp_path / "no").exists()
    assert res.output.count("\n") == 1 and "model.kind: unknown model 'residual_mlp'; registered: cnn, logistic, " \
        "mlp, multinomial, " in res.output
    # the run folder's scenario rebuilds the same partition: every agent holds exactly its devices' rows
    load_plugin(str(PLUGINS / "residual_mlp.py"))
    sim = prepare(load_scenario(out / "scenario.toml"))
    g = sim.data.groups
    held = [set(g[a.rows]) for a in sim.agents]
    for a, mine in zip(sim.agents, held, strict=True):
        assert np.array_equal(a.rows, np.flatnonzero(np.isin(g, list(mine))))
    assert sorted(set().union(*held)) == [f"phone{k}" for k in range(5)] and sum(map(len, held)) == 5
    assert sim.model.ghost_clipping
    # the plugins' own keys in the reference and the models / datasets listings
    res = runner.invoke(app, ["keys", "model", "--plugin", str(PLUGINS / "residual_mlp.py")])
    assert "model.width  (integer, default 32)" in res.output and "only when kind = 'residual_mlp'" in res.output
    res = runner.invoke(app, ["datasets", "device_folder"])
    assert res.exit_code == 0 and "data.target  (string, default 'label')" in res.output
    res = runner.invoke(app, ["models"])
    assert "residual_mlp: width=32, depth=2" in res.output
