"""Rounds on activation ticks (DO-ADP, rounds/ticks.py) as lookahead windows (rounds/ticks_windows.py): the
windowed engine against the events engine, byte for byte (trace.arrows, metrics.csv, final models), on drawn
scenarios of the admitted region: Bernoulli or periodic ticks on own clocks (offsets, drift, jitter), stragglers,
random compute times and latencies, lossy links, messages late for their round, the finish at T or at run.rounds."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

from tests.search import search
from tests.test_broadcast_windows import both
from tests.test_windowed import buildable


@st.composite
def ticked(draw) -> dict:
    n = draw(st.integers(4, 10))
    u = {"kind": "uniform"}
    period = draw(st.sampled_from([0.5, 1.0]))
    act = draw(st.sampled_from([{"kind": "periodic", "period": period},
                                {"kind": "bernoulli", "period": period, "p": draw(st.sampled_from([0.5, 0.8, 1.0]))}]))
    agents = {"count": n, "activation": act,
              "clock_offset": draw(st.sampled_from([{"kind": "constant", "value": 0.0},
                                                    {**u, "low": 0.0, "high": 0.3}])),
              "clock_drift": draw(st.sampled_from([{"kind": "constant", "value": 0.0},
                                                   {**u, "low": -0.02, "high": 0.02}])),
              "compute_time": draw(st.sampled_from([{"kind": "constant", "value": 0.01},
                                                    {**u, "low": 0.0, "high": 0.08}]))}
    if draw(st.booleans()):
        agents["clock_jitter"] = {**u, "low": 0.0, "high": 0.05}
    if draw(st.booleans()):
        agents.update(stragglers=[0], straggler_factor=3.0)
    low = draw(st.sampled_from([0.01, 0.1]))
    lat = draw(st.sampled_from([{"kind": "constant", "value": low},
                                {**u, "low": low, "high": low + draw(st.sampled_from([0.05, 1.2]))}]))  # late ones
    rounds = draw(st.integers(2, 12))
    run = dict(draw(st.sampled_from([{"until": rounds * period + 2.0}, {"until": 0.6 * rounds * period},
                                     {"rounds": draw(st.integers(2, 8))}])))
    run["trace_flush_every"] = draw(st.sampled_from([7, 1000]))
    ratio = draw(st.sampled_from([0.3, 1.0]))
    alg = {"name": "do_adp", "rounds": rounds, "lr": draw(st.sampled_from([0.0, 0.3])),
           "beta": draw(st.sampled_from([0.0, 0.5])), "gamma": draw(st.sampled_from([0.3, 1.0])), "ratio": ratio,
           "k_rounding": draw(st.sampled_from(["ceil", "floor"])), "batch": draw(st.integers(0, 4)),
           "clip": draw(st.sampled_from([0.0, 1.0])), "clip_kind": draw(st.sampled_from(["coordinate", "l2"]))}
    if draw(st.booleans()):
        alg["sigma"] = draw(st.sampled_from([0.0, 0.2]))
    else:
        alg |= {"epsilon": 1.0, "clip": 1.0, "sensitivity": draw(st.sampled_from(["topk", "full"]))}
    return {"name": "ticked", "run": {"seed": draw(st.integers(0, 50)), **run}, "agents": agents,
            "topology": {"kind": "random_regular", "degree": draw(st.sampled_from([2, 3]))},
            "network": {"latency": lat, "loss": draw(st.sampled_from([0.0, 0.2]))},
            "data": {"kind": "synthetic", "samples": 40 * n, "features": 6, "partition": "iid"},
            "model": {"kind": "logistic", "dtype": draw(st.sampled_from(["float32", "float64"])),
                      "batch_invariant": draw(st.sampled_from(["auto", False]))},
            "algorithm": alg, "privacy": {"delta0": 1e-5},
            "evaluation": {"every": draw(st.sampled_from([1.0e6, 0.7, 2.0])), "metrics": ["loss", "consensus"]}}


@search(12, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=ticked())
def test_ticked_windows_agree_with_the_engine_on_drawn_scenarios(tmp_path_factory, sc):
    buildable(sc)
    both(tmp_path_factory.mktemp("drawn"), sc)


def test_late_messages_are_dropped_alike_and_counted(tmp_path):
    """Latencies up to 1.5 periods: some differences arrive after their round was replayed; both engines drop the
    same ones (the same bytes) and count them."""
    sc = {"run": {"seed": 3, "until": 14.0}, "agents": {
        "count": 8, "activation": {"kind": "bernoulli", "period": 1.0, "p": 0.7},
        "clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.5},
        "compute_time": {"kind": "constant", "value": 0.01}},
        "topology": {"kind": "random_regular", "degree": 3},
        "network": {"latency": {"kind": "uniform", "low": 0.05, "high": 1.5}},
        "data": {"kind": "synthetic", "samples": 320, "features": 6, "partition": "iid"},
        "model": {"kind": "logistic", "dtype": "float64"},
        "algorithm": {"name": "do_adp", "rounds": 12, "lr": 0.3, "ratio": 0.5, "sigma": 0.1, "batch": 2},
        "evaluation": {"every": 3.0, "metrics": ["loss", "consensus"]}}
    summary = both(tmp_path, sc)
    assert summary["do_adp_late"] > 0


@pytest.mark.parametrize("changes", [{"bandwidth": 50.0}, {"uplink": 100.0}])
def test_a_broadcast_that_takes_time_to_transmit_holds_its_agent_alike(tmp_path, changes):
    """Bandwidth or an uplink: each round's differences take ~1 s to transmit and the agent waits for them
    before its next wake; both engines the same bytes, and some ticks pass while it waits (fewer activations)."""
    sc = {"run": {"seed": 4, "until": 12.0}, "agents": {
        "count": 6, "activation": {"kind": "periodic", "period": 0.5},
        "clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.3},
        "compute_time": {"kind": "constant", "value": 0.01}},
        "topology": {"kind": "random_regular", "degree": 3},
        "network": {"latency": {"kind": "uniform", "low": 0.05, "high": 0.3}, **changes},
        "data": {"kind": "synthetic", "samples": 240, "features": 6, "partition": "iid"},
        "model": {"kind": "logistic", "dtype": "float64"},
        "algorithm": {"name": "do_adp", "rounds": 20, "lr": 0.3, "ratio": 0.5, "sigma": 0.1, "batch": 2},
        "evaluation": {"every": 3.0, "metrics": ["loss", "consensus"]}}
    from netsim.trace.io import read_trace

    both(tmp_path / "slow", sc)
    sc["network"] = {"latency": sc["network"]["latency"]}
    both(tmp_path / "fast", sc)
    woken = [(read_trace(tmp_path / f / "events").table.column("kind").to_pylist()).count("activate")
             for f in ("slow", "fast")]
    assert woken[0] < woken[1]


@pytest.mark.parametrize(("changes", "why"), [
    ({"privacy": {"epsilon_cap": 5.0}}, "privacy.epsilon_cap"),
    ({"network": {"latency": {"kind": "exponential", "mean": 0.05}}}, "no positive lower bound"),
])
def test_what_the_ticked_windows_cannot_play_is_refused(changes, why):
    from netsim.api import prepare
    from netsim.rounds.windowed import reason
    from netsim.scenario import scenario_from_dict

    sc = {"run": {"seed": 1, "until": 5.0}, "agents": {"count": 6, "activation": {"kind": "periodic", "period": 1.0}},
          "topology": {"kind": "ring"}, "data": {"kind": "synthetic", "samples": 120, "features": 4},
          "model": {"kind": "logistic"}, "algorithm": {"name": "do_adp", "rounds": 4, "sigma": 0.1},
          "network": {"latency": {"kind": "constant", "value": 0.01}}}
    assert reason(prepare(scenario_from_dict(sc))) is None  # the fast path, until one change
    for key, value in changes.items():
        sc[key] = {**sc.get(key, {}), **value}
    assert why in reason(prepare(scenario_from_dict(sc)))
