"""Lookahead windows (rounds/lookahead.py) with agents going offline, outages and bursty loss: the windowed engine
against the events engine, byte for byte (trace.arrows, metrics.csv, final models)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

import netsim
from netsim.scenario import scenario_from_dict
from tests.search import search
from tests.test_windowed import async_gossip, buildable, gossip, lookahead_run


def availability(folder, repeating: bool) -> str:
    """A FedScale-style trace of 12 clients, each online in two intervals of its own: repeating every 3 s, or
    once (then online to the end of any run here)."""
    path = folder / ("repeating.json" if repeating else "once.json")
    if repeating:
        data = {str(k): {"active": [0.2 * (k % 3), 1.4 + 0.1 * (k % 5)], "inactive": [1.0 + 0.1 * (k % 4), 2.8],
                         "finish_time": 3.0} for k in range(12)}
    else:
        data = {str(k): {"active": [0.0, 2.0 + 0.3 * (k % 3)], "inactive": [0.6 + 0.2 * (k % 4), 1.0e9]}
                for k in range(12)}
    path.write_text(json.dumps(data))
    return str(path)


@st.composite
def churned_gossip(draw, unbounded: bool = True) -> dict:
    """A drawn asynchronous gossip scenario (tests/test_windowed.py's region) with at least one of: scheduled
    offline intervals (some starting on a tick), random churn, an availability trace, outages, bursty loss."""
    sc = draw(async_gossip(unbounded))
    n = sc["agents"]["count"]
    kinds = draw(st.sets(st.sampled_from(["offline", "churn", "availability", "outages", "burst"]), min_size=1))
    agents, net = sc["agents"], sc["network"]
    if "offline" in kinds:
        agents["offline"] = [{"agent": draw(st.integers(0, n - 1)), "start": s, "end": s + length}
                             for s, length in draw(st.lists(st.tuples(
                                 st.sampled_from([0.0, 0.5, 1.0, 1.25, 2.0, 3.3]),
                                 st.sampled_from([0.1, 0.5, 1.0, 2.5])), min_size=1, max_size=3))]
    if "churn" in kinds:
        agents["churn"] = {"mean_online": draw(st.sampled_from([0.8, 3.0])),
                           "mean_offline": draw(st.sampled_from([0.2, 1.0]))}
    if "availability" in kinds:
        agents["availability"] = draw(st.sampled_from(["repeating", "once"]))  # the test writes the file
    if "outages" in kinds:
        net["outages"] = [{"start": s, "end": s + length, **ends}
                          for s, length, ends in draw(st.lists(st.tuples(
                              st.sampled_from([0.0, 0.5, 1.0, 2.2]), st.sampled_from([0.3, 1.0, 2.0]),
                              st.sampled_from([{}, {"src": 0}, {"dst": n - 1}, {"src": 1, "dst": 2}])),
                              min_size=1, max_size=2))]
    if "burst" in kinds:
        net["burst"] = {"p_enter": draw(st.sampled_from([0.1, 0.4])), "p_exit": draw(st.sampled_from([0.3, 1.0])),
                        "loss_good": draw(st.sampled_from([0.0, 0.05])),
                        "loss_bad": draw(st.sampled_from([0.7, 1.0]))}
    return sc


def agree(folder, sc: dict) -> dict:
    """Both engines on ``sc`` (its availability trace written to ``folder``): the same bytes and models."""
    if "availability" in sc["agents"]:
        sc["agents"]["availability"] = availability(folder, sc["agents"]["availability"] == "repeating")
    buildable(sc)
    return lookahead_run(folder, sc)  # churn, outages and bursts keep the run out of synchronous rounds


@search(12, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=churned_gossip())
def test_lookahead_windows_agree_with_the_engine_when_agents_go_offline_and_links_fail(tmp_path_factory, sc):
    agree(tmp_path_factory.mktemp("churned"), sc)


@search(8, phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(sc=churned_gossip(), every=st.sampled_from([0.6, 1.3]), nth=st.integers(1, 3))
def test_lookahead_windows_killed_after_a_checkpoint_restore_offline_agents_and_failing_links(tmp_path_factory, sc,
                                                                                               every, nth):
    """The same drawn scenarios with checkpoints, killed right after one of them and resumed by restoring it: the random
    churn drawn so far, each composed link's draws and Gilbert-Elliott state, the driver's queue (offline timers
    among its events): the uninterrupted run's trace, metrics and models."""
    import torch

    from netsim import api
    from tests.test_checkpoint_windowed import killed_at, watched

    folder = tmp_path_factory.mktemp("restored")
    if "availability" in sc["agents"]:
        sc["agents"]["availability"] = availability(folder, sc["agents"]["availability"] == "repeating")
    buildable(sc)
    sc["run"]["checkpoint_every"] = every
    with pytest.MonkeyPatch.context() as m:
        models, written = watched(m)
        ref = api.run(scenario_from_dict(sc), out=folder / "ref", interruptible=False)
        if ref.summary["engine"] != "windowed" or not written:  # (refused for another reason, or ended before one)
            return
        out = killed_at(folder, sc, min(nth, len(written)))
        res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore"
    for name in ("trace.arrows", "metrics.csv"):
        assert (out / name).read_bytes() == (ref.out / name).read_bytes(), name
    assert torch.equal(models[-1], models[0])


def test_an_agent_offline_for_good_is_restored(tmp_path):
    """An availability trace whose clients go offline and never come back: the driver's queue holds their offline
    timers with an infinite duration and end, which a restore takes as they are (a finite check refused them)."""
    import json as js

    from netsim import api
    from netsim.sim import checkpoint
    from tests.test_checkpoint_windowed import killed_at

    sc = gossip(agents={"activation": {"kind": "poisson", "rate": 3.0}, "count": 12,
                        "availability": availability(tmp_path, repeating=False)},
                algorithm={"batch": 3}, run={"rounds": None, "until": 4.0, "checkpoint_every": 1.0},
                evaluation={"every": 1.0})
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", interruptible=False)
    assert ref.summary["engine"] == "windowed"
    out = killed_at(tmp_path, sc, 2)
    held = js.loads(checkpoint.load(checkpoint.checkpoints(out)[-1]).meta["state"]["windowed"]["held"]["dict"][0][1])
    assert any(e[2] == 6 and e[4][1] == float("inf") for e in held["events"])  # (OFF: an interval with no end)
    res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore"
    for name in ("trace.arrows", "metrics.csv"):
        assert (out / name).read_bytes() == (ref.out / name).read_bytes(), name


def kinds_of(folder) -> dict:
    from netsim.trace.io import read_trace

    t = read_trace(folder).table.to_pandas()
    return {"offline": t[t["kind"] == "offline"], "drops": t[t["kind"] == "drop"]["tag"].value_counts().to_dict(),
            "waits": t[t["kind"] == "compute_start"]["value"]}


@pytest.mark.parametrize("activation", [{"kind": "periodic", "period": 0.5}, {"kind": "poisson", "rate": 3.0}])
def test_every_offline_source_outages_and_bursts_together(tmp_path, activation):
    """Scheduled intervals that start on a tick (their ``offline`` rows tie with activations, the first tick's
    too: the recorders' timers are set before the programs' first wakes), random churn, an
    availability trace, outages and Gilbert-Elliott bursts at once: every drop reason, gradients that wait for
    the agent to be back, the engine's bytes."""
    sc = gossip(agents={"activation": activation, "compute_time": {"kind": "constant", "value": 0.15},
                        "offline": [{"agent": 0, "start": 1.0, "end": 2.5}, {"agent": 5, "start": 0.0, "end": 0.7},
                                    {"agent": 7, "start": 2.0, "end": 2.02}, {"agent": 3, "start": 0.5, "end": 0.9}],
                        "churn": {"mean_online": 1.5, "mean_offline": 0.4},
                        "availability": availability(tmp_path, repeating=True), "count": 12},
                network={"outages": [{"start": 1.0, "end": 1.6}, {"start": 0.5, "end": 3.0, "src": 2}],
                         "burst": {"p_enter": 0.2, "p_exit": 0.5, "loss_bad": 0.9}},
                algorithm={"batch": 3}, run={"rounds": None, "until": 6.0},
                evaluation={"every": 1.0})
    sc["run"] = {k: v for k, v in sc["run"].items() if v is not None}
    summary = lookahead_run(tmp_path, sc)
    assert summary["stop_reason"] == "until" and summary["messages_delivered"] > 0
    got = kinds_of(tmp_path / "windowed")
    assert {"offline", "outage", "loss"} <= set(got["drops"])
    off = got["offline"]
    assert len(off) > 12 and set(off["agent"]) >= {0, 5, 7}
    first = off[off["agent"] == 0]  # agent 0's scheduled interval, as its recorder traces it when it starts
    assert ((first["t"] == 1.0) & (first["value"] == 1.5)).any()
    assert (got["waits"] > 0.15 + 1e-9).any()  # a gradient asked for while offline starts when the agent is back


def test_an_interval_that_starts_on_the_first_tick_is_traced_before_its_activations(tmp_path):
    """The churn recorders start with the network, before the programs: an interval's ``offline`` row comes
    before the activations it ties with, the first tick's as the later ones', and one that starts at run.until
    is traced (its timer was set before run.until's condition fired)."""
    sc = gossip(agents={"activation": {"kind": "periodic", "period": 0.5},
                        "offline": [{"agent": 3, "start": 0.5, "end": 0.9}, {"agent": 0, "start": 1.0, "end": 2.5},
                                    {"agent": 5, "start": 3.0, "end": 3.5}]},
                run={"rounds": None, "until": 3.0})
    sc["run"] = {k: v for k, v in sc["run"].items() if v is not None}
    lookahead_run(tmp_path, sc)
    from netsim.trace.io import read_trace

    t = read_trace(tmp_path / "windowed").table.to_pandas()
    for start, agent in ((0.5, 3), (1.0, 0), (3.0, 5)):
        tie = t[t["t"] == start]
        assert tie["kind"].iloc[0] == "offline" and tie["agent"].iloc[0] == agent
        assert (tie["kind"] == "activate").sum() == 29  # everyone else, after it


# transmission times and per-link settings -----------------------------------------------------------------------
def link_trace(folder, n: int, low: float) -> str:
    """A measured link trace: some links' latency (one below the scenario's lower bound, so the lookahead is the
    trace's), bandwidth and loss change at 1.5 s; empty cells fall back to the scenario's model."""
    rows = ["time,src,dst,latency,bandwidth,loss"]
    for src in range(0, n - 1, 2):
        rows += [f"0.0,{src},{src + 1},{low / 2},,", f"1.5,{src},{src + 1},{3 * low},400.0,0.4",
                 f"0.5,{src + 1},{src},,,0.9"]
    path = folder / "links.csv"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


@st.composite
def linked_gossip(draw) -> dict:
    """A drawn asynchronous gossip scenario with at least one of: per-link bandwidth (link queues), node uplinks,
    per-link overrides (latency, loss, bandwidth; one-way or both ways), a measured link trace, a time-varying
    topology; sometimes churn or bursts besides. A 24-byte model at 240 to 2,400 bytes/s takes 10 to 100 ms to
    transmit."""
    sc = draw(st.one_of(async_gossip(False), churned_gossip(False)))  # (the lookahead's bounds: below)
    n = sc["agents"]["count"]
    net = sc["network"]
    kinds = draw(st.sets(st.sampled_from(["bandwidth", "uplink", "links", "trace", "dynamic"]), min_size=1))
    if "dynamic" in kinds:  # each activation adopts its epoch's links
        sc["topology"]["dynamic"] = draw(st.sampled_from([
            {"kind": "one_peer_exponential"}, {"kind": "one_peer_exponential", "every": "period", "period": 0.7},
            {"kind": "resample"}, {"kind": "schedule", "every": "period", "period": 1.0,
                                   "graphs": [{"kind": "ring"}, {"kind": "complete"}]}]))
        if sc["topology"]["dynamic"]["kind"] == "resample":  # dense enough that every epoch's draw is connected
            sc["topology"].update(kind="erdos_renyi", p=0.7)
            sc["topology"].pop("degree")
    if "bandwidth" in kinds:
        net["bandwidth"] = draw(st.sampled_from([240.0, 2400.0]))
    if "uplink" in kinds:
        net["uplink"] = draw(st.sampled_from([240.0, 1200.0]))
    if "links" in kinds:
        net["links"] = [{"src": 0, "dst": 1, "latency": draw(st.sampled_from([{"kind": "constant", "value": 0.015},
                                                                              {"kind": "uniform", "low": 0.3,
                                                                               "high": 0.6}])),
                         "bandwidth": 480.0, "both": draw(st.booleans())},
                        {"src": n - 1, "dst": 0, "loss": 0.5}]
    if "trace" in kinds:
        net["trace"] = "links.csv"  # the test writes the file
    return sc


@search(11, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=linked_gossip())
def test_lookahead_windows_agree_with_the_engine_on_link_queues_per_link_settings_changing_graphs(tmp_path_factory,
                                                                                                   sc):
    folder = tmp_path_factory.mktemp("linked")
    net = sc["network"]
    low = net["latency"].get("low", net["latency"].get("value"))
    if "trace" in net:
        net["trace"] = link_trace(folder, sc["agents"]["count"], low)
    agree(folder, sc)
    summary = json.loads((folder / "windowed" / "summary.json").read_text())
    bounds = [low] + [lk["latency"].get("low", lk["latency"].get("value")) for lk in net.get("links", ())
                      if "latency" in lk] + ([low / 2] if "trace" in net else [])
    assert summary["windows"]["lookahead_s"] == min(bounds)  # the smallest latency any link can give


@pytest.mark.parametrize("network", [{"bandwidth": 240.0},  # the lean path
                                     {"bandwidth": 240.0, "uplink": 480.0}])  # the composed models
def test_link_queues_delay_arrivals_in_the_windows_as_in_the_engine(tmp_path, network):
    """Bandwidth and uplinks queue a node's pushes: deliveries come later than the latency alone (the trace's
    ``deliver`` value is the whole delay), byte for byte with the engine."""
    from netsim.trace.io import read_trace

    sc = poisson(**network)
    sc["agents"].pop("churn")
    sc["run"] = {"seed": 3, "until": 5.0}
    lookahead_run(tmp_path, sc)
    assert json.loads((tmp_path / "windowed" / "summary.json").read_text())["windows"]["lookahead_s"] == 0.01
    t = read_trace(tmp_path / "windowed").table.to_pandas()
    delays = t[t["kind"] == "deliver"]["value"]
    assert (delays >= 0.1 + 0.01 - 1e-12).all()  # 24 bytes at 240 bytes/s, then at least the latency's 0.01 s
    assert (delays > 0.5 + 0.1).any()  # a push queued behind another on its link or uplink


# what the lookahead windows still refuse, with the reason ------------------------------------------------------
def poisson(**network) -> dict:
    """Churned Poisson gossip: out of synchronous rounds, so only the lookahead windows could play it."""
    return gossip(agents={"activation": {"kind": "poisson", "rate": 1.0},
                          "churn": {"mean_online": 2.0, "mean_offline": 0.5}}, network=network)


@pytest.mark.parametrize("network", [
    {"links": [{"src": 0, "dst": 1, "latency": {"kind": "exponential", "mean": 0.1}}]},
    {"links": [{"src": 0, "dst": 1}, {"src": 1, "dst": 2, "latency": {"kind": "uniform", "low": 0.0, "high": 0.1}}]},
    {"trace": "zero"},
])
def test_latencies_with_no_positive_minimum_are_played_with_each_merge_after_its_push(tmp_path, network):
    """No lookahead (a per-link latency with no positive minimum, a link trace measuring 0): a message may be sent
    and delivered inside one window, and push gossip's tensor work merges it a lock step after its push."""
    if network.get("trace") == "zero":
        (tmp_path / "zero.csv").write_text("time,src,dst,latency,bandwidth,loss\n0.0,0,1,0.0,,\n")
        network["trace"] = str(tmp_path / "zero.csv")
    summary = lookahead_run(tmp_path, poisson(**network))
    assert summary["messages_delivered"] > 0


@pytest.mark.parametrize(("network", "why"), [
    ({"links": [{"src": 0, "dst": 1, "latency": {"kind": "exponential", "mean": 0.1}}]},
     r"lookahead windows: network.links\[0\].latency 'exponential' has no positive lower bound: no lookahead"),
    ({"trace": "zero"}, "lookahead windows: network.trace measures a latency of 0: no lookahead"),
])
def test_triggered_sends_refuse_a_latency_with_no_positive_minimum(tmp_path, network, why):
    """Whether a triggered send goes out is decided after the window's control: it must land in a later window."""
    from netsim.errors import InputError

    if network.get("trace") == "zero":
        (tmp_path / "zero.csv").write_text("time,src,dst,latency,bandwidth,loss\n0.0,0,1,0.0,,\n")
        network["trace"] = str(tmp_path / "zero.csv")
    sc = poisson(**network)
    sc["algorithm"] = {"name": "event_triggered", "lr": 0.5, "batch": 4, "trigger": "relative", "threshold": 0.1}
    with pytest.raises(InputError, match=why):
        netsim.run(scenario_from_dict(sc), out=tmp_path / "run", engine="windowed")
    assert not (tmp_path / "run").exists()


def test_a_link_model_of_its_own_is_refused(tmp_path):
    """A model installed by a plugin or a replay decides messages the driver cannot know of in advance."""
    from netsim.errors import InputError

    class Fixed:
        def outcome(self, src, dst, now, size):
            return now, 0.125, ""

    with pytest.raises(InputError, match="lookahead windows: a link model of its own decides the messages "
                                         r"\(Fixed: a replay's recorded network or a setup hook's\) — nothing to "
                                         "change"):
        netsim.run(scenario_from_dict(poisson()), out=tmp_path / "run", engine="windowed",
                   setup=lambda sim: sim.network.use(Fixed()))


def test_the_cli_refuses_a_link_with_no_lookahead_with_exit_2(tmp_path):
    import subprocess

    import tomli_w

    from tests.conftest import cli_env, netsim_cli

    fast = {"src": 0, "dst": 1, "latency": {"kind": "exponential", "mean": 0.1}}
    sc = poisson(links=[fast])
    sc["algorithm"] = {"name": "event_triggered", "lr": 0.5, "batch": 4, "trigger": "relative", "threshold": 0.1}
    (tmp_path / "s.toml").write_text(tomli_w.dumps(sc))
    res = subprocess.run(netsim_cli("run", str(tmp_path / "s.toml"), "--engine", "windowed", "--out",
                                    str(tmp_path / "cli")), capture_output=True, text=True, env=cli_env())
    assert res.returncode == 2
    assert "lookahead windows: network.links[0].latency 'exponential' has no positive lower bound" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "cli").exists()
