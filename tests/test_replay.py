"""Replay of recorded network traces: byte-identical re-runs, recorded conditions for
another algorithm, and clean errors for bad traces."""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa
import pytest

import netsim
from netsim.errors import InputError
from netsim.replay import replay
from netsim.scenario.load import scenario_from_dict, to_toml
from netsim.trace.io import TRACE_FILE, read_trace, write_trace

NET = {"latency": {"kind": "lognormal", "mean": 0.03, "sigma": 0.6}, "uplink": 2e5, "loss": 0.05,
       "burst": {"p_enter": 0.05, "p_exit": 0.3}, "outages": [{"start": 2.0, "end": 2.5, "src": 1}]}
BASE = {
    "run": {"seed": 11, "until": 8.0, "trace_flush_every": 64},
    "agents": {"count": 5, "compute_time": {"kind": "exponential", "mean": 0.02},
               "clock_drift": {"kind": "normal", "mean": 0.0, "sigma": 0.01},
               "activation": {"kind": "periodic", "period": 0.3},
               "churn": {"mean_online": 3.0, "mean_offline": 0.7}},
    "topology": {"kind": "ring"},
    "network": NET,
    "data": {"samples": 300, "features": 4},
    "algorithm": {"name": "dpsgd", "lr": 0.2, "batch": 8, "round_timeout": 0.25},
    "evaluation": {"every": 4.0, "metrics": ["accuracy"]},
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    d = tmp_path_factory.mktemp("rec")
    return netsim.run(scenario_from_dict(BASE), out=d / "run")


def test_exact_replay_is_byte_identical(recorded, tmp_path):
    res = replay(recorded.out, out=tmp_path / "rep")
    assert (tmp_path / "rep" / TRACE_FILE).read_bytes() == recorded.trace_path.read_bytes()
    s = res.summary
    assert s["replay_mode"] == "exact" and s["replay_messages_fallback"] == 0
    assert s["replay_messages_matched"] == recorded.summary["messages_sent"]
    kinds = set(read_trace(recorded.out).to_pandas().kind)
    assert {"drop", "offline", "activate"} <= kinds  # the recording exercised churn and loss


def _rewrite(src, dst, edit):
    """Copy a trace, changing its table with ``edit(dict of columns)``; metadata kept (an edited recording,
    written with its checksums)."""
    tr = read_trace(src)
    cols = tr.table.to_pydict()
    edit(cols)
    write_trace(pa.table(cols, schema=tr.table.schema), dst)


def test_exact_replay_takes_delays_and_drops_from_the_trace_not_the_seed(recorded, tmp_path):
    t = read_trace(recorded.out).to_pandas()
    sends = t[t.kind == "send"]
    dropped = set(t[t.kind == "drop"].msg)
    kept = sends[~sends.msg.isin(dropped)]
    victim = int(kept.msg.iloc[3])  # a delivered message: make it a 'loss' in the recording
    slow = int(kept.msg.iloc[5])  # and another one 0.07 s slower

    def edit(c):
        def send_row(msg):
            pairs = enumerate(zip(c["kind"], c["msg"], strict=True))
            return next(i for i, (k, m) in pairs if m == msg and k == "send")
        i = send_row(victim)
        for name in c:
            c[name].insert(i + 1, c[name][i])
        c["kind"][i + 1], c["tag"][i + 1] = "drop", "loss"
        c["value"][send_row(slow)] += 0.07
    _rewrite(recorded.trace_path, tmp_path / "edited.arrows", edit)
    replay(tmp_path / "edited.arrows", out=tmp_path / "rep")
    r = read_trace(tmp_path / "rep").to_pandas()
    assert ((r.kind == "drop") & (r.msg == victim) & (r.tag == "loss")).sum() == 1
    assert not ((r.kind == "deliver") & (r.msg == victim)).any()
    orig = t[(t.kind == "send") & (t.msg == slow)].iloc[0]
    new = r[(r.kind == "send") & (r.msg == slow)].iloc[0]
    assert new.value == pytest.approx(orig.value + 0.07)
    deliver = r[(r.kind == "deliver") & (r.msg == slow)]
    assert deliver.t.iloc[0] == pytest.approx(orig.t + orig.value + 0.07)


def test_exact_replay_of_a_recording_missing_a_message_warns_it_is_not_exact(recorded, tmp_path):
    t = read_trace(recorded.out).to_pandas()
    sends = t[t.kind == "send"]
    victim = int(sends[(sends.agent == 0) & (sends.peer == 1)].msg.iloc[-1])  # the link's last message

    def edit(c):
        keep = [i for i, m in enumerate(c["msg"]) if m != victim]
        for name in c:
            c[name] = [c[name][i] for i in keep]
    _rewrite(recorded.trace_path, tmp_path / "edited.arrows", edit)
    res = replay(tmp_path / "edited.arrows", out=tmp_path / "rep")
    s = res.summary
    assert s["replay_messages_fallback"] == 1  # everything before it is as recorded
    assert s["replay_warnings"] == [f"1 of {s['replay_messages_matched'] + 1} messages are not in the recording "
                                    "and came from the scenario's own link model: the replay is not exact"]


def test_exact_replay_takes_activation_times_from_the_trace(recorded, tmp_path):
    t = read_trace(recorded.out).to_pandas()
    acts = t[(t.kind == "activate") & (t.agent == 0)]
    target = float(acts.t.iloc[4])

    def edit(c):
        i = next(i for i, (k, a, tt) in enumerate(zip(c["kind"], c["agent"], c["t"], strict=True))
                 if k == "activate" and a == 0 and tt == target)
        c["t"][i] = target + 0.01  # agent 0's fifth activation comes 10 ms late
    _rewrite(recorded.trace_path, tmp_path / "edited.arrows", edit)
    replay(tmp_path / "edited.arrows", out=tmp_path / "rep")
    r = read_trace(tmp_path / "rep").to_pandas()
    got = r[(r.kind == "activate") & (r.agent == 0)].t.to_numpy()
    assert got[4] == pytest.approx(target + 0.01) and target not in set(got)
    assert got[:4] == pytest.approx(acts.t.to_numpy()[:4])


def test_replay_under_another_scenario_uses_recorded_delays_and_drops(recorded, tmp_path):
    other = {**BASE, "algorithm": {"name": "gossip", "lr": 0.1, "batch": 8, "reply_timeout": 0.3},
             "network": {"latency": {"kind": "constant", "value": 5.0}},  # would be 5 s without the trace
             "agents": {k: v for k, v in BASE["agents"].items() if k != "churn"}}
    path = tmp_path / "other.toml"
    path.write_text(to_toml(scenario_from_dict(other)))
    window = 0.5
    res = replay(recorded.out, scenario=path, out=tmp_path / "rep", window=window)
    s = res.summary
    assert s["replay_mode"] == "conditions" and s["algorithm"] == "gossip"
    assert s["replay_messages_matched"] > 0
    assert s["replay_messages_matched"] + s["replay_messages_fallback"] == s["messages_sent"]
    rec = read_trace(recorded.out).to_pandas()
    new = read_trace(res.trace_path).to_pandas()
    rdrops = rec[rec.kind == "drop"].set_index("msg").tag
    ndrops = new[new.kind == "drop"].set_index("msg").tag
    matched = fallback = 0
    for (i, j), grp in new[new.kind == "send"].groupby(["agent", "peer"]):
        r = rec[(rec.kind == "send") & (rec.agent == i) & (rec.peer == j)].sort_values("t")
        times = r.t.to_numpy()
        for m in grp.itertuples():
            k = bisect.bisect_left(times, m.t)
            cands = [c for c in (k - 1, k) if 0 <= c < len(times)]
            best = min(cands, key=lambda c: abs(times[c] - m.t)) if cands else None
            if best is None or abs(times[best] - m.t) > window:
                fallback += 1
                assert m.value == 5.0  # OTHER's own link model
                continue
            matched += 1
            src = r.iloc[best]
            assert m.value == pytest.approx(src.value)  # recorded delay (uplink transfer is shorter)
            want = rdrops.get(src.msg, "")
            got = ndrops.get(m.msg, "")
            if want in ("loss", "outage"):
                assert got == want
            elif got != "offline":
                assert got == ""
    assert (matched, fallback) == (s["replay_messages_matched"], s["replay_messages_fallback"])
    # activations at the recorded times (recorded churn replaces OTHER's: it has none of its own)
    ra = rec[rec.kind == "activate"]
    na = new[new.kind == "activate"]
    for i in range(5):
        rt = ra[ra.agent == i].t.to_numpy()
        nt = na[na.agent == i].t.to_numpy()
        within = nt[nt <= rt.max()]  # before the recording runs out, only recorded times occur
        assert len(within) > 0 and np.isin(within, rt).all()
    assert sorted(new[new.kind == "offline"].t.round(9)) == sorted(rec[rec.kind == "offline"].t.round(9))


def test_truncated_or_foreign_traces_are_clean_errors(recorded, tmp_path):
    data = recorded.trace_path.read_bytes()
    cut = tmp_path / "cut.arrows"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="partial run, up to t = "):
        replay(cut, out=tmp_path / "x")
    junk = tmp_path / "junk.arrows"
    junk.write_text("time,src\n1,2\n")
    with pytest.raises(InputError, match="not a netsim trace"):
        replay(junk, out=tmp_path / "y")


def test_cli_replay_of_a_truncated_trace_is_one_line_exit_2(recorded, tmp_path):
    import subprocess

    from tests.conftest import cli_env, netsim_cli

    data = recorded.trace_path.read_bytes()
    cut = tmp_path / "cut.arrows"
    cut.write_bytes(data[: len(data) - 100])
    p = subprocess.run(netsim_cli("replay", str(cut), "--out", str(tmp_path / "o"), "-q"),
                       capture_output=True, text=True, env=cli_env())
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert p.stderr.startswith(f"error: {cut}: partial run, up to t = ")
    assert not (tmp_path / "o").exists()


EXTRA = {"dp_dda": {"sigma": 1.0}, "do_adp": {"sigma": 1.0},  # parameters some algorithms require
         **{n: {"iterations": 30} for n in ("privsgp", "privsgp_vr", "dp2_sgd", "adp2_sgd")}}


FAST = {"dpsgd", "gossip", "adpsgd", "pushsum", "do_adp"}  # the rest: make test-slow


def _algorithms():
    from netsim.algorithms import names

    return [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in names()]


@pytest.mark.parametrize("name", _algorithms())
def test_every_registered_algorithm_replays_byte_identically(name, tmp_path):
    """Poisson activations, churn, drift, bursty loss and shared uplinks, under every algorithm."""
    act = {"kind": "poisson", "rate": 3.0}
    if name == "do_adp":  # runs in rounds
        act = {"kind": "bernoulli", "period": 0.3, "p": 0.8}
    data = {**BASE, "run": {"seed": 9, "until": 3.0}, "agents": {**BASE["agents"], "activation": act},
            "algorithm": {"name": name, **EXTRA.get(name, {})},
            "data": {**BASE["data"], **({"validation": 30} if name == "pdsl" else {})}}
    try:
        rec = netsim.run(scenario_from_dict(data), out=tmp_path / "run")
    except InputError as e:  # the documented refusal of a setting this algorithm does not take; anything else fails
        pytest.skip(f"{name} refuses this scenario: {e}")
    rep = replay(rec.out, out=tmp_path / "rep")
    assert rep.trace_path.read_bytes() == rec.trace_path.read_bytes()
    assert rep.summary["replay_messages_fallback"] == 0


def in_process(*args):
    """A ``netsim`` command without --plugin, in this process (from the repository root, as the subprocesses)."""
    import contextlib
    from pathlib import Path

    from typer.testing import CliRunner

    from netsim.cli import app

    with contextlib.chdir(Path(__file__).resolve().parent.parent):
        return CliRunner().invoke(app, [str(a) for a in args])


def test_a_run_with_a_plugin_link_model_replays_byte_for_byte(tmp_path):
    """The recording drives the network; the plugin's model is asked only for its transmission ends (it used to
    crash in the full path's links, blamed on an agent's program)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    plugin = root / "examples/plugins/planar_links.py"

    def netsim(*args):
        return subprocess.run([sys.executable, "-m", "netsim", *map(str, args)], cwd=root, capture_output=True,
                              text=True, timeout=300)

    r = netsim("run", "scenarios/quickstart.toml", "--plugin", plugin, "--set", "network.model=planar", "--set",
               "run.until=3", "--set", "network.bandwidth=20000", "--out", tmp_path / "rec", "-q")
    assert r.returncode == 0, r.stderr
    r = netsim("replay", tmp_path / "rec", "--plugin", plugin, "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stdout + r.stderr
    # without the plugin (in this process: no test loads it here): the recording decides every message
    # (transmissions end by the bandwidth, as planar's)
    r = in_process("replay", tmp_path / "rec", "--out", tmp_path / "rep2")
    assert r.exit_code == 0, r.output
    for f in ("trace.arrows", "metrics.csv"):
        assert (tmp_path / "rec" / f).read_bytes() == (tmp_path / "rep" / f).read_bytes(), f
        assert (tmp_path / "rec" / f).read_bytes() == (tmp_path / "rep2" / f).read_bytes(), f
    # under another scenario the scenario's own model is used: that needs the plugin, said in one line
    r = in_process("replay", tmp_path / "rec", "--scenario", "scenarios/quickstart.toml", "--set",
                   "network.model=planar", "--out", tmp_path / "rep3")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "unknown link model 'planar'" in r.stderr, r.output


def test_a_run_with_a_plugin_schedule_replays_byte_for_byte_with_and_without_the_plugin(tmp_path):
    """A Weibull renewal schedule (examples/plugins/weibull_activation.py): the recording fixes every activation
    at its recorded time, so the replay needs the plugin only where the run reads the schedule itself."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    plugin = root / "examples/plugins/weibull_activation.py"

    def netsim(*args):
        return subprocess.run([sys.executable, "-m", "netsim", *map(str, args)], cwd=root, capture_output=True,
                              text=True, timeout=300)

    r = netsim("run", "scenarios/quickstart.toml", "--plugin", plugin, "--set",
               'agents.activation={kind="poisson", rate=4.0, schedule="weibull2"}', "--set", "run.until=5",
               "--set", 'agents.clock_offset={kind="uniform", low=0.0, high=3.0}',
               "--out", tmp_path / "rec", "-q")
    assert r.returncode == 0, r.stderr
    r = netsim("replay", tmp_path / "rec", "--plugin", plugin, "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stdout + r.stderr
    r = in_process("replay", tmp_path / "rec", "--out", tmp_path / "rep2")  # (no test loads the plugin here)
    assert r.exit_code == 0, r.output
    for out in ("rep", "rep2"):
        for f in ("trace.arrows", "metrics.csv"):
            assert (tmp_path / "rec" / f).read_bytes() == (tmp_path / out / f).read_bytes(), (out, f)


def test_an_unloaded_schedule_whose_ticks_the_ledger_read_is_refused_in_one_line(tmp_path, scenario):
    """Releases accounted with a plugin schedule's ticks (p < 1) cannot be replayed without it."""
    from netsim.sim.activation import SCHEDULES, Bernoulli

    SCHEDULES["test_unloaded_bernoulli"] = lambda spec, rng, offset: Bernoulli(0.5, 0.6, rng, offset)
    try:
        rec = netsim.run(scenario(run={"until": 4.0},
                                  agents={"activation": {"kind": "periodic", "period": 0.5,
                                                         "schedule": "test_unloaded_bernoulli"}},
                                  algorithm={"name": "dp_dpsgd", "lr": 0.5, "batch": 16, "round_timeout": 0.2,
                                             "clip": 1.0, "noise_multiplier": 4.0}), out=tmp_path / "rec")
    finally:
        del SCHEDULES["test_unloaded_bernoulli"]
    with pytest.raises(InputError, match="schedule 'test_unloaded_bernoulli' is not loaded and the recorded "
                                         "releases were accounted with its ticks"):
        replay(rec.out, out=tmp_path / "rep")
    assert "test_unloaded_bernoulli" not in SCHEDULES


def test_replay_of_a_run_the_default_engine_played_as_windows_runs_on_events_and_says_why(tmp_path):
    """The default engine (auto) plays an exact synchronous run as windows; its exact replay installs the recorded
    network, which the windows cannot play: the events engine writes the recording's very bytes and the summary
    says why in one line."""
    sc = {"run": {"seed": 2, "rounds": 6, "until": 1.0e6},
          "agents": {"count": 6, "compute_time": {"kind": "constant", "value": 0.01},
                     "activation": {"kind": "periodic", "period": 0.1}},
          "topology": {"kind": "ring"}, "network": {"latency": {"kind": "constant", "value": 0.005}, "loss": 0.1},
          "data": {"samples": 240, "features": 4},
          "algorithm": {"name": "dpsgd", "lr": 0.2, "batch": 8, "round_timeout": 0.05},
          "evaluation": {"every": 1.0e6, "metrics": ["accuracy"]}}
    rec = netsim.run(scenario_from_dict(sc), out=tmp_path / "run")
    assert rec.summary["engine"] == "windowed"
    res = replay(rec.out, out=tmp_path / "rep")
    assert (tmp_path / "rep" / TRACE_FILE).read_bytes() == rec.trace_path.read_bytes()
    assert res.summary["engine"] == "events" and res.summary["windowed_refused"] == (
        "a link model of its own decides the messages (ReplayNetwork: a replay's recorded network or a setup hook's) "
        "— nothing to change: a replay runs on the events engine")
