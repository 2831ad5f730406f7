"""Barrier rounds on a time-varying graph and over a kernel's own routes, played by both engines.

The synchronous windows adopt each round's epoch of a time-varying topology where the engine's activation listener
does (``Exchange.adopt``), ask a kernel's ``routes`` agent by agent as the engine's program does (``Exchange.route``)
and end a kernel's run at its own horizon; these tests hold them to the events engine byte for byte (trace,
metrics.csv, final models), with PrivSGP-VR and PrivSGP (push-sum shares on the one-peer exponential graph, the
SAGA table, DP releases) drawn over their parameters.
"""

from __future__ import annotations

import attrs
import pytest
import torch
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

import netsim
from netsim.algorithms.registry import register
from netsim.rounds import GradientRequest, SyncKernel, SyncRounds
from netsim.scenario import scenario_from_dict
from netsim.scenario.structure import at_least, field, positive
from tests.search import search
from tests.test_round_kernels import assert_identical, base, run_both


@attrs.frozen
class PeerParams:
    lr: float = field(0.3, check=positive, doc="step size")
    batch: int = field(4, check=at_least(1), doc="mini-batch")
    exchanges: int = field(1, check=at_least(1), doc="barrier exchanges a round")
    round_timeout: float = field(0.05, check=positive, doc="seconds a barrier waits")


@register("test_peer_average", PeerParams)
class PeerAverage(SyncKernel):
    """A gradient step, then per exchange the plain average with the round's peers: exchange 0 both ways with the
    epoch's out- and in-neighbour (its own routes), the others over the graph's links (routes None)."""

    pattern = SyncRounds(tag="peers")
    reads = frozenset({"lr", "batch", "exchanges"})
    per_row = frozenset({"y"})

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch)

    def exchanges(self, p, state):
        return p.exchanges

    def local(self, b, p):
        b.y = b.x - p.lr * b.g
        b.send(b.y)

    def routes(self, b, p):
        if b.s > 0:
            return None
        a = b.agents[0]
        peers = sorted(set(a.neighbors) | set(a.in_neighbors))
        return peers, peers

    def combine(self, b, p, got):
        rows = []
        for y, g in zip(b.y, got, strict=True):
            out = y.clone()
            for j in sorted(g):
                out.add_(g[j])
            rows.append(out / (1 + len(g)))
        b.y = torch.stack(rows)
        if b.s + 1 < p.exchanges:
            b.send(b.y)
        else:
            b.set_params(b.y)


ONE_PEER = {"kind": "ring", "directed": True, "dynamic": {"kind": "one_peer_exponential"}}


@st.composite
def routed(draw) -> dict:
    n = draw(st.integers(3, 8))
    steps = draw(st.integers(1, 2))
    sc = base(n=n, rounds=draw(st.integers(2, 5)))
    every = draw(st.sampled_from([{"every": "round"}, {"every": "period", "period": 0.1},
                                  {"every": "period", "period": 0.25}]))
    sc["topology"] = {**ONE_PEER, "dynamic": {**ONE_PEER["dynamic"], **every}}
    sc["algorithm"] = {"name": "test_peer_average", "lr": 0.3, "batch": draw(st.integers(1, 6)), "exchanges": steps,
                       "round_timeout": 0.05}
    sc["network"]["loss"] = 0.0 if steps > 1 else draw(st.sampled_from([0.0, 0.3]))
    sc["model"] = {"kind": "logistic", "dtype": draw(st.sampled_from(["float32", "float64"]))}
    sc["evaluation"]["every"] = draw(st.sampled_from([1.0e6, 0.13, 0.015]))
    return sc


@search(4, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=routed())
def test_a_kernel_with_routes_on_a_one_peer_graph_runs_windowed_byte_for_byte(tmp_path_factory, sc):
    assert_identical(run_both(tmp_path_factory.mktemp("routes"), sc))


def test_routes_and_the_epochs_links_are_the_ones_used(tmp_path):
    """Round k's sends (tag ``peers``, exchange 0) go both ways to the epoch's peers i +- 2^(k mod m), in either
    engine; a graph exchange (exchange 1) only to i + 2^(k mod m)."""
    from netsim.trace.io import read_trace

    sc = base(n=8, rounds=5)
    sc["topology"] = ONE_PEER
    sc["algorithm"] = {"name": "test_peer_average", "lr": 0.3, "batch": 2, "exchanges": 2, "round_timeout": 0.05}
    run_both(tmp_path, sc)
    t = read_trace(tmp_path / "windowed" / "trace.arrows").table.to_pylist()
    sends = [r for r in t if r["kind"] == "send"]
    m = (8 - 1).bit_length()
    assert len(sends) == sum(8 * (2 if 2 ** (k % m) != 4 else 1) + 8 for k in range(5))  # hop 4: i + 4 = i - 4
    for r in sends:
        k, s = divmod(r["round"], 2)
        h = 2 ** (k % m)
        want = {(r["agent"] + h) % 8, (r["agent"] - h) % 8} if s == 0 else {(r["agent"] + h) % 8}
        assert r["peer"] in want


def test_routes_that_do_not_agree_are_named(tmp_path):
    """A route to an agent that does not wait for the sender would leave its message queued: the windows say so."""

    class OneWay(PeerAverage):
        def routes(self, b, p):
            a = b.agents[0]
            return list(a.neighbors), [a.id]  # waits for itself, sends to its peer

    from netsim.algorithms import registry
    from netsim.errors import RunCrashed

    registry.REGISTRY["test_one_way"] = (OneWay(), PeerParams)
    try:
        sc = base(n=4, rounds=2)
        sc["algorithm"] = {"name": "test_one_way", "lr": 0.3, "batch": 2, "round_timeout": 0.05}
        with pytest.raises(RunCrashed, match=r"ValueError: OneWay\.routes: agent 0 sends to 1, which does not wait for "
                                            "it"):
            netsim.run(scenario_from_dict(sc), out=tmp_path / "w", engine="windowed")
    finally:
        del registry.REGISTRY["test_one_way"]


# PrivSGP-VR and PrivSGP (push-sum on the one-peer exponential graph, SAGA), DP^2-SGD: DP releases, their own K ------
@st.composite
def privsgp(draw) -> dict:
    n = draw(st.integers(3, 9))
    sc = base(n=n, rounds=4)
    del sc["run"]["rounds"]  # the algorithm's own K ends the run
    sc["run"]["until"] = 100.0
    sc["data"] = {"kind": "synthetic", "samples": draw(st.sampled_from([12, 20])) * n, "features": 4,
                  "partition": draw(st.sampled_from(["iid", "quantity"]))}
    name = draw(st.sampled_from(["privsgp_vr", "privsgp", "dp2_sgd"]))
    undirected = [{"kind": "ring"}, {"kind": "erdos_renyi", "p": 0.6}]  # DP^2-SGD: a symmetric mixing
    directed = [ONE_PEER, {"kind": "erdos_renyi", "p": 0.5, "directed": True}]
    sc["topology"] = draw(st.sampled_from(undirected if name == "dp2_sgd" else directed))
    alg = {"name": name, "iterations": draw(st.integers(2, 5)), "batch": draw(st.integers(1, 4)),
           "lr": draw(st.sampled_from([0.0, 0.2])), "block": draw(st.integers(1, 3)), "clip": draw(st.booleans()),
           "G": draw(st.sampled_from([0.5, 1.0])), "round_timeout": 0.05}
    if draw(st.booleans()):
        alg["sigma"] = draw(st.sampled_from([0.0, 0.1]))
    sc["algorithm"] = alg
    sc["network"]["loss"] = draw(st.sampled_from([0.0, 0.0, 0.3]))
    sc["model"] = {"kind": "logistic", "dtype": draw(st.sampled_from(["float32", "float64"]))}
    sc["evaluation"]["every"] = draw(st.sampled_from([1.0e6, 0.13, 0.2]))
    return sc


@search(10, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=privsgp())
def test_privsgp_runs_windowed_byte_for_byte_with_drawn_parameters(tmp_path_factory, sc):
    from hypothesis import assume

    from netsim.api import prepare
    from netsim.errors import InputError

    try:
        prepare(scenario_from_dict(sc))
    except InputError as e:  # a drawn digraph that cannot be built (not strongly connected): not a scenario
        assume("topology" not in str(e))
        raise
    assert_identical(run_both(tmp_path_factory.mktemp("privsgp"), sc))


def test_privsgp_vr_killed_after_a_checkpoint_resumes_by_restore_byte_for_byte(tmp_path):
    """A windowed run on the one-peer graph cut after its second checkpoint (round 4): the restore (push-sum weights
    in the kernel's state, numerators and the SAGA table in the bank, the epoch's links adopted again at the next
    activation) continues to the uninterrupted run's bytes."""
    from netsim import api
    from tests.test_checkpoint_windowed import killed_at, same_outputs

    sc = base(n=6, rounds=4)
    del sc["run"]["rounds"]
    sc["run"].update(until=100.0, checkpoint_every_rounds=2)
    sc["topology"] = ONE_PEER
    sc["algorithm"] = {"name": "privsgp_vr", "iterations": 7, "lr": 0.2, "sigma": 0.1, "round_timeout": 0.05}
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)
    out = killed_at(tmp_path, sc, 2)
    res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore" and res.summary["engine"] == "windowed"
    same_outputs(res.out, ref.out)
