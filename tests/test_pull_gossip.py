"""A pull (the pairwise pattern's one-sided exchange, ``Pairwise(pull=True)``) written as a plugin kernel,
examples/plugins/pull_gossip.py: the lookahead windows play it with the events engine's bytes (trace.arrows,
metrics.csv, final models) with no code of its own, and it does what a pull does."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

import netsim
from netsim.scenario import scenario_from_dict
from netsim.trace.io import read_trace
from tests.conftest import ROOT
from tests.search import search
from tests.test_broadcast_windows import both, poisson, spread
from tests.test_windowed import async_gossip, buildable

PLUGIN = ROOT / "examples" / "plugins" / "pull_gossip.py"


@pytest.fixture(scope="module")
def pull():
    """The plugin registered in this process for the module's tests, the registry as it was after them."""
    from netsim.algorithms import registry

    registry.load_plugin(str(PLUGIN))
    before = {k: v for k, v in registry.REGISTRY.items() if k != "pull_gossip"}
    yield
    registry.REGISTRY.clear()
    registry.REGISTRY.update(before)
    sys.modules.pop("netsim_plugin_pull_gossip", None)


@search(8, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_pull_windows_agree_with_the_engine_on_drawn_asynchronous_scenarios(tmp_path_factory, pull, data):
    """Own clocks, drift, jitter, stragglers, random compute times and latencies, loss (``async_gossip``); replies
    within or after their timeout, a step or none, any merge weight, a directed graph or not, bandwidth or not."""
    sc = data.draw(async_gossip())
    sc["algorithm"] = {"name": "pull_gossip", "lr": data.draw(st.sampled_from([0.0, 0.5])),
                       "batch": data.draw(st.integers(0, 6)), "alpha": data.draw(st.sampled_from([0.25, 0.5, 1.0])),
                       "reply_timeout": data.draw(st.sampled_from([0.02, 0.3, 2.0]))}
    if data.draw(st.booleans()):
        sc["topology"] = {"kind": "erdos_renyi", "p": 0.4, "directed": True}
    if data.draw(st.booleans()):  # the request waits for its transmission, the reply queues on its link
        sc["network"] = {**sc["network"], **data.draw(st.sampled_from([{"bandwidth": 2.0e3}, {"uplink": 4.0e3}]))}
    buildable(sc)
    both(tmp_path_factory.mktemp("drawn"), sc)


def test_a_pull_moves_only_the_puller_and_keeps_models_in_their_hull(tmp_path, pull):
    """Pure pull averaging (lr = 0, alpha = 1/2) without loss: the windows write the engine's bytes; each request is a
    1-byte message and each reply a model; a server never averages (no lock, nothing refused); every final model
    stays in the starting models' coordinate-wise hull while their spread shrinks; and with no flag the run takes the
    windows."""
    sc = poisson({"name": "pull_gossip", "lr": 0.0, "alpha": 0.5, "reply_timeout": 2.0},
                 network={"loss": 0.0, "latency": {"kind": "uniform", "low": 0.05, "high": 0.3}})
    sc["model"] = {"kind": "logistic", "dtype": "float64"}
    summary = both(tmp_path / "both", sc)
    assert summary["gossip_exchanges"] > 10 and "gossip_refused" not in summary
    start = torch.randn(summary["W"].shape, generator=torch.Generator().manual_seed(sc["run"]["seed"]),
                        dtype=torch.float64)
    W = summary["W"]
    assert (W >= start.min(0).values - 1e-12).all() and (W <= start.max(0).values + 1e-12).all()
    assert (W - W.mean(0)).norm() < 0.5 * (start - start.mean(0)).norm()
    t = read_trace(tmp_path / "both" / "events" / "trace.arrows").table.to_pandas()
    sends = t[t["kind"] == "send"]
    assert set(sends[sends["tag"] == "pull.req"]["size"]) == {1}
    assert set(sends[sends["tag"] == "pull.rep"]["size"]) == {8 * W.shape[1]}
    r = netsim.run(scenario_from_dict(sc), out=tmp_path / "auto", setup=spread)
    assert r.summary["engine"] == "windowed"
