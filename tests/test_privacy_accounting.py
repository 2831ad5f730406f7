"""Ledger -> trace -> accountant equals dp-accounting called directly on the equivalent event;
budget caps stop releases exactly at the budget; calibration inverts the accountant."""

from __future__ import annotations

import math

import attrs
import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from netsim.algorithms.registry import register
from netsim.api import run
from netsim.privacy.accountants import composed_event, epsilon
from netsim.privacy.calibration import gaussian_sigma, max_steps, noise_multiplier
from netsim.privacy.ledger import exhausted_from_table, releases_from_table
from netsim.privacy.mechanisms import PrivacyError
from netsim.scenario.structure import field
from netsim.trace.io import read_trace

DELTA = 1e-5
N_AGENTS = 101
SENS = 0.7  # an arbitrary sensitivity: the accountant must only see sigma / sensitivity


def _configs(n: int, seed: int = 2024) -> list[tuple[float, float, int]]:
    """(noise multiplier, q, steps) per agent: z in [0.6, 6], q log-uniform in [1e-3, 1] (a fifth at 1),
    steps in [1, 60] -- heterogeneous per-agent counts."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        z = float(rng.uniform(0.6, 6.0))
        q = 1.0 if rng.random() < 0.2 else float(10 ** rng.uniform(-3, 0))
        out.append((z, q, int(rng.integers(1, 61))))
    return out


CONFIGS = _configs(N_AGENTS)
PHASED = {0: [(2.5, 0.02, 7), (1.8, 0.1, 5), (2.5, 0.02, 3)]}  # agent 0: a heterogeneous sequence


@attrs.frozen
class ReleaserParams:
    mechanism: str = field("gaussian")


@register("test_privacy_releaser", ReleaserParams)
def releaser(agent, p: ReleaserParams):
    """Release exactly the configured schedule, one release per activation, then idle."""
    plan = PHASED.get(agent.id, [CONFIGS[agent.id]])
    for z, q, steps in plan:
        for _ in range(steps):
            yield agent.wake()
            agent.privatize(torch.zeros(3), sigma=z * SENS, sensitivity=SENS, q=q,
                            mechanism=p.mechanism)  # None once the budget cap refuses it
    yield agent.env.event()


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    from netsim.scenario import scenario_from_dict

    sc = scenario_from_dict({
        "name": "acc", "run": {"seed": 1, "until": 70.0},
        "agents": {"count": N_AGENTS, "compute_time": {"kind": "constant", "value": 0.0},
                   "activation": {"kind": "periodic", "period": 1.0}},
        "topology": {"kind": "ring"}, "data": {"samples": 2 * N_AGENTS + 40, "features": 2},
        "algorithm": {"name": "test_privacy_releaser"}, "evaluation": {"every": 200.0},
    })
    out = tmp_path_factory.mktemp("acc")
    run(sc, out=out)
    return releases_from_table(read_trace(out).table)


def _direct(z: float, q: float, steps: int, acc) -> float:
    ev = dp_accounting.GaussianDpEvent(z)
    if q < 1:
        ev = dp_accounting.PoissonSampledDpEvent(q, ev)
    acc.compose(ev, steps)
    return acc.get_epsilon(DELTA)


def test_trace_holds_every_release_exactly(releases):
    assert len(releases) == N_AGENTS
    for i in range(1, N_AGENTS):
        z, q, steps = CONFIGS[i]
        rs = releases[i]
        assert len(rs) == steps  # heterogeneous per-agent counts
        # bit-exact round trip through the trace's tag column
        assert all(r.scale == z * SENS and r.sensitivity == SENS and r.q == q for r in rs)
        assert all(r.mechanism == "gaussian" and r.what == "gradient" and r.size == 3 for r in rs)
        assert [r.round for r in rs] == list(range(1, steps + 1))


def test_rdp_equals_dp_accounting_on_100_random_configurations(releases):
    for i in range(1, N_AGENTS):
        z, q, steps = CONFIGS[i]
        ours = epsilon(releases[i], DELTA, "rdp")
        ref = _direct(z, q, steps, RdpAccountant())
        assert math.isclose(ours, ref, rel_tol=1e-6), (i, z, q, steps, ours, ref)


QUICK_PLD = [3, 4, 5, 6, 7, 8, 10, 11]


@pytest.mark.parametrize("i", QUICK_PLD + [pytest.param(i, marks=pytest.mark.slow)
                                           for i in range(1, 40) if i not in QUICK_PLD])
def test_pld_equals_dp_accounting(releases, i):
    # PLD composition takes up to ~10 s for q = 1 and small z: eight cheap ones here, 31 more under -m slow
    z, q, steps = CONFIGS[i]
    ours = epsilon(releases[i], DELTA, "pld")
    ref = _direct(z, q, steps, PLDAccountant())
    assert math.isclose(ours, ref, rel_tol=1e-6), (i, z, q, steps, ours, ref)


def test_heterogeneous_sequence_equals_the_composed_event(releases):
    rs = releases[0]
    assert len(rs) == 15
    ref_ev = dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), n)
        for z, q, n in PHASED[0]])
    assert composed_event(rs) == ref_ev
    for kind, acc in (("rdp", RdpAccountant()), ("pld", PLDAccountant())):
        ref = acc.compose(ref_ev).get_epsilon(DELTA)
        assert math.isclose(epsilon(rs, DELTA, kind), ref, rel_tol=1e-6)


def test_epsilon_grows_with_releases_and_falls_with_noise(releases):
    rs = releases[5]
    eps = [epsilon(rs[:k], DELTA) for k in (1, len(rs) // 2 + 1, len(rs))]
    assert eps == sorted(eps)
    assert epsilon([], DELTA) == 0.0
    noisier = [attrs.evolve(r, scale=2 * r.scale, value=2 * r.scale) for r in rs]
    assert epsilon(noisier, DELTA) < eps[-1]


def test_bad_delta_and_mode_are_refused(releases):
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(PrivacyError, match="delta"):
            epsilon(releases[1], bad)
    with pytest.raises(PrivacyError, match="accounting mode"):
        epsilon(releases[1], DELTA, mode="hopeful")


# --- calibration -----------------------------------------------------------------------------------------
def test_calibrated_multiplier_meets_the_target_tightly():
    for eps, q, steps in [(1.0, 0.01, 1000), (3.0, 1 / 3125, 3120), (0.5, 1.0, 10)]:
        z = noise_multiplier(eps, DELTA, [(q, steps)])
        assert _direct(z, q, steps, RdpAccountant()) <= eps + 1e-6
        assert _direct(z * 0.99, q, steps, RdpAccountant()) > eps


def test_privsgp_vr_paper_noise_is_far_below_the_accounted_one():
    # PrivSGP-VR: (3, 1e-5) at K = 3120, q = 1/3125 needs z ~ 0.57 (integer orders, classic conversion);
    # dp-accounting (fractional orders, tighter conversion) needs a little less; the paper's z ~ 0.0075.
    z = noise_multiplier(3.0, DELTA, [(1 / 3125, 3120)])
    assert 0.45 < z < 0.57
    assert z / 0.0075 > 50


def test_calibration_over_a_heterogeneous_schedule_and_sigma():
    sched = [(0.01, 500), (0.05, 100)]
    z = noise_multiplier(2.0, DELTA, sched)
    acc = RdpAccountant()
    for q, n in sched:
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), n)
    assert abs(acc.get_epsilon(DELTA) - 2.0) < 1e-3
    assert math.isclose(gaussian_sigma(2.0, DELTA, 0.25, sched), 0.25 * z, rel_tol=1e-9)


def test_max_steps_is_the_last_count_within_budget():
    n = max_steps(1.5, DELTA, 1.1, 0.01)
    assert _direct(1.1, 0.01, n, RdpAccountant()) <= 1.5 < _direct(1.1, 0.01, n + 1, RdpAccountant())


@pytest.mark.parametrize("args, match", [
    ((0.0, DELTA, [(0.1, 10)]), "epsilon must be > 0"),
    ((-1.0, DELTA, [(0.1, 10)]), "epsilon must be > 0"),
    ((1.0, 1.0, [(0.1, 10)]), "delta"),
    ((1.0, DELTA, [(0.0, 10)]), "q must be"),
    ((1.0, DELTA, [(0.1, 0)]), "steps"),
    ((1.0, DELTA, []), "schedule is empty"),
])
def test_bad_calibration_targets(args, match):
    with pytest.raises(PrivacyError, match=match):
        noise_multiplier(*args)


# --- budget caps with random activation -------------------------------------------------------------------
CAP = 2.0


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    from netsim.scenario import scenario_from_dict

    CONFIGS_CAP = {"z": 1.2, "q": 0.05}
    sc = scenario_from_dict({
        "name": "cap", "run": {"seed": 4, "until": 400.0},
        "agents": {"count": 6, "compute_time": {"kind": "constant", "value": 0.0},
                   "activation": {"kind": "bernoulli", "period": 1.0, "p": 0.5}},
        "topology": {"kind": "ring"}, "data": {"samples": 60, "features": 2},
        "algorithm": {"name": "test_privacy_capped"}, "evaluation": {"every": 500.0},
        "privacy": {"epsilon_cap": CAP, "delta": DELTA},
    })
    out = tmp_path_factory.mktemp("cap")
    res = run(sc, out=out)
    table = read_trace(out).table
    return CONFIGS_CAP, releases_from_table(table), exhausted_from_table(table), table, res


@register("test_privacy_capped", ReleaserParams)
def capped_releaser(agent, p: ReleaserParams):
    """Release on every activation until privatize says the budget is spent; count the Nones."""
    nones = 0
    while True:
        yield agent.wake()
        if agent.privatize(torch.ones(2), sigma=1.2 * 0.5, sensitivity=0.5, q=0.05) is None:
            nones += 1
            agent.nones = nones


def test_cap_stops_releases_exactly_at_the_budget(capped):
    cfg, rel, exhausted, table, _ = capped
    counts = {len(rs) for rs in rel.values()}
    assert len(counts) == 1  # identical mechanisms: every agent stops after the same number of releases
    n = counts.pop()
    assert n > 10
    z, q = cfg["z"], cfg["q"]
    assert _direct(z, q, n, RdpAccountant()) <= CAP < _direct(z, q, n + 1, RdpAccountant())
    assert sorted(exhausted) == list(range(6))
    for i, rs in rel.items():
        assert exhausted[i] > rs[-1].t  # the refusal comes after the last release
    # random activation: agents ran out at different times
    assert len(set(exhausted.values())) > 1


def test_exhaustion_is_traced_once_and_the_algorithm_sees_none(capped):
    _, rel, _, table, res = capped
    kinds = table["kind"].to_pylist()
    assert kinds.count("budget_exhausted") == 6
    cols = zip(kinds, table["agent"].to_pylist(), table["value"].to_pylist(), table["tag"].to_pylist(),
               strict=True)
    rows = [(a, v, tag) for k, a, v, tag in cols if k == "budget_exhausted"]
    for a, spent, tag in rows:
        assert 0 < spent <= CAP and tag.startswith(f"cap={CAP!r}")
        assert math.isclose(spent, epsilon(rel[a], DELTA), rel_tol=1e-9)


def test_cap_in_amplified_mode_counts_the_skipped_ticks(tmp_path):
    """Amplified accounting: every tick (active or not) is a run at rate p q; the cap refuses the first
    release whose ticks (its own and the skipped ones before it) would take epsilon above the cap."""
    from netsim.scenario import scenario_from_dict

    sc = scenario_from_dict({
        "name": "capamp", "run": {"seed": 9, "until": 400.0},
        "agents": {"count": 4, "compute_time": {"kind": "constant", "value": 0.0},
                   "activation": {"kind": "bernoulli", "period": 1.0, "p": 0.5}},
        "topology": {"kind": "ring"}, "data": {"samples": 40, "features": 2},
        "algorithm": {"name": "test_privacy_capped"}, "evaluation": {"every": 500.0},
        "privacy": {"epsilon_cap": CAP, "delta": DELTA, "accounting": "amplified"},
    })
    run(sc, out=tmp_path)
    table = read_trace(tmp_path).table
    rel, exhausted = releases_from_table(table), exhausted_from_table(table)
    assert sorted(exhausted) == list(range(4))
    for i, rs in rel.items():
        ticks = sum(1 + r.skipped for r in rs)
        assert ticks == round(rs[-1].t)  # period 1, no offset: the last release's tick index
        refused_ticks = round(exhausted[i]) - round(rs[-1].t)  # the refused release and the ticks it skipped
        rate = 0.5 * 0.05
        assert _direct(1.2, rate, ticks, RdpAccountant()) <= CAP
        assert _direct(1.2, rate, ticks + refused_ticks, RdpAccountant()) > CAP
        assert math.isclose(epsilon(rs, DELTA, mode="amplified"), _direct(1.2, rate, ticks, RdpAccountant()),
                            rel_tol=1e-6)
