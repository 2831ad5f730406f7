"""Link and agent models: closed forms, hand computations, invariants."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import simpy

from netsim.compute.data import find_data_file
from netsim.errors import InputError
from netsim.scenario.load import scenario_from_dict
from netsim.scenario.schema import BurstSpec
from netsim.sim.churn import build_churn
from netsim.sim.links import GilbertElliott
from netsim.sim.network import ComposedLinks, LeanLinks, Network
from netsim.sim.streams import Streams


def scenario(network=None, agents=None, n=4, seed=0, until=10.0, **extra):
    data = {"run": {"seed": seed, "until": until}, "agents": {"count": n, **(agents or {})},
            "algorithm": {"name": "dpsgd"}, "network": network or {}, **extra}
    return scenario_from_dict(data)


ZERO = {"kind": "constant", "value": 0.0}


def make_net(network=None, agents=None, n=4, seed=0):
    """A Network on its own simpy env (no model, no torch): returns (env, net, events, delivered)."""
    sc = scenario(network, agents, n, seed)
    env = simpy.Environment()
    events, delivered = [], []
    streams = Streams(seed)
    net = Network(env, sc.network, streams, events.append, delivered.append)
    churn = build_churn(sc.agents, streams, find_data_file)
    net.attach(SimpleNamespace(scenario=sc, emit=events.append, env=env, start_housekeeping=env.process,
                               housekeeping_ended=lambda: None, churn=churn))
    return env, net, events, delivered


def send_at(env, net, plan):
    """plan: [(t, src, dst, size)], sent in order; returns the sender busy times."""
    busy = []

    def proc():
        for t, src, dst, size in plan:
            if t > env.now:
                yield env.timeout(t - env.now)
            busy.append(net.send(src, dst, None, "m", 0, size))
    env.process(proc())
    env.run()
    return busy


def by_kind(events, kind):
    return [e for e in events if e.kind == kind]


# Gilbert-Elliott -------------------------------------------------------------------------------------

@pytest.mark.parametrize("p_enter,p_exit", [(0.05, 0.25), (0.01, 0.5), (0.2, 0.1)])
def test_gilbert_elliott_stationary_loss_and_mean_burst(p_enter, p_exit):
    spec = BurstSpec(p_enter=p_enter, p_exit=p_exit)
    ge = GilbertElliott(spec, np.random.default_rng(1))
    n = 200_000
    lost = np.array([ge.lost() for _ in range(n)])
    pi_bad = p_enter / (p_enter + p_exit)  # closed form stationary loss rate (loss_bad=1, loss_good=0)
    assert GilbertElliott.stationary_loss(spec) == pytest.approx(pi_bad)
    se = np.sqrt(pi_bad * (1 - pi_bad) / n * (2 - p_enter - p_exit) / (p_enter + p_exit))  # AR(1) variance
    assert abs(lost.mean() - pi_bad) < 5 * se
    # runs of consecutive losses are geometric with mean 1 / p_exit
    edges = np.flatnonzero(np.diff(np.r_[0, lost.astype(int), 0]))
    runs = edges[1::2] - edges[::2]
    assert runs.mean() == pytest.approx(1 / p_exit, rel=0.05)


def test_gilbert_elliott_partial_loss_states():
    spec = BurstSpec(p_enter=0.1, p_exit=0.3, loss_good=0.02, loss_bad=0.6)
    ge = GilbertElliott(spec, np.random.default_rng(2))
    rate = np.mean([ge.lost() for _ in range(200_000)])
    assert rate == pytest.approx(0.75 * 0.02 + 0.25 * 0.6, abs=0.01)


def test_burst_loss_through_the_network_is_per_link_and_bursty():
    env, net, events, _ = make_net({"burst": {"p_enter": 0.1, "p_exit": 0.2}, "latency": ZERO})
    send_at(env, net, [(k * 0.01, 0, 1, 10) for k in range(20_000)])
    drops = {e.msg for e in by_kind(events, "drop")}
    assert {e.tag for e in by_kind(events, "drop")} == {"loss"}
    lost = np.array([e.msg in drops for e in by_kind(events, "send")])
    assert lost.mean() == pytest.approx(1 / 3, abs=0.03)
    # P(loss | previous lost) = 1 - p_exit, far above the marginal (Bernoulli would give 1/3)
    assert lost[1:][lost[:-1]].mean() == pytest.approx(0.8, abs=0.03)


# bandwidth, uplink contention, overrides, outages ------------------------------------------------------

def test_uplink_contention_matches_hand_computation():
    env, net, events, delivered = make_net({"uplink": 1000.0, "latency": {"kind": "constant", "value": 0.01}})
    # node 0 sends 500 B to 1, 2, 3 at t=0 (a broadcast), then 250 B to 1 at t=0.2; node 1 sends at 0
    plan = [(0, 0, 1, 500), (0, 0, 2, 500), (0, 0, 3, 500), (0, 1, 2, 1000), (0.2, 0, 1, 250)]
    busy = send_at(env, net, plan)
    # uplink FIFO: ends 0.5, 1.0, 1.5; node 1's own uplink is independent: 1.0; then 1.5 + 0.25 = 1.75
    assert busy == pytest.approx([0.5, 1.0, 1.5, 1.0, 1.75 - 0.2])
    delays = [e.value for e in by_kind(events, "send")]
    assert delays == pytest.approx([0.51, 1.01, 1.51, 1.01, 1.56])
    arrivals = sorted((e.t, e.agent) for e in by_kind(events, "deliver"))
    assert [t for t, _ in arrivals] == pytest.approx([0.51, 1.01, 1.01, 1.51, 1.76])
    assert len(delivered) == 5


def test_link_bandwidth_and_uplink_take_the_slower_rate():
    env, net, events, _ = make_net({"uplink": 1000.0, "bandwidth": 500.0, "latency": ZERO})
    busy = send_at(env, net, [(0, 0, 1, 500), (0, 0, 2, 500)])
    assert busy == pytest.approx([1.0, 2.0])  # 500 B at min(500, 1000) B/s, FIFO on 0's uplink


def test_per_link_override_is_directed_unless_both():
    env, net, events, _ = make_net({"latency": {"kind": "constant", "value": 0.01},
                                    "links": [{"src": 0, "dst": 1,
                                               "latency": {"kind": "constant", "value": 0.2}},
                                              {"src": 2, "dst": 3, "loss": 1.0, "both": True}]})
    send_at(env, net, [(0, 0, 1, 8), (0, 1, 0, 8), (0, 2, 3, 8), (0, 3, 2, 8), (0, 1, 2, 8)])
    sends = by_kind(events, "send")
    assert [s.value for s in sends[:2]] == pytest.approx([0.2, 0.01])  # asymmetric link 0 <-> 1
    assert sorted((d.agent, d.peer) for d in by_kind(events, "drop")) == [(2, 3), (3, 2)]


def test_scheduled_outage_drops_only_inside_the_window_and_link():
    env, net, events, _ = make_net({"outages": [{"start": 1.0, "end": 2.0, "src": 0},
                                                {"start": 5.0, "end": 6.0}]})
    plan = [(t, s, d, 8) for t in (0.5, 1.0, 1.5, 2.0, 5.5) for s, d in ((0, 1), (1, 0))]
    send_at(env, net, plan)
    drops = sorted((round(e.t, 6), e.agent, e.tag) for e in by_kind(events, "drop"))
    assert drops == [(1.0, 0, "outage"), (1.5, 0, "outage"), (5.5, 0, "outage"), (5.5, 1, "outage")]


def test_out_of_range_agent_ids_are_input_errors():
    with pytest.raises(InputError, match=r"network.links\[0\].dst.*\[0, 3\]"):
        make_net({"links": [{"src": 0, "dst": 9}]})
    with pytest.raises(InputError, match=r"agents.offline\[0\].agent"):
        make_net(agents={"offline": [{"agent": 4, "start": 0.0, "end": 1.0}]})
    with pytest.raises(InputError, match="end: must be > start"):
        scenario({"outages": [{"start": 2.0, "end": 1.0}]})


# named streams -------------------------------------------------------------------------------------------

def test_kth_message_on_a_link_sees_the_same_draws_whatever_else_is_sent():
    spec = {"latency": {"kind": "exponential", "mean": 0.05}, "loss": 0.2, "uplink": 1e9,
            "burst": {"p_enter": 0.1, "p_exit": 0.3}}
    env, net, ev_a, _ = make_net(spec)
    send_at(env, net, [(k * 0.1, 0, 1, 8) for k in range(50)])
    env, net, ev_b, _ = make_net(spec)  # same link, interleaved with traffic on other links
    send_at(env, net, [(k * 0.1, s, d, 8) for k in range(50) for s, d in ((2, 1), (0, 1), (1, 3))])

    def link(events):
        drops = {e.msg for e in by_kind(events, "drop")}
        return [(round(e.value, 9), e.msg in drops) for e in by_kind(events, "send")
                if (e.agent, e.peer) == (0, 1)]
    assert link(ev_a) == link(ev_b)


def test_full_path_reproduces_the_default_path_draws():
    base = {"latency": {"kind": "lognormal", "mean": 0.02, "sigma": 0.5}, "loss": 0.3, "bandwidth": 1e4}
    env, net, ev_fast, _ = make_net(base)
    assert net.model is None  # nothing extra configured: the lean path, inline in send
    plan = [(k * 0.05, k % 3, (k + 1) % 3, 100) for k in range(300)]
    send_at(env, net, plan)
    env, net, ev_full, _ = make_net({**base, "outages": [{"start": 1e6, "end": 1e6 + 1}]})
    assert isinstance(net.model, ComposedLinks)
    send_at(env, net, plan)
    assert [(e.kind, e.t, e.value) for e in ev_fast] == [(e.kind, e.t, e.value) for e in ev_full]
    env, net, ev_model, _ = make_net(base)
    net.use(LeanLinks(net))  # the lean path as a model object decides exactly as the inline path
    send_at(env, net, plan)
    assert ev_model == ev_fast


def test_a_link_model_object_decides_delay_and_drop():
    """Any object with outcome(src, dst, now, size) is a link model: here every third message is dropped
    and the rest take 0.5 s plus 1 s per 100 bytes of transmission on a 100 B/s link."""

    class EveryThirdLost:
        def __init__(self):
            self.calls = []

        def outcome(self, src, dst, now, size):
            self.calls.append((src, dst, now, size))
            tx_end = now + size / 100
            return tx_end, tx_end - now + 0.5, "lost" if len(self.calls) % 3 == 0 else ""

    env, net, events, delivered = make_net()
    model = EveryThirdLost()
    net.use(model)
    busy = send_at(env, net, [(k * 1.0, 0, 1, 100) for k in range(6)])
    env.run()
    assert busy == [1.0] * 6 and [c[2] for c in model.calls] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert [(e.t, e.tag) for e in by_kind(events, "drop")] == [(2.0, "lost"), (5.0, "lost")]
    assert [(e.t, e.value) for e in by_kind(events, "deliver")] == [(t + 1.5, 1.5) for t in (0.0, 1.0, 3.0, 4.0)]
    assert len(delivered) == 4


# churn ---------------------------------------------------------------------------------------------------

def test_offline_agent_sends_and_receives_nothing():
    env, net, events, delivered = make_net(agents={"offline": [{"agent": 1, "start": 1.0, "end": 2.0}]},
                                           network={"latency": {"kind": "constant", "value": 0.3}})
    send_at(env, net, [(0.5, 0, 1, 8), (0.8, 0, 1, 8), (1.5, 1, 0, 8), (1.8, 0, 1, 8), (2.5, 1, 0, 8)])
    drops = [(e.t, e.agent, e.peer, e.tag) for e in by_kind(events, "drop")]
    # arrives 1.1 and 2.1 (receiver offline at 1.1 only); 1.5 sender offline
    assert drops == [(0.8, 0, 1, "offline"), (1.5, 1, 0, "offline")]
    assert sorted(round(m.sent, 6) for m in delivered) == [0.5, 1.8, 2.5]
    assert [(e.t, e.agent, e.value) for e in by_kind(events, "offline")] == [(1.0, 1, 1.0)]


def test_random_churn_intervals_have_the_configured_means():
    from netsim.sim.churn import RandomChurn

    rc = RandomChurn(np.random.default_rng(0), 5.0, 2.0)
    rc.end_of(40_000.0)
    off = np.array(rc.ends) - np.array(rc.starts)
    on = np.array(rc.starts[1:]) - np.array(rc.ends[:-1])
    assert off.mean() == pytest.approx(2.0, rel=0.05) and on.mean() == pytest.approx(5.0, rel=0.05)


def test_periodic_availability_wraps_like_fedscale(tmp_path):
    from netsim.sim.churn import read_availability

    p = tmp_path / "a.json"
    p.write_text('{"7": {"active": [1, 5], "inactive": [3, 8], "finish_time": 10},'
                 ' "2": {"active": [0], "inactive": [100]}}')
    iv = read_availability(p, 2)
    assert iv[0].end_of(50.0) is None  # client "2" comes first by id: online in [0, 100)
    a = iv[1]  # offline [0,1), [3,5), [8,10) repeating every 10 s
    assert [a.end_of(t) for t in (0.5, 2.0, 3.0, 9.0, 13.5, 28.0)] == [1.0, None, 5.0, 10.0, 15.0, 30.0]
    assert a.next_start(5.5) == 8.0 and a.next_start(11.5) == 13.0 and a.next_start(10.5) == 10.5



def test_a_link_model_installed_through_setup_decides_a_whole_run(tmp_path):
    """The Python API's setup hook installs a model for a real run: every delivery takes exactly its delay."""
    import netsim
    from netsim.trace.io import read_trace

    class Fixed:
        def outcome(self, src, dst, now, size):
            return now, 0.125, ""

    sc = scenario(network={"loss": 0.5}, until=4.0)
    netsim.run(sc, out=tmp_path / "run", setup=lambda sim: sim.network.use(Fixed()))
    t = read_trace(tmp_path / "run").table.to_pandas()
    assert (t["kind"] == "drop").sum() == 0          # the model, not the scenario's 50% loss, decides
    d = t[t["kind"] == "deliver"]
    assert len(d) > 20 and (d["value"] == 0.125).all()


@pytest.mark.parametrize("extra", [{}, {"outages": [{"start": 0.3, "end": 0.6}], "uplink": 2e4}])
def test_a_broadcasts_outcomes_in_one_call_are_its_links_outcomes_one_by_one(extra):
    """``network.outcomes`` (the model's ``outcome`` link by link: the lean path's or a composed model's) decides a
    broadcast's messages as ``outcome`` does each in send order: the same delays, drops and busy links, and the
    longest hold."""
    from netsim.sim.network import hold_time, outcomes

    spec = {"latency": {"kind": "lognormal", "mean": 0.02, "sigma": 0.5}, "loss": 0.3, "bandwidth": 1e4, **extra}
    plan = [(k * 0.05, k % 4, [(k % 4 + d) % 4 for d in (1, 2, 3)], 100 + k) for k in range(40)]
    _, one, _, _ = make_net(spec)
    _, many, _, _ = make_net(spec)
    model_one, model_many = one.model or one.lean(), many.model or many.lean()
    assert (type(model_one) is LeanLinks) == (not extra)
    decide, dropped = outcomes(model_many), 0
    for now, src, dsts, size in plan:
        each = [model_one.outcome(src, d, now, size) for d in dsts]
        delays, reasons, longest = decide(src, dsts, now, size)
        assert delays == [e[1] for e in each] and reasons == [e[2] for e in each]
        assert longest == max([0.0, *(hold_time(e[0], now) for e in each)])
        dropped += sum(map(bool, reasons))
    assert 0 < dropped < 3 * len(plan)  # (lossy links: some of each)
