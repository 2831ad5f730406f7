"""Pairwise network DP from a run (netsim/privacy/pairwise.py): hand-derived cases, an independent numpy
recomputation of the exact Gaussian view (lossless: from the nominal W; lossy: from the trace and the
mixing record), the Muffliato bound and its flag, refusals, and the CLI outputs."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from netsim.cli import app
from tests.conftest import BASE, ROOT, merge

RATIO = 0.5  # Delta / sigma of every release: batch clipping, Delta = 2 C = 2, sigma = 4


def pair_scenario(n: int, topology: dict, K: int = 1, rounds: int = 1, loss: float = 0.0,
                  algorithm: str = "muffliato", **alg) -> dict:
    if algorithm == "muffliato":
        params = {"name": "muffliato", "lr": 0.1, "batch": 16, "clip": 1.0, "sigma": 4.0, "gossip_steps": K,
                  "round_timeout": 0.2, **alg}
    else:
        params = {"name": "dp_dpsgd", "lr": 0.1, "batch": 16, "clip": 1.0, "clip_mode": "batch", "sigma": 4.0,
                  "round_timeout": 0.2, **alg}
    return merge(BASE, {"run": {"seed": 5, "rounds": rounds}, "agents": {"count": n},
                        "topology": topology, "network": {"loss": loss}, "algorithm": params,
                        "evaluation": {"every": 100.0}, "privacy": {"record": "mixing"}})


def run_pairs(tmp_path, sc: dict, **kw) -> tuple[dict, dict]:
    from netsim.api import run
    from netsim.privacy.report import privacy_report
    from netsim.scenario import scenario_from_dict

    run(scenario_from_dict(sc), out=tmp_path)
    rep = privacy_report(tmp_path, pld=False, plot=False, pairwise=True, **kw)
    with (tmp_path / "pairwise.csv").open() as f:
        rows = {(int(r["victim"]), int(r["observer"])): r for r in csv.DictReader(f)}
    return rep, rows


def mu(rows, u, v) -> float:
    return float(rows[(u, v)]["mu"])


def test_complete_graph_one_step_every_pair_sees_the_release(tmp_path):
    _, rows = run_pairs(tmp_path, pair_scenario(5, {"kind": "complete"}, K=1))
    assert len(rows) == 20
    for r in rows.values():
        assert float(r["mu"]) == pytest.approx(RATIO, rel=1e-9)
        assert int(r["hops"]) == 1


@pytest.mark.parametrize("K", [2, 3])
def test_star_of_seven_leaf_to_leaf_is_one_over_sqrt5(tmp_path, K):
    _, rows = run_pairs(tmp_path, pair_scenario(7, {"kind": "star"}, K=K))
    for u in range(1, 7):
        for v in range(1, 7):
            if u != v:
                assert mu(rows, u, v) == pytest.approx(RATIO / math.sqrt(5), rel=1e-9)
                assert int(rows[(u, v)]["hops"]) == 2
        assert mu(rows, u, 0) == pytest.approx(RATIO, rel=1e-9)  # the centre hears every leaf directly


@pytest.mark.parametrize("K, expected", [(1, 0.0), (2, RATIO)])
def test_path_of_three(tmp_path, K, expected):
    topo = {"kind": "networkx", "generator": "path_graph", "args": [3]}
    _, rows = run_pairs(tmp_path, pair_scenario(3, topo, K=K))
    assert mu(rows, 0, 2) == pytest.approx(expected, abs=1e-12)
    assert float(rows[(0, 2)]["epsilon"]) == (0.0 if expected == 0 else pytest.approx(
        float(rows[(0, 1)]["epsilon"]), rel=1e-9))
    assert mu(rows, 0, 1) == pytest.approx(RATIO, rel=1e-9)


# -- an independent recomputation: the linear system from matrices, mu from the covariance's pseudo-inverse ---


def nominal_W(n: int, topology: dict) -> tuple[np.ndarray, dict[int, list[int]]]:
    from netsim.scenario.schema import TopologySpec
    from netsim.sim.streams import Streams
    from netsim.sim.topology import weighted_graph

    spec = TopologySpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in topology.items()})
    g, W = weighted_graph(spec, n, Streams(5).seed_for("topology"))
    return W.toarray(), {i: sorted(g.predecessors(i)) for i in range(n)}


def mu_from_covariance(rows: np.ndarray, victim_cols: list[int], observer_cols: list[int]) -> float:
    """mu^2 = 1^T C^T Sigma^+ C 1 (Delta/sigma)^2, Sigma the noise covariance of the observations."""
    if not len(rows):
        return 0.0
    M = rows.copy()
    M[:, observer_cols] = 0.0
    Sigma = M @ M.T
    C = M[:, victim_cols]
    G = C.T @ np.linalg.pinv(Sigma, rcond=1e-10, hermitian=True) @ C
    total = G.sum() if G.min() >= -1e-9 * abs(G).max(initial=1.0) else abs(G).sum()  # exact, or the |G| bound
    # never above the victim's releases seen directly (post-processing)
    return RATIO * min(math.sqrt(max(0.0, total)), math.sqrt(len(victim_cols)))


def muffliato_view(W: np.ndarray, nbrs, K: int, T: int, v: int) -> np.ndarray:
    n = len(W)
    C = np.zeros((n, n * T))  # every agent's value as coefficients of the n*T releases
    rows = []
    for t in range(T):
        B = C.copy()
        B[:, t * n:(t + 1) * n] += np.eye(n)
        P = B
        for _ in range(K):
            rows += [P[w] for w in nbrs[v] if w != v]
            P = W @ P
        C = P
    return np.array(rows)


@pytest.mark.parametrize("topology, n, K, T", [
    ({"kind": "ring"}, 8, 4, 1),
    ({"kind": "ring"}, 8, 3, 3),
    ({"kind": "networkx", "generator": "lollipop_graph", "args": [4, 3]}, 7, 3, 2),  # edges of different weights
    ({"kind": "erdos_renyi", "p": 0.4}, 9, 2, 3),
])
def test_muffliato_matches_an_independent_computation(tmp_path, topology, n, K, T):
    W, nbrs = nominal_W(n, topology)
    weights = {round(W[i, j], 12) for i in range(n) for j in range(n) if i != j and W[i, j] > 0}
    if topology.get("generator") == "lollipop_graph":
        assert len(weights) >= 3  # the case of edges with different weights
    _, rows = run_pairs(tmp_path, pair_scenario(n, topology, K=K, rounds=T))
    for v in range(n):
        view = muffliato_view(W, nbrs, K, T, v)
        for u in range(n):
            if u == v:
                continue
            want = mu_from_covariance(view, [t * n + u for t in range(T)], [t * n + v for t in range(T)])
            assert mu(rows, u, v) == pytest.approx(want, rel=1e-6, abs=1e-9), (u, v)


def test_ring_of_eight_four_hops_exact_exceeds_the_bound_and_says_so(tmp_path):
    rep, rows = run_pairs(tmp_path, pair_scenario(8, {"kind": "ring"}, K=4))
    r = rows[(0, 4)]
    assert int(r["hops"]) == 4
    assert float(r["mu"]) == pytest.approx(RATIO, rel=1e-9)  # recovered exactly
    assert float(r["mu_bound"]) < float(r["mu"]) and r["bound_below_exact"] == "True"
    # the bound, recomputed: messages of in-neighbours w at steps s < K, (W^s)_wu^2 / ||(W^s)_w||^2
    W, nbrs = nominal_W(8, {"kind": "ring"})
    tot = sum(np.linalg.matrix_power(W, s)[w, 0] ** 2 / np.sum(np.linalg.matrix_power(W, s)[w] ** 2)
              for s in range(4) for w in (3, 5))
    assert float(r["mu_bound"]) == pytest.approx(RATIO * math.sqrt(tot), rel=1e-9)
    from netsim.privacy.pairwise import muffliato_bound

    assert muffliato_bound(W, 4, 0, 4, [3, 5], [RATIO]) == pytest.approx(RATIO * math.sqrt(tot), rel=1e-12)
    assert rep["pairwise"]["bound_below_exact"] > 0
    assert float(r["mu_local"]) == pytest.approx(RATIO)


def test_dp_dpsgd_with_step_size_decay_matches_an_independent_computation(tmp_path):
    n, T = 6, 4
    topology = {"kind": "ring"}
    _, rows = run_pairs(tmp_path, pair_scenario(n, topology, rounds=T, algorithm="dp_dpsgd", lr_decay=0.7))
    W, nbrs = nominal_W(n, topology)
    for v in range(n):
        C = np.zeros((n, n * T))
        view = []
        for k in range(T):
            view += [C[w] for w in nbrs[v] if w != v]  # round k: the neighbours' x^k
            C = W @ C
            C[:, k * n:(k + 1) * n] -= (0.1 / (1 + 0.7 * k)) * np.eye(n)
        view = np.array(view)
        for u in range(n):
            if u != v:
                want = mu_from_covariance(view, [k * n + u for k in range(T)], [k * n + v for k in range(T)])
                assert mu(rows, u, v) == pytest.approx(want, rel=1e-6, abs=1e-9), (u, v)


def test_with_loss_the_figures_follow_the_delivered_messages_and_applied_weights(tmp_path):
    """An independent recomputation from the trace (deliveries) and mixing.csv (per-step matrices)."""
    from netsim.trace.io import read_trace

    n, K, T = 8, 3, 3
    rep, rows = run_pairs(tmp_path, pair_scenario(n, {"kind": "ring"}, K=K, rounds=T, loss=0.3))
    t = read_trace(tmp_path).table.to_pandas()
    dl = t[(t.kind == "deliver") & (t.tag == "muff")]
    drops = t[t.kind == "drop"]  # a drop's tag is its reason
    assert len(drops) > 0  # the case has losses
    mix = list(csv.DictReader((tmp_path / "mixing.csv").open()))
    steps = n * K * T
    # per round r: the applied matrix W_r, and which agents inject before it (releases made before round r)
    Wr = [np.zeros((n, n)) for _ in range(K * T)]
    released = np.zeros((K * T, n), dtype=int)
    for m in mix:
        a, k = int(m["agent"]), int(m["step"])
        Wr[k][a, int(m["src"])] = float(m["weight"])
        released[k, a] = int(m["released"])
    assert len(mix) >= steps and all(abs(w.sum(axis=1) - 1).max() < 1e-12 for w in Wr)
    for v in range(n):
        C = np.zeros((n, n * T))
        view = []
        for r in range(K * T):
            for a in range(n):  # a release made before step r enters at once (Muffliato's local step)
                for j in range(released[r - 1, a] if r else 0, released[r, a]):
                    C[a, j * n + a] += 1.0
            got = dl[(dl.agent == v) & (dl["round"] == r)]
            view += [C[int(j)] for j in got.peer]
            C = Wr[r] @ C
        view = np.array(view)
        for u in range(n):
            if u != v:
                want = mu_from_covariance(view, [k * n + u for k in range(T)], [k * n + v for k in range(T)])
                assert mu(rows, u, v) == pytest.approx(want, rel=1e-6, abs=1e-9), (u, v)
    assert rep["pairwise"]["bound"] is None and "lost" in rep["pairwise"]["bound_note"]


def test_gdp_epsilon_inverts_the_gdp_delta():
    from netsim.privacy.pairwise import gdp_delta, gdp_epsilon

    for m in (0.1, 0.5, 1.0, 3.0):
        e = gdp_epsilon(m, 1e-5)
        assert gdp_delta(m, e) == pytest.approx(1e-5, rel=1e-6)
    assert gdp_epsilon(0.0, 1e-5) == 0.0 and gdp_epsilon(math.inf, 1e-5) == math.inf
    # mu = 1 at delta = 1e-5: epsilon = 4.41 (a reference point of the Gaussian-DP conversion)
    assert gdp_epsilon(1.0, 1e-5) == pytest.approx(4.4, abs=0.05)


def test_refusals_name_the_reason(tmp_path):
    from netsim.api import run
    from netsim.errors import InputError
    from netsim.privacy.report import privacy_report
    from netsim.scenario import scenario_from_dict

    sc = pair_scenario(4, {"kind": "ring"})
    sc.pop("privacy")
    run(scenario_from_dict(sc), out=tmp_path / "a")
    with pytest.raises(InputError, match="mixing"):
        privacy_report(tmp_path / "a", pld=False, plot=False, pairwise=True)
    assert not (tmp_path / "a" / "pairwise.csv").exists()
    with pytest.raises(InputError, match="victims"):
        run_pairs(tmp_path / "c", pair_scenario(4, {"kind": "ring"}), victims="0,9")


def test_victims_and_observers_select_pairs(tmp_path):
    rep, rows = run_pairs(tmp_path, pair_scenario(6, {"kind": "ring"}, K=2), victims="0,1", observers="3-5")
    assert set(rows) == {(u, v) for u in (0, 1) for v in (3, 4, 5)}
    assert rep["pairwise"]["victims"] == [0, 1] and rep["pairwise"]["observers"] == [3, 4, 5]


def test_cli_pairwise_writes_csv_json_plots_and_a_table(tmp_path):
    from netsim.api import run
    from netsim.scenario import scenario_from_dict

    run(scenario_from_dict(pair_scenario(8, {"kind": "ring"}, K=4)), out=tmp_path)
    p = CliRunner().invoke(app, ["privacy", str(tmp_path), "--pairwise"])
    assert p.exit_code == 0, p.output
    assert "hops" in p.stdout and "bound is below the exact figure" in p.stdout
    with (tmp_path / "pairwise.csv").open() as f:
        head = next(csv.reader(f))
    assert head[:6] == ["victim", "observer", "hops", "mu", "epsilon", "delta"]
    sec = json.loads((tmp_path / "privacy.json").read_text())["pairwise"]
    assert sec["pairs"] == 56 and [r["hops"] for r in sec["by_hops"]] == [1, 2, 3, 4]
    assert (tmp_path / "pairwise_hops.png").stat().st_size > 0 and (tmp_path / "pairwise_heatmap.png").exists()
    bad = CliRunner().invoke(app, ["privacy", str(tmp_path), "--pairwise", "--observers", "x"])
    assert bad.exit_code == 2 and "--observers" in bad.stderr and "Traceback" not in bad.stderr


def test_runs_beyond_the_exact_limits_are_refused_with_the_limit_named(tmp_path, monkeypatch):
    from netsim.errors import InputError
    from netsim.privacy import pairwise

    monkeypatch.setattr(pairwise, "EXACT_LIMIT", 5)
    with pytest.raises(InputError, match="8 releases: the exact computation takes at most 5"):
        run_pairs(tmp_path / "a", pair_scenario(4, {"kind": "ring"}, rounds=2))
    monkeypatch.setattr(pairwise, "EXACT_LIMIT", 6000)
    monkeypatch.setattr(pairwise, "VIEW_BYTES_LIMIT", 100)
    with pytest.raises(InputError, match="choose fewer observers"):
        run_pairs(tmp_path / "b", pair_scenario(4, {"kind": "ring"}, rounds=2))
    assert not (tmp_path / "b" / "pairwise.csv").exists() and not (tmp_path / "b" / "privacy.json").exists()


def test_shipped_scenario_and_engine_refusals(tmp_path):
    from netsim.api import run
    from netsim.errors import InputError
    from netsim.privacy.report import privacy_report
    from netsim.rounds.windowed import scenario_refusal
    from netsim.scenario import load_scenario, scenario_from_dict

    sc = load_scenario("scenarios/privacy_pairwise.toml", {"agents.count": 8, "run.rounds": 2})
    assert sc.privacy.record == "mixing" and sc.network.loss > 0
    # the synchronous windows write the mixing record as the engine's agents do (tests/test_windowed_records.py)
    assert scenario_refusal(scenario_from_dict(pair_scenario(4, {"kind": "ring"}, algorithm="dp_dpsgd"))) is None
    run(sc, out=tmp_path / "ship")
    sec = privacy_report(tmp_path / "ship", pld=False, plot=False, pairwise=True)["pairwise"]
    assert sec["pairs"] == 56 and sec["status"] == "guarantee" and sec["bound"] is None
    assert sec["by_hops"][0]["epsilon_max"] >= sec["by_hops"][-1]["epsilon_max"]  # farther observers learn less
    plain = pair_scenario(4, {"kind": "ring"})
    plain["algorithm"] = {"name": "dpsgd", "lr": 0.5, "batch": 16, "round_timeout": 0.2}
    run(scenario_from_dict(plain), out=tmp_path / "dpsgd")
    with pytest.raises(InputError, match="not a linear Gaussian algorithm.*muffliato, dp_dpsgd"):
        privacy_report(tmp_path / "dpsgd", pld=False, plot=False, pairwise=True)


def test_time_varying_graph_with_loss_uses_the_weights_applied(tmp_path):
    """DP-D-PSGD on a one-peer exponential graph (a new peer every round) with loss: the exact figures follow
    the weights each agent applied (mixing.csv), recomputed here as per-round matrices."""
    from netsim.trace.io import read_trace

    n, T = 8, 5
    sc = pair_scenario(n, {"kind": "ring", "dynamic": {"kind": "one_peer_exponential"}}, rounds=T, loss=0.2,
                       algorithm="dp_dpsgd")
    rep, rows = run_pairs(tmp_path, sc)
    assert "time-varying" in rep["pairwise"]["bound_note"] or "published" in rep["pairwise"]["bound_note"]
    t = read_trace(tmp_path).table.to_pandas()
    dl = t[(t.kind == "deliver") & (t.tag == "model")]
    mix = list(csv.DictReader((tmp_path / "mixing.csv").open()))
    Wk = [np.zeros((n, n)) for _ in range(T)]
    lr = np.zeros((T, n))
    released = np.zeros((T, n), dtype=int)
    for m in mix:
        a, k = int(m["agent"]), int(m["step"])
        Wk[k][a, int(m["src"])] = float(m["weight"])
        lr[k, a], released[k, a] = float(m["lr"]), int(m["released"])
    assert any(len({j for j in range(n) if Wk[k][a, j] > 0} - {a}) == 1 for k in range(T) for a in range(n))
    for v in range(n):
        C = np.zeros((n, n * T))
        view = []
        for k in range(T):
            view += [C[int(j)] for j in dl[(dl.agent == v) & (dl["round"] == k)].peer]
            C = Wk[k] @ C
            for a in range(n):
                for j in range(released[k - 1, a] if k else 0, released[k, a]):
                    C[a, j * n + a] -= lr[k, a]
        view = np.array(view) if view else np.zeros((0, n * T))
        for u in range(n):
            if u != v:
                want = mu_from_covariance(view, [k * n + u for k in range(T)], [k * n + v for k in range(T)])
                assert mu(rows, u, v) == pytest.approx(want, rel=1e-6, abs=1e-9), (u, v)


def test_chebyshev_accelerated_muffliato_matches_an_independent_computation(tmp_path):
    from netsim.sim.topology import spectral_gap

    n, K, T = 8, 3, 2
    rep, rows = run_pairs(tmp_path, pair_scenario(n, {"kind": "ring"}, K=K, rounds=T, acceleration="chebyshev"))
    assert rep["pairwise"]["bound"] is None and "Chebyshev" in rep["pairwise"]["bound_note"]
    W, nbrs = nominal_W(n, {"kind": "ring"})
    lam2 = (1.0 - spectral_gap(W)) ** 2
    for v in range(n):
        C = np.zeros((n, n * T))
        view = []
        for t in range(T):
            x = C.copy()
            x[:, t * n:(t + 1) * n] += np.eye(n)
            prev, w = x, 1.0
            for s in range(K):  # Algorithm 1's recursion: x <- w_s (W x - x_prev) + x_prev for s > 0
                view += [x[j] for j in nbrs[v] if j != v]
                wx = W @ x
                if s == 0:
                    prev, x = x, wx
                else:
                    w = 2.0 / (2.0 - lam2) if s == 1 else 1.0 / (1.0 - lam2 * w / 4.0)
                    prev, x = x, w * (wx - prev) + prev
            C = x
        view = np.array(view)
        for u in range(n):
            if u != v:
                want = mu_from_covariance(view, [k * n + u for k in range(T)], [k * n + v for k in range(T)])
                assert mu(rows, u, v) == pytest.approx(want, rel=1e-6, abs=1e-9), (u, v)


# -- subsampling: credited where it composes exactly, and never a pair figure above the per-agent one ----------


def _rdp(*events) -> float:
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant()
    for ev in events:
        acc.compose(ev)
    return acc.get_epsilon(1e-5)


def test_a_single_release_seen_through_the_view_is_a_poisson_subsampled_gaussian(tmp_path):
    """One release per agent (q = 16/128 < 1): each observer's view of a victim is one Gaussian mechanism of
    sensitivity mu; the victim's record enters it with probability q, so the pair's epsilon is dp-accounting's
    PoissonSampledDpEvent(q, GaussianDpEvent(1/mu)), as the per-agent figure is for the release itself."""
    import dp_accounting

    rep, rows = run_pairs(tmp_path, pair_scenario(7, {"kind": "star"}, K=2))
    q = _rates(tmp_path)
    assert all(len(qs) == 1 and 0 < qs[0] < 0.2 for qs in q.values())  # 16 of ~91 training rows
    for (u, v), r in rows.items():
        assert r["subsampling"] == "True" and r["method"] == "exact, subsampled", r
        if u and v:  # leaf to leaf, through the centre: mu = RATIO / sqrt(5)
            leaf = _rdp(dp_accounting.PoissonSampledDpEvent(q[u][0], dp_accounting.GaussianDpEvent(
                math.sqrt(5) / RATIO)))
            assert float(r["epsilon"]) == pytest.approx(leaf, rel=1e-9)
        elif not v:  # the centre hears every leaf's release itself: the per-agent figure
            centre = _rdp(dp_accounting.PoissonSampledDpEvent(q[u][0], dp_accounting.GaussianDpEvent(1 / RATIO)))
            assert float(r["epsilon"]) == pytest.approx(centre, rel=1e-9)
            assert float(r["epsilon"]) == pytest.approx(rep["agents"][u]["epsilon"], rel=1e-9)
        assert float(r["epsilon"]) < float(_gdp(float(r["mu"])))  # below the plain Gaussian figure of the view
    assert "0 of 42 pairs" not in rep["pairwise"]["credits"] and "42 of 42 pairs" in rep["pairwise"]["credits"]


def _gdp(mu: float) -> float:
    from netsim.privacy.pairwise import gdp_epsilon

    return gdp_epsilon(mu, 1e-5)


def _rates(folder) -> dict[int, list[float]]:
    from netsim.privacy.ledger import releases_from_table
    from netsim.trace.io import read_trace

    return {a: [r.q for r in rs] for a, rs in releases_from_table(read_trace(folder).table).items()}


def test_pairwise_and_per_agent_figures_agree_on_screen(tmp_path):
    """DP-D-PSGD with subsampling (scenarios/privacy_activation.toml, recording its mixing): no observer learns
    more about a victim than the per-agent table says its neighbours could at most; pairs whose view cannot be
    split into independent releases fall back on the victim's own releases, subsampling credited; both tables
    say what they credit, the plots say which methods the figures come from."""
    from netsim.api import run
    from netsim.scenario import load_scenario

    sc = load_scenario(ROOT / "scenarios" / "privacy_activation.toml",
                       {"agents.count": 6, "run.until": 6.0, "privacy.record": "mixing"})
    run(sc, out=tmp_path)
    p = CliRunner().invoke(app, ["privacy", str(tmp_path), "--pairwise"])
    assert p.exit_code == 0, p.output
    rep = json.loads((tmp_path / "privacy.json").read_text())
    per_agent = {r["agent"]: r["epsilon"] for r in rep["agents"]}
    with (tmp_path / "pairwise.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 30
    for r in rows:
        eps, local = float(r["epsilon"]), float(r["epsilon_local"])
        assert eps <= per_agent[int(r["victim"])] * (1 + 1e-12) and local == pytest.approx(per_agent[int(r["victim"])])
        assert eps <= _gdp(float(r["mu"])) * (1 + 1e-12)  # never above the view's plain figure either
        if r["method"] == "local (post-processing)":
            assert r["subsampling"] == "True" and eps == local
    one_hop = [float(r["epsilon"]) for r in rows if r["hops"] == "1"]
    assert max(one_hop) == pytest.approx(max(per_agent[int(r["victim"])] for r in rows if r["hops"] == "1"))
    out = p.stdout
    qs = {q for rs in _rates(tmp_path).values() for q in rs}
    assert ("per agent: every release seen directly (what its neighbours could learn at most); credits: each "
            f"release at its sampling rate q (subsampling credited, q = {min(qs):.4g} to {max(qs):.4g})") in out
    assert "credits: subsampling (q) where it composes exactly: " in out and "Muffliato's bound credits none" in out
    assert rep["pairwise"]["credits"] in out


def test_pairwise_plots_are_titled_by_the_methods_of_their_figures(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from netsim.privacy import pairwise_plots

    titles = []
    real = plt.Axes.set_title

    def keep(self, label, *a, **k):
        titles.append(label)
        return real(self, label, *a, **k)

    rows = [{"victim": u, "observer": v, "hops": 1 + (u + v) % 2, "epsilon": 0.1 * (u + 1), "delta": 1e-5,
             "epsilon_bound": None, "epsilon_local": 0.5, "method": m, "subsampling": m != "exact"}
            for (u, v), m in zip([(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1)],
                                 ["exact", "mf-bound", "local (post-processing)", "exact, subsampled", "exact",
                                  "exact"], strict=True)]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(plt.Axes, "set_title", keep)
        pairwise_plots.plot_pairwise(rows, 3, tmp_path)
    assert len(titles) == 2 and not any("exact view" in t for t in titles)
    for t in titles:
        assert ("pairs by method: exact (3), exact, subsampled (1), local (post-processing) (1),\nmf-bound (1); "
                "subsampling credited in 3") in t


def test_the_documented_command_for_muffliatos_bound_shows_it(tmp_path):
    """docs/privacy.md's command for the bound column (the shipped scenario, reliable and on time) really shows
    it; loss = 0 alone, with the scenario's lognormal latency, does not (late messages), and says why."""
    import shlex

    from netsim.api import run
    from netsim.privacy.report import privacy_report
    from netsim.scenario import load_scenario
    from netsim.scenario.load import parse_override

    doc = (ROOT / "docs" / "privacy.md").read_text()
    line = next(x for x in doc.splitlines() if x.startswith("netsim run scenarios/privacy_pairwise.toml --set"))
    words = shlex.split(line)
    sets = [words[k + 1] for k, w in enumerate(words) if w == "--set"]
    small = {"run.rounds": 2}  # the shipped 16 agents, fewer rounds
    for name, over in (("doc", dict(parse_override(x) for x in sets)), ("loss0", {"network.loss": 0.0})):
        run(load_scenario(ROOT / words[2], {**over, **small}), out=tmp_path / name)
    sec = privacy_report(tmp_path / "doc", pld=False, plot=False, pairwise=True)["pairwise"]
    assert sec["bound"] is not None and sec["bound_below_exact"] > 0
    sec = privacy_report(tmp_path / "loss0", pld=False, plot=False, pairwise=True)["pairwise"]
    assert sec["bound"] is None and "lost or late" in sec["bound_note"]
