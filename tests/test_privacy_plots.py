"""The plots a private-learning paper needs: privacy.png (every agent's epsilon over time, the worst agent
highlighted, the paper's closed form overlaid, labelled) and a sweep's privacy-utility plot (final accuracy
against the accountant's epsilon, mean +- std over seeds, one line per method). Checked on the data
behind each figure and on its labels, never on pixels."""

from __future__ import annotations

import csv
import math
import statistics

import pytest
import tomli_w
import tomllib

from netsim.api import run
from netsim.privacy.accountants import epsilon_curve
from netsim.privacy.ledger import releases_from_table
from netsim.privacy.report import closed_form, epsilon_figure, epsilon_series, privacy_report
from netsim.scenario.load import load_scenario
from netsim.trace.io import read_trace
from tests.conftest import ROOT

SWEEP = ROOT / "scenarios" / "privacy_utility_sweep.toml"


@pytest.fixture(scope="module")
def private_run(tmp_path_factory):
    """DP-D-PSGD with Bernoulli activation and DO-ADP's closed form named, capped."""
    folder = tmp_path_factory.mktemp("pplot")
    sc = load_scenario(ROOT / "scenarios" / "privacy_activation.toml",
                       {"run.until": 5.0, "agents.count": 6, "privacy.epsilon_cap": 5.0})
    run(sc, out=folder)
    return folder, sc


def test_privacy_series_are_the_accountants_curves_and_the_closed_form(private_run):
    folder, sc = private_run
    rel = releases_from_table(read_trace(folder).table)
    s = epsilon_series(rel, 1e-5, "observed", sc.privacy)
    assert sorted(s["curves"]) == sorted(i for i, rs in rel.items() if rs) and len(s["curves"]) == 6
    for i, (t, e) in s["curves"].items():
        assert (t, e) == epsilon_curve(rel[i], 1e-5, "observed")
    finals = {i: e[-1] for i, (_, e) in s["curves"].items()}
    assert s["worst"] == max(finals, key=finals.get)
    closed = s["closed"]
    assert closed["name"] == "do_adp" and closed["paper_name"].startswith("Huo, Liu, Ding")
    worst = rel[s["worst"]]
    assert len(closed["t"]) >= 3
    for t, paper, conservative in zip(closed["t"], closed["paper"], closed["conservative"], strict=True):
        k = max(j for j, r in enumerate(worst) if r.t == t)
        form = closed_form("do_adp", worst[:k + 1], sc.privacy, 1e-5)
        assert (paper, conservative) == (form["paper"], form["conservative"])
    for t, paper in zip(closed["t"], closed["paper"], strict=True):  # the paper's curve stops where its bound
        if paper is None:                                                # turns vacuous (delta_hat > 1)
            assert closed["blank"]["t"] <= t and "vacuous" in closed["blank"]["reason"]
    assert s["cap"] == 5.0
    none = epsilon_series(rel, 1e-5, "observed", None)
    assert none["closed"] is None and none["cap"] is None


def test_privacy_figure_is_labelled_with_the_worst_agent_highlighted(private_run):
    import matplotlib.pyplot as plt

    folder, sc = private_run
    rel = releases_from_table(read_trace(folder).table)
    s = epsilon_series(rel, 1e-5, "observed", sc.privacy)
    fig = epsilon_figure(s, "privacy_activation")
    try:
        ax = fig.axes[0]
        assert ax.get_title().startswith("privacy_activation: privacy spent per agent")
        assert "RDP accountant, observed accounting" in ax.get_title()
        # the paper's curve is at its own delta (delta_hat = sqrt(S), growing): the axis and legend say so
        assert ax.get_xlabel() == "simulated time (s)"
        assert ax.get_ylabel() == "epsilon at delta = 1e-05\n(dashed: at the delta in the legend)"
        lo, hi = s["closed"]["delta_paper_range"]
        assert 1e-5 < lo < hi < 1 and s["closed"]["delta_conservative_range"] == (1e-5, 1e-5)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        worst_eps = s["curves"][s["worst"]][1][-1]
        assert legend[0] == "other agents (5)"
        assert f"worst agent: {s['worst']} (epsilon {worst_eps:.3g})" in legend
        own = f"at the paper's own delta ({lo:.2g} to {hi:.2g})"
        assert f"closed form (Huo et al.), agent {s['worst']}, {own}" in legend
        assert "the same, conservative" in legend  # at the axis's delta: nothing to add
        assert "budget cap 5" in legend
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        red = lines[f"worst agent: {s['worst']} (epsilon {worst_eps:.3g})"]
        assert list(red.get_ydata()) == s["curves"][s["worst"]][1]
        assert red.get_linewidth() > max(ln.get_linewidth() for ln in ax.get_lines() if ln is not red)
        assert len(ax.get_lines()) == 6 + 2 + 1  # agents, closed form (paper, conservative), cap
    finally:
        plt.close(fig)
    fig = epsilon_figure(epsilon_series(rel, 1e-5, "observed", None))
    try:  # every curve at the axis's delta: the plain label
        assert fig.axes[0].get_ylabel() == "epsilon at delta = 1e-05"
    finally:
        plt.close(fig)
    rep = privacy_report(folder, pld=False)
    assert rep["plot"] == "privacy.png" and (folder / "privacy.png").stat().st_size > 10_000


def test_the_privacy_utility_sweep_is_two_methods_over_four_budgets_three_seeds():
    from netsim.sweep import load_sweep, noise_keys

    sw = load_sweep(SWEEP)
    assert len(sw.tasks) == 2 * 4 * 3
    assert noise_keys(sw.swept) == ["algorithm.epsilon"]
    assert sorted({(c["algorithm.name"], c["algorithm.epsilon"]) for c in sw.configs}) == sorted(
        (m, e) for m in ("dp_dpsgd", "pdsl") for e in (0.1, 0.3, 1.0, 3.0))


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory):
    """The shipped sweep with fewer budgets, seeds and rounds (the full one: test_privacy_utility_full)."""
    from netsim.sweep import run_sweep

    tmp = tmp_path_factory.mktemp("pu")
    spec = tomllib.loads(SWEEP.read_text())
    spec.update(scenario=str(ROOT / "scenarios" / spec["scenario"]), seeds=2, out=str(tmp / "out"))
    spec["grid"]["algorithm.epsilon"] = [0.3, 3.0]
    spec["set"] = {"run.rounds": 8}
    (tmp / "pu.toml").write_text(tomli_w.dumps(spec))
    return run_sweep(tmp / "pu.toml")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def check_privacy_utility(res, budgets):
    """privacy_utility.csv against runs.csv: one row per (method, budget), the mean and sample std over
    seeds of the worst agent's epsilon and of the final accuracy; the plot beside it."""
    out = res.out
    assert (out / "privacy_utility.png").stat().st_size > 10_000
    assert out / "privacy_utility.png" in res.plots
    points = read_csv(out / "privacy_utility.csv")
    runs = read_csv(out / "runs.csv")
    assert {(p["method"], float(p["algorithm.epsilon"])) for p in points} == {
        (m, e) for m in ("dp_dpsgd", "pdsl") for e in budgets}
    for p in points:
        mine = [r for r in runs if r["algorithm.name"] == p["method"]
                and float(r["algorithm.epsilon"]) == float(p["algorithm.epsilon"])]
        assert len(mine) == int(p["seeds"]) >= 2
        for col, key in (("privacy_epsilon_max", "epsilon"), ("accuracy", "accuracy")):
            xs = [float(r[col]) for r in mine]
            assert float(p[f"{key}_mean"]) == pytest.approx(statistics.fmean(xs), rel=1e-12)
            assert float(p[f"{key}_std"]) == pytest.approx(statistics.stdev(xs), rel=1e-9, abs=1e-15)
    for m in ("dp_dpsgd", "pdsl"):  # one line per method, by epsilon; more budget, more epsilon spent
        eps = [float(p["epsilon_mean"]) for p in points if p["method"] == m]
        assert eps == sorted(eps) and eps[0] < eps[-1] and all(math.isfinite(e) and e > 0 for e in eps)
    dp = [p for p in points if p["method"] == "dp_dpsgd"]
    for p in dp:  # DP-D-PSGD's noise is calibrated by the same accountant to its budget for the run
        assert float(p["epsilon_mean"]) <= float(p["algorithm.epsilon"]) * (1 + 1e-6)


def test_a_sweep_over_epsilon_draws_accuracy_against_the_accountants_epsilon(small_sweep):
    import matplotlib

    matplotlib.use("Agg")
    check_privacy_utility(small_sweep, (0.3, 3.0))
    table = small_sweep.table.to_pylist()
    assert all(r["privacy_epsilon_max_mean"] > 0 for r in table)  # a private sweep reports epsilon by default


def test_the_privacy_utility_figure_names_the_accountant(small_sweep, monkeypatch):
    import matplotlib.pyplot as plt

    from netsim import sweep as sweep_mod

    captured = {}
    real = plt.subplots

    def keep(*a, **k):
        fig, ax = real(*a, **k)
        captured["ax"] = ax
        return fig, ax

    monkeypatch.setattr(plt, "subplots", keep)
    monkeypatch.setattr(plt, "close", lambda fig: None)
    points = [p for p in read_csv(small_sweep.out / "privacy_utility.csv")]
    for p in points:
        for k in ("epsilon_mean", "epsilon_std", "accuracy_mean", "accuracy_std"):
            p[k] = float(p[k])
    sw = sweep_mod.load_sweep(small_sweep.out.parent / "pu.toml")
    sweep_mod.plot_privacy_utility(sw, points, 1e-5)
    ax = captured["ax"]
    assert ax.get_xlabel() == ("epsilon of the worst agent (RDP accountant, observed accounting, "
                               "delta = 1e-05)")
    assert ax.get_ylabel() == "final accuracy (mean +- std over seeds)" and ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["dp_dpsgd", "pdsl"]
    plt.close("all")


def test_a_sweep_without_a_noise_level_draws_no_privacy_utility_plot():
    from netsim.sweep import noise_keys

    assert noise_keys(["algorithm.lr", "network.loss", "algorithm.name"]) == []
    assert noise_keys(["algorithm.sigma", "algorithm.noise_multiplier", "algorithm.sigma_per_eps",
                       "privacy.epsilon_cap"]) == ["algorithm.sigma", "algorithm.noise_multiplier",
                                                   "algorithm.sigma_per_eps", "privacy.epsilon_cap"]


@pytest.mark.slow
def test_privacy_utility_full(tmp_path):
    """``netsim sweep scenarios/privacy_utility_sweep.toml`` as shipped (24 runs)."""
    from netsim.sweep import run_sweep

    check_privacy_utility(run_sweep(SWEEP, out=tmp_path / "full"), (0.1, 0.3, 1.0, 3.0))
