"""The options that let a scenario state a paper's setting exactly: data seed, Hsu et al.'s equal-shard
Dirichlet split, label splits, subsampling, standardisation, the sign-linear generator, intercept-free
models, initialisation, batch sampling, f* and suboptimality, one final metrics row, networkx graphs."""

from __future__ import annotations

import copy
import csv
import json

import numpy as np
import pytest
import torch
from scipy import stats

from netsim.api import prepare
from netsim.cli import app
from netsim.compute.data import partition, sign_linear
from netsim.compute.models import MLP, LogisticRegression, build_model, mlp_module
from netsim.compute.optimum import optimum, solve
from netsim.errors import InputError
from netsim.scenario.load import scenario_from_dict
from netsim.scenario.schema import ModelSpec

BASE = {
    "run": {"seed": 3, "rounds": 6},
    "agents": {"count": 4},
    "data": {"kind": "synthetic", "samples": 400, "features": 5},
    "algorithm": {"name": "dpsgd", "lr": 0.1, "batch": 8},
    "evaluation": {"every": 2.0},
}


def sc(**sections):
    d = copy.deepcopy(BASE)
    for key, val in sections.items():
        d.setdefault(key, {}).update(val)
    return scenario_from_dict(d)


# --- partitions -------------------------------------------------------------------------------------

def test_hsu_partition_equal_shards_disjoint_and_dirichlet_mixes():
    """Equal shards of floor(N/m) with no row twice; and, where no class runs out, class mixes distributed
    as Dir(alpha): a class's share is Beta(alpha, (C-1) alpha) (plus the multinomial noise of 1000 draws)."""
    rng = np.random.default_rng(0)
    C, alpha = 10, 0.5
    y = rng.integers(0, C, 60_000)
    parts = partition(y, 200, "dirichlet_equal", alpha, np.random.default_rng(1))
    assert {len(p) for p in parts} == {300}
    allrows = np.concatenate(parts)
    assert len(np.unique(allrows)) == len(allrows) == 60_000
    y = rng.integers(0, C, 600_000)  # 200 shards of 1000 from 60,000 rows per class: none runs out
    parts = partition(y, 200, "dirichlet_equal", alpha, np.random.default_rng(1), per_agent=1000)
    shares = np.array([np.bincount(y[p], minlength=C) / len(p) for p in parts])  # (m, C)
    beta = stats.beta(alpha, (C - 1) * alpha)
    noise = (beta.mean() - beta.var() - beta.mean() ** 2) / 1000  # E[p(1-p)] / n
    assert shares.var() == pytest.approx(beta.var() + noise, rel=0.15)
    assert stats.kstest(shares[:, 0], beta.cdf).pvalue > 0.01
    assert stats.kstest(shares[:, 0], stats.beta(2 * alpha, (C - 1) * 2 * alpha).cdf).pvalue < 0.01  # sensitive


def test_hsu_partition_redraws_exhausted_classes_and_honours_per_agent():
    y = np.repeat(np.arange(3), [5, 50, 500])  # class 0 runs out almost at once
    parts = partition(y, 10, "dirichlet_equal", 0.1, np.random.default_rng(2), per_agent=50)
    assert [len(p) for p in parts] == [50] * 10
    assert len(np.unique(np.concatenate(parts))) == 500
    with pytest.raises(InputError, match="data.per_agent"):
        partition(y, 10, "dirichlet_equal", 0.1, np.random.default_rng(2), per_agent=60)


def test_label_splits_classes_and_alternate():
    y = np.repeat(np.arange(4), 12)
    parts = partition(y, 3, "classes", 0.5, np.random.default_rng(0), classes=((0, 1), (2,), (2, 3)))
    held = [sorted(set(y[p].tolist())) for p in parts]
    assert held == [[0, 1], [2], [2, 3]]
    assert len(parts[1]) == 6 and len(parts[2]) == 6 + 12  # class 2 split evenly by its two holders
    parts = partition(np.repeat(np.arange(2), 10), 5, "alternate", 0.5, np.random.default_rng(0))
    assert [sorted(set((np.repeat(np.arange(2), 10))[p].tolist())) for p in parts] == [[0], [1], [0], [1], [0]]
    with pytest.raises(InputError, match="data.classes"):
        partition(y, 3, "classes", 0.5, np.random.default_rng(0), classes=((0,), (9,), (1,)))


def test_bare_dirichlet_is_refused_with_both_names():
    with pytest.raises(InputError, match="dirichlet_equal.*dirichlet_classes"):
        sc(data={"partition": "dirichlet"})


def test_per_agent_subsamples_every_partition():
    sim = prepare(sc(data={"per_agent": 30}))
    assert [len(a.rows) for a in sim.agents] == [30] * 4
    with pytest.raises(InputError, match="data.per_agent"):
        prepare(sc(data={"per_agent": 500}))


# --- data seed, standardisation, generator, held-out sets ---------------------------------------------

def test_data_seed_fixes_the_data_while_run_seed_varies_the_rest():
    a = prepare(sc(run={"seed": 1}, data={"seed": 7, "partition": "dirichlet_equal", "alpha": 0.3}))
    b = prepare(sc(run={"seed": 2}, data={"seed": 7, "partition": "dirichlet_equal", "alpha": 0.3}))
    assert np.array_equal(a.data.X, b.data.X) and np.array_equal(a.data.X_test, b.data.X_test)
    assert all(np.array_equal(p, q) for p, q in zip(a.data.parts, b.data.parts, strict=True))
    # the run's own randomness differs: batches and noise
    assert not np.array_equal(a.agents[0].sample_rows(8), b.agents[0].sample_rows(8))
    na = a.streams.rng("noise", 0).normal(size=4)
    nb = b.streams.rng("noise", 0).normal(size=4)
    assert not np.allclose(na, nb)
    # and without data.seed the data follow run.seed (existing scenarios unchanged)
    c = prepare(sc(run={"seed": 1}))
    d = prepare(sc(run={"seed": 2}))
    assert not np.array_equal(c.data.X, d.data.X)


def test_standardize_fit_gives_zero_mean_unit_std_on_training_split():
    sim = prepare(sc(data={"standardize": "fit"}))
    X = sim.data.X.astype(np.float64)
    assert np.abs(X.mean(0)).max() < 1e-5 and np.abs(X.std(0) - 1).max() < 1e-5
    given = prepare(sc(data={"standardize": "given", "mean": 1.0, "std": 2.0}))
    raw = prepare(sc())
    assert np.allclose(given.data.X, (raw.data.X - 1.0) / 2.0, atol=1e-6)
    with pytest.raises(InputError, match="data.standardize"):
        sc(data={"standardize": "given", "mean": 1.0})


def test_mnist_standardisation_uses_the_canonical_values(tmp_path, monkeypatch):
    from tests.test_compute_data import write_mnist

    write_mnist(tmp_path / "mnist")
    monkeypatch.setenv("NETSIM_DATA", str(tmp_path))
    plain = prepare(sc(data={"kind": "mnist"}, model={"kind": "multinomial"}))
    std = prepare(sc(data={"kind": "mnist", "standardize": "mnist"}, model={"kind": "multinomial"}))
    assert np.allclose(std.data.X, (plain.data.X - 0.1307) / 0.3081, atol=1e-5)


def test_sign_linear_generator_unit_rows_and_labels_follow_the_sign():
    X, y = sign_linear(5000, 50, np.random.default_rng(0))
    assert np.allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-6)
    assert set(np.unique(y)) == {-1, 1}
    # labels agree with sign(a.x*) except where the N(0, 0.25) noise outweighs 3 a.x*
    x_star = np.random.default_rng(0).normal(size=50)
    agree = np.mean(np.sign(X @ x_star) == y)
    assert 0.6 < agree < 1.0


def test_validation_and_test_sizes_are_set_apart_and_disjoint():
    sim = prepare(sc(data={"samples": 1000, "test_fraction": 0.3, "validation": 50, "test_samples": 200}))
    assert sim.X_val.shape[0] == 50 and sim.X_test.shape[0] == 200
    val = {tuple(r.tolist()) for r in sim.X_val}
    assert not any(tuple(r.tolist()) in val for r in sim.X_test)
    with pytest.raises(InputError, match="data.validation"):
        prepare(sc(data={"samples": 1000, "test_fraction": 0.3, "validation": 200, "test_samples": 200}))


def test_batches_without_replacement_are_distinct():
    sim = prepare(sc(data={"sampling": "without_replacement"}))
    a = sim.agents[0]
    for _ in range(20):
        rows = a.sample_rows(40)
        assert len(np.unique(rows)) == 40 and set(rows) <= set(a.rows)
    assert np.array_equal(a.sample_rows(10_000), a.rows)  # a batch at least the part: the whole part


# --- models ---------------------------------------------------------------------------------------------

def test_bias_false_has_exactly_d_parameters_and_matches_autograd():
    D = torch.float64
    assert LogisticRegression(7, bias=False).size == 7
    assert MLP(7, 4, (), bias=False).size == 28
    assert build_model(ModelSpec("multinomial", bias=False), 7, 4).size == 28
    assert prepare(sc(model={"bias": False})).bank.W.shape[1] == 5
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3, 6, 7, generator=g, dtype=D)
    y = torch.randint(0, 2, (3, 6), generator=g)
    m = LogisticRegression(7, l2=0.1, bias=False)
    W = torch.randn(3, 7, generator=g, dtype=D, requires_grad=True)
    s = 2 * y - 1
    loss = torch.nn.functional.softplus(-s * (X * W.unsqueeze(1)).sum(2)).mean(1) + 0.05 * (W ** 2).sum(1)
    ref = torch.autograd.grad(loss.sum(), W)[0]
    assert torch.allclose(m.grad(W.detach(), X, y), ref, rtol=1e-10)
    assert torch.allclose(m.grad(W.detach()[:1], X[:1], y[:1]), ref[:1], rtol=1e-10)  # the one-request path
    # per-sample clipping without the intercept: the norm is |r| ||x|| (no +1)
    clipped = m.grad(W.detach(), X, y, clip=1e-3)
    assert torch.linalg.vector_norm(clipped - 0.1 * W.detach(), dim=1).max() <= 1e-3 + 1e-12
    mlp = MLP(7, 3, (5,), bias=False)
    net = mlp_module(mlp.dims, bias=False).to(D)
    Wm = torch.cat([p.detach().flatten() for p in net.parameters()]).unsqueeze(0)
    assert Wm.shape[1] == mlp.size
    yy = torch.randint(0, 3, (1, 6), generator=g)
    out = torch.nn.functional.cross_entropy(net(X[0]), yy[0])
    ref = torch.cat([p.flatten() for p in torch.autograd.grad(out, list(net.parameters()))])
    assert torch.allclose(mlp.grad(Wm, X[:1], yy)[0], ref, rtol=1e-10)


def test_mlp_init_torch_draws_biases_zero_bias_keeps_them_zero():
    torch_init = MLP(7, 3, (5,), init="torch").init(2, torch.float64, torch.device("cpu"), seed=4)
    zero = MLP(7, 3, (5,), init="zero_bias").init(2, torch.float64, torch.device("cpu"), seed=4)
    m = MLP(7, 3, (5,))
    for (_, b0, o, _), bound in zip(m.slices, (1 / 7 ** 0.5, 1 / 5 ** 0.5), strict=True):
        b = torch_init[0, b0:b0 + o]
        assert b.abs().max() <= bound and b.abs().min() > 0
        assert not zero[0, b0:b0 + o].any()
    assert torch.equal(torch_init[:, :35], zero[:, :35])  # first weights: same draws
    assert torch.equal(torch_init[0], torch_init[1])  # every agent starts from one draw


# --- f*, suboptimality, the final row, headline -----------------------------------------------------------

def test_f_star_gradient_norm_below_1e_8(tmp_path, monkeypatch):
    monkeypatch.setenv("NETSIM_CACHE", str(tmp_path))
    X, b = sign_linear(800, 10, np.random.default_rng(1))
    y = (b > 0).astype(np.int64)
    for bias in (False, True):
        m = LogisticRegression(10, l2=1e-3, bias=bias)
        f_star, gnorm = solve(m, X, y)
        assert gnorm < 1e-8
        W = torch.zeros(1, m.size, dtype=torch.float64)
        f0 = float(m.evaluate(W, torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(y))[0][0])
        assert f_star < f0
    mm = MLP(10, 3, (), l2=1e-2)
    y3 = np.random.default_rng(2).integers(0, 3, 800)
    assert solve(mm, X, y3)[1] < 1e-8
    # cached by data hash: the second call reads the file
    first = optimum(m, X, y)
    assert len(list((tmp_path / "fstar").glob("*.json"))) == 1
    assert optimum(m, X, y) == first
    with pytest.raises(InputError, match="convex"):
        optimum(MLP(10, 3, (4,)), X, y3)


def test_suboptimality_metric_one_final_row_and_headline(tmp_path, monkeypatch):
    monkeypatch.setenv("NETSIM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "s.toml"
    path.write_text("""
[run]
seed = 1
until = 10.0
[agents]
count = 4
[data]
kind = "synthetic"
generator = "sign_linear"
samples = 500
features = 6
per_agent = 100
[model]
kind = "logistic"
bias = false
l2 = 0.01
[algorithm]
name = "dpsgd"
lr = 0.5
batch = 16
[evaluation]
every = 2.0
metrics = ["train_loss", "suboptimality", "accuracy"]
headline = "suboptimality"
""")
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    times = [float(r["time"]) for r in rows]
    assert times == sorted(set(times)) and times[-1] == 10.0  # one row per time, theta_T last
    sub = [float(r["suboptimality"]) for r in rows]
    assert all(s >= -1e-6 for s in sub) and sub[-1] < sub[0]
    assert all(float(r["train_loss"]) - s == pytest.approx(float(rows[0]["train_loss"]) - sub[0], abs=1e-6)
               for r, s in zip(rows, sub, strict=True))  # f* is one constant
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["headline"] == {"metric": "suboptimality", "value": pytest.approx(sub[-1])}


def test_suboptimality_refuses_a_neural_network():
    with pytest.raises(InputError, match="convex"):
        prepare(sc(model={"kind": "mlp", "hidden": [4]}, evaluation={"metrics": ["suboptimality"]}))


def test_headline_must_be_a_column_the_metrics_write():
    assert sc(evaluation={"metrics": ["tracking"], "headline": "tracking_mse"}).evaluation.headline == "tracking_mse"
    for metrics, head in ((["tracking"], "tracking"), (["loss"], "accuracy"), (["accuracy"], "acc")):
        with pytest.raises(InputError, match="evaluation.headline.*not a column.*allowed: round_mean"):
            sc(evaluation={"metrics": metrics, "headline": head})


# --- topologies -----------------------------------------------------------------------------------------

def test_networkx_generators_by_name():
    import networkx as nx

    sim = prepare(sc(agents={"count": 6}, topology={"kind": "networkx", "generator": "complete_bipartite_graph",
                                                     "args": [3, 3]}))
    assert nx.is_isomorphic(sim.graph.to_undirected(), nx.complete_bipartite_graph(3, 3))
    ws = sc(agents={"count": 10}, topology={"kind": "networkx", "generator": "watts_strogatz_graph",
                                            "args": [10, 4, 0.3]})
    a, b = prepare(ws), prepare(ws)
    assert sorted(a.graph.edges) == sorted(b.graph.edges)  # its seed comes from the run
    assert prepare(sc(agents={"count": 8}, topology={"kind": "networkx", "generator": "hypercube_graph",
                                                     "args": [3]})).graph.number_of_edges() == 24
    for bad, key in ((dict(generator="os_system"), "topology.generator"),
                     (dict(generator="__import__"), "topology.generator"),
                     (dict(generator="cycle_graph", args=[5]), "topology.args"),
                     (dict(generator="complete_graph", args=[10 ** 12]), "topology.args"),
                     (dict(generator="grid_graph", kwargs={"dim": [2, 10 ** 9]}), "topology.args"),
                     (dict(generator="barabasi_albert_graph", args=[4, 9]), "topology.args")):
        with pytest.raises(InputError, match=key):
            prepare(sc(topology={"kind": "networkx", **bad}))


def test_training_objective_is_over_the_rows_agents_hold(tmp_path, monkeypatch):
    monkeypatch.setenv("NETSIM_CACHE", str(tmp_path))
    sim = prepare(sc(data={"per_agent": 50}, model={"l2": 0.1}, evaluation={"metrics": ["suboptimality"]}))
    X, y = sim.train_rows
    held = np.sort(np.concatenate(sim.data.parts))
    assert X.shape[0] == 200 < len(sim.data.y)
    assert np.array_equal(X.numpy(), sim.data.X[held])
    assert sim.f_star == pytest.approx(solve(sim.model, sim.data.X[held], sim.data.y[held])[0])
