"""Kernel, links, topology and determinism of the foundation, against closed forms and reference libraries."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from netsim.api import prepare, run
from netsim.scenario.schema import Dist, TopologySpec
from netsim.sim.dists import scipy_dist
from netsim.sim.topology import build_graph, mixing_matrix, spectral_gap
from netsim.trace.io import read_trace

# --- topology ---------------------------------------------------------------------------------------
UNDIRECTED = ["ring", "torus", "grid", "complete", "star", "erdos_renyi", "random_regular", "exponential"]


@pytest.mark.parametrize("kind", UNDIRECTED)
@pytest.mark.parametrize("mixing", ["metropolis_hastings", "uniform", "max_degree", "column_stochastic"])
def test_mixing_matrices_are_stochastic_as_promised(kind, mixing):
    n = 16
    g = build_graph(TopologySpec(kind=kind, p=0.3, degree=4), n, seed=5)
    W = mixing_matrix(g, mixing).toarray()
    assert (W >= -1e-15).all()
    # W[i, j] > 0 only along edges j -> i or on the diagonal
    for i, j in zip(*np.nonzero(W)):
        assert i == j or g.has_edge(j, i)
    if mixing == "column_stochastic":
        np.testing.assert_allclose(W.sum(0), 1.0, atol=1e-12)
    else:
        np.testing.assert_allclose(W.sum(1), 1.0, atol=1e-12)
    if mixing in ("metropolis_hastings", "max_degree"):
        np.testing.assert_allclose(W, W.T, atol=1e-12)  # symmetric => doubly stochastic
        np.testing.assert_allclose(W.sum(0), 1.0, atol=1e-12)
    gap = spectral_gap(W)
    assert 0 < gap <= 1 + 1e-12


@pytest.mark.parametrize("kind", ["ring", "erdos_renyi", "exponential"])
def test_directed_column_stochastic(kind):
    g = build_graph(TopologySpec(kind=kind, directed=True, p=0.4), 12, seed=1)
    assert any(not g.has_edge(v, u) for u, v in g.edges)  # really directed
    W = mixing_matrix(g, "column_stochastic").toarray()
    np.testing.assert_allclose(W.sum(0), 1.0, atol=1e-12)


def test_ring_spectral_gap_closed_form():
    # MH on a ring: W = I/3 + (shift + shift^T)/3, eigenvalues (1 + 2 cos(2 pi k / n)) / 3
    n = 10
    W = mixing_matrix(build_graph(TopologySpec(kind="ring"), n, 0), "metropolis_hastings")
    lam = sorted(abs((1 + 2 * np.cos(2 * np.pi * k / n)) / 3) for k in range(n))[::-1]
    assert spectral_gap(W) == pytest.approx(1 - lam[1], abs=1e-12)


def test_edges_file(tmp_path):
    p = tmp_path / "edges.txt"
    p.write_text("# a path and a chord\n0 1\n1 2\n2 3\n3 0 0.5\n")
    g = build_graph(TopologySpec(kind="edges_file", path=str(p)), 4, 0)
    assert g.has_edge(1, 0) and g.has_edge(0, 3) and g.number_of_edges() == 8


# --- D-PSGD learns: consensus and the optimum ------------------------------------------------------
def _spread_params(sim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    sim.bank.W[:] = torch.randn(sim.bank.W.shape, generator=gen, dtype=sim.bank.W.dtype)
    return sim.bank.W.mean(0).clone()


@pytest.mark.parametrize("algo", ["dpsgd", "gossip"])
def test_averaging_reaches_exact_consensus(scenario, algo):
    """lr = 0: D-PSGD is x <- W x (doubly stochastic), so every agent converges to the initial mean."""
    params = {"name": algo, "lr": 0.0} | ({"round_timeout": 1.0} if algo == "dpsgd" else {})
    sc = scenario(algorithm=params, run={"until": 200.0}, model={"dtype": "float64"},
                  agents={"count": 8, "clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.2}})
    sim = prepare(sc)
    mean0 = _spread_params(sim)
    sim.run()
    W = sim.bank.W
    assert float((W - mean0).abs().max()) < 1e-6
    if algo == "gossip":  # pairwise averaging without loss preserves the sum exactly
        torch.testing.assert_close(W.mean(0), mean0, atol=1e-12, rtol=0)


def test_dpsgd_reaches_the_centralized_optimum(scenario):
    """Full local gradients, decaying steps, reliable links: the average model -> argmin of the global loss."""
    sc = scenario(algorithm={"name": "dpsgd", "lr": 1.0, "batch": 0, "lr_decay": 0.01, "round_timeout": 1.0},
                  run={"until": 400.0}, model={"dtype": "float64", "l2": 0.1},
                  data={"kind": "synthetic", "samples": 400, "features": 3, "noise": 0.5})
    sim = prepare(sc)
    sim.run()
    X = torch.cat([sim.X.cpu(), torch.ones(len(sim.X), 1, dtype=sim.X.dtype)], 1)  # reference on the CPU
    y = sim.y.cpu().to(X.dtype)
    # Global objective = mean over agents of local means; weight each row by 1/(n * |part_i|).
    wts = torch.zeros(len(y), dtype=X.dtype)
    for part in sim.data.parts:
        wts[torch.as_tensor(part)] = 1.0 / (len(sim.data.parts) * len(part))
    w = torch.zeros(X.shape[1], dtype=X.dtype)
    for _ in range(200):  # Newton's method on the (strongly convex) global objective
        p = torch.sigmoid(X @ w)
        reg = torch.full((X.shape[1],), 0.1, dtype=X.dtype)
        reg[-1] = 0
        grad = X.T @ (wts * (p - y)) + reg * w
        H = X.T @ (X * (wts * p * (1 - p))[:, None]) + torch.diag(reg)
        w = w - torch.linalg.solve(H, grad)
    xbar = sim.bank.W.mean(0).cpu()
    assert float((xbar - w).norm() / w.norm()) < 0.02
    assert sim.metrics[-1]["consensus"] < 2e-3 and sim.metrics[-1]["consensus"] < sim.metrics[5]["consensus"]


# --- links -------------------------------------------------------------------------------------------
def test_drop_rate_matches_p(scenario, tmp_path):
    p = 0.2
    res = run(scenario(network={"loss": p}, run={"until": 150.0}), out=tmp_path / "r")
    t = read_trace(res.out).table.to_pandas()
    sent, dropped = (t.kind == "send").sum(), (t.kind == "drop").sum()
    assert sent > 2000
    assert stats.binomtest(int(dropped), int(sent), p).pvalue > 1e-3
    # a dropped message is never delivered; a delivered one was never dropped
    assert set(t.msg[t.kind == "drop"]).isdisjoint(t.msg[t.kind == "deliver"])


@pytest.mark.parametrize("dist", [
    Dist("lognormal", mean=0.05, sigma=0.6), Dist("exponential", mean=0.02), Dist("uniform", low=0.01, high=0.03),
])
def test_latency_samples_match_distribution(scenario, tmp_path, dist):
    import attrs

    d = {k: v for k, v in attrs.asdict(dist).items() if v is not None}
    res = run(scenario(network={"latency": d}, run={"until": 60.0}), out=tmp_path / "r")
    t = read_trace(res.out).table.to_pandas()
    delays = t.value[t.kind == "deliver"].to_numpy()  # no bandwidth limit: delay = latency
    assert len(delays) > 1000
    assert stats.kstest(delays, scipy_dist(dist).cdf).pvalue > 1e-3


def test_bandwidth_transfer_time(scenario, tmp_path):
    bw = 2000.0  # bytes/s; a 6-float32 model (5 features + bias) is 24 bytes -> 12 ms on the wire
    res = run(scenario(network={"bandwidth": bw}, agents={"count": 4}, run={"until": 5.0}), out=tmp_path / "r")
    t = read_trace(res.out).table.to_pandas()
    d = t[t.kind == "deliver"]
    assert (d["size"] == 24).all()
    np.testing.assert_allclose(d.value, 0.01 + 24 / bw, rtol=1e-9)


# --- clocks and activation ------------------------------------------------------------------------------
def test_periodic_activation_follows_each_clock(scenario, tmp_path):
    sc = scenario(agents={"clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.4},
                          "clock_drift": {"kind": "uniform", "low": -0.01, "high": 0.01},
                          "activation": {"kind": "periodic", "period": 0.5}}, run={"until": 10.0})
    sim = prepare(sc)
    sim.run()
    t = read_trace  # noqa: F841
    for a in sim.agents[:3]:
        ticks = [(k * 0.5 - a.offset) / a.rate for k in range(1, 25)]
        ticks = [x for x in ticks if x >= 0][:5]
        assert a.global_time(a.local_time(ticks[0])) == pytest.approx(ticks[0])
    res = run(sc, out=tmp_path / "r")
    tr = read_trace(res.out).table.to_pandas()
    act = tr[tr.kind == "activate"]
    sim = prepare(sc)
    for a in sim.agents:
        mine = act[act.agent == a.id]
        # activation k happens when the agent's own clock reads a multiple of the period
        np.testing.assert_allclose(mine.value % 0.5, 0, atol=1e-9)
        np.testing.assert_allclose(mine.t, (mine.value - a.offset) / a.rate, rtol=1e-12)


def test_poisson_activation_rate(scenario, tmp_path):
    rate = 4.0
    # pure gossip over fast links keeps agents idle, so (almost) no arrival falls while busy
    res = run(scenario(agents={"activation": {"kind": "poisson", "rate": rate}}, run={"until": 100.0},
                       network={"latency": {"kind": "constant", "value": 0.0005}},
                       algorithm={"name": "gossip", "lr": 0.0}), out=tmp_path / "r")
    tr = read_trace(res.out).table.to_pandas()
    t0 = tr[(tr.kind == "activate") & (tr.agent == 0)].t.to_numpy()
    gaps = np.diff(np.concatenate([[0.0], t0]))
    assert stats.kstest(gaps, stats.expon(scale=1 / rate).cdf).pvalue > 1e-3


def test_bernoulli_activation_fraction(scenario, tmp_path):
    res = run(scenario(agents={"activation": {"kind": "bernoulli", "period": 0.5, "p": 0.3}}, run={"until": 200.0},
                       algorithm={"name": "gossip", "lr": 0.1}), out=tmp_path / "r")
    tr = read_trace(res.out).table.to_pandas()
    n_act = int((tr.kind == "activate").sum())
    ticks = 8 * 400
    assert stats.binomtest(n_act, ticks, 0.3).pvalue > 1e-3


def test_rounds_stop_rule(scenario):
    sim = prepare(scenario(run={"until": None, "rounds": 7}))
    sim.run()
    assert [a.round for a in sim.agents] == [7] * 8 and sim.stop_reason == "rounds"


# --- determinism -------------------------------------------------------------------------------------------
def test_same_seed_byte_identical_trace(scenario, tmp_path):
    sc = scenario(network={"loss": 0.1, "latency": {"kind": "lognormal", "mean": 0.02, "sigma": 0.5}},
                  agents={"compute_time": {"kind": "exponential", "mean": 0.05}})
    a, b = run(sc, out=tmp_path / "a"), run(sc, out=tmp_path / "b")
    assert a.trace_path.read_bytes() == b.trace_path.read_bytes()
    assert (a.out / "metrics.csv").read_bytes() == (b.out / "metrics.csv").read_bytes()
    c = run(sc, overrides={"run.seed": 4}, out=tmp_path / "c")
    assert c.trace_path.read_bytes() != a.trace_path.read_bytes()


def test_other_algorithm_sees_identical_network_draws(scenario, tmp_path):
    net = {"loss": 0.2, "latency": {"kind": "lognormal", "mean": 0.02, "sigma": 0.5}}
    agents = {"activation": {"kind": "periodic", "period": 0.5},
              "clock_drift": {"kind": "normal", "mean": 0, "sigma": 0.01},
              "clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.5}}
    t1 = read_trace(run(scenario(network=net, agents=agents), out=tmp_path / "a").out).to_pandas()
    t2 = read_trace(run(scenario(network=net, agents=agents, algorithm={"name": "gossip", "lr": 0.2,
                                                                        "reply_timeout": 0.3}),
                        out=tmp_path / "b").out).to_pandas()
    # activations: identical times per agent (up to the shorter run's count)
    for i in range(8):
        a1 = t1[(t1.kind == "activate") & (t1.agent == i)].t.to_numpy()
        a2 = t2[(t2.kind == "activate") & (t2.agent == i)].t.to_numpy()
        k = min(len(a1), len(a2))
        assert k > 10 and np.array_equal(a1[:k], a2[:k])
    # links: the k-th message on each link sees the same delay and the same loss outcome
    compared = 0
    for (src, dst), s1 in t1[t1.kind == "send"].groupby(["agent", "peer"]):
        s2 = t2[(t2.kind == "send") & (t2.agent == src) & (t2.peer == dst)]
        k = min(len(s1), len(s2))
        if k == 0:
            continue
        np.testing.assert_array_equal(s1.value.to_numpy()[:k], s2.value.to_numpy()[:k])
        lost1 = s1.msg.isin(t1.msg[t1.kind == "drop"]).to_numpy()[:k]
        lost2 = s2.msg.isin(t2.msg[t2.kind == "drop"]).to_numpy()[:k]
        np.testing.assert_array_equal(lost1, lost2)
        compared += k
    assert compared > 200


def test_trace_is_columnar_and_carries_the_scenario(scenario, tmp_path):
    import hashlib

    import pyarrow as pa

    res = run(scenario(run={"until": 20.0, "trace_flush_every": 500}), out=tmp_path / "r")
    tr = read_trace(res.out)
    assert tr.complete and tr.table.num_rows == res.summary["events"]
    assert hashlib.sha256(tr.scenario_text.encode()).hexdigest() == tr.metadata["netsim.scenario_sha256"]
    assert tr.scenario_text == (res.out / "scenario.toml").read_text()
    # a killed run: the file cut inside the last batch still reads up to the last complete batch
    data = res.trace_path.read_bytes()
    cut = tmp_path / "cut.arrows"
    cut.write_bytes(data[: len(data) - 100])
    part = read_trace(cut)
    assert not part.complete and 0 < part.table.num_rows < tr.table.num_rows
    assert pa.ipc.open_stream(res.trace_path.read_bytes()).read_all().num_rows == tr.table.num_rows


@pytest.mark.parametrize("kind,directed", [("random_regular", False), ("exponential", True), ("ring", False)])
def test_spectral_gap_arpack_path_matches_dense(kind, directed):
    spec = TopologySpec(kind=kind, directed=directed, mixing="column_stochastic" if directed else None)
    W = mixing_matrix(build_graph(spec, 500, seed=2), spec.mixing_kind)
    lam = np.sort(np.abs(np.linalg.eigvals(W.toarray())))[::-1]
    assert spectral_gap(W) == pytest.approx(1 - lam[1], rel=1e-6, abs=1e-9)


def test_spectral_gap_of_large_circulant_graphs_in_closed_form():
    """Rings (and other circulant W) of any size: 1 - |lambda_2| from the row's offsets, exact to rounding (ARPACK
    never converges on a ring beyond a few thousand agents, so this was None)."""
    import networkx as nx

    for n in (2_001, 100_000):
        W = mixing_matrix(build_graph(TopologySpec(kind="ring"), n, 0), "metropolis_hastings")
        # (1 + 2 cos(2 pi / n)) / 3 = 1 - (4/3) sin^2(pi / n)
        assert spectral_gap(W) == pytest.approx(4 / 3 * np.sin(np.pi / n) ** 2, rel=1e-9)
    g = nx.DiGraph(nx.circulant_graph(600, [1, 2, 5]).to_directed())
    W = mixing_matrix(g, "metropolis_hastings")
    lam = np.sort(np.abs(np.linalg.eigvalsh(W.toarray())))[::-1]
    assert spectral_gap(W) == pytest.approx(1 - lam[1], rel=1e-9)
    W = W.tolil()
    W[0, 0], W[0, 1] = W[0, 0] + 0.01, W[0, 1] - 0.01  # no longer circulant: ARPACK/dense, the same answer
    W = W.tocsr()
    lam = np.sort(np.abs(np.linalg.eigvals(W.toarray())))[::-1]
    assert spectral_gap(W) == pytest.approx(1 - lam[1], rel=1e-6)


@pytest.mark.slow
def test_spectral_gap_of_a_large_expander_converges():
    """Beyond 20,000 agents ARPACK gets a wider Krylov space: a random 4-regular graph's gap comes out (the
    default gave up at 10^5 after 300 restarts). Metropolis weights 1/5 make W = (I + A) / 5, and A's second
    eigenvalue modulus is close to 2 sqrt(3) (Friedman), so the gap is close to 1 - (1 + 2 sqrt(3)) / 5."""
    from netsim.sim.topology import weighted_graph

    W = weighted_graph(TopologySpec(kind="random_regular", degree=4), 25_000, 3)[1]
    gap = spectral_gap(W)
    assert gap is not None
    assert 1 - (1 + 2 * 3**0.5) / 5 - 0.01 < gap < 1 - (1 + 2 * 3**0.5) / 5 + 0.002


def test_a_negative_zero_scale_draws_zeros():
    """-0.0 passes the schema's ">= 0" (it equals 0), and numpy refuses a scale whose sign bit is set: the samplers
    draw it as 0."""
    from netsim.sim.dists import sampler

    rng = np.random.default_rng(0)
    assert sampler(Dist(kind="exponential", mean=-0.0), rng)(3).tolist() == [0.0, 0.0, 0.0]
    assert sampler(Dist(kind="normal", mean=2.0, sigma=-0.0), rng)(2).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("kind, shape", [("grid", "line"), ("torus", "ring")])
def test_a_grid_of_a_prime_count_is_refused_not_built_as_a_line(tmp_path, kind, shape):
    """``topology.kind = "grid"`` with 7 agents once became a 1 x 7 line without a word: one line naming the key
    and what is allowed, exit 2, nothing written; ``rows = 1`` still asks for the line on purpose."""
    import tomli_w
    import tomllib
    from typer.testing import CliRunner

    from netsim.cli import app
    from netsim.errors import InputError
    from netsim.sim.graph_arrays import fixed_edges
    from tests.conftest import BASE, ROOT, merge

    with pytest.raises(InputError, match=rf"topology.kind: a '{kind}' of 7 agents would be a single {shape} "
                                         r"\(7 is prime.*allowed: an agents.count with a factor >= 2 \(such as 6 "
                                         r"or 8\), or topology.rows = 1"):
        build_graph(TopologySpec(kind=kind), 7, seed=1)
    with pytest.raises(InputError, match="would be a single"):
        fixed_edges(TopologySpec(kind=kind), 7)  # validate's own graph, without networkx: the same refusal
    assert build_graph(TopologySpec(kind=kind, rows=1), 7, seed=1).number_of_nodes() == 7
    assert build_graph(TopologySpec(kind=kind), 8, seed=1).number_of_edges() > 0
    path = tmp_path / "s.toml"
    path.write_text(tomli_w.dumps(merge(BASE, {"topology": {"kind": kind}, "agents": {"count": 7}})))
    for args in (["validate", "--quick", str(path)], ["validate", str(path)],
                 ["run", str(path), "--out", str(tmp_path / "out"), "-q"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "topology.kind: " in res.stderr, res.output
    assert not (tmp_path / "out").exists()
    for sc in sorted((ROOT / "scenarios").glob("*.toml")):  # no shipped scenario relies on the old line
        data = tomllib.loads(sc.read_text())
        if data.get("topology", {}).get("kind") in ("grid", "torus") and "rows" not in data["topology"]:
            n = data.get("agents", {}).get("count", 16)
            assert any(n % r == 0 for r in range(2, int(n**0.5) + 1)), sc.name
