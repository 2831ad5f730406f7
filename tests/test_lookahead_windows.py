"""Lookahead windows end to end: runs of each asynchronous pattern the windows play (evaluations inside the run,
churn, sampled rows, a trace cut in small batches, the broadcast pattern) write the events engine's bytes and end
with its models; a failure in the control keeps the trace written so far, the start of the whole run. Checkpoints
are cut between two windows and restored by ``netsim resume``: a run killed or interrupted after one ends as the
uninterrupted run, byte for byte."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

import netsim
from netsim.scenario import scenario_from_dict
from netsim.trace.io import read_trace
from tests.search import search
from tests.test_checkpoint_windowed import finals, killed_at, same_outputs  # noqa: F401, F811 - finals: a fixture
from tests.test_windowed import async_gossip, buildable, gossip, identical, lookahead_run

VARY = ("wall_time", "events_per_s", "engine", "windows")


def asynchronous(**changes) -> dict:
    """The asynchronous gossip benchmark's job, small: Poisson clocks, drift, uniform latency, loss."""
    sc = gossip(agents={"activation": {"kind": "poisson", "rate": 2.0},
                        "clock_drift": {"kind": "uniform", "low": -0.01, "high": 0.01}},
                run={"rounds": None, "until": 6.0})
    sc["run"] = {k: v for k, v in sc["run"].items() if v is not None}
    for key, value in changes.items():
        sc[key] = {**sc.get(key, {}), **value}
    return sc


def played(tmp_path, sc: dict, engine: str) -> dict:
    import hashlib

    built: list = []
    folder = tmp_path / engine
    r = netsim.run(scenario_from_dict(sc), out=folder, setup=built.append, engine=engine)
    writer = built[0].recorder.writer
    raw = (folder / "trace.arrows").read_bytes()
    # the writer's count of bytes and their sha256 are the file's
    assert writer.sha.hexdigest() == hashlib.sha256(raw[:writer.bytes]).hexdigest() and len(raw) - writer.bytes == 8
    return {"trace": hashlib.sha256(raw).hexdigest(),
            "metrics": (folder / "metrics.csv").read_text(),
            "summary": {k: v for k, v in r.summary.items() if k not in VARY},
            "W": built[0].bank.W.clone(), "engine": r.summary.get("engine", "events"),
            "windows": r.summary.get("windows")}


@pytest.mark.parametrize("changes", [
    {"evaluation": {"every": 1.5, "metrics": ["loss", "accuracy", "consensus", "agent_accuracy"]}},
    {"model": {"kind": "logistic", "batch_invariant": True},  # one gradient call per lock step
     "agents": {"churn": {"mean_online": 2.0, "mean_offline": 0.5}}},
    {"model": {"kind": "logistic", "batch_invariant": True},  # whole parts of two lengths: a block per length
     "data": {"samples": 617}},
    {"algorithm": {"batch": 3, "lr_decay": 0.2}, "model": {"dtype": "float64"},  # sampled rows
     "network": {"latency": {"kind": "uniform", "low": 0.02, "high": 0.3}, "loss": 0.2, "bandwidth": 2.0e5}},
    {"run": {"until": 4.0, "trace_flush_every": 7},  # batches cut at 7 rows
     "evaluation": {"every": 0.7, "metrics": ["accuracy"]}},
    # the broadcast pattern's driver
    {"algorithm": {"name": "async_push", "batch": 2, "staleness_power": 1.0},
     "evaluation": {"every": 1.5, "metrics": ["loss", "consensus"]}},
    {"algorithm": {"name": "pushsum", "lr": 0.3, "batch": 3}, "network": {"loss": 0.2},
     "model": {"kind": "logistic", "batch_invariant": True}},
])
def test_the_windows_write_the_engines_bytes_and_models(tmp_path, changes):
    sc = asynchronous(**changes)
    windowed = played(tmp_path, sc, "windowed")
    events = played(tmp_path, sc, "events")
    assert "tensor_worker" not in windowed["windows"]
    if scenario_from_dict(sc).model.batch_invariant is True:  # the windows batch a lock step's gradients ("auto")
        for run in (events, windowed):
            for k in ("gradient_batches", "mean_gradient_batch"):
                run["summary"].pop(k)
    summary = identical({"events": events, "windowed": windowed})
    assert summary["gradients"] > 0 and summary["messages_delivered"] > 0


def fails_keeping_the_runs_start(tmp_path, monkeypatch, method: str, nth: int, what: str, said: str) -> None:
    """The driver's ``method`` raises ``what`` at its ``nth`` call: the run fails saying ``said``, and the partial
    trace is the start of the whole run (every row made before the failure was written)."""
    from netsim.errors import RunCrashed
    from netsim.rounds import lookahead

    real, calls = getattr(lookahead._Driver, method), []

    def broken(self, arg):
        calls.append(arg)
        if len(calls) == nth:
            raise ValueError(what)
        real(self, arg)

    sc = asynchronous(run={"trace_flush_every": 50})
    monkeypatch.setattr(lookahead._Driver, method, broken)
    with pytest.raises(RunCrashed, match=said):
        netsim.run(scenario_from_dict(sc), out=tmp_path / "run", engine="windowed")
    partial = json.loads((tmp_path / "run" / "summary.partial.json").read_text())
    monkeypatch.setattr(lookahead._Driver, method, real)
    netsim.run(scenario_from_dict(sc), out=tmp_path / "whole", engine="windowed")
    cut, whole = read_trace(tmp_path / "run"), read_trace(tmp_path / "whole")
    assert not cut.complete and 0 < cut.table.num_rows < whole.table.num_rows
    assert cut.table.equals(whole.table.slice(0, cut.table.num_rows))
    assert partial["events"] == cut.table.num_rows


def test_a_failure_in_the_tensor_work_keeps_the_trace_so_far(tmp_path, monkeypatch):
    fails_keeping_the_runs_start(tmp_path, monkeypatch, "tensor_work", 2, "a kernel that breaks",
                                 "ValueError: a kernel that breaks")


def test_a_failure_in_the_control_keeps_the_trace_so_far(tmp_path, monkeypatch):
    fails_keeping_the_runs_start(tmp_path, monkeypatch, "events_until", 60, "a control that breaks",
                                 "a control that breaks")


# checkpoints between two windows, restored ----------------------------------------------------------------------
RESTORED = {  # each pattern whose windows restore, with what its state holds between windows
    # push gossip: payloads in flight, activations waiting for their gradient (the engine's batches), peers drawn
    "push_gossip": {"algorithm": {"batch": 3}, "network": {"bandwidth": 2.0e5}},  # bandwidth: links' queues
    # the broadcast pattern: asynchronous push SGD's points kept for their batch, its staleness weights
    "async_push": {"algorithm": {"name": "async_push", "batch": 2, "staleness_power": 1.0},
                   "agents": {"clock_jitter": {"kind": "uniform", "low": 0.0, "high": 0.01}}},
    # push-sum: running sums kept per sender, weights, one gradient call per lock step
    "pushsum": {"algorithm": {"name": "pushsum", "lr": 0.3, "batch": 3}, "model": {"kind": "logistic",
                                                                                     "batch_invariant": True}},
    # the pairwise pattern: locks, exchanges waiting on replies and their timers, requests queued at a server
    "adpsgd": {"algorithm": {"name": "adpsgd", "batch": 2, "reply_timeout": 0.3}},
    # no lookahead (requests and replies sent and delivered inside a window; pushes for push-sum): windows of the
    # mean latency, restored with the same length
    "adpsgd_lognormal": {"algorithm": {"name": "adpsgd", "batch": 2, "reply_timeout": 0.3},
                         "network": {"latency": {"kind": "lognormal", "mean": 0.05, "sigma": 1.0}}},
    "pushsum_exponential": {"algorithm": {"name": "pushsum", "lr": 0.3, "batch": 3},
                            "network": {"latency": {"kind": "exponential", "mean": 0.05}}},
    # the composed models' links: each link's Gilbert-Elliott chain and draws, an outage, a per-link setting, uplinks
    "push_gossip_bursty": {"algorithm": {"batch": 3},
                           "network": {"burst": {"p_enter": 0.2, "p_exit": 0.4, "loss_bad": 0.8},
                                       "outages": [{"start": 1.0, "end": 2.0, "src": 0}],
                                       "links": [{"src": 0, "dst": 1, "loss": 0.3, "both": True}]}},
    "adpsgd_bursty": {"algorithm": {"name": "adpsgd", "batch": 2, "reply_timeout": 0.3},
                      "network": {"burst": {"p_enter": 0.2, "p_exit": 0.4, "loss_bad": 0.8}, "uplink": 2.0e5}},
    # churn: each agent's random on/off intervals drawn so far (activations moved, gradients waiting, messages dropped)
    "push_gossip_churn": {"algorithm": {"batch": 3}, "agents": {"churn": {"mean_online": 1.5, "mean_offline": 0.4}}},
    # a time-varying topology: the epoch whose links each agent holds (messages and copies from other epochs' links)
    "push_gossip_resampled": {"algorithm": {"batch": 3},
                              "topology": {"kind": "erdos_renyi", "p": 0.6,
                                           "dynamic": {"kind": "resample", "every": "period", "period": 0.8}}},
    # (long gradients: at a checkpoint agents are between their wake, which took the epoch's links, and their push)
    "async_push_one_peer": {"algorithm": {"name": "async_push", "batch": 2},
                            "agents": {"compute_time": {"kind": "uniform", "low": 0.2, "high": 0.6}},
                            "topology": {"kind": "ring", "dynamic": {"kind": "one_peer_exponential"}}},
    "event_triggered_one_peer": {"algorithm": {"name": "event_triggered", "lr": 0.3, "batch": 4, "trigger": "absolute",
                                               "threshold": 0.1},
                                 "topology": {"kind": "ring", "dynamic": {"kind": "one_peer_exponential"}}},
    "adpsgd_resampled": {"algorithm": {"name": "adpsgd", "batch": 2, "reply_timeout": 0.3},
                         "topology": {"kind": "erdos_renyi", "p": 0.6,
                                      "dynamic": {"kind": "resample", "every": "period", "period": 0.8}}},
    "dpsgd_churn": {"algorithm": {"name": "dpsgd", "batch": 2, "round_timeout": 0.3},  # (barrier rounds)
                    "agents": {"activation": {"kind": "periodic", "period": 0.5},
                               "clock_jitter": {"kind": "uniform", "low": 0.0, "high": 0.05},
                               "churn": {"mean_online": 1.5, "mean_offline": 0.4}}},
    # event-triggered DP-SGD: the neighbour copies, what each agent last sent each out-neighbour (about half the
    # sends skipped), the releases and the agents whose budget cap has stopped them
    "event_triggered": {"algorithm": {"name": "event_triggered", "lr": 0.3, "batch": 4, "trigger": "absolute",
                                      "threshold": 0.1, "clip": 1.0, "noise_multiplier": 1.0},
                        "privacy": {"delta": 1e-5, "epsilon_cap": 5.0}},
    # SPARQ-SGD: the public copies (in the bank), compressed differences in flight, each agent's trigger count
    "sparq": {"algorithm": {"name": "sparq", "lr": 0.3, "batch": 4, "compressor": "randk", "trigger": "absolute",
                            "threshold": 0.05}},
    # DO-ADP's rounds on ticks: each agent's rounds replayed and applied, differences pending by round (some late)
    "do_adp": {"agents": {"activation": {"kind": "bernoulli", "period": 0.5, "p": 0.7},
                          "clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.4}},
               "network": {"latency": {"kind": "uniform", "low": 0.01, "high": 1.2}},
               "algorithm": {"name": "do_adp", "rounds": 10, "lr": 0.3, "ratio": 0.5, "sigma": 0.1, "batch": 2},
               "privacy": {"delta0": 1e-5}},
    # barrier rounds (DP-D-PSGD) on jittery Bernoulli clocks over lossy links: open barriers with what they took, their
    # timers (timeouts, stale rounds), messages queued for a later round, parts kept for their combine, ledgers,
    # broadcasts whose transmission holds their sender (bandwidth)
    "barrier_dp_dpsgd": {"algorithm": {"name": "dp_dpsgd", "batch": 3, "round_timeout": 0.3, "clip": 1.0,
                                       "noise_multiplier": 1.0},
                         "agents": {"activation": {"kind": "bernoulli", "period": 0.5, "p": 0.7},
                                    "clock_jitter": {"kind": "uniform", "low": 0.0, "high": 0.05},
                                    "compute_time": {"kind": "uniform", "low": 0.02, "high": 0.3}},
                         "network": {"bandwidth": 300.0}, "privacy": {"delta": 1e-5}},
    # barrier rounds with compute times of each agent's own (stragglers): points waiting for the engine's gradient
    # batches, gradients waiting for their ``local``; Muffliato's two exchanges a round (payloads made by ``combine``)
    "barrier_stragglers": {"algorithm": {"name": "dpsgd", "batch": 2, "round_timeout": 0.4},
                           "agents": {"activation": {"kind": "periodic", "period": 0.5},
                                      "clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.3},
                                      "compute_time": {"kind": "uniform", "low": 0.01, "high": 0.2},
                                      "stragglers": [0, 3], "straggler_factor": 4.0},
                           "model": {"kind": "logistic", "batch_invariant": False}},
    "barrier_muffliato": {"algorithm": {"name": "muffliato", "batch": 2, "round_timeout": 0.3, "clip": 1.0,
                                        "sigma": 1.0, "gossip_steps": 2},
                          "agents": {"activation": {"kind": "periodic", "period": 0.5},
                                     "clock_jitter": {"kind": "uniform", "low": 0.0, "high": 0.05}},
                          "topology": {"kind": "ring"}},
}


def checkpointed(alg: str) -> dict:
    return asynchronous(run={"checkpoint_every": 1.0, "trace_flush_every": 37},
                        evaluation={"every": 1.5, "metrics": ["loss", "accuracy", "agent_accuracy"]},
                        **RESTORED[alg])


@pytest.mark.parametrize("alg", sorted(RESTORED))
def test_a_lookahead_run_killed_after_a_checkpoint_resumes_by_restore_byte_identical(tmp_path, finals, alg):  # noqa: F811
    """Killed right after its second checkpoint (nothing after it written), the run resumes by restoring the
    driver's state between two windows: trace, metrics and final models are the uninterrupted run's; both are the
    events engine's rows, metrics and models."""
    from netsim import api
    from netsim.sim import checkpoint

    sc = checkpointed(alg)
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)
    assert ref.summary["engine"] == "windowed" and "windows" in ref.summary
    events = api.run(scenario_from_dict(sc), out=tmp_path / "events", engine="events", interruptible=False)
    out = killed_at(tmp_path, sc, 2)
    ck = checkpoint.load(checkpoint.checkpoints(out)[-1])
    held = json.loads(ck.meta["state"]["windowed"]["held"]["dict"][0][1])  # the driver's plain state
    assert ck.meta["engine"] == "windowed" and ck.meta["state"]["windowed"]["round"] == ck.step > 0
    own = held["own"]
    assert held["events"] and held["shipped"]  # mid-run: events due, rows not yet written
    assert held["payloads"] or own["payload"]  # payloads in flight (the barrier windows keep their own)
    if alg.startswith("barrier"):  # barriers open with what they took, parts kept for their combine
        assert any(w and w[1] for w in own["waiter"]) and own["parts"] and own["recs"]
    if alg == "push_gossip":  # killed again after the resumed run's first checkpoint: links it has not used since
        real = checkpoint.write  # the first restore are kept as that restore left them

        def write_then_die(*args, **kwargs):
            real(*args, **kwargs)
            raise KeyboardInterrupt

        checkpoint.write = write_then_die
        try:
            with pytest.raises(KeyboardInterrupt):
                api.resume(out, interruptible=False)
        finally:
            checkpoint.write = real
        again = checkpoint.load(checkpoint.checkpoints(out)[-1])
        assert again.step > ck.step and json.loads(again.meta["state"]["windowed"]["held"]["dict"][0][1])["events"]
        ck = again
    res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore" and res.summary["resumed_at_step"] == ck.step
    same_outputs(out, ref.out, skip={"windows", "resumed_at_step"})
    assert torch.equal(finals[-1], finals[0])  # the resumed run's models are the uninterrupted run's
    assert torch.equal(finals[1], finals[0])  # and the events engine's
    assert read_trace(events.out).table.equals(read_trace(ref.out).table)  # (a checkpoint there flushes a batch)
    assert (events.out / "metrics.csv").read_bytes() == (ref.out / "metrics.csv").read_bytes()


def test_ctrl_c_stops_lookahead_windows_between_two_windows_and_resume_restores(tmp_path, finals):  # noqa: F811
    """SIGINT stops the windows after the window it is in, with a checkpoint there; the resume restores it. Without
    checkpoints the windows keep no restorable state: the run plays to its end and is complete."""
    from netsim import api
    from netsim.sim import checkpoint

    sc = checkpointed("push_gossip")
    sc["run"]["checkpoint_every"] = 100.0  # no periodic one: the interrupt's
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)

    sent = []

    def progress(t: float) -> None:
        if t > 2.0 and not sent:  # once (a second Ctrl-C aborts)
            sent.append(t)
            os.kill(os.getpid(), signal.SIGINT)

    stopped = api.run(scenario_from_dict(sc), out=tmp_path / "run", engine="windowed", progress=progress)
    assert stopped.summary["stop_reason"] == "interrupted"
    ck = checkpoint.load(checkpoint.checkpoints(stopped.out)[-1])
    assert ck.meta["kind"] == "interrupt" and 2.0 < ck.meta["state"]["windowed"]["end"] < 6.0
    res = api.resume(stopped.out, interruptible=False)
    assert res.summary["resumed_by"] == "restore"
    same_outputs(res.out, ref.out, skip={"windows", "resumed_at_step"})
    assert torch.equal(finals[-1], finals[0])
    plain = asynchronous()
    sent.clear()
    whole = api.run(scenario_from_dict(plain), out=tmp_path / "plain", engine="windowed", progress=progress)
    assert whole.summary["stop_reason"] == "until" and api.is_complete(whole.out)


@pytest.mark.parametrize(("changes", "said"), [
    ({"algorithm": {"name": "dpsgd", "batch": 2}}, "this pattern's lookahead windows cannot be restored"),
])
def test_checkpoints_the_windows_cannot_restore_are_refused_in_one_line(tmp_path, monkeypatch, changes, said):
    """--engine auto runs them on the events engine and says why; --engine windowed refuses them (a pattern whose
    windows keep no restorable state: one that does not declare ``restores``, here the barrier rounds made so)."""
    from netsim.errors import InputError
    from netsim.rounds.sync import SyncRounds

    if "cannot be restored" in said:
        monkeypatch.setattr(SyncRounds, "restores", False)
    sc = asynchronous(run={"checkpoint_every": 1.0}, **changes)
    r = netsim.run(scenario_from_dict(sc), out=tmp_path / "auto", engine="auto")
    assert r.summary["engine"] == "events" and said in r.summary["windowed_refused"]
    assert "remove run.checkpoint_every" in r.summary["windowed_refused"]
    with pytest.raises(InputError, match=said):
        netsim.run(scenario_from_dict(sc), out=tmp_path / "windowed", engine="windowed")


def test_a_checkpoint_before_the_first_trace_batch_resumes(tmp_path, finals):  # noqa: F811
    """A window's checkpoint flushes nothing: one taken before the trace's first batch was written points at no
    bytes of a file not made yet; the resume makes it at its first batch, and the trace is the uninterrupted one."""
    from netsim import api
    from netsim.sim import checkpoint

    sc = checkpointed("push_gossip")
    sc["run"]["trace_flush_every"] = 100_000
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)
    out = killed_at(tmp_path, sc, 1)
    ck = checkpoint.load(checkpoint.checkpoints(out)[-1])
    assert ck.meta["trace"]["bytes"] == 0 and not (out / "trace.arrows").exists()
    api.resume(out, interruptible=False)
    same_outputs(out, ref.out, skip={"windows", "resumed_at_step"})
    assert torch.equal(finals[-1], finals[0])


def test_a_gradient_batchs_rows_are_kept_without_a_copy_and_anything_else_is_stacked():
    """``stacked``: rows back to back in one storage, in order (a gradient batch's results, all or the first of them),
    are a view of it (no (B, P) copy of a large model's gradient batch); rows in another order, a transposed tensor's,
    separate rows or one row twice are stacked; the values are always those ``torch.stack`` gives."""
    from netsim.rounds.lookahead import stacked

    G = torch.randn(5, 7)
    for rows in (list(G.unbind(0)), list(G.unbind(0))[:4], [G[0]]):
        out = stacked(rows)
        assert out.data_ptr() == G.data_ptr() and out.shape == (len(rows), 7) and torch.equal(out, torch.stack(rows))
    for rows in (list(G.unbind(0))[::-1], list(G.unbind(0))[1:][::-1], list(torch.randn(7, 5).t().unbind(0)),
                 [torch.randn(7) for _ in range(3)], [G[1], G[1]]):
        out = stacked(rows)
        assert out.data_ptr() != rows[0].data_ptr() and torch.equal(out, torch.stack(rows))


def reference_steps(ops: list[list[int]], waits: dict[tuple[int, int], list[tuple[int, int]]]) -> list[list[int]]:
    """The lock steps as a plain pass per step finds them: each agent goes as far as it can in the order update,
    merge, ask, push; an operation waiting for another goes on the step after that one's."""
    step = [[-1] * len(o) for o in ops]
    ptr, s = [0] * len(ops), 0
    while any(p < len(o) for p, o in zip(ptr, ops, strict=True)):
        done = []
        for i, o in enumerate(ops):
            last = -1
            while ptr[i] < len(o) and o[ptr[i]] > last:
                if any(step[a][k] < 0 or step[a][k] >= s for a, k in waits.get((i, ptr[i]), ())):
                    break
                done.append((i, ptr[i]))
                last = o[ptr[i]]
                ptr[i] += 1
        if not done:
            raise RuntimeError("the operations wait on each other")
        for i, k in done:
            step[i][k] = s
        s += 1
    return step


@search(60, phases=[Phase.explicit, Phase.generate])
@given(data=st.data())
def test_lock_steps_are_the_earliest_that_keep_each_agents_order_and_its_waits(data):
    """``lock_steps`` over the arrays of every operation gives each the step a plain pass per step gives it: an
    operation joins its predecessor's step when its kind comes later in a step, else the next one, and comes a step
    after every operation it waits for (waits drawn between agents, chains of them included); operations that wait
    on each other are refused."""
    import numpy as np

    from netsim.rounds.lookahead import lock_steps

    ops = data.draw(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=6))
    where = [(i, k) for i, o in enumerate(ops) for k in range(len(o))]
    pairs = data.draw(st.lists(st.tuples(st.sampled_from(where), st.sampled_from(where)), max_size=6))
    waits: dict = {}
    for w, on in pairs:
        waits.setdefault(w, []).append(on)
    flat = {w: n for n, w in enumerate(where)}
    kind = np.array([c for o in ops for c in o], np.int64)
    first = np.array([k == 0 for _, k in where])
    waiter = np.array([flat[w] for w, on in pairs], np.int64)
    waited = np.array([flat[on] for w, on in pairs], np.int64)
    try:
        want = reference_steps(ops, waits)
    except RuntimeError:
        with pytest.raises(RuntimeError, match="wait on each other"):
            lock_steps(kind, first, waiter, waited)
        return
    assert lock_steps(kind, first, waiter, waited).tolist() == [s for row in want for s in row]


@search(6, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=async_gossip(), gathers=st.sampled_from([1, 3, 32, 200]))
def test_push_gossip_windows_agree_with_the_engine_whatever_windows_are_worked_together(tmp_path_factory, sc,
                                                                                        gathers):
    """Drawn asynchronous scenarios with the tensor work of 1 to 200 windows done together (a merge then waits in
    lock step for a push of the same work, chains of them across agents): the engine's bytes and models."""
    from netsim.rounds import lookahead

    buildable(sc)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(lookahead._Driver, "gathers", gathers)
        lookahead_run(tmp_path_factory.mktemp("drawn"), sc, windows=False)


@pytest.mark.parametrize("network", [
    {"latency": {"kind": "uniform", "low": 0.05, "high": 0.5}, "loss": 0.2},
    {"latency": {"kind": "constant", "value": 0.1}, "loss": 0.0},  # no latency draws, no loss draws
])
def test_push_gossip_links_read_past_their_first_draws_give_the_engines_bytes(tmp_path, monkeypatch, network):
    """Push gossip's windows read each link's first latency and loss draws from flat arrays (``LinksAhead.flat``),
    then its own streams: links that carry more pushes than a first block give the engine's bytes and models."""
    from netsim.sim.network import LinksAhead
    from netsim.sim.streams import FIRST_BLOCK

    real, calls = LinksAhead.flat, {}

    def counted(self):
        outcome = real(self)

        def count(r, src, dst, now):
            calls[r] = calls.get(r, 0) + 1
            return outcome(r, src, dst, now)

        return count

    monkeypatch.setattr(LinksAhead, "flat", counted)
    sc = asynchronous(agents={"count": 8, "activation": {"kind": "poisson", "rate": 4.0}}, network=network,
                      run={"until": 30.0})
    got = {"events": played(tmp_path, sc, "events"), "windowed": played(tmp_path, sc, "windowed")}
    for run in got.values():  # (the windows batch a lock step's gradients: "auto" is true on own clocks)
        for k in ("gradient_batches", "mean_gradient_batch"):
            run["summary"].pop(k)
    assert identical(got)["messages_delivered"] > 0
    assert max(calls.values()) > FIRST_BLOCK + 2 and min(calls.values()) > 0
