"""The lookahead windows' tensor worker (rounds/tensor_worker.py): a run whose tensor work a forked worker does
writes the bytes and ends with the models of the same run in one process (and of the events engine); a failure in
the worker fails the run with the worker's traceback; the runs it must not take stay in one process, and say why."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys

import pytest
import torch

import netsim
from netsim.rounds import tensor_worker
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


def played(tmp_path, sc: dict, engine: str, worker: str | None, monkeypatch) -> dict:
    import hashlib

    if worker is not None:
        monkeypatch.setenv(tensor_worker.ENV, worker)
    built: list = []
    folder = tmp_path / f"{engine}-{worker}"
    r = netsim.run(scenario_from_dict(sc), out=folder, setup=built.append, engine=engine)
    writer = built[0].recorder.writer
    raw = (folder / "trace.arrows").read_bytes()
    # the writer came back from the worker (or never left): its count of bytes and their sha256 are the file's
    assert writer.sha.hexdigest() == hashlib.sha256(raw[:writer.bytes]).hexdigest() and len(raw) - writer.bytes == 8
    return {"trace": hashlib.sha256(raw).hexdigest(),
            "metrics": (folder / "metrics.csv").read_text(),
            "summary": {k: v for k, v in r.summary.items() if k not in VARY},
            "W": built[0].bank.W.clone(), "engine": r.summary.get("engine", "events"),
            "windows": r.summary.get("windows")}


@pytest.mark.parametrize("changes", [
    {"evaluation": {"every": 1.5, "metrics": ["loss", "accuracy", "consensus", "agent_accuracy"]}},  # bank synced
    {"model": {"kind": "logistic", "batch_invariant": True},  # one gradient call per lock step
     "agents": {"churn": {"mean_online": 2.0, "mean_offline": 0.5}}},
    {"algorithm": {"batch": 3, "lr_decay": 0.2}, "model": {"dtype": "float64"},  # sampled rows cross the pipe
     "network": {"latency": {"kind": "uniform", "low": 0.02, "high": 0.3}, "loss": 0.2, "bandwidth": 2.0e5}},
    {"run": {"until": 4.0, "trace_flush_every": 7},  # the trace file open before the fork, batches cut at 7 rows
     "evaluation": {"every": 0.7, "metrics": ["accuracy"]}},
    # the broadcast pattern's driver: its operations carry the takes and scalars its control decided
    {"algorithm": {"name": "async_push", "batch": 2, "staleness_power": 1.0},
     "evaluation": {"every": 1.5, "metrics": ["loss", "consensus"]}},
    {"algorithm": {"name": "pushsum", "lr": 0.3, "batch": 3}, "network": {"loss": 0.2},
     "model": {"kind": "logistic", "batch_invariant": True}},
])
def test_the_worker_writes_the_same_bytes_and_models_as_one_process(tmp_path, monkeypatch, changes):
    sc = asynchronous(**changes)
    inline = played(tmp_path, sc, "windowed", "0", monkeypatch)
    forked = played(tmp_path, sc, "windowed", "1", monkeypatch)
    events = played(tmp_path, sc, "events", None, monkeypatch)
    assert forked["windows"]["tensor_worker"] is True and "tensor_worker_why_not" not in forked["windows"]
    assert inline["windows"]["tensor_worker"] is False
    assert inline["windows"]["tensor_worker_why_not"] == f"{tensor_worker.ENV}=0"
    assert forked["summary"] == inline["summary"]  # the gradient batches too: counted in the worker
    if scenario_from_dict(sc).model.batch_invariant is True:  # the windows batch a lock step's gradients ("auto")
        for run in (events, forked, inline):
            for k in ("gradient_batches", "mean_gradient_batch"):
                run["summary"].pop(k)
    summary = identical({"events": events, "windowed": forked})
    identical({"events": events, "windowed": inline})
    assert summary["gradients"] > 0 and summary["messages_delivered"] > 0
    assert torch.equal(forked["W"], inline["W"])
    assert not multiprocessing.active_children()  # the worker ended with the run


def fails_keeping_the_runs_start(tmp_path, monkeypatch, method: str, nth: int, what: str, said: str) -> None:
    """The driver's ``method`` raises ``what`` at its ``nth`` call, with a worker: the run fails saying ``said``,
    the worker is gone, and the partial trace is the start of the whole run (every row handed to the worker was
    written, the writer came back with its counts)."""
    from netsim.errors import RunCrashed
    from netsim.rounds import lookahead

    real, calls = getattr(lookahead._Driver, method), []

    def broken(self, arg):
        calls.append(arg)
        if len(calls) == nth:
            raise ValueError(what)
        real(self, arg)

    sc = asynchronous(run={"trace_flush_every": 50})
    monkeypatch.setattr(lookahead._Driver, method, broken)  # in place before the fork: the worker's too
    monkeypatch.setenv(tensor_worker.ENV, "1")
    with pytest.raises(RunCrashed, match=said):
        netsim.run(scenario_from_dict(sc), out=tmp_path / "run", engine="windowed")
    assert not multiprocessing.active_children()
    partial = json.loads((tmp_path / "run" / "summary.partial.json").read_text())
    monkeypatch.setattr(lookahead._Driver, method, real)
    netsim.run(scenario_from_dict(sc), out=tmp_path / "whole", engine="windowed")
    cut, whole = read_trace(tmp_path / "run"), read_trace(tmp_path / "whole")
    assert not cut.complete and 0 < cut.table.num_rows < whole.table.num_rows
    assert cut.table.equals(whole.table.slice(0, cut.table.num_rows))
    assert partial["events"] == cut.table.num_rows


def test_a_failure_in_the_worker_fails_the_run_with_its_traceback(tmp_path, monkeypatch):
    fails_keeping_the_runs_start(tmp_path, monkeypatch, "tensor_work", 5, "a kernel that breaks in the worker",
                                 "tensor worker failed: ValueError: a kernel that breaks in the worker")


def test_a_failure_in_the_control_takes_the_trace_back_from_the_worker(tmp_path, monkeypatch):
    fails_keeping_the_runs_start(tmp_path, monkeypatch, "events_until", 60, "a control that breaks",
                                 "a control that breaks")


def test_runs_the_worker_must_not_take_stay_in_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv(tensor_worker.ENV, "1")
    sc = asynchronous(privacy={"delta": 1e-5})  # a release is accounted where it is made
    r = netsim.run(scenario_from_dict(sc), out=tmp_path / "private", engine="windowed")
    assert r.summary["windows"]["tensor_worker"] is False
    assert r.summary["windows"]["tensor_worker_why_not"].startswith("privacy")
    monkeypatch.setenv(tensor_worker.ENV, "auto")  # the broadcast pattern's windows keep one process unless asked
    sc = asynchronous(algorithm={"name": "async_push", "batch": 2})
    r = netsim.run(scenario_from_dict(sc), out=tmp_path / "broadcast", engine="windowed")
    assert r.summary["windows"]["tensor_worker"] is False
    assert r.summary["windows"]["tensor_worker_why_not"].startswith("the broadcast control bounds the run")


def test_the_cli_says_where_the_tensor_work_ran(tmp_path, monkeypatch):
    import tomli_w
    from typer.testing import CliRunner

    from netsim.cli import app

    (tmp_path / "s.toml").write_text(tomli_w.dumps(asynchronous()))
    for setting, said in (("1", "a worker process, beside the control"),
                          ("0", f"in this process: {tensor_worker.ENV}=0")):
        monkeypatch.setenv(tensor_worker.ENV, setting)
        res = CliRunner().invoke(app, ["run", str(tmp_path / "s.toml"), "--engine", "windowed", "--out",
                                       str(tmp_path / setting)])
        assert res.exit_code == 0 and said in " ".join(res.output.split()), res.output


def test_a_worker_only_where_torch_runs_one_thread(tmp_path, monkeypatch):
    """The worker computes at one thread (OpenMP's threads do not survive a fork): at more, it would not make the
    events engine's products, so the windows keep their tensor work here; at one, a worker takes it (two cores)."""
    import os

    import torch

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: no worker either way")
    monkeypatch.setenv(tensor_worker.ENV, "auto")
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        r = netsim.run(scenario_from_dict(asynchronous()), out=tmp_path / "two", engine="windowed")
        assert r.summary["windows"]["tensor_worker"] is False
        assert r.summary["windows"]["tensor_worker_why_not"].startswith("torch runs 2 threads here and the worker one")
        torch.set_num_threads(1)
        r1 = netsim.run(scenario_from_dict(asynchronous()), out=tmp_path / "one", engine="windowed")
        assert r1.summary["windows"]["tensor_worker"] is True
    finally:
        torch.set_num_threads(old)
    assert (tmp_path / "two" / "trace.arrows").read_bytes() == (tmp_path / "one" / "trace.arrows").read_bytes()


def test_what_was_printed_before_the_worker_is_printed_once(tmp_path):
    """Output still buffered when the worker forks is not written again when the worker ends (multiprocessing
    flushes the standard streams before it forks: a bare os.fork would not)."""
    import json
    import os

    code = ("import json, sys, netsim; from netsim.scenario import scenario_from_dict; print('before the run'); "
            f"netsim.run(scenario_from_dict(json.loads(sys.argv[1])), out={str(tmp_path / 'run')!r}, "
            "engine='windowed'); print('after the run')")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(asynchronous())], capture_output=True, text=True,
                          env={**os.environ, tensor_worker.ENV: "1"}, check=True)  # stdout a pipe: block-buffered
    assert done.stdout.split("\n")[:2] == ["before the run", "after the run"], done.stdout


def test_a_release_in_the_worker_fails_the_run_instead_of_going_unaccounted(tmp_path, monkeypatch):
    from netsim.errors import RunCrashed
    from netsim.rounds import lookahead

    real = lookahead._Driver.tensor_work

    def releasing(self, first_ticket):
        real(self, first_ticket)
        self.agents[0].ledger  # a kernel's first release makes the agent's ledger  # noqa: B018

    monkeypatch.setattr(lookahead._Driver, "tensor_work", releasing)
    monkeypatch.setenv(tensor_worker.ENV, "1")
    with pytest.raises(RunCrashed, match="would not be accounted: run with NETSIM_TENSOR_WORKER=0"):
        netsim.run(scenario_from_dict(asynchronous()), out=tmp_path / "run", engine="windowed")
    monkeypatch.setenv(tensor_worker.ENV, "0")  # in one process, the release is accounted
    netsim.run(scenario_from_dict(asynchronous()), out=tmp_path / "one", engine="windowed")
