"""The model and dataset plugins of examples/plugins/ (a residual MLP, a folder of per-device CSV files) end to
end through --plugin, and the model registry's book-keeping clipping on a plugin's nn.Module."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from netsim.errors import InputError
from netsim.trace.io import read_trace
from tests.test_plugin_examples import PLUGINS, netsim


@pytest.fixture
def own_registries(monkeypatch):
    """Model and dataset registries of this test only (a plugin module executed in-process registers into
    them, and is gone afterwards)."""
    from netsim.compute import data, model_registry

    for mod, names in ((model_registry, ("MODELS", "MODEL_PARAMS")), (data, ("DATASETS", "DATASET_PARAMS"))):
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

    from netsim.algorithms import load_plugin
    from netsim.compute.models import TorchModel, build_model, clip_per_sample
    from netsim.scenario.schema import ModelSpec

    load_plugin(str(PLUGINS / "residual_mlp.py"))  # (into this test's registries)
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
    assert any(ln.startswith("residual_mlp ") and ln.endswith("(own keys: width=32, depth=2)")
               for ln in res.output.splitlines()), res.output
