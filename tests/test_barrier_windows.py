"""Barrier rounds (D-PSGD, DP-D-PSGD, CHOCO-SGD) as lookahead windows (rounds/barrier_windows.py): agents on their
own clocks, compute times of their own, Bernoulli and Poisson activation, lossy links, barriers that time out and
discard stale rounds, churn, transmission times (bandwidth, node uplinks, per-link bandwidth, link traces). The
windowed engine against the events engine, byte for byte (trace.arrows,
metrics.csv, final models)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

import netsim
from netsim.rounds import barrier_windows
from netsim.scenario import scenario_from_dict
from tests.search import search
from tests.test_broadcast_windows import both
from tests.test_checkpoint_windowed import finals, killed_at, watched  # noqa: F401  (a fixture)
from tests.test_windowed import buildable


@st.composite
def barriers(draw, names=("dpsgd", "dp_dpsgd", "choco", "muffliato"), records=(None, "mixing", "payloads")) -> dict:
    """A scenario of barrier rounds the synchronous rounds refuse and the lookahead windows play: own clocks (offsets,
    drift, jitter), Bernoulli, Poisson or periodic activation, random or straggling compute times, a constant,
    uniform, lognormal or exponential latency (no positive minimum: sent and delivered in one window), loss, a round
    timeout from shorter than a round trip to longer than a period (stale rounds, full
    barriers), D-PSGD, DP-D-PSGD (per-example or batch clipping: releases through each agent's ledger), CHOCO-SGD or
    Muffliato (one to three barrier exchanges a round, each with its own timeout and stale rounds; plain or Chebyshev
    gossip); for D-PSGD, DP-D-PSGD and Muffliato transmission times of about a tenth of a period to more than one (link
    bandwidth, node uplinks whose FIFO queue serializes a broadcast's sends, a per-link bandwidth): the sender waits
    for them. Half of them keep a privacy record: the mixing steps, or the delivered payloads and release values
    (with an audit's gradient or input canaries)."""
    n = draw(st.integers(4, 9))
    u = {"kind": "uniform"}
    act = draw(st.sampled_from([{"kind": "periodic", "period": 0.5}, {"kind": "bernoulli", "period": 0.5, "p": 0.6},
                                {"kind": "poisson", "rate": 2.0}]))
    zero = {"kind": "constant", "value": 0.0}
    agents = {"count": n, "activation": act,
              "clock_offset": draw(st.sampled_from([zero, {**u, "low": 0.0, "high": 0.3}])),
              "clock_drift": draw(st.sampled_from([zero, {**u, "low": -0.02, "high": 0.02}])),
              "compute_time": draw(st.sampled_from([{"kind": "constant", "value": 0.05},
                                                    {**u, "low": 0.01, "high": 0.2}]))}
    if draw(st.booleans()):
        agents["clock_jitter"] = {**u, "low": 0.0, "high": 0.05}
    elif act["kind"] == "periodic" and agents["clock_drift"]["kind"] == "constant":  # (simultaneous wakes: the
        agents["clock_offset"] = {**u, "low": 0.0, "high": 0.3}  # synchronous rounds may play it)
    if draw(st.booleans()):
        agents.update(stragglers=[0], straggler_factor=4.0)
    low = draw(st.sampled_from([0.02, 0.1]))
    lat = draw(st.sampled_from([{"kind": "constant", "value": low}, {**u, "low": low, "high": low + 0.3},
                                {"kind": "lognormal", "mean": low, "sigma": 1.0},
                                {"kind": "exponential", "mean": low}]))
    name = draw(st.sampled_from(names))
    alg = {"name": name, "lr": 0.3, "batch": draw(st.integers(1, 6)),
           "round_timeout": draw(st.sampled_from([0.05, 0.3, 2.0]))}
    if name == "dpsgd":
        alg["lr_decay"] = draw(st.sampled_from([0.0, 0.5]))
    elif name == "dp_dpsgd":
        alg |= {"clip": 1.0, "noise_multiplier": 1.0, "clip_mode": draw(st.sampled_from(["per_example", "batch"])),
                "lr_decay": draw(st.sampled_from([0.0, 0.5]))}  # (0: one call per lock step, ``any_round``)
    elif name == "choco":
        alg |= {"compressor": draw(st.sampled_from(["topk", "randk"])), "ratio": 0.5, "gamma": 0.5}
    else:
        alg |= {"clip": 1.0, "sigma": 1.0, "clip_mode": draw(st.sampled_from(["per_example", "batch"])),
                "gossip_steps": draw(st.integers(1, 3)), "acceleration": draw(st.sampled_from(["none", "chebyshev"]))}
    net = {"latency": lat, "loss": draw(st.sampled_from([0.0, 0.2]))}
    # a payload of 24 or 48 bytes: 0.01 s to 0.7 s on the wire (for the kernels that declare their payloads' bytes)
    if name != "choco" and draw(st.booleans()):
        net["bandwidth"] = draw(st.sampled_from([None, 300.0, 3000.0]))
        net["uplink"] = draw(st.sampled_from([None, 150.0, 2000.0]))
        if draw(st.booleans()):
            net["links"] = [{"src": 0, "dst": 1, "bandwidth": 100.0, "both": True}]
        net = {k: v for k, v in net.items() if v is not None}
    run = dict(draw(st.sampled_from([{"until": 3.0}, {"rounds": draw(st.integers(2, 5))}])))
    run["trace_flush_every"] = draw(st.sampled_from([7, 1000]))
    record = draw(st.sampled_from(records))
    privacy = {} if record is None else {"privacy": {"delta": 1e-5, "record": record}}
    if record == "payloads" and draw(st.booleans()):
        privacy["privacy"]["audit"] = {"victims": [draw(st.integers(0, n - 1))], "canaries": 3,
                                       "kind": draw(st.sampled_from(["gradient", "input"])), "norm": 4.0}
    return {**privacy, "name": "barrier", "run": {"seed": draw(st.integers(0, 50)), **run}, "agents": agents,
            "topology": {"kind": "random_regular", "degree": draw(st.sampled_from([2, 3]))},
            "network": net,
            "data": {"kind": "synthetic", "samples": 40 * n, "features": 5, "partition": "iid"},
            "model": {"kind": "logistic", "dtype": draw(st.sampled_from(["float32", "float64"])),
                      "batch_invariant": draw(st.sampled_from(["auto", False]))},
            "algorithm": alg,
            "evaluation": {"every": draw(st.sampled_from([1.0e6, 0.7])), "metrics": ["loss", "accuracy",
                                                                                     "agent_accuracy"]}}


@search(8, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=barriers(), gathers=st.sampled_from([1, 3, 8, 40]))
def test_barrier_windows_agree_with_the_engine_on_drawn_scenarios(tmp_path_factory, sc, gathers):
    """... with the tensor work of 1 to 40 windows done together (a combine waits in lock step for a payload made in
    the same work)."""
    buildable(sc)
    tmp = tmp_path_factory.mktemp("drawn")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(barrier_windows._Driver, "gathers", gathers)
        both(tmp, sc)
    same_records(tmp, sc)


@search(6, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=barriers(names=("muffliato",), records=("mixing", "payloads")), gathers=st.sampled_from([1, 8, 64]))
def test_several_exchanges_and_privacy_records_on_barrier_windows(tmp_path_factory, sc, gathers):
    """Muffliato's gossip steps, each a barrier exchange with its own timeout (a payload made by the ``combine`` of the
    exchange before, in the same work or an earlier one), with the mixing record or the payloads record: the engine's
    trace, metrics, models, ledgers, ``mixing.csv`` and ``payloads.npz``."""
    buildable(sc)
    tmp = tmp_path_factory.mktemp("records")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(barrier_windows._Driver, "gathers", gathers)
        both(tmp, sc)
    same_records(tmp, sc)


RECORDS = ("mixing.csv", "payloads.npz")


@search(6, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=barriers(records=(None,)), gathers=st.sampled_from([1, 3, 8, 64]), every=st.sampled_from([0.3, 0.77]),
       nth=st.integers(1, 3), composed=st.booleans())
def test_barrier_windows_killed_after_a_checkpoint_resume_by_restore_on_drawn_scenarios(tmp_path_factory, sc,
                                                                                         gathers, every, nth, composed):
    """A drawn scenario with checkpoints (cut between two tensor works of 1 to 64 windows), killed right after one of
    them and resumed by restoring the driver's state (open barriers, queues, payloads, parts, points and gradients
    waiting, the event queue) and the links' (the composed models' too: node uplinks, a per-link setting, bursts and
    an outage; random churn): the uninterrupted run's trace, metrics and models; the events engine's rows, metrics and
    models."""
    from netsim import api
    from netsim.trace.io import read_trace

    buildable(sc)
    if composed:  # each link's Gilbert-Elliott chain and draws, agent 0's sends dropped for a while, random churn
        sc["network"] |= {"burst": {"p_enter": 0.2, "p_exit": 0.4, "loss_good": 0.05, "loss_bad": 0.7},
                          "outages": [{"start": 0.4, "end": 0.9, "src": 0}]}
        sc["agents"]["churn"] = {"mean_online": 1.5, "mean_offline": 0.3}
    sc["run"]["checkpoint_every"] = every
    tmp = tmp_path_factory.mktemp("killed")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(barrier_windows._Driver, "gathers", gathers)
        models, written = watched(m)
        ref = api.run(scenario_from_dict(sc), out=tmp / "ref", engine="windowed", interruptible=False)
        made = len(written)  # (the uninterrupted run's checkpoints, not the events engine's below)
        assert ref.summary["engine"] == "windowed" and "windows" in ref.summary
        events = api.run(scenario_from_dict(sc), out=tmp / "events", engine="events", interruptible=False)
        if not made:  # (a run of a few rounds may end before its first checkpoint)
            return
        out = killed_at(tmp, sc, min(nth, made))
        res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore"
    for name in ("trace.arrows", "metrics.csv", "agent_metrics.csv"):
        assert (out / name).read_bytes() == (ref.out / name).read_bytes(), name
    assert torch.equal(models[-1], models[0]) and torch.equal(models[1], models[0])
    assert read_trace(events.out).table.equals(read_trace(ref.out).table)  # (checkpoints there flush batches)
    assert (events.out / "metrics.csv").read_bytes() == (ref.out / "metrics.csv").read_bytes()


def test_the_composed_links_state_is_kept_by_a_checkpoint_and_restored(tmp_path, finals):  # noqa: F811
    """Bursty, per-link and uplink-limited links with an outage (the composed models): the checkpoint keeps each link's
    draws, its Gilbert-Elliott state and its queue, and each node's uplink queue; a run killed after its second
    checkpoint and restored writes the uninterrupted run's trace, metrics and models, which are the events engine's.
    A checkpoint whose chain state is not a bool is refused in one line."""
    import json

    from typer.testing import CliRunner

    from netsim import api
    from netsim.cli import app
    from netsim.sim import checkpoint
    from netsim.trace.io import read_trace
    from tests.test_checkpoint_windowed import same_outputs

    sc = jittery()
    sc["evaluation"]["metrics"].append("agent_accuracy")
    sc["network"] |= {"burst": {"p_enter": 0.2, "p_exit": 0.4, "loss_good": 0.05, "loss_bad": 0.7},
                      "outages": [{"start": 1.0, "end": 2.0, "src": 0}], "uplink": 2000.0,
                      "links": [{"src": 1, "dst": 2, "bandwidth": 500.0, "latency": {"kind": "constant",
                                                                                     "value": 0.02}}]}
    sc["run"]["checkpoint_every"] = 1.5
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)
    events = api.run(scenario_from_dict(sc), out=tmp_path / "events", engine="events", interruptible=False)
    assert "windows" in ref.summary and ref.summary["messages_dropped"] > 0
    assert read_trace(events.out).table.equals(read_trace(ref.out).table)  # (checkpoints there flush batches)
    assert (events.out / "metrics.csv").read_bytes() == (ref.out / "metrics.csv").read_bytes()
    out = killed_at(tmp_path, sc, 2)
    ck = checkpoint.load(checkpoint.checkpoints(out)[-1])
    w = ck.meta["state"]["windowed"]
    rows = w["full_links"]
    assert len(rows) == 16 and all(isinstance(r[4][0], bool) for r in rows)  # the ring's 16 directed links
    assert any(r[4][0] for r in rows) and w["uplinks"] and all(b > 0 for _, b in w["uplinks"])
    res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore"
    same_outputs(out, ref.out, skip={"resumed_at_step", "windows"})  # (the windows' own timing)
    assert len(finals) == 3 and all(torch.equal(f, finals[0]) for f in finals)  # uninterrupted, events, resumed

    again = killed_at(tmp_path / "again", sc, 2)
    for c in checkpoint.checkpoints(again):
        meta = json.loads((c / "state.json").read_text())
        meta["state"]["windowed"]["full_links"][0][4][0] = 1
        (c / "state.json").write_text(json.dumps(meta))
        (c / "SHA256SUMS").write_text(json.dumps({n: checkpoint._sha(c / n) for n in ("arrays.npz", "state.json")}))
    r = CliRunner().invoke(app, ["resume", str(again), "-q"])
    assert r.exit_code == 2 and "full_links" in r.output and "Traceback" not in r.output


def same_records(tmp: Path, sc: dict) -> None:
    """The privacy records a run keeps (``privacy.record``), the same bytes from both engines (none without it)."""
    record = sc.get("privacy", {}).get("record")
    for f in RECORDS:
        kept = record == "payloads" or record == "mixing" and f == "mixing.csv"
        ev, win = tmp / "events" / f, tmp / "windowed" / f
        assert ev.exists() == win.exists() == kept
        if kept:
            assert win.read_bytes() == ev.read_bytes(), f


def jittery(**alg) -> dict:
    """Offsets, drift and jitter on a ring, random compute times, lossy uniform links."""
    return {"name": "jittery", "run": {"seed": 5, "until": 6.0},
            "agents": {"count": 8, "activation": {"kind": "periodic", "period": 0.25},
                       "clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.05},
                       "clock_drift": {"kind": "normal", "mean": 0.0, "sigma": 0.001},
                       "clock_jitter": {"kind": "uniform", "low": 0.0, "high": 0.02},
                       "compute_time": {"kind": "lognormal", "mean": 0.05, "sigma": 0.3}},
            "topology": {"kind": "ring"},
            "network": {"latency": {"kind": "uniform", "low": 0.01, "high": 0.04}, "loss": 0.1},
            "data": {"kind": "synthetic", "samples": 800, "features": 10, "partition": "iid"},
            "model": {"kind": "logistic"},
            "algorithm": {"name": "dpsgd", "lr": 0.5, "batch": 8, "round_timeout": 0.15, **alg},
            "evaluation": {"every": 1.0, "metrics": ["loss", "accuracy", "consensus"]}}


def test_barriers_time_out_discard_stale_rounds_and_release_on_the_windows(tmp_path):
    """The quickstart's clocks and compute times with lossy links and a short timeout: barriers time out (missing
    counts), late messages are discarded as stale, DP-D-PSGD's releases are traced where the engine traces them; all
    of it the events engine's bytes, and the run is played as windows."""
    sc = jittery(name="dp_dpsgd", noise_multiplier=1.0, clip=1.0, round_timeout=0.03)
    summary = both(tmp_path, sc)
    from netsim.trace.io import read_trace

    kinds = read_trace(tmp_path / "windowed" / "trace.arrows").table.column("kind").to_pylist()
    assert kinds.count("timeout") > 10 and kinds.count("stale") > 10 and kinds.count("release") > 100
    assert summary["messages_dropped"] > 0


def test_barriers_completed_at_instants_shared_with_other_events(tmp_path):
    """Bernoulli activation on one tick grid with no offsets, one compute time and a constant latency: the agents
    active at a tick compute, send, deliver and complete their barriers at the same instants, so a barrier's completion
    (processed right after the event that completes it where nothing else is due by then, else queued behind what is)
    ties with deliveries, completions and timers of other agents; Muffliato's completions send the next exchange's
    messages, so their place among the tied events shows in the rows. The engine's bytes."""
    sc = jittery(name="muffliato", clip=1.0, sigma=1.0, gossip_steps=3, round_timeout=0.1)
    sc["agents"] = {"count": 10, "activation": {"kind": "bernoulli", "period": 0.25, "p": 0.6},
                    "compute_time": {"kind": "constant", "value": 0.05}}
    sc["network"] = {"latency": {"kind": "constant", "value": 0.01}, "loss": 0.1}
    both(tmp_path, sc)
    from netsim.trace.io import read_trace

    t = read_trace(tmp_path / "windowed" / "trace.arrows").table
    times = [x for x, k in zip(t.column("t").to_pylist(), t.column("kind").to_pylist(), strict=True)
             if k == "deliver"]
    assert len(times) - len(set(times)) > 100  # (deliveries to several agents at one instant)
    kinds = t.column("kind").to_pylist()
    assert kinds.count("timeout") > 5 and kinds.count("release") > 50


def test_churn_on_barrier_windows(tmp_path):
    """Agents going offline (their activations moved, their gradients waiting, their messages dropped) on the
    barrier windows: the engine's bytes."""
    sc = jittery()
    sc["agents"]["churn"] = {"mean_online": 1.0, "mean_offline": 0.3}
    both(tmp_path, sc)


TRACES = Path(__file__).resolve().parents[1] / "traces"


@pytest.mark.parametrize(("network", "wait"), [
    ({"bandwidth": 400.0}, 44 / 400.0),  # 44 bytes: 0.11 s on the wire, before the barrier and its timer
    ({"uplink": 150.0, "links": [{"src": 0, "dst": 1, "bandwidth": 60.0, "both": True}]}, None),  # serialized sends
    # dpsgd_bursty's network: a link trace's latencies, bandwidths and losses, bursts, node uplinks, and churn
    ({"trace": str(TRACES / "links_example.csv"), "burst": {"p_enter": 0.1, "p_exit": 0.3}, "uplink": 300.0,
      "latency": {"kind": "lognormal", "mean": 0.03, "sigma": 0.5}}, None),
])
def test_transmission_times_on_barrier_windows(tmp_path, network, wait):
    """A barrier round's sender waits for its broadcast's transmission (the longest of its links', FIFO per link and
    per node uplink) before its barrier: the engine's bytes, with transmissions long enough to delay the barriers
    (a barrier's timer runs out ``wait`` + round_timeout after its agent's ``compute_end``)."""
    sc = jittery(name="dp_dpsgd", noise_multiplier=1.0, clip=1.0)
    sc["network"] = {**sc["network"], **network}
    if "trace" in network:
        sc["agents"]["availability"] = str(TRACES / "availability_example.json")
    summary = both(tmp_path, sc)
    assert summary["messages_delivered"] > 0 and summary["round_timeouts"] > 0
    if wait is not None:
        from netsim.trace.io import read_trace

        t = read_trace(tmp_path / "windowed" / "trace.arrows").table.to_pydict()
        last: dict[int, float] = {}
        for when, kind, i in zip(t["t"], t["kind"], t["agent"], strict=True):
            if kind == "compute_end":
                last[i] = when
            elif kind == "timeout":
                assert when == pytest.approx(last[i] + wait + 0.15, abs=1e-9)


@pytest.mark.parametrize(("changes", "why"), [
    ({"network": {"bandwidth": 1.0e6}, "algorithm": {"name": "choco", "lr": 0.5, "batch": 8, "round_timeout": 0.15,
                                                    "compressor": "topk", "ratio": 0.5, "gamma": 0.5}},
     "bandwidth or uplinks with choco: a payload's size depends on its values \\(compression\\)"),
    ({"algorithm": {"name": "dfedsam", "lr": 0.1, "batch": 8, "local_steps": 2, "gossip_steps": 2,
                    "round_timeout": 0.15}},
     "dfedsam chooses its own routes each exchange"),
    ({"topology": {"kind": "ring", "dynamic": {"kind": "one_peer_exponential"}}},
     "the topology changes over time: a barrier waits for the in-neighbours of its round"),
    ({"algorithm": {"name": "muffliato", "lr": 0.3, "batch": 8, "clip": 1.0, "sigma": 1.0, "gossip_steps": 2,
                    "round_timeout": 0.15}, "privacy": {"delta": 1e-5, "epsilon_cap": 8.0}},
     "privacy.epsilon_cap: a release's budget check is traced when the windows' tensor work makes it"),
])
def test_barrier_windows_refuse_in_one_line_what_they_do_not_play(tmp_path, changes, why):
    from netsim.errors import InputError

    sc = jittery()
    for key, value in changes.items():
        sc[key] = value if key == "algorithm" else {**sc.get(key, {}), **value}
    with pytest.raises(InputError, match="nor as lookahead windows: " + why) as e:
        netsim.run(scenario_from_dict(sc), out=tmp_path / "run", engine="windowed")
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


@pytest.mark.parametrize("latency", [{"kind": "lognormal", "mean": 0.02, "sigma": 0.5},
                                     {"kind": "exponential", "mean": 0.02}])
def test_latencies_with_no_positive_minimum_on_barrier_windows(tmp_path, latency):
    """The quickstart's lognormal latency (and an exponential one): messages sent and delivered inside one window, the
    combine after the send in lock step; the engine's bytes, on windows of the mean latency."""
    sc = jittery()
    sc["network"] = {**sc["network"], "latency": latency}
    summary = both(tmp_path, sc)
    assert summary["messages_delivered"] > 0
    from netsim.api import prepare
    from netsim.rounds.lookahead import window

    assert window(prepare(scenario_from_dict(sc))) == 0.02


def test_auto_runs_the_quickstart_clocks_on_the_windows(tmp_path):
    """--engine auto (the default) takes the lookahead windows for barrier rounds on jittery clocks and says so."""
    r = netsim.run(scenario_from_dict(jittery()), out=tmp_path / "auto")
    assert r.summary["engine"] == "windowed" and r.summary["windows"]["windows"] > 0
    assert "windowed_refused" not in r.summary or r.summary["windowed_refused"] is None


@pytest.mark.parametrize("changes", [
    {"agents": {"activation": {"kind": "poisson", "rate": 10.0}}},
    {"network": {"latency": {"kind": "uniform", "low": 0.001, "high": 0.004}}},
    {"agents": {"clock_jitter": {"kind": "uniform", "low": 0.0, "high": 0.01}}, "network": {"loss": 0.2}},
    {"agents": {"compute_time": {"kind": "constant", "value": 0.06}}},  # messages miss the barrier: stale
    {"evaluation": {"every": 0.3}, "run": {"stop_on_divergence": True}},
])
def test_barrier_windows_play_what_synchronous_rounds_refuse(tmp_path, changes):
    """The synchronous rounds' refusals of tests/test_windowed.py, played by the lookahead windows: the engine's
    bytes, and the synchronous rounds still say why not them."""
    from netsim.api import prepare
    from netsim.rounds import windowed
    from tests.test_windowed import exact

    sc = exact(**changes)
    sim = prepare(scenario_from_dict(sc))
    assert windowed.rounds_refusal(sim, sim.program) is not None and windowed.reason(sim) is None
    summary = both(tmp_path, sc)
    assert summary["stop_reason"] == "rounds" and summary["messages_delivered"] > 0


@pytest.mark.parametrize("name", ["privacy_pairwise", "attack_audit"])
def test_shipped_privacy_scenarios_on_barrier_windows(tmp_path, name):
    """Muffliato's shipped privacy scenarios run on the barrier windows with no flag (lossy links, its gossip steps;
    privacy_pairwise's lognormal latency): the events engine's trace, metrics, models and records, which are all
    ``netsim privacy`` reads (tests/test_windowed_records.py runs it on both engines' folders)."""
    from tests.conftest import ROOT

    got = {}
    for engine in ("events", "auto"):
        built: list = []
        r = netsim.run(ROOT / "scenarios" / f"{name}.toml", out=tmp_path / engine, setup=built.append, engine=engine,
                       interruptible=False)
        folder = tmp_path / engine
        got[engine] = (r.summary.get("engine"), built[0].bank.W.clone(),
                       {f: (folder / f).read_bytes() for f in ("trace.arrows", "metrics.csv", *RECORDS)
                        if (folder / f).exists()})
    ev, auto = got["events"], got["auto"]
    assert ev[0] == "events" and auto[0] == "windowed"
    assert torch.equal(auto[1], ev[1]) and auto[2] == ev[2] and "mixing.csv" in ev[2]


def bernoulli_dp(**alg) -> dict:
    """DP-D-PSGD with Bernoulli activation: the agents' rounds spread, so a lock step holds several round indices."""
    sc = jittery(name="dp_dpsgd", noise_multiplier=1.0, clip=1.0, round_timeout=0.3, **alg)
    sc["agents"]["activation"] = {"kind": "bernoulli", "period": 0.25, "p": 0.5}
    sc["run"]["until"] = 4.0
    return sc


@pytest.mark.parametrize("planned", [False, True])
def test_one_call_per_lock_step_where_the_kernel_reads_no_round_index(tmp_path, planned):
    """DP-D-PSGD with a constant step size reads no ``b.k`` (``any_round``): each lock step's locals and combines are
    one call, batches joining agents at different rounds, and the bytes are the events engine's: the event-by-event
    control's lock steps (a round limit) and the planned run's (``RoundWork._steps``: gradients that are not
    batch-invariant keep the engine's batches)."""
    from netsim.rounds import barrier_plan
    from netsim.rounds.kernel import AnyRound

    calls: list = []
    local, planned_local = barrier_windows._Work.locals, barrier_plan.RoundWork.locals

    def counted(self, step):
        ks = {self.store.recs[o[2]][1] for _, o in step}
        calls.append((len(ks), len(self.by_round(step, 2))))
        return local(self, step)

    def planned_counted(self, k, rids, ev):
        calls.append((len(set(self.ek[ev].tolist())), 1 if isinstance(k, AnyRound) or len(set(self.ek[ev])) == 1
                      else 0))
        return planned_local(self, k, rids, ev)

    sc = bernoulli_dp()
    sc["model"]["batch_invariant"] = False  # (the engine's gradient batches: lock steps)
    if not planned:
        sc["run"]["rounds"] = 100  # (a round limit: the event-by-event control)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(barrier_windows._Work, "locals", counted)
        m.setattr(barrier_plan.RoundWork, "locals", planned_counted)
        both(tmp_path, sc)
    assert calls and all(n == 1 for _, n in calls) and max(k for k, _ in calls) > 1


def test_a_kernel_that_reads_the_round_index_it_declared_unread_fails_in_one_line(tmp_path):
    """A step size that decays with k reads ``b.k``: declared unread anyway, the joined batch's ``b.k`` raises (the
    lock steps join rounds; batch-invariant gradients go round by round, one ``b.k`` a call)."""
    from netsim.algorithms.dp_dpsgd import DPDPSGD
    from netsim.errors import RunCrashed

    sc = bernoulli_dp(lr_decay=0.5)
    sc["model"]["batch_invariant"] = False
    with pytest.MonkeyPatch.context() as m:
        m.setattr(DPDPSGD, "any_round", lambda self, p: True)
        with pytest.raises(RunCrashed, match=r"DPDPSGD.any_round says no hook reads b.k, and one read it"):
            netsim.run(scenario_from_dict(sc), out=tmp_path / "w", engine="windowed")


def test_netsim_check_names_a_kernel_that_reads_the_round_index_it_declared_unread():
    """The exactness check hands a batch whose ``b.k`` raises to a kernel that declares ``any_round``: DP-D-PSGD's
    constant step passes, a decaying step declared unread is named with its hook."""
    from netsim.algorithms.dp_dpsgd import DPDPSGD, DPDPSGDParams
    from netsim.rounds.exactness import CHECK, check

    p = dict(clip=1.0, noise_multiplier=1.0)
    assert DPDPSGD().any_round(DPDPSGDParams(**p)) and not DPDPSGD().any_round(DPDPSGDParams(**p, lr_decay=0.5))
    assert check("dp_dpsgd", DPDPSGD(), DPDPSGDParams(**p), CHECK[:1]).violation is None
    assert check("dp_dpsgd", DPDPSGD(), DPDPSGDParams(**p, lr_decay=0.5), CHECK[:1]).violation is None

    class Declared(DPDPSGD):
        def any_round(self, p):
            return True

    line = check("declared", Declared(), DPDPSGDParams(**p, lr_decay=0.5), CHECK[:1]).violation
    assert line is not None and "Declared.combine" in line and "any_round says no hook reads b.k" in line, line


def test_dpsgd_with_a_constant_step_joins_rounds_and_passes_the_check():
    """D-PSGD with a constant step reads no ``b.k`` (``any_round``), and the check's batch whose ``b.k`` raises passes
    its hooks; with a decaying step it reads ``b.k`` and joins none."""
    from netsim.algorithms.dpsgd import DPSGD, DPSGDParams
    from netsim.rounds.exactness import CHECK, check

    assert DPSGD().any_round(DPSGDParams()) and not DPSGD().any_round(DPSGDParams(lr_decay=0.5))
    assert check("dpsgd", DPSGD(), DPSGDParams(), CHECK[:1]).violation is None
    assert check("dpsgd", DPSGD(), DPSGDParams(lr_decay=0.5), CHECK[:1]).violation is None


def test_lock_steps_of_every_agent_take_their_rows_without_a_copy(tmp_path):
    """Where a lock step's rows are every row of one tensor, in order (the parameters of an ask of every agent, the
    gradients of a whole batch), ``local`` and the gradient batches take that tensor itself, not a copy; the bytes
    stay the events engine's (D-PSGD: ``local`` sends its rows, ``combine`` reads them)."""
    shared: list = []
    join = barrier_windows.join_rows

    def counted(rows, share=False):
        out = join(rows, share)
        shared.append(out is rows[0][0])
        return out

    sc = jittery(name="dpsgd")
    sc["agents"] = {"count": 8, "compute_time": {"kind": "constant", "value": 0.05}}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(barrier_windows, "join_rows", counted)
        both(tmp_path, sc)
    assert any(shared)  # (8 agents on one clock: each lock step is every agent)
