"""Churn and clocks inside whole (tiny) simulations."""

from __future__ import annotations

import numpy as np
import pytest

import netsim
from netsim.trace.io import read_trace

BASE = {
    "run": {"seed": 5, "until": 12.0},
    "agents": {"count": 4, "compute_time": {"kind": "constant", "value": 0.01},
               "activation": {"kind": "periodic", "period": 0.5}},
    "topology": {"kind": "ring"},
    "network": {"latency": {"kind": "constant", "value": 0.01}},
    "data": {"samples": 400, "features": 4},
    "algorithm": {"name": "dpsgd", "lr": 0.2, "batch": 8, "round_timeout": 0.2},
    "evaluation": {"every": 6.0, "metrics": ["accuracy"]},
}


def run(tmp_path, **sections):
    from netsim.scenario.load import scenario_from_dict

    data = {k: {**v, **sections.get(k, {})} if isinstance(v, dict) else v for k, v in BASE.items()}
    res = netsim.run(scenario_from_dict(data), out=tmp_path / "run")
    return read_trace(res.trace_path).to_pandas()


def test_churned_agent_neither_computes_sends_nor_receives_while_offline(tmp_path):
    t = run(tmp_path, agents={"offline": [{"agent": 2, "start": 3.0, "end": 7.0}]})
    two = t[(t.agent == 2) & (t.t >= 3.0) & (t.t < 7.0)]
    assert set(two.kind) <= {"offline", "drop", "send", "timeout"}
    sent = two[two.kind == "send"].msg
    assert set(sent) <= set(two[(two.kind == "drop") & (two.tag == "offline")].msg)  # every send dropped
    delivered_to_2 = t[(t.kind == "deliver") & (t.agent == 2) & (t.t >= 3.0) & (t.t < 7.0)]
    assert delivered_to_2.empty
    to_2 = t[(t.kind == "drop") & (t.peer == 2) & (t.tag == "offline")]
    assert len(to_2) > 0 and (to_2.t + to_2.value).between(3.0, 7.0).all()
    acts = t[(t.kind == "activate") & (t.agent == 2)].t
    assert not acts.between(3.0, 7.0, inclusive="left").any() and (acts >= 7.0).any()  # back after
    off = t[t.kind == "offline"]
    assert list(zip(off.t, off.agent, off.value, strict=True)) == [(3.0, 2, 4.0)]


def test_clock_drift_and_offset_move_periodic_activations_as_computed(tmp_path):
    drift, offset, period = 0.1, 0.05, 0.5
    t = run(tmp_path, agents={"clock_drift": {"kind": "constant", "value": drift},
                              "clock_offset": {"kind": "constant", "value": offset}})
    for i in range(4):
        a = t[(t.kind == "activate") & (t.agent == i)]
        k = np.arange(1, len(a) + 1)
        # local clock = offset + (1 + drift) t ticks at k * period: global time (k*period - offset)/(1+drift)
        assert a.t.to_numpy() == pytest.approx((k * period - offset) / (1 + drift), abs=1e-12)
        assert a.value.to_numpy() == pytest.approx(k * period)
    assert len(a) == int((12.0 * (1 + drift) + offset) / period)


def test_runs_with_link_models_are_deterministic(tmp_path):
    net = {"burst": {"p_enter": 0.1, "p_exit": 0.4}, "uplink": 5e4,
           "outages": [{"start": 2.0, "end": 3.0, "src": 1}]}
    agents = {"churn": {"mean_online": 4.0, "mean_offline": 1.0}}
    a = run(tmp_path / "a", network=net, agents=agents)
    b = run(tmp_path / "b", network=net, agents=agents)
    assert a.equals(b)
    assert {"loss", "outage", "offline"} <= set(a[a.kind == "drop"].tag)


def test_clock_jitter_delays_each_activation_by_its_own_draw(tmp_path):
    from netsim.sim.streams import Streams

    t = run(tmp_path, agents={"clock_jitter": {"kind": "uniform", "low": 0.0, "high": 0.1}})
    for i in range(4):
        a = t[(t.kind == "activate") & (t.agent == i)]
        u = Streams(5).rng("jitter", i).uniform(0.0, 0.1, 256)[: len(a)]  # the agent's jitter stream
        k = np.arange(1, len(a) + 1)
        assert a.t.to_numpy() == pytest.approx(k * 0.5 + u, abs=1e-12)
