"""Gossip learning (push_gossip): one push per round to one neighbour; merge-then-update on receipt."""

from __future__ import annotations

import numpy as np
import pytest

import netsim
from netsim import api

from .conftest import BASE, merge


def run(tmp_path, **extra):
    from netsim.scenario import scenario_from_dict

    data = merge(BASE, {"run": {"seed": 2, "rounds": 30, "until": 1.0e4},
                        "agents": {"count": 8, "activation": {"kind": "periodic", "period": 1.0}},
                        "topology": {"kind": "random_regular", "degree": 4},
                        "network": {"latency": {"kind": "uniform", "low": 0.01, "high": 0.5}},
                        "algorithm": {"name": "push_gossip", "lr": 0.5, "batch": 0},
                        "evaluation": {"every": 1.0e3, "metrics": ["accuracy", "agent_accuracy"]}, **extra})
    res = netsim.run(scenario_from_dict(data), out=tmp_path / "r")
    return res, res.events.to_pandas()


@pytest.mark.parametrize("update", ["per_receipt", "per_round"])
def test_one_push_per_round_to_a_neighbour_and_an_update_only_after_a_receipt(tmp_path, update):
    res, t = run(tmp_path, network={"latency": {"kind": "uniform", "low": 0.01, "high": 0.5}, "loss": 0.2},
                 algorithm={"name": "push_gossip", "lr": 0.5, "batch": 0, "update": update})
    sends = t[t.kind == "send"]
    assert len(sends) == 8 * 30 and (sends.groupby("agent").size() == 30).all()
    graph = api.prepare(res.scenario).graph  # the run's own graph (same seed)
    assert all(graph.has_edge(a, b) for a, b in zip(sends.agent, sends.peer, strict=True))
    assert sends.groupby("agent").peer.nunique().max() > 1  # a random neighbour, not a fixed one
    assert (t[t.kind == "drop"].tag == "loss").all() and (t.kind == "drop").sum() > 0
    for a in range(8):
        mine = t[t.agent == a]
        acts = mine[mine.kind == "activate"].t.to_numpy()
        got = t[(t.kind == "deliver") & (t.agent == a)].t.to_numpy()
        windows = list(zip(acts[:-1], acts[1:], strict=True))
        if update == "per_receipt":  # one update per model delivered before the last activation (Ormándi et al.)
            expect = int((got <= acts[-1]).sum())
        else:  # one update at activation k iff something was delivered since activation k-1
            expect = sum(bool(((got > lo) & (got <= hi)).any()) for lo, hi in windows)
            expect += bool((got <= acts[0]).any())
        assert (mine.kind == "compute_start").sum() == expect
        if update == "per_receipt":  # the k-th update of an activation starts k compute times (0.01 s) in
            starts = mine[mine.kind == "compute_start"].t.to_numpy()
            bounds = [0.0, *acts[:-1]]
            for (lo, hi), act in zip(zip(bounds, acts, strict=True), acts, strict=True):
                n = int(((got > lo) & (got <= hi)).sum()) if lo else int((got <= hi).sum())
                mine_now = starts[(starts >= act) & (starts < act + 0.5)]
                assert mine_now == pytest.approx(act + 0.01 * np.arange(n))


def test_gossip_learning_learns(tmp_path):
    res, _ = run(tmp_path)
    assert res.summary["agent_accuracy_mean"] > 0.8
    first = res.metrics[0]["agent_accuracy_mean"]
    assert res.summary["agent_accuracy_mean"] > first + 0.2
