"""Lookahead windows end to end: runs of each asynchronous pattern the windows play (evaluations inside the run,
churn, sampled rows, a trace cut in small batches, the broadcast pattern) write the events engine's bytes and end
with its models; a failure in the control keeps the trace written so far, the start of the whole run."""

from __future__ import annotations

import json

import pytest

import netsim
from netsim.scenario import scenario_from_dict
from netsim.trace.io import read_trace
from tests.test_windowed import gossip, identical

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
    fails_keeping_the_runs_start(tmp_path, monkeypatch, "tensor_work", 5, "a kernel that breaks",
                                 "ValueError: a kernel that breaks")


def test_a_failure_in_the_control_keeps_the_trace_so_far(tmp_path, monkeypatch):
    fails_keeping_the_runs_start(tmp_path, monkeypatch, "events_until", 60, "a control that breaks",
                                 "a control that breaks")
