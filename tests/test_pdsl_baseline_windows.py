"""DP-NET-FLEET (PDSL's baseline) and CPGT (DO-ADP's) as barrier-round kernels: on scenarios drawn from the fast
path's admitted region both engines write the same trace, metrics.csv and final models, and keep the same
method state (trackers) in the parameter bank."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

import netsim
from netsim.scenario import scenario_from_dict
from tests.search import search
from tests.test_round_kernels import admitted_and_identical, base

STATE = {"dp_netfleet": ("netfleet.v", "netfleet.gprev"), "cpgt": ("cpgt_tracker",)}


@st.composite
def netfleet_scenarios(draw) -> dict:
    """DP-NET-FLEET's K + 1 gradients after the exchange on drawn graphs, latencies, compute times, lossy links
    (timeouts), clippings, evaluations between the rounds and run.until at an activation or between two rounds."""
    ct = draw(st.sampled_from([0.001, 0.005]))
    lat = draw(st.sampled_from([0.001, 0.005, 0.0301]))
    K = draw(st.integers(1, 3))
    sc = base(n=draw(st.integers(3, 7)), rounds=draw(st.integers(2, 5)))
    sc["agents"]["compute_time"]["value"] = ct
    timeout = round(lat + (K + 1) * ct + draw(st.sampled_from([0.002, 0.01])), 6)  # the waves end before it
    sc["algorithm"] = {"name": "dp_netfleet", "lr": draw(st.sampled_from([0.05, 0.3])), "local_steps": K,
                       "batch": draw(st.integers(1, 6)), "clip": draw(st.sampled_from([0.5, 5.0])),
                       "clip_mode": draw(st.sampled_from(["batch", "per_example"])),
                       "sigma": draw(st.sampled_from([None, 0.0, 0.05])), "round_timeout": timeout}
    sc["network"] = {"latency": {"kind": "constant", "value": lat}, "loss": draw(st.sampled_from([0.0, 0.1, 0.3]))}
    sc["topology"] = draw(st.sampled_from([{"kind": "ring"}, {"kind": "erdos_renyi", "p": 0.6},
                                           {"kind": "complete"}]))
    sc["model"] = {"kind": "logistic", "dtype": draw(st.sampled_from(["float32", "float64"]))}
    sc["evaluation"]["every"] = draw(st.sampled_from([1.0e6, 0.2, 0.3]))
    if draw(st.booleans()):
        del sc["run"]["rounds"]
        sc["run"]["until"] = draw(st.sampled_from([0.3, 0.5, 0.395]))
    return sc


@search(8, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=netfleet_scenarios())
def test_dp_netfleet_runs_fast_byte_for_byte(tmp_path_factory, sc):
    admitted_and_identical(tmp_path_factory.mktemp("fleet"), sc, STATE["dp_netfleet"])


def test_dp_netfleet_releases_k_plus_one_gradients_a_round_and_stops_at_its_budget_cap(tmp_path):
    """K + 1 releases per agent and round (each gradient evaluation, none of x or v); under a budget cap the windows
    refuse and the events engine's agents stop releasing once refused (no step that round)."""
    from netsim import api
    from netsim.rounds.windowed import refusal
    from netsim.trace.io import read_trace

    sc = base(n=4, rounds=3)
    sc["algorithm"] = {"name": "dp_netfleet", "lr": 0.1, "local_steps": 2, "batch": 4, "sigma": 0.05,
                       "round_timeout": 0.05}
    netsim.run(scenario_from_dict(sc), out=tmp_path / "a")
    t = read_trace(tmp_path / "a" / "trace.arrows").to_pandas()
    assert (t.kind == "release").sum() == 4 * 3 * 3 and (t.kind == "compute_start").sum() == 4 * 3 * 3
    sc["privacy"] = {"epsilon_cap": 2.0, "delta": 1e-5}
    assert "privacy.epsilon_cap" in refusal(api.prepare(scenario_from_dict(sc)))
    netsim.run(scenario_from_dict(sc), out=tmp_path / "b", engine="events")
    t = read_trace(tmp_path / "b" / "trace.arrows").to_pandas()
    out = t[t.kind == "budget_exhausted"]
    assert len(out) > 0
    for a, at in out.groupby("agent").t.min().items():
        assert not ((t.kind == "release") & (t.agent == a) & (t.t > at)).any()


@st.composite
def cpgt_scenarios(draw) -> dict:
    """CPGT's one exchange of two messages (x then y) and its gradient at the new point, g(x_0) in round 0 only, on
    drawn graphs, latencies, compute times, compressions, noise, evaluations between the rounds, run.until at an
    activation or between two rounds, and T (its own horizon) below run.rounds or not."""
    ct = draw(st.sampled_from([0.0, 0.001, 0.005]))
    lat = draw(st.sampled_from([0.001, 0.005, 0.0301]))
    rounds = draw(st.integers(2, 5))
    sc = base(n=draw(st.integers(3, 7)), rounds=rounds)
    sc["agents"]["compute_time"]["value"] = ct
    sc["algorithm"] = {"name": "cpgt", "rounds": draw(st.sampled_from([rounds, rounds - 1, 50])),
                       "lr": draw(st.sampled_from([0.05, 0.3])), "gamma": draw(st.sampled_from([0.5, 1.0])),
                       "ratio": draw(st.sampled_from([0.3, 1.0])), "batch": draw(st.integers(0, 4)),
                       "clip": draw(st.sampled_from([0.0, 1.0])), "round_timeout": round(lat + 2 * ct + 0.01, 6)}
    if sc["algorithm"]["clip"] == 0.0 or draw(st.booleans()):
        sc["algorithm"].update(epsilon=None, sigma=draw(st.sampled_from([0.0, 0.05])))
    else:
        sc["algorithm"]["epsilon"] = draw(st.sampled_from([1.0, 50.0]))
    sc["network"] = {"latency": {"kind": "constant", "value": lat}}
    sc["topology"] = draw(st.sampled_from([{"kind": "ring"}, {"kind": "erdos_renyi", "p": 0.6},
                                           {"kind": "complete"}]))
    sc["model"] = {"kind": "logistic", "dtype": draw(st.sampled_from(["float32", "float64"]))}
    sc["evaluation"]["every"] = draw(st.sampled_from([1.0e6, 0.15, 0.35]))  # between rounds
    if draw(st.booleans()):
        del sc["run"]["rounds"]
        sc["run"]["until"] = draw(st.sampled_from([0.3, 0.5, 0.25]))
    return sc


@search(8, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=cpgt_scenarios())
def test_cpgt_runs_fast_byte_for_byte(tmp_path_factory, sc):
    admitted_and_identical(tmp_path_factory.mktemp("cpgt"), sc, STATE["cpgt"])


def test_cpgt_sends_both_messages_before_its_gathers_and_refuses_what_windows_cannot_play(tmp_path):
    """Each round every agent sends its cpgt_x then its cpgt_y message to each neighbour back to back, before any
    delivery; lossy links, clock offsets and a budget cap are refused with their reason."""
    from netsim import api
    from netsim.rounds.windowed import refusal
    from netsim.trace.io import read_trace

    sc = base(n=4, rounds=3)
    sc["algorithm"] = {"name": "cpgt", "rounds": 3, "ratio": 0.4, "epsilon": 5.0, "round_timeout": 0.05}
    netsim.run(scenario_from_dict(sc), out=tmp_path / "a")
    t = read_trace(tmp_path / "a" / "trace.arrows").to_pandas()
    sends = t[t.kind == "send"]
    assert len(sends) == 4 * 3 * 4
    for _, sent in sends.groupby(["agent", "round"]):  # ring: x to both neighbours, then y to both, at one time
        assert sent.tag.tolist() == ["cpgt_x", "cpgt_x", "cpgt_y", "cpgt_y"] and sent.t.nunique() == 1
    assert (t.kind == "finish").sum() == 4 and t[t.kind == "finish"]["round"].eq(3).all()
    lossy = {**sc, "network": {**sc["network"], "loss": 0.1}}
    assert "network.loss = 0" in refusal(api.prepare(scenario_from_dict(lossy)))
    capped = {**sc, "privacy": {"epsilon_cap": 2.0, "delta": 1e-5}}
    assert "privacy.epsilon_cap" in refusal(api.prepare(scenario_from_dict(capped)))
    netsim.run(scenario_from_dict(capped), out=tmp_path / "b", engine="events")
    t = read_trace(tmp_path / "b" / "trace.arrows").to_pandas()
    out = t[t.kind == "budget_exhausted"]
    assert len(out) > 0
    for a, at in out.groupby("agent").t.min().items():  # nothing more leaves an agent out of budget
        assert not ((t.kind == "send") & (t.agent == a) & (t.t > at)).any()
