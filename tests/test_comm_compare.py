"""Sync vs async comparison scenarios, time_to_target, `netsim compare`, determinism of the comm
algorithms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import netsim
from netsim.cli import app
from netsim.comm.stats import comm_summary
from netsim.metrics.compare import time_to_target
from netsim.scenario import scenario_from_dict
from tests.conftest import BASE, merge

SCEN = Path(__file__).resolve().parent.parent / "scenarios"
runner = CliRunner()


def test_time_to_target_is_first_evaluation_reaching_it():
    rows = [{"time": 0.0, "accuracy": 0.5}, {"time": 1.0, "accuracy": 0.8}, {"time": 2.0, "accuracy": 0.79},
            {"time": 3.0, "accuracy": 0.9}]
    assert time_to_target(rows, 0.8) == 1.0
    assert time_to_target(rows, 0.85) == 3.0
    assert time_to_target(rows, 0.95) is None
    assert time_to_target([{"time": 0.0, "loss": 1.0}], 0.5) is None


def test_comparison_async_beats_sync_under_stragglers(tmp_path):
    """The comparison's claim: with 3 stragglers at 5x, async gossip and event-triggered sends reach the
    target accuracy in less simulated time than synchronous D-PSGD, and triggering saves messages."""
    res = {}
    for name in ("compare_sync_async", "compare_sync_async_gossip", "compare_sync_async_event",
                 "compare_sync_async_sparq"):
        r = netsim.run(SCEN / f"{name}.toml", overrides={"run.until": 6.0}, out=tmp_path / name)
        res[name] = r.summary
        assert r.scenario.agents.stragglers == (0, 5, 10) and r.scenario.agents.straggler_factor == 5.0
    sync, gossip, event = (res[n] for n in ("compare_sync_async", "compare_sync_async_gossip",
                                            "compare_sync_async_event"))
    assert sync["time_to_target"] is not None and gossip["time_to_target"] is not None
    assert gossip["time_to_target"] < sync["time_to_target"]
    assert event["time_to_target"] is not None and event["time_to_target"] < sync["time_to_target"]
    assert event["trigger_skipped"] > 0 and 0 < event["trigger_saved_fraction"] < 1
    assert event["messages_sent"] == event["trigger_sent"]
    assert gossip["adpsgd_staleness_samples"] > 0 and gossip["gossip_exchanges"] > 0
    sparq = res["compare_sync_async_sparq"]  # triggered + compressed: sooner, and fewer bytes than sync
    assert sparq["time_to_target"] is not None and sparq["time_to_target"] < sync["time_to_target"]
    assert sparq["bytes_sent"] < sync["bytes_sent"]
    saved = json.loads((tmp_path / "compare_sync_async_event" / "summary.json").read_text())
    assert saved["trigger_saved_fraction"] == event["trigger_saved_fraction"]

    out = tmp_path / "cmp.png"
    r = runner.invoke(app, ["compare", *(str(tmp_path / n) for n in res), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 1000 and "reached accuracy >= 0.88 at t = " in r.output
    bad = runner.invoke(app, ["compare", str(tmp_path / "nope")])
    assert bad.exit_code == 2 and "not a run folder" in bad.output


def test_target_accuracy_is_validated():
    from netsim.errors import InputError

    with pytest.raises(InputError, match=r"evaluation\.target_accuracy.*\(0, 1\]"):
        scenario_from_dict(merge(BASE, {"evaluation": {"target_accuracy": 1.5}}))


ALGOS = [
    {"name": "adpsgd", "lr": 0.5, "batch": 8},
    {"name": "async_push", "lr": 0.5, "batch": 8, "staleness_power": 1.0},
    {"name": "event_triggered", "lr": 0.5, "batch": 8, "trigger": "relative", "threshold": 0.05},
    {"name": "choco", "lr": 0.5, "batch": 8, "compressor": "qsgd", "bits": 2, "round_timeout": 0.2},
    {"name": "choco", "lr": 0.5, "batch": 8, "compressor": "randk", "ratio": 0.5, "round_timeout": 0.2},
    {"name": "sparq", "lr": 0.5, "batch": 8, "compressor": "qsgd", "trigger": "relative", "threshold": 0.05},
]


@pytest.mark.parametrize("alg", ALGOS, ids=lambda a: f"{a['name']}-{a.get('compressor', '')}")
def test_comm_algorithms_are_deterministic_and_learn(alg, tmp_path):
    extra = {"algorithm": alg, "run": {"until": 8.0},
             "agents": {"activation": {"kind": "poisson", "rate": 2.0},
                        "compute_time": {"kind": "exponential", "mean": 0.05}},
             "network": {"latency": {"kind": "exponential", "mean": 0.05}, "loss": 0.05}}
    sc = scenario_from_dict(merge(BASE, extra))
    a = netsim.run(sc, out=tmp_path / "a")
    b = netsim.run(sc, out=tmp_path / "b")
    assert a.trace_path.read_bytes() == b.trace_path.read_bytes()
    assert a.summary["accuracy"] > 0.85, a.summary["accuracy"]


def test_pushsum_learns_on_a_directed_graph_and_is_deterministic(tmp_path):
    sc = scenario_from_dict(merge(BASE, {
        "algorithm": {"name": "pushsum", "lr": 0.3, "batch": 8},
        "topology": {"kind": "exponential", "directed": True},
        "agents": {"activation": {"kind": "poisson", "rate": 2.0}},
        "network": {"latency": {"kind": "exponential", "mean": 0.05}, "loss": 0.1}, "run": {"until": 8.0}}))
    a, b = netsim.run(sc, out=tmp_path / "a"), netsim.run(sc, out=tmp_path / "b")
    assert a.trace_path.read_bytes() == b.trace_path.read_bytes()
    assert a.summary["accuracy"] > 0.85 and a.summary["messages_dropped"] > 0


def test_bipartite_roles_need_a_bipartite_graph(tmp_path):
    from netsim.errors import InputError

    sc = scenario_from_dict(merge(BASE, {"agents": {"count": 7},
                                         "algorithm": {"name": "adpsgd", "roles": "bipartite"}}))
    with pytest.raises(InputError, match="bipartite topology"):
        netsim.run(sc, out=tmp_path / "odd")


def test_async_push_staleness_weights_change_the_merge():
    def run(power):
        sc = scenario_from_dict(merge(BASE, {
            "algorithm": {"name": "async_push", "lr": 0.5, "batch": 8, "staleness_power": power},
            "agents": {"activation": {"kind": "poisson", "rate": 4.0}},
            "network": {"latency": {"kind": "exponential", "mean": 0.5}}, "run": {"until": 5.0}}))
        sim = netsim.api.prepare(sc)
        sim.run()
        return sim

    plain, weighted = run(0.0), run(2.0)
    s = comm_summary(plain)
    assert s["push_staleness_max"] >= 1 and s["push_staleness_samples"] > 50
    assert comm_summary(weighted)["push_staleness_samples"] == s["push_staleness_samples"]
    assert not torch.equal(plain.bank.W, weighted.bank.W)


def test_sparq_huge_threshold_sends_nothing_and_counts_encoded_bytes_saved():
    sc = scenario_from_dict(merge(BASE, {
        "algorithm": {"name": "sparq", "lr": 0.5, "batch": 8, "compressor": "topk", "ratio": 0.5,
                      "trigger": "absolute", "threshold": 1e9},
        "agents": {"activation": {"kind": "poisson", "rate": 2.0}}, "run": {"until": 5.0}}))
    sim = netsim.api.prepare(sc)
    sim.run()
    s = comm_summary(sim)
    P = sim.bank.W.shape[1]
    assert sim.network.next_id == 0 and s["trigger_sent"] == 0 and s["trigger_skipped"] > 50
    assert s["trigger_bytes_saved"] == s["trigger_skipped"] * -(-P // 2) * (4 + 4)
