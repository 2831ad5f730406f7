"""Time-varying topologies: one-peer exponential, resampled and scheduled graphs."""

from __future__ import annotations

import numpy as np
import pytest

import netsim
from netsim.api import prepare
from netsim.errors import InputError
from netsim.replay import replay
from netsim.scenario.load import scenario_from_dict
from netsim.sim.dynamic import DynamicTopology, one_peer_exponential
from netsim.trace.io import read_trace


def dense(lists) -> np.ndarray:
    n = len(lists)
    W = np.zeros((n, n))
    for i, (_, _, w, s) in enumerate(lists):
        W[i, i] = s
        for j, x in w.items():
            W[i, j] += x
    return W


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_peer_exponential_averages_exactly_in_log2_n_rounds(n):
    m = int(np.log2(n))
    P = np.eye(n)
    for k in range(m):
        Wk = dense(one_peer_exponential(n, k))
        assert np.allclose(Wk.sum(0), 1) and np.allclose(Wk.sum(1), 1)  # doubly stochastic
        P = Wk @ P
    assert np.allclose(P, np.full((n, n), 1 / n), atol=1e-12)


def test_one_peer_exponential_hops_for_other_sizes():
    assert [one_peer_exponential(9, k)[0][0] for k in range(5)] == [[1], [2], [4], [8], [1]]
    assert [one_peer_exponential(6, k)[5][1] for k in range(4)] == [[4], [3], [1], [4]]


BASE = {
    "run": {"seed": 2, "until": 4.0},
    "agents": {"count": 8, "activation": {"kind": "periodic", "period": 0.5}},
    "network": {"latency": {"kind": "constant", "value": 0.01}},
    "data": {"samples": 200, "features": 4},
    "algorithm": {"name": "dpsgd", "lr": 0.1, "batch": 8, "round_timeout": 0.3},
    "evaluation": {"every": 2.0, "metrics": ["accuracy"]},
}


def run(tmp_path, topology):
    return netsim.run(scenario_from_dict({**BASE, "topology": topology}), out=tmp_path)


def test_dpsgd_follows_the_one_peer_exponential_sequence(tmp_path):
    res = run(tmp_path / "r", {"kind": "exponential", "dynamic": {"kind": "one_peer_exponential"}})
    t = read_trace(res.trace_path).to_pandas()
    sends = t[t.kind == "send"]
    acts = t[(t.kind == "activate") & (t.t < 3.9)]  # rounds that had time to send before `until`
    assert len(sends) == len(acts) and (sends.groupby(["agent", "round"]).size() == 1).all()  # one peer
    assert ((sends.agent + 2 ** (sends["round"] % 3)) % 8 == sends.peer).all()
    assert res.summary["round_timeouts"] == 0  # everyone waits for exactly the one who sent
    # and the recorded run replays byte for byte with the dynamic graph in place
    replay(res.out, out=tmp_path / "rep")
    assert (tmp_path / "rep" / "trace.arrows").read_bytes() == res.trace_path.read_bytes()


def test_resampled_graphs_are_fresh_per_epoch_and_the_same_for_every_algorithm(tmp_path):
    topo = {"kind": "erdos_renyi", "p": 0.4, "dynamic": {"kind": "resample"}}
    res = run(tmp_path / "r", topo)
    sim = prepare(res.scenario)
    dyn = DynamicTopology(sim)
    t = read_trace(res.trace_path).to_pandas()
    sends = t[t.kind == "send"]
    for k, grp in sends.groupby("round"):
        lists = dyn.at(int(k))
        assert all(p in lists[a][0] for a, p in zip(grp.agent, grp.peer, strict=True))
    graphs = {tuple(tuple(x[0]) for x in dyn.at(k)) for k in range(6)}
    assert len(graphs) == 6
    other = prepare(scenario_from_dict({**BASE, "topology": topo,
                                                   "algorithm": {"name": "gossip"}}))
    assert DynamicTopology(other).at(3) == dyn.at(3)


def test_schedule_cycles_and_errors_name_the_graph(tmp_path):
    topo = {"kind": "ring", "dynamic": {"kind": "schedule", "every": "period", "period": 1.0,
                                        "graphs": [{"kind": "star"}, {"kind": "complete"}]}}
    res = run(tmp_path / "r", topo)
    t = read_trace(res.trace_path).to_pandas()
    acts = t[t.kind == "activate"][["agent", "round", "t"]]
    sends = t[t.kind == "send"].merge(acts, left_on=["agent", "round"],
                                      right_on=["agent", acts["round"] - 1], suffixes=("", "_act"))
    star = sends[np.floor(sends.t_act) % 2 == 0]
    assert ((star.agent == 0) | (star.peer == 0)).all()  # star epochs: only hub links
    assert len(sends[np.floor(sends.t_act) % 2 == 1].groupby(["agent", "peer"])) == 56  # complete
    graphs = [{"kind": "ring"}, {"kind": "random_regular", "degree": 9}]
    bad = {"kind": "ring", "dynamic": {"kind": "schedule", "graphs": graphs}}
    with pytest.raises(InputError, match=r"topology.dynamic.graphs\[1\].degree"):
        prepare(scenario_from_dict({**BASE, "topology": bad}))
    with pytest.raises(InputError, match="'resample' needs a random topology.kind"):
        ring = {"kind": "ring", "dynamic": {"kind": "resample"}}
        prepare(scenario_from_dict({**BASE, "topology": ring}))


# asynchronous programs read the links of the current activation ---------------------------------------------------
def asynchronous(algorithm: dict, topology: dict, n: int = 8) -> dict:
    return {"run": {"seed": 4, "until": 6.0},
            "agents": {"count": n, "activation": {"kind": "poisson", "rate": 2.0},
                       "compute_time": {"kind": "constant", "value": 0.001}},
            "topology": topology, "network": {"latency": {"kind": "uniform", "low": 0.01, "high": 0.2}},
            "data": {"samples": 40 * n, "features": 4}, "algorithm": algorithm,
            "evaluation": {"every": 1.0e6, "metrics": ["accuracy"]}}


def test_push_gossip_pushes_to_the_one_peer_of_each_epoch(tmp_path):
    """Gossip learning on one-peer exponential graphs: each push goes to i + 2^((round - 1) mod 3), the peer of the
    activation's epoch (a program that kept the links it started with would push to i + 1 forever)."""
    sc = asynchronous({"name": "push_gossip", "lr": 0.5, "batch": 0},
                      {"kind": "ring", "dynamic": {"kind": "one_peer_exponential"}})
    res = netsim.run(scenario_from_dict(sc), out=tmp_path / "r")
    sends = read_trace(res.trace_path).to_pandas().query("kind == 'send'")
    assert len(sends) > 50 and set(sends["round"] % 3) == {0, 1, 2}
    assert ((sends.agent + 2 ** ((sends["round"] - 1) % 3)) % 8 == sends.peer).all()


@pytest.mark.parametrize("trigger", ["always", "absolute"])
def test_event_triggered_mixes_and_sends_over_the_current_graph(tmp_path, trigger):
    """Resampled Erdos-Renyi graphs: every send goes to an out-neighbour of the activation's epoch, and an agent
    first met later is mixed at (and compared with) the common initial model instead of failing the run."""
    topo = {"kind": "erdos_renyi", "p": 0.4, "dynamic": {"kind": "resample"}}
    sc = asynchronous({"name": "event_triggered", "lr": 0.5, "batch": 4, "trigger": trigger, "threshold": 0.01},
                      topo)
    res = netsim.run(scenario_from_dict(sc), out=tmp_path / "r")
    assert res.summary["stop_reason"] == "until" and res.summary["messages_delivered"] > 20
    dyn = DynamicTopology(prepare(res.scenario))
    sends = read_trace(res.trace_path).to_pandas().query("kind == 'send'")
    # a send's round tag is the activation's count k from 0: its epoch
    assert all(p in dyn.at(int(k))[a][0] for a, p, k in zip(sends.agent, sends.peer, sends["round"], strict=True))


def test_mixing_with_copies_uses_the_current_weights_and_the_initial_model_for_a_new_neighbour():
    """NeighborCopies against the formula: W_ii x + sum over the current in-neighbours of W_ij xhat_j, where an
    in-neighbour that never sent (here one new to this agent) counts at the common initial model."""
    import torch

    from netsim.comm.patterns import NeighborCopies

    class Fake:
        def __init__(self):
            self.weights, self.self_weight = {1: 0.25, 2: 0.25}, 0.5
            self.bank = {0: torch.zeros(3), 1: torch.zeros(3), 2: torch.zeros(3), 3: torch.zeros(3)}

        def params_of(self, j):
            return self.bank[j].clone()

        @property
        def params(self):
            return self.bank[0].clone()

    a = Fake()
    nc = NeighborCopies(a)
    nc.copies[2] = torch.tensor([4.0, 4.0, 4.0])  # what 2 last sent
    a.weights, a.self_weight = {2: 0.5, 3: 0.25}, 0.25  # a new epoch: 1 gone, 3 new (never sent)
    x = torch.tensor([1.0, 2.0, 3.0])
    assert torch.equal(nc.mix(x), 0.25 * x + 0.5 * torch.tensor([4.0, 4.0, 4.0]))


@pytest.mark.parametrize("name", ["choco", "sparq", "do_adp", "cpgt"])
def test_public_copy_methods_refuse_a_changing_topology_before_the_run(tmp_path, name):
    """CHOCO public copies are sums of a neighbour's compressed differences since the start: a neighbour met later
    has none. Refused with the key before anything is written (the run used to crash at its first new neighbour)."""
    algorithm = {"name": name, **({"sigma": 0.1} if name == "do_adp" else {})}
    sc = asynchronous(algorithm, {"kind": "erdos_renyi", "p": 0.5, "dynamic": {"kind": "resample"}})
    why = rf"topology.dynamic: algorithm '{name}' keeps public copies .* needs a fixed topology"
    with pytest.raises(InputError, match=why):
        netsim.run(scenario_from_dict(sc), out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_the_cli_refuses_choco_on_a_changing_topology_with_exit_2(tmp_path):
    import subprocess

    import tomli_w

    from tests.conftest import cli_env, netsim_cli

    sc = asynchronous({"name": "choco"}, {"kind": "ring", "dynamic": {"kind": "one_peer_exponential"}})
    (tmp_path / "s.toml").write_text(tomli_w.dumps(sc))
    for cmd in ("run", "validate"):
        res = subprocess.run(netsim_cli(cmd, str(tmp_path / "s.toml"), *(["--out", str(tmp_path / "o")]
                                                                        if cmd == "run" else [])),
                             capture_output=True, text=True, env=cli_env())
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert "topology.dynamic: algorithm 'choco' keeps public copies" in res.stderr
    assert not (tmp_path / "o").exists()
