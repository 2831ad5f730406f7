"""PDSL (Wang, Yuan, Wang, Li) and its baselines: Shapley values against closed forms and enumeration, Monte-Carlo
convergence, normalisation and weighting (eqs. 19-20), the CGA dual QP's KKT conditions, noise
exactly where the paper puts it (release events), batching of coalition evaluations, determinism."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from netsim.algorithms import shapley as sh
from netsim.api import prepare, run
from netsim.errors import InputError
from netsim.scenario import scenario_from_dict
from netsim.trace.io import read_trace
from tests.conftest import BASE, merge


# -- Shapley: exact ----------------------------------------------------------------------------------
def test_additive_game_shapley_is_individual_contribution():
    a = np.array([0.3, -0.1, 0.7, 0.05])
    v = lambda m: sum(a[j] for j in sh.members(m))  # noqa: E731
    np.testing.assert_allclose(sh.exact_shapley(4, v), a, atol=1e-12)
    # stratified Monte Carlo is exact on additive games for any R (every marginal is a_j)
    perms = sh.permutations(4, 3, np.random.default_rng(0))
    np.testing.assert_allclose(sh.mc_shapley(perms, v), a, atol=1e-12)


def test_glove_game_known_values():
    # player 0 holds a left glove, 1 and 2 right gloves; a pair is worth 1: phi = (2/3, 1/6, 1/6)
    v = lambda m: float(bool(m & 1) and bool(m & 0b110))  # noqa: E731
    np.testing.assert_allclose(sh.exact_shapley(3, v), [2 / 3, 1 / 6, 1 / 6], atol=1e-12)


def test_exact_equals_average_over_all_permutations_and_is_efficient():
    rng = np.random.default_rng(1)
    n = 5
    table = {m: float(rng.normal()) for m in sh.all_coalitions(n)}
    exact = sh.exact_shapley(n, table.__getitem__, v_empty=0.2)
    every = np.array(list(itertools.permutations(range(n))))
    np.testing.assert_allclose(sh.mc_shapley(every, table.__getitem__, v_empty=0.2), exact, atol=1e-12)
    assert exact.sum() == pytest.approx(table[(1 << n) - 1] - 0.2)  # efficiency


def test_shapley_values_all_coalitions_in_one_utility_call():
    calls = []

    def utility(masks):
        calls.append(list(masks))
        return [m.bit_count() ** 2 for m in masks]  # symmetric game: equal shares of v(N) = n^2

    phi, vals = sh.shapley(3, utility)
    assert len(calls) == 1 and sorted(calls[0]) == list(range(1, 8))  # the ring's 7 coalitions
    np.testing.assert_allclose(phi, [3.0, 3.0, 3.0])


# -- Shapley: Monte Carlo --------------------------------------------------------------------------
def _random_game(n: int, seed: int):
    """A non-additive game (pairwise synergies, concave size term), tabulated once."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=n)
    pair = rng.normal(size=(n, n)) * 0.3
    table = {}
    for m in sh.all_coalitions(n):
        s = sh.members(m)
        table[m] = float(w[s].sum() + pair[np.ix_(s, s)].sum() + 0.5 * np.sqrt(len(s)))
    return table.__getitem__


@pytest.mark.parametrize("stratified", [True, False])
def test_monte_carlo_converges_to_exact(stratified):
    n = 9
    v = _random_game(n, 2)
    exact = sh.exact_shapley(n, v)
    errs = []
    for R in (9, 90, 900):
        e = [np.abs(sh.mc_shapley(sh.permutations(n, R, np.random.default_rng(s), stratified), v) - exact)
             .max() for s in range(4)]
        errs.append(float(np.mean(e)))
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < errs[0] / 4  # ~ 1/sqrt(R): 100x permutations, ~10x smaller error
    # every estimate is efficient: the permutation's marginals telescope to v(N)
    est = sh.mc_shapley(sh.permutations(n, 7, np.random.default_rng(0), stratified), v)
    assert est.sum() == pytest.approx(v((1 << n) - 1))


def test_monte_carlo_plan_caches_shared_prefixes():
    n = 10
    masks, perms = sh.plan(n, exact_max=8, rng=np.random.default_rng(0))
    assert perms.shape == (20, n)  # default R = 2n
    assert len(masks) == len(set(masks)) < 20 * n  # prefixes deduplicated: the full set N is shared
    assert (1 << n) - 1 in masks
    # stratified: each player is first exactly R / n times
    assert np.bincount(perms[:, 0], minlength=n).tolist() == [2] * n
    phi, _ = sh.shapley(n, lambda ms: [float(m.bit_count()) for m in ms], rng=np.random.default_rng(0))
    np.testing.assert_allclose(phi, np.ones(n))  # additive unit game: exact for any permutations


# -- normalisation and weighting (eqs. 19, 20) -----------------------------------------------------
def test_minmax_and_pdsl_weights():
    phi_hat = sh.minmax([0.2, 0.5, 0.35])
    np.testing.assert_allclose(phi_hat, [0.0, 1.0, 0.5])
    np.testing.assert_array_equal(sh.minmax([0.4, 0.4, 0.4]), [1.0, 1.0, 1.0])  # guard A4
    omega = np.full(3, 1 / 3)
    pi = sh.pdsl_weights(phi_hat, omega)
    np.testing.assert_allclose(pi, [0.0, 2.0, 1.0])  # shares (0, 2/3, 1/3) / (1/3): sums to |M_i| = 3
    np.testing.assert_allclose(sh.pdsl_weights(phi_hat, omega, divide_by_omega=False), [0, 2 / 3, 1 / 3])
    np.testing.assert_allclose(sh.pdsl_weights(phi_hat, omega, False, share_floor=0.5), [1 / 6, 1 / 2, 1 / 3])


# -- DP-CGA's dual QP ------------------------------------------------------------------------------
def test_cga_dual_qp_closed_form_and_kkt():
    from netsim.algorithms.dp_cga import project_dual

    g = np.array([1.0, -2.0, 0.5])
    G = np.array([[0.5, 1.0, 0.0]])
    P, c = float(G[0] @ G[0]), float(G[0] @ g)
    assert project_dual(G, g, margin=0.5)[0] == pytest.approx(max(0.5, -c / P), abs=1e-9)
    assert project_dual(G, g, margin=0.0)[0] == pytest.approx(max(0.0, -c / P), abs=1e-9)
    rng = np.random.default_rng(0)
    for _ in range(20):
        G, g = rng.normal(size=(3, 12)), rng.normal(size=12)
        v = project_dual(G, g, margin=0.5)
        grad = G @ G.T @ v + G @ g
        assert (v >= 0.5 - 1e-9).all()
        free = v > 0.5 + 1e-7
        np.testing.assert_allclose(grad[free], 0.0, atol=1e-7)   # KKT: stationary where not at the bound
        assert (grad[~free] >= -1e-7).all()                      # and pushing into the bound elsewhere


def test_parameter_slices_follow_the_module_parameters():
    from netsim.algorithms.dp_cga import parameter_slices
    from netsim.compute.models import MLP, mlp_module

    m = MLP(6, 3, (4,))
    sl = parameter_slices(m)
    assert [s.stop - s.start for s in sl] == [p.numel() for p in mlp_module([6, 4, 3]).parameters()]
    assert sl[-1].stop == sum(p.numel() for p in mlp_module([6, 4, 3]).parameters())


def test_muffliato_default_gossip_steps():
    from netsim.algorithms.muffliato import default_gossip_steps
    from netsim.scenario.schema import TopologySpec
    from netsim.sim.topology import spectral_gap, weighted_graph

    _, W = weighted_graph(TopologySpec(kind="ring"), 10, 0)
    assert default_gossip_steps(spectral_gap(W)) == 3   # 3 on the 10-ring
    assert default_gossip_steps(1.0) == 1               # complete graph (lambda = 0)


# -- whole runs ------------------------------------------------------------------------------------
SIGMA = 0.05


def pdsl_scenario(name: str = "pdsl", seed: int = 1, until: float = 4.0, **params) -> dict:
    return merge(BASE, {
        "run": {"seed": seed, "until": until},
        "agents": {"count": 6},
        "data": {"samples": 900, "features": 5, "validation": 60},
        "algorithm": {"name": name, "lr": 0.1, "batch": 16, "round_timeout": 0.1, "sigma": SIGMA, **params},
        "evaluation": {"every": 2.0},
    })


@pytest.fixture(scope="module")
def pdsl_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pdsl")
    res = run(scenario_from_dict(pdsl_scenario()), out=folder)
    return folder, res, read_trace(folder).table.to_pandas()


def test_noise_exactly_on_own_and_cross_gradients(pdsl_run):
    _, _, t = pdsl_run
    rel = t[t.kind == "release"]
    assert set(rel.value) == {SIGMA}
    what = rel.tag.str.split(" ").str[1]
    assert set(what) == {"gradient", "cross_gradient"}  # nothing else (models, momenta) is noised
    assert (rel.tag.str.contains("s=2.0 ")).all()        # batch clipping: sensitivity 2C (eqs. 10, 13)
    rounds = sorted(set(t[t.kind == "shapley"]["round"]))
    for (agent, rnd), grp in rel.groupby(["agent", "round"]):
        if rnd not in rounds:
            continue
        own = grp[what[grp.index] == "gradient"]
        cross = grp[what[grp.index] == "cross_gradient"]
        assert len(own) == 1 and own.peer.iloc[0] == -1       # eq. (11): one own noisy gradient
        assert sorted(cross.peer) == sorted({(agent - 1) % 6, (agent + 1) % 6})  # eq. (14): one per neighbour


def test_shapley_weights_logged_and_normalised(pdsl_run):
    _, _, t = pdsl_run
    s = t[t.kind == "shapley"].copy()
    assert len(s) > 0
    s["hat"] = s.tag.str.extract(r"hat=(\S+)")[0].astype(float)
    omega = 1 / 3  # Metropolis weights on a ring
    for _, grp in s.groupby(["agent", "round"]):
        assert len(grp) == 3                                   # the closed neighbourhood M_i
        assert (grp.value * omega).sum() == pytest.approx(1.0)  # eq. (20): shares sum to 1
        assert grp.hat.max() == 1.0
        assert grp.hat.min() == 0.0 or (grp.hat == 1.0).all()  # eq. (19) with guard A4


def test_coalitions_of_all_agents_in_one_batched_evaluation():
    sc = scenario_from_dict(pdsl_scenario())
    sim = prepare(sc)
    sim.run()
    svc = sim.services.find(("lookahead", "pdsl.coalitions")).evaluate
    rounds = int(min(a.round for a in sim.agents)) - 1
    assert svc.models >= 7 * 6 * rounds            # 7 coalitions per agent and round (exact, |M_i| = 3)
    assert svc.models / svc.calls == pytest.approx(42, rel=0.1)  # the 6 agents' 7 coalitions per call


def test_same_seed_same_trace(tmp_path):
    for name in ("pdsl", "dp_cga"):
        a, b = tmp_path / f"{name}a", tmp_path / f"{name}b"
        run(scenario_from_dict(pdsl_scenario(name, until=2.0)), out=a)
        run(scenario_from_dict(pdsl_scenario(name, until=2.0)), out=b)
        assert (a / "trace.arrows").read_bytes() == (b / "trace.arrows").read_bytes()


@pytest.mark.parametrize("name", ["dp_cga", "muffliato", "dp_netfleet"])
def test_baselines_learn_and_release_noisy_gradients_only(tmp_path, name):
    res = run(scenario_from_dict(pdsl_scenario(name, until=6.0)), out=tmp_path)
    t = read_trace(tmp_path).table.to_pandas()
    rel = t[t.kind == "release"]
    assert len(rel) > 0 and set(rel.value) == {SIGMA}
    assert set(rel.tag.str.split(" ").str[1]) <= {"gradient", "cross_gradient"}
    assert res.summary["accuracy"] > 0.8


def test_pdsl_needs_validation_set_and_undirected_graph():
    d = pdsl_scenario()
    d["data"].pop("validation")
    with pytest.raises(InputError, match="data.validation"):
        prepare(scenario_from_dict(d))  # before the run: nothing is written
    d = merge(pdsl_scenario(), {"topology": {"directed": True, "mixing": "column_stochastic"}})
    with pytest.raises(InputError, match="undirected"):
        prepare(scenario_from_dict(d))


def test_validation_split_is_disjoint_and_seeded():
    sim = prepare(scenario_from_dict(pdsl_scenario()))
    held_out = len(sim.data.y_test) + len(sim.data.y_val)
    assert sim.X_val.shape[0] == 60 and sim.X_test.shape[0] == held_out - 60
    rows = {tuple(r.tolist()) for r in sim.X_test}
    assert not any(tuple(r.tolist()) in rows for r in sim.X_val)
    again = prepare(scenario_from_dict(pdsl_scenario()))
    assert torch.equal(again.X_val, sim.X_val)


def test_calibration_modes():
    from netsim.algorithms.pdsl import PDSLParams, resolve_sigma
    from netsim.privacy import closed_forms as cf

    sim = prepare(scenario_from_dict(pdsl_scenario()))
    a = sim.agents[0]
    assert resolve_sigma(a, PDSLParams(epsilon=0.3)) == pytest.approx(0.01)  # 0.003 C / eps (A6)
    pm = resolve_sigma(a, PDSLParams(epsilon=0.3, calibration="per_message_gaussian"))
    assert pm == pytest.approx(2 * math.sqrt(2 * math.log(1.25e5)) / 0.3)   # sigma/C = 32 at eps 0.3
    t1 = resolve_sigma(a, PDSLParams(epsilon=0.3, calibration="theorem1"))
    bound = cf.pdsl_theorem1_sigma(sim.W.toarray(), 0.3, 1e-5, 1.0, strict=False)
    assert t1 == pytest.approx(bound.sigma_over_C)
    assert t1 * 0.3 == pytest.approx(67, rel=0.01)  # Theorem 1 on the ring: sigma/C >= 67/eps


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    import tomli_w
    from typer.testing import CliRunner

    from netsim.cli import app

    d = pdsl_scenario()
    d["data"].pop("validation")
    f = tmp_path / "bad.toml"
    f.write_text(tomli_w.dumps({k: v for k, v in d.items() if k != "name"}))
    res = CliRunner().invoke(app, ["run", "-q", str(f), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "data.validation" in lines[0] and "bad.toml" in lines[0]
    assert not (tmp_path / "out").exists()


def test_privacy_report_pdsl_closed_form(tmp_path):
    """Thm 1's per-round epsilon from the ledger: one classical Gaussian release of sensitivity 2C each;
    basic composition over the 1 + deg releases per round (the own gradient and one per neighbour)."""
    from netsim.privacy.report import privacy_report

    d = merge(pdsl_scenario(until=2.0), {"privacy": {"closed_form": "pdsl", "delta0": 1e-5}})
    run(scenario_from_dict(d), out=tmp_path)
    rep = privacy_report(tmp_path, pld=False, plot=False)
    eps_msg = 2.0 * math.sqrt(2 * math.log(1.25e5)) / SIGMA
    for row in rep["agents"]:
        form = row["closed_form"]
        assert form["paper"] == pytest.approx(eps_msg)
        assert form["conservative"] == pytest.approx(row["releases"] * eps_msg)
        assert row["releases"] % 3 == 0 and row["releases"] > 0


def test_random_activation_drops_missing_players_and_keeps_learning(tmp_path):
    """Outside the paper: an inactive neighbour's cross-gradient never comes, so it leaves
    the round's game; clock round tags keep agents that skipped a tick in step."""
    d = merge(pdsl_scenario(until=8.0, round_from="clock"),
              {"agents": {"activation": {"kind": "bernoulli", "period": 0.5, "p": 0.7}}})
    res = run(scenario_from_dict(d), out=tmp_path)
    s = read_trace(tmp_path).table.to_pandas()
    s = s[s.kind == "shapley"]
    sizes = s.groupby(["agent", "round"]).size()
    assert sizes.max() == 3 and sizes.min() < 3            # full games and games with dropped players
    assert res.summary["stop_reason"] == "until" and res.summary["accuracy"] > 0.8
