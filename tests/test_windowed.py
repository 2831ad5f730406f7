"""The window-synchronous vectorised D-PSGD step against the per-message engine (differential test)."""

from __future__ import annotations

import pytest
import torch

import netsim
from netsim.api import prepare
from netsim.scenario import scenario_from_dict
from netsim.sim import windowed
from netsim.sim.agent import Agent


def scenario(n: int = 12, rounds: int = 8, **agents) -> dict:
    return {"name": "windowed", "run": {"seed": 3, "rounds": rounds, "until": 1.0e6},
            "agents": {"count": n, "compute_time": {"kind": "constant", "value": 0.01},
                       "activation": {"kind": "periodic", "period": 0.1}, **agents},
            "topology": {"kind": "erdos_renyi", "p": 0.4},
            "network": {"latency": {"kind": "constant", "value": 0.005}},
            "data": {"kind": "synthetic", "samples": 40 * n, "features": 6, "partition": "iid"},
            "model": {"kind": "logistic"},
            "algorithm": {"name": "dpsgd", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "lr_decay": 0.1},
            "evaluation": {"every": 1.0e6}}


def engine_models(sc, tmp_path) -> torch.Tensor:
    built: list = []
    r = netsim.run(sc, out=tmp_path / "engine", setup=built.append)
    assert r.summary["stop_reason"] == "rounds"
    return built[0].bank.W


def test_agrees_with_the_engine_to_round_off(tmp_path):
    sc = scenario_from_dict(scenario())
    W = windowed.run_dpsgd(prepare(sc), 8)
    ref = engine_models(sc, tmp_path)
    assert not torch.equal(W, prepare(sc).bank.W)  # it moved
    assert torch.allclose(W, ref, rtol=0, atol=1e-5)


def test_bit_identical_when_the_engine_mixes_in_sender_order(tmp_path, monkeypatch):
    """The only difference is the order of summation among simultaneous arrivals."""
    mix = Agent.mix_into_params
    monkeypatch.setattr(Agent, "mix_into_params",
                        lambda self, own, got, **kw: mix(self, own, dict(sorted(got.items())), **kw))
    sc = scenario_from_dict(scenario())
    assert torch.equal(windowed.run_dpsgd(prepare(sc), 8), engine_models(sc, tmp_path))


@pytest.mark.parametrize(("change", "why"), [
    ({"activation": {"kind": "poisson", "rate": 10.0}}, "only periodic"),
    ({"clock_jitter": {"kind": "uniform", "low": 0.0, "high": 0.01}}, "not simultaneous"),
    ({"compute_time": {"kind": "constant", "value": 0.06}}, "miss the barrier"),
])
def test_refuses_scenarios_whose_rounds_are_not_windows(change, why):
    sc = scenario_from_dict(scenario(**change))
    assert why in windowed.unsupported(sc)
    with pytest.raises(ValueError, match=why):
        windowed.run_dpsgd(prepare(sc), 1)
