"""Communication parts: push-sum, pairwise gossip, event triggers, compression."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from netsim.comm.compression import Compressor, ErrorFeedback, PublicCopies, kept_count
from netsim.comm.patterns import PushSum
from netsim.comm.stats import comm_summary
from netsim.scenario import scenario_from_dict
from netsim.sim.kernel import Simulation
from netsim.trace.events import records
from netsim.trace.io import TraceWriter
from tests.conftest import BASE, merge


def _sim(program=None, collect: list | None = None, **extra) -> Simulation:
    from netsim import api

    sc = scenario_from_dict(merge(BASE, extra))
    writer = TraceWriter(None, {}, on_batch=lambda cols: collect.extend(records(cols))) if collect is not None else None
    if program is None:
        return api.prepare(sc, writer)
    return Simulation(sc, program, None, writer=writer)


def _random_params(sim: Simulation, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(sim.bank.W.shape, generator=g, dtype=sim.bank.W.dtype).to(sim.device)
    sim.bank.W.copy_(W)
    return W.clone()


DIRECTED = {"topology": {"kind": "erdos_renyi", "p": 0.3, "directed": True},
            "model": {"dtype": "float64"},
            "agents": {"count": 10, "activation": {"kind": "poisson", "rate": 2.0},
                       "compute_time": {"kind": "constant", "value": 0.0}},
            "network": {"latency": {"kind": "exponential", "mean": 0.05}},
            "run": {"seed": 5, "until": 150.0}, "evaluation": {"every": 50.0}}


# push-sum ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss", [0.0, 0.2])
def test_pushsum_directed_converges_to_exact_average_and_conserves_mass(loss):
    states: dict[int, PushSum] = {}

    def program(agent, _params):
        ps = states[agent.id] = PushSum(agent, agent.params)
        while True:
            yield agent.wake()
            ps.absorb()
            agent.params = ps.estimate
            yield ps.push()

    sim = _sim(program, **merge(DIRECTED, {"network": {"loss": loss}}))
    x0 = _random_params(sim)
    assert not all(sim.graph.has_edge(v, u) for u, v in sim.graph.edges)  # really directed
    sim.run()
    target = x0.mean(0)
    err = (sim.bank.W - target).abs().max().item()
    assert err < 1e-8, err
    # running sums: mass held + mass in flight (sent sums not yet absorbed) is exactly the initial mass
    held_x = sum(ps.x for ps in states.values())
    held_y = sum(ps.y for ps in states.values())
    for i, ps in states.items():
        for j in sim.agents[i].neighbors:
            last = states[j].rho.get(i)
            held_x = held_x + ps.sigma_x - (last[1] if last else 0.0)
            held_y += ps.sigma_y - (last[2] if last else 0.0)
    assert torch.allclose(held_x, x0.sum(0), atol=1e-9)
    assert held_y == pytest.approx(len(states), abs=1e-9)


def _pushsum_program(running_sums: bool):
    def program(agent, _params):
        ps = PushSum(agent, agent.params, running_sums=running_sums)
        while True:
            yield agent.wake()
            ps.absorb()
            agent.params = ps.estimate
            yield ps.push()
    return program


def test_pushsum_registered_algorithm_under_loss_and_plain_shares_are_biased():
    """The registered 'pushsum' (lr = 0) is exact under 20% loss; plain shares lose mass and miss."""
    events: list = []
    lossy = merge(DIRECTED, {"algorithm": {"name": "pushsum", "lr": 0.0}, "network": {"loss": 0.2}})
    sim = _sim(collect=events, **lossy)
    x0 = _random_params(sim, seed=1)
    sim.run()
    drops = sum(e.kind == "drop" for e in events)
    assert drops > 0.15 * sum(e.kind == "send" for e in events)
    assert (sim.bank.W - x0.mean(0)).abs().max().item() < 1e-8
    plain = _sim(_pushsum_program(False), **lossy)
    _random_params(plain, seed=1)
    plain.run()
    assert (plain.bank.W - x0.mean(0)).abs().max().item() > 1e-2
    assert (plain.bank.W - plain.bank.W.mean(0)).abs().max().item() < 1e-6  # consensus, on a wrong value


# pairwise gossip -----------------------------------------------------------------------------------
@pytest.mark.parametrize("roles", ["all", "bipartite"])
def test_pairwise_gossip_preserves_sum_and_reaches_average(roles):
    sim = _sim(**{"algorithm": {"name": "adpsgd", "lr": 0.0, "reply_timeout": 5.0, "roles": roles},
                  "model": {"dtype": "float64"},
                  "agents": {"activation": {"kind": "poisson", "rate": 2.0}},
                  "network": {"latency": {"kind": "exponential", "mean": 0.05}},
                  "run": {"until": 60.0}})
    x0 = _random_params(sim, seed=2)
    sim.run()
    s = comm_summary(sim)
    assert s["gossip_exchanges"] > 100
    if roles == "all":
        assert s["gossip_refused"] > 0  # the lock was exercised
    assert torch.allclose(sim.bank.W.sum(0), x0.sum(0), atol=1e-10)
    assert (sim.bank.W - x0.mean(0)).abs().max().item() < 1e-3


def test_adpsgd_records_staleness_and_learns():
    sim = _sim(**{"algorithm": {"name": "adpsgd", "lr": 0.5, "batch": 16, "reply_timeout": 1.0},
                  "agents": {"activation": {"kind": "poisson", "rate": 2.0},
                             "compute_time": {"kind": "exponential", "mean": 0.3}}})
    sim.run()
    s = comm_summary(sim)
    assert s["adpsgd_staleness_samples"] > 100 and s["adpsgd_staleness_max"] >= 1
    assert sim.metrics[-1]["accuracy"] > 0.9


# event-triggered -----------------------------------------------------------------------------------
ET = {"agents": {"activation": {"kind": "poisson", "rate": 2.0}},
      "network": {"latency": {"kind": "exponential", "mean": 0.05}}}


def _et(trigger: str, threshold: float):
    events: list = []
    sim = _sim(collect=events, **merge(ET, {"algorithm": {"name": "event_triggered", "lr": 0.5, "batch": 16,
                                                           "trigger": trigger, "threshold": threshold}}))
    sim.run()
    sends = [(e.t, e.agent, e.peer, e.size) for e in events if e.kind == "send"]
    return sim, sends


def test_event_triggered_threshold_zero_equals_always_bit_for_bit():
    a, sa = _et("always", 0.0)
    b, sb = _et("absolute", 0.0)
    assert torch.equal(a.bank.W, b.bank.W)
    assert sa == sb and len(sa) > 100
    s = comm_summary(b)
    assert "trigger_skipped" not in s and s["trigger_sent"] == len(sb)


def test_event_triggered_huge_threshold_sends_nothing_and_counts_savings():
    sim, sends = _et("absolute", 1e9)
    s = comm_summary(sim)
    assert sends == [] and "trigger_sent" in s and s["trigger_sent"] == 0
    assert s["trigger_skipped"] > 100 and s["trigger_saved_fraction"] == 1.0
    assert s["trigger_bytes_saved"] == s["trigger_skipped"] * sim.bank.W.shape[1] * 4


def test_event_triggered_thresholds_save_messages_and_still_learn():
    base, s0 = _et("always", 0.0)
    for kind, thr in [("absolute", 0.05), ("relative", 0.05), ("decaying", 0.2)]:
        sim, sends = _et(kind, thr)
        assert 0 < len(sends) < len(s0), kind
        assert sim.metrics[-1]["accuracy"] > base.metrics[-1]["accuracy"] - 0.05, kind


# compression --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("comp", [Compressor("none"), Compressor("topk", 0.1), Compressor("topk", 0.33),
                                  Compressor("randk", 0.25, unbiased=True), Compressor("qsgd", bits=1),
                                  Compressor("qsgd", bits=3), Compressor("qsgd", bits=8)])
def test_payload_size_equals_encoded_size(comp, dtype):
    comp = Compressor(comp.kind, comp.ratio, comp.unbiased, comp.bits, rng=np.random.default_rng(0))
    for d in (1, 7, 101):
        v = torch.randn(d, dtype=dtype, generator=torch.Generator().manual_seed(d))
        enc = comp(v)
        assert enc.size_bytes == len(enc.to_bytes())
        vb = 4 if dtype == torch.float32 else 8
        k = max(1, math.ceil(comp.ratio * d))
        expect = {"none": d * vb, "topk": k * (vb + 4), "randk": 8 + k * vb,
                  "qsgd": 4 + math.ceil(d * (comp.bits + 1) / 8)}[comp.kind]
        assert enc.size_bytes == expect == comp.encoded_size(d, vb)
        assert enc.decode().shape == v.shape and enc.decode().dtype == dtype


def test_kept_count_rounding():
    """k = ratio * d as an integer in [1, d]: rounded up, down or half up; a product that misses an integer
    by floating-point error only (0.14 * 50 = 7.000000000000001) is that integer under every rounding."""
    assert [kept_count(51, 0.3, r) for r in ("ceil", "floor", "round")] == [16, 15, 15]
    assert [kept_count(8, 0.3, r) for r in ("ceil", "floor", "round")] == [3, 2, 2]
    assert [kept_count(10, 0.25, r) for r in ("ceil", "floor", "round")] == [3, 2, 3]   # 2.5: half up
    assert 0.14 * 50 != 7 and [kept_count(50, 0.14, r) for r in ("ceil", "floor", "round")] == [7, 7, 7]
    assert [kept_count(90, 0.7, r) for r in ("ceil", "floor", "round")] == [63, 63, 63]   # 62.99999999999999
    assert kept_count(50, 0.3) == 15 and kept_count(5, 0.01, "floor") == 1 and kept_count(5, 1.0) == 5
    v = torch.arange(51, dtype=torch.float64)
    for r, k in (("ceil", 16), ("floor", 15), ("round", 15)):
        comp = Compressor("topk", 0.3, rounding=r)
        enc = comp(v)
        assert enc.values.numel() == k and enc.size_bytes == comp.encoded_size(51, 8) == k * 12
        assert torch.equal(enc.indices, torch.arange(51 - k, 51))
    with pytest.raises(ValueError):
        kept_count(10, 0.33, "nearest")


def test_topk_keeps_largest_and_randk_qsgd_are_unbiased():
    v = torch.tensor([0.1, -3.0, 0.2, 2.0, -0.05, 0.0], dtype=torch.float64)
    assert torch.equal(Compressor("topk", 2 / 6)(v).decode(), torch.tensor([0, -3.0, 0, 2.0, 0, 0],
                                                                             dtype=torch.float64))
    rng = np.random.default_rng(1)
    for comp in (Compressor("randk", 0.5, unbiased=True, rng=rng), Compressor("qsgd", bits=2, rng=rng)):
        mean = torch.stack([comp(v).decode() for _ in range(8000)]).mean(0)
        assert torch.allclose(mean, v, atol=0.1), (comp.kind, mean)
    # qsgd never exceeds the norm and keeps signs
    q = Compressor("qsgd", bits=2, rng=rng)(v).decode()
    assert torch.all(q.abs() <= torch.linalg.vector_norm(v).float() + 1e-6)
    assert torch.all((q * v) >= 0)


def test_topk_error_feedback_converges_on_quadratic():
    """EF-SGD (Karimireddy et al. 2019, Alg. 2) with top-1 of 20 coordinates on f = 1/2 x'Ax - b'x."""
    g = torch.Generator().manual_seed(0)
    d = 20
    M = torch.randn(d, d, generator=g, dtype=torch.float64)
    A = M @ M.T / d + torch.eye(d, dtype=torch.float64)
    b = torch.randn(d, generator=g, dtype=torch.float64)
    x_star = torch.linalg.solve(A, b)
    lr = 0.1 / torch.linalg.eigvalsh(A).max().item()  # EF needs ~ (k/d)-scaled steps (Stich et al. 2018)
    x = y = torch.zeros(d, dtype=torch.float64)
    ef, top1 = ErrorFeedback(Compressor("topk", 1 / d), x), Compressor("topk", 1 / d)
    for _ in range(3000):
        x = x - ef(lr * (A @ x - b)).decode()
        y = y - top1(lr * (A @ y - b)).decode()
    assert (x - x_star).norm().item() < 1e-10
    assert ef.e.norm().item() < 1e-10
    assert (y - x_star).norm().item() > 1e-3  # without memory: far slower at the same budget


def test_public_copies_track_exactly_with_identity_compression():
    pc = PublicCopies(Compressor("none"), torch.zeros(3), [1])
    x = torch.tensor([1.0, 2.0, 3.0])
    q = pc.delta(x)
    pc.receive(1, q)  # a neighbour whose public copy equals ours
    assert torch.equal(pc.own, x) and torch.equal(pc.copies[1], x)
    assert torch.equal(pc.consensus(x, {1: 0.5}, 1.0), x)


def test_choco_network_sees_compressed_size():
    events: list = []
    sim = _sim(collect=events, algorithm={"name": "choco", "lr": 0.5, "batch": 16, "round_timeout": 0.2,
                                          "compressor": "topk", "ratio": 0.5, "gamma": 0.5})
    sim.run()
    P = sim.bank.W.shape[1]
    sizes = {e.size for e in events if e.kind == "send"}
    assert sizes == {math.ceil(0.5 * P) * (4 + 4)}
    assert sim.metrics[-1]["accuracy"] > 0.9


def test_scenario_errors_name_the_key():
    from netsim.errors import InputError

    with pytest.raises(InputError, match="trigger"):
        _sim(algorithm={"name": "event_triggered", "trigger": "sometimes"})
    with pytest.raises(InputError, match="ratio"):
        _sim(algorithm={"name": "choco", "ratio": 0.0})


def _fake_agent(round_: int, weights: dict[int, float], msgs: list):
    """Just what AsyncPush touches: an inbox queue, the round, the mixing weights, the stats."""
    from collections import deque
    from types import SimpleNamespace

    from netsim.sim.network import Message

    q = deque(Message(i, src, 0, "push", rnd, torch.full((2,), val, dtype=torch.float64), 16, 0.0)
              for i, (src, rnd, val) in enumerate(msgs))
    from netsim.comm.stats import CommStats

    return SimpleNamespace(stats=CommStats(), round=round_, weights=weights,
                           inbox=SimpleNamespace(queues={"push": q}))


def test_async_push_merge_closed_form_with_staleness_weights():
    from netsim.comm.patterns import AsyncPush

    # from j=1: an old value (round 2) overtaken by round 3; from k=2: round 1; my round is 5
    agent = _fake_agent(5, {1: 0.25, 2: 0.25, 3: 0.25}, [(1, 2, 9.0), (2, 1, 2.0), (1, 3, 1.0)])
    own = torch.zeros(2, dtype=torch.float64)
    out = AsyncPush(agent, staleness_power=1.0).merge(own)
    # s_j = 5 - 1 - 3 = 1, s_k = 5 - 1 - 1 = 3: weights 0.25/2 and 0.25/4; agent 3 sent nothing
    assert torch.allclose(out, torch.full((2,), 0.125 * 1.0 + 0.0625 * 2.0, dtype=torch.float64))
    assert not agent.inbox.queues["push"]  # drained
    agent = _fake_agent(5, {1: 0.25, 2: 0.25}, [(1, 4, 1.0), (2, 4, 3.0)])
    assert torch.allclose(AsyncPush(agent).merge(own + 1.0), torch.full((2,), 0.5 + 0.25 + 0.75,
                                                                        dtype=torch.float64))
    s = agent.stats.summary()
    assert s["push_staleness_max"] == 0.0 and s["push_staleness_samples"] == 2
