"""LDP online learning (Chen & Wang): Algorithm 1 against a reference implementation of its
stacked recursion, special cases, where the Laplace noise is, projection, the budget against the
closed form on the run's own releases, the theta*_t oracle, streaming partitions, async and lossy runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from netsim.algorithms.ldp_online import project
from netsim.api import prepare, run
from netsim.compute.data import partition
from netsim.compute.streaming import HistoryStream, TrackingOracle
from netsim.errors import InputError
from netsim.privacy import closed_forms as cf
from netsim.privacy.ledger import releases_from_table
from netsim.privacy.report import privacy_report
from netsim.scenario import scenario_from_dict
from netsim.sim.streams import Streams
from netsim.trace.io import read_trace
from tests.conftest import BASE, merge

M, D, T = 5, 4, 30  # learners, features (model size D + 1 with the bias), steps
W = 0.3
C = 2.0


def scen(alg: dict, **extra) -> dict:
    base = merge(BASE, {
        "run": {"seed": 5, "rounds": T, "until": T + 5.0},
        "agents": {"count": M, "compute_time": {"kind": "constant", "value": 0.0},
                   "activation": {"kind": "periodic", "period": 1.0}},
        "data": {"samples": 300, "features": D, "partition": "label"},
        "model": {"kind": "logistic", "l2": 1.0, "dtype": "float64"},
        "algorithm": {"name": "ldp_online", "w": W, "C": C, "round_timeout": 0.5, **alg},
        "privacy": {"closed_form": "ldp_online"},
        "evaluation": {"every": 10.0, "metrics": ["loss", "accuracy", "tracking"]},
    })
    return merge(base, extra)


def go(tmp_path, d: dict, name: str = "r"):
    folder = tmp_path / name
    res = run(scenario_from_dict(d), out=folder)
    return folder, res


def reference(d: dict, gamma_const: float | None = None, couple: bool = True) -> np.ndarray:
    """Noise-free Alg 1 in stacked form (Sec. II: theta_{t+1} = (I + gamma_t W) theta_t - lambda_t d_t),
    in numpy from the same data, partition, initial draws and streams."""
    sim = prepare(scenario_from_dict(d))
    a = d["algorithm"]
    bias = d["model"].get("bias", True)  # an unpenalised intercept, last; or exactly D coordinates
    X = sim.data.X.astype(np.float64)
    X = np.hstack([X, np.ones((len(X), 1))]) if bias else X
    y = sim.data.y.astype(np.float64)
    st = Streams(d["run"]["seed"])
    theta = np.stack([st.rng("algorithm", i).normal(0.0, 1.0, X.shape[1]) for i in range(M)])
    hist = [HistoryStream(sim.data.parts[i], st.rng("data_stream", i), 1) for i in range(M)]
    reg = np.r_[np.full(D, d["model"]["l2"]), 0.0] if bias else np.full(D, d["model"]["l2"])
    for k in range(d["run"]["rounds"]):
        for h in hist:
            h.next()
        g = np.stack([(X[h.history].T @ (1 / (1 + np.exp(-X[h.history] @ th)) - y[h.history])) / h.n
                      + reg * th for h, th in zip(hist, theta, strict=True)])
        lam = a.get("lam0", 1.0) / (k + 1) ** a.get("v", 0.77)
        gam = gamma_const if gamma_const is not None else a.get("gam0", 1.0) / (k + 1) ** a.get("u", 0.65)
        new = theta.copy()
        for i in range(M):
            nb = [(i - 1) % M, (i + 1) % M]
            coupling = sum(W * (theta[j] - theta[i]) for j in nb) if couple else 0.0
            new[i] = theta[i] + gam * coupling - lam * g[i]
        theta = new
    return theta


def run_params(d: dict):
    sim = prepare(scenario_from_dict(d))
    sim.run()
    return sim.bank.W.cpu().numpy().copy(), sim


# --- Algorithm 1 = its stacked recursion; special cases ---------------------------------------------
def test_noise_free_alg1_equals_stacked_reference():
    """Exact up to float64 rounding: same streams, same order of operations apart from summation."""
    d = scen({"noise": False})
    got, _ = run_params(d)
    np.testing.assert_allclose(got, reference(d), rtol=0, atol=1e-10)


def test_noise_free_alg1_without_intercept_equals_stacked_reference(tmp_path):
    """model.bias = false (the paper's model): exactly D parameters, the same recursion without the
    intercept column, and the oracle theta*_t solves that model (its tracking numbers are finite)."""
    d = scen({"noise": False}, model={"bias": False})
    got, sim = run_params(d)
    assert got.shape == (M, D)
    np.testing.assert_allclose(got, reference(d), rtol=0, atol=1e-10)
    assert all(math.isfinite(r["tracking_mse"]) for r in sim.metrics[1:])


def test_alg1_without_noise_and_coupling_decay_is_dsgd():
    """u = 0, gamma_0 = 1, no noise, and one row per learner (so the history-averaged gradient is the
    newest sample's gradient) -> DSGD (B1) exactly, to float tolerance (the history mean of t+1
    identical gradients is computed as a sum / (t+1), which rounds)."""
    one_row = {"data": {"samples": 6, "test_fraction": 0.2, "partition": "iid"}}
    common = {"noise": False, "u": 0.0, "gam0": 1.0, "check_conditions": False}
    a, _ = run_params(scen(common, **one_row))
    b, _ = run_params(scen({"name": "ldp_dsgd", **common}, **one_row))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def dola_reference(d: dict, shift: int) -> np.ndarray:
    """Noise-free DOLA (Li et al., Alg. 1) in numpy: b = (I + W) w, w <- b - alpha_{t+shift} grad l(b, xi_t)
    on the newest sample, alpha_s = alpha0/(s+1); same data, initial draws and streams as the run."""
    sim = prepare(scenario_from_dict(d))
    X = np.hstack([sim.data.X.astype(np.float64), np.ones((len(sim.data.X), 1))])
    y = sim.data.y.astype(np.float64)
    st = Streams(d["run"]["seed"])
    w = np.stack([st.rng("algorithm", i).normal(0.0, 1.0, D + 1) for i in range(M)])
    hist = [HistoryStream(sim.data.parts[i], st.rng("data_stream", i), 1) for i in range(M)]
    reg = np.r_[np.full(D, d["model"]["l2"]), 0.0]
    alpha0 = d["algorithm"]["alpha0"]
    for k in range(d["run"]["rounds"]):
        new = [h.next() for h in hist]
        b = np.stack([(1 - 2 * W) * w[i] + W * (w[(i - 1) % M] + w[(i + 1) % M]) for i in range(M)])
        g = np.stack([X[r].T @ (1 / (1 + np.exp(-X[r] @ bi)) - y[r]) / len(r) + reg * bi
                      for r, bi in zip(new, b, strict=True)])
        w = b - alpha0 / (k + shift + 1) * g
    return w


@pytest.mark.parametrize("step_index, shift", [("t+1", 1), ("t", 0)])
def test_dola_step_index_convention(step_index, shift):
    """step_index = 't+1' takes w_{t+1} = b_t - alpha_{t+1} grad (DOLA's Alg. 1, the default), 't' takes
    alpha_t: each equals its numpy recursion, and the two differ."""
    d = scen({"name": "dola", "alpha0": 0.8, "noise0": 0.0, "step_index": step_index})
    got, _ = run_params(d)
    np.testing.assert_allclose(got, dola_reference(d, shift), rtol=0, atol=1e-10)
    assert np.abs(dola_reference(d, 1 - shift) - got).max() > 1e-3


def test_dola_default_step_index_is_t_plus_1():
    from netsim.algorithms.ldp_online import DOLAParams

    assert DOLAParams().step_index == "t+1"


@pytest.mark.parametrize("step_index, shift", [("t+1", 1), ("t", 0)])
def test_dola_sensitivity_follows_the_step_that_made_the_release(tmp_path, step_index, shift):
    """The release of w_t records sqrt(n) C alpha_s of the step that produced it: alpha_t = alpha0/(t+1)
    with 't+1', alpha_{t-1} = alpha0/t with 't'; the Laplace scale is noise0/(t+1) either way."""
    alpha0, noise0, n = 0.8, 0.5, D + 1
    folder, _ = go(tmp_path, scen({"name": "dola", "alpha0": alpha0, "noise0": noise0,
                                   "step_index": step_index}))
    rel = releases_from_table(read_trace(folder).table)
    for i in range(M):
        steps = [r.round - 1 for r in rel[i]]  # agent round r = step t + 1
        assert steps == list(range(1, T))
        want = [math.sqrt(n) * C * alpha0 / (t - 1 + shift + 1) for t in steps]
        np.testing.assert_allclose([r.sensitivity for r in rel[i]], want, rtol=1e-12)
        np.testing.assert_allclose([r.scale for r in rel[i]], [noise0 / (t + 1) for t in steps], rtol=1e-12)


# --- where the noise is -----------------------------------------------------------------------------
def test_laplace_releases_where_the_paper_puts_them(tmp_path):
    """One public Laplace release of the state per learner per step t >= 1 (step 3: one draw shared by
    all outgoing copies), scale (sigma / sqrt 2)(t+1)^varsigma_i growing, varsigma_i = 0.1 + 0.01 i."""
    sigma = 1.3
    folder, _ = go(tmp_path, scen({"sigma": sigma}))
    table = read_trace(folder).table
    rel = releases_from_table(table)
    sends = table.filter(np.array(table["kind"].to_pylist()) == "send")
    assert len(sends) == 2 * M * T  # ring: 2 copies of each broadcast
    for i in range(M):
        rs = rel[i]
        assert [r.round for r in rs] == list(range(2, T + 1))  # agent rounds 2..T = steps t = 1..T-1
        assert {(r.mechanism, r.what, r.peer) for r in rs} == {("laplace", "model", -1)}
        want = [sigma / math.sqrt(2) * (t + 1) ** (0.1 + 0.01 * i) for t in range(1, T)]
        np.testing.assert_allclose([r.scale for r in rs], want, rtol=1e-12)
        assert all(b > a for a, b in zip(want, want[1:], strict=False))


def test_own_state_stays_clean_noise_enters_only_through_neighbours():
    """Step 6 uses the learner's own clean theta_t: with every message lost the noisy run equals the
    noise-free, uncoupled recursion exactly."""
    lost = {"network": {"loss": 0.999999999}}
    got, sim = run_params(scen({"sigma": 5.0}, **lost))
    assert sum(len(a.ledger.releases) for a in sim.agents) == M * (T - 1)  # noise was drawn
    np.testing.assert_allclose(got, reference(scen({"noise": False}), couple=False), rtol=0, atol=1e-10)
    noisy, _ = run_params(scen({"sigma": 5.0}))
    assert np.abs(noisy - reference(scen({"noise": False}))).max() > 1e-3  # and, delivered, it matters


def test_broadcast_noise_is_laplace_with_the_recorded_scale(monkeypatch):
    """The value neighbours receive minus the sender's state is Lap(rho_t) (KS test on all draws)."""
    from netsim.algorithms import ldp_online as mod

    seen = []
    real = mod.release_rows

    def spy(b, x, scales, sens):
        out = real(b, x, scales, sens)
        if b.k >= 1:
            seen.append(((b.stack(out) - x) / torch.tensor(scales, dtype=x.dtype)[:, None]).cpu().numpy().ravel())
        return out

    monkeypatch.setattr(mod, "release_rows", spy)
    run_params(scen({"sigma": 2.0}))
    z = np.concatenate(seen)
    assert stats.kstest(z, stats.laplace.cdf).pvalue > 1e-3


# --- projection -------------------------------------------------------------------------------------
def test_projection_keeps_iterates_in_the_ball():
    x = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert torch.allclose(project(x, 1.0), torch.tensor([0.6, 0.8], dtype=torch.float64))
    assert project(x, 10.0) is x
    R = 0.2
    for name in ("ldp_online", "ldp_dsgd", "dola", "pdop"):
        alg = {"name": name, "radius": R, "init_std": 3.0}
        sim = prepare(scenario_from_dict(scen(alg)))
        norms: list[float] = []
        orig = sim.bank.set

        def spy(i, value, orig=orig, norms=norms):
            norms.append(float(torch.linalg.vector_norm(value)))
            orig(i, value)

        sim.bank.set = spy
        sim.run()
        assert len(norms) == M * (T + 1)  # the initial draw, then every step
        assert max(norms[M:]) <= R * (1 + 1e-12), name


# --- the budget on the run's own releases -----------------------------------------------------------
def test_cumulative_budget_matches_closed_form(tmp_path):
    """netsim privacy's Lemma 2 sum over the releases = closed_forms.ldp_budget (recursion 22, L = 0,
    wbar = 2w on the ring) for Alg 1, mode 'dsgd' for B1, eps_step (T-1) for DOLA."""
    sigma, n = 1.7, D + 1
    for name, extra in (("ldp_online", {"sigma": sigma}), ("ldp_dsgd", {"sigma": sigma}),
                        ("dola", {"noise0": 0.5, "alpha0": 0.8})):
        folder, res = go(tmp_path, scen({"name": name, **extra}), name)
        rep = privacy_report(folder, pld=False, plot=False)
        for row in rep["agents"]:
            i = row["agent"]
            got = row["closed_form"]["paper"]
            if name == "dola":
                want = (T - 1) * math.sqrt(n) * C * 0.8 / 0.5
            else:
                want = cf.ldp_budget(T - 1, n, C, 2 * W, sigma, 0.1 + 0.01 * i,
                                     mode="recursion" if name == "ldp_online" else "dsgd").epsilon
            assert got == pytest.approx(want, rel=1e-12), (name, i)
            assert row["rdp_observed"] is not None  # the accountant's number is reported beside it
        assert res.summary["privacy_epsilon_max"] > 0


def test_alg1_budget_levels_off_baselines_grow():
    """The closed forms behind the claim (mushrooms sizes): Alg 1 saturates, DSGD keeps growing."""
    n, Cm = 112, 2 * math.sqrt(21)
    a = [cf.ldp_budget(T_, n, Cm, 0.6, math.sqrt(2), 0.1).epsilon for T_ in (2000, 20000, 200000)]
    b = [cf.ldp_budget(T_, n, Cm, 0.6, math.sqrt(2), 0.1, mode="dsgd").epsilon
         for T_ in (2000, 20000, 200000)]
    # increments per decade shrink like 10^-(v - u + varsigma) = 10^-0.22 (eq. 25: a convergent series)
    assert a[2] - a[1] < 0.7 * (a[1] - a[0]) and a[2] < 1.1 * a[0]
    assert b[2] - b[1] > b[1] - b[0] > 0 and b[2] > 2 * b[0]


def test_mushrooms_scenario_is_the_papers_setting():
    """The shipped mushrooms scenario: no intercept (n = 112), C = 2 sqrt 21, all rows streamed, the
    label split, T = 2000, tracking as the headline; its worst learner's Lemma-2 budget over the 1999
    data-dependent releases (t = 1..T-1) is 1140.8, the independent value 1141."""
    from pathlib import Path

    from netsim.scenario import load_scenario

    root = Path(__file__).resolve().parents[1] / "scenarios"
    sc = load_scenario(root / "ldp_online_cheapest.toml")
    assert sc.model.bias is False and sc.model.kind == "logistic" and sc.model.l2 == 1.0
    assert sc.data.partition == "label" and sc.data.test_path == sc.data.path
    assert sc.run.rounds == 2000 and sc.evaluation.headline == "tracking_mse"
    assert sc.algorithm.params["C"] == pytest.approx(2 * math.sqrt(21))
    eps = max(cf.ldp_budget(1999, 112, 2 * math.sqrt(21), 0.6, math.sqrt(2), 0.1 + 0.01 * i).epsilon
              for i in range(5))
    assert eps == pytest.approx(1140.79, abs=0.01)
    for name in ("dsgd", "dola", "pdop", "dsgd_eq", "dola_eq"):
        other = load_scenario(root / f"ldp_online_cheapest_{name}.toml")
        assert other.model == sc.model and other.data == sc.data and other.network == sc.network, name


def test_drops_weaken_contraction_and_raise_epsilon(tmp_path):
    """A missing neighbour's term is skipped, so the realised |w_ii| is smaller and the recorded
    sensitivity (eq. 22 with that weight) can only grow."""
    f0, _ = go(tmp_path, scen({}), "clean")
    f1, _ = go(tmp_path, scen({}, network={"loss": 0.5}), "lossy")
    r0 = releases_from_table(read_trace(f0).table)
    r1 = releases_from_table(read_trace(f1).table)
    for i in range(M):
        s0 = [r.sensitivity for r in r0[i]]
        s1 = [r.sensitivity for r in r1[i]]
        assert all(b >= a * (1 - 1e-12) for a, b in zip(s0, s1, strict=True))
        assert s1[-1] > s0[-1]


# --- asynchronous activation, lossy and delayed links; determinism ----------------------------------
@pytest.mark.parametrize("name", ["ldp_online", "ldp_dsgd", "dola", "pdop"])
def test_runs_async_lossy_delayed_and_deterministic(tmp_path, name):
    d = scen({"name": name, "exchange": "async"},
             run={"rounds": None, "until": 25.0},
             agents={"activation": {"kind": "poisson", "rate": 1.0},
                     "compute_time": {"kind": "exponential", "mean": 0.05}},
             network={"loss": 0.2, "latency": {"kind": "exponential", "mean": 0.3}})
    d["run"].pop("rounds")
    f1, r1 = go(tmp_path, d, "a")
    f2, _ = go(tmp_path, d, "b")
    assert (f1 / "trace.arrows").read_bytes() == (f2 / "trace.arrows").read_bytes()
    assert r1.summary["messages_dropped"] > 0 and r1.summary["privacy_releases"] > 0
    assert math.isfinite(r1.metrics[-1]["tracking_mse"])


def test_alg1_schedule_conditions_are_checked():
    d = scen({"u": 0.6})  # max varsigma = 0.14 + 1/2 > 0.6: eq. (4) fails
    with pytest.raises(InputError, match="eq. 4"):
        prepare(scenario_from_dict(d))


# --- the theta*_t oracle and the streams --------------------------------------------------------------
def test_oracle_matches_sklearn_weighted_logistic_regression():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 6))
    y = (X @ rng.normal(size=6) + rng.normal(size=120) > 0).astype(np.int64)
    hist = [rng.integers(0, 60, 40), rng.integers(60, 120, 25)]
    o = TrackingOracle(X, y, l2=0.3, m=2)
    w = o.weights(hist)
    assert w.sum() == pytest.approx(1.0)
    rows = np.flatnonzero(w)
    star = o.solve(rows, w[rows])
    ref = LogisticRegression(C=1 / 0.3, tol=1e-12, max_iter=10000)
    ref.fit(X[rows], y[rows], sample_weight=w[rows])
    np.testing.assert_allclose(star, np.r_[ref.coef_[0], ref.intercept_], atol=1e-5)
    # without an intercept (the paper's model): exactly d coordinates, all penalised
    o = TrackingOracle(X, y, l2=0.3, m=2, bias=False)
    star = o.solve(rows, w[rows])
    ref = LogisticRegression(C=1 / 0.3, tol=1e-12, max_iter=10000, fit_intercept=False)
    ref.fit(X[rows], y[rows], sample_weight=w[rows])
    assert star.shape == (6,)
    np.testing.assert_allclose(star, ref.coef_[0], atol=1e-5)


def test_history_stream_is_iid_from_own_pool_and_append_only():
    pool = np.arange(10, 20)
    s = HistoryStream(pool, np.random.default_rng(1), per_round=3)
    first = s.next().copy()
    view = s.history
    for _ in range(100):
        s.next()
    assert s.n == 303 and np.array_equal(view, first) and np.isin(s.history, pool).all()
    assert stats.chisquare(np.bincount(s.history - 10)).pvalue > 1e-3


def test_tracking_falls_in_a_noise_free_run(tmp_path):
    """Without noise and label skew the learners track theta*_t ever closer (Thm 1's rate)."""
    _, res = go(tmp_path, scen({"noise": False}, run={"rounds": 80, "until": 85.0},
                               data={"partition": "iid"}))
    m = [r["tracking_mse"] for r in res.metrics if not math.isnan(r["tracking_mse"])]
    assert max(m[len(m) // 2:]) < 0.75 * m[0] and m[-1] < 0.5 * m[0], m


def test_label_partitions():
    y = np.array([0] * 30 + [1] * 40)
    parts = partition(y, 5, "label", 0.5, np.random.default_rng(0))
    assert [set(y[p]) for p in parts] == [{0}, {0}, {0}, {1}, {1}]
    assert [len(p) for p in parts] == [10, 10, 10, 20, 20]
    y = np.repeat(np.arange(10), 100)
    parts = partition(y, 5, "label_share", 0.5, np.random.default_rng(0), share=0.4)
    counts = np.stack([np.bincount(y[p], minlength=10) for p in parts])
    assert counts[0, 0] == 40 and counts[1, 0] == 15 and counts[0, 5] == 40
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    with pytest.raises(InputError, match="without rows"):
        partition(np.array([0, 0, 0]), 3, "label_share", 0.5, np.random.default_rng(0), share=1.0)
