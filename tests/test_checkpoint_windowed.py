"""Checkpoints of the windowed engine: written between two rounds, restored by ``netsim resume`` without
recomputing anything (sim/restore.py). A run killed (SIGKILL) at a random point and resumed writes the
uninterrupted run's trace and metrics byte for byte and ends with the same models; the resume computes only
the rounds after the checkpoint; a restore that misses a piece of the state is refused."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tomli_w
import torch
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from netsim import api
from netsim.cli import app
from netsim.scenario import scenario_from_dict
from netsim.sim import checkpoint
from netsim.sim.kernel import Simulation
from netsim.trace.io import TRACE_FILE, read_trace
from tests.search import search

ALGORITHMS = {
    "dpsgd": {"name": "dpsgd", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "lr_decay": 0.1},
    # a ledger per agent (releases, a noise generator) and the kernel's own state
    "dp_dpsgd": {"name": "dp_dpsgd", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "clip": 1.0,
                 "noise_multiplier": 1.0},
    # public copies in the bank, rand-k drawn from each agent's compression stream
    "choco": {"name": "choco", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "gamma": 0.4, "compressor": "randk",
              "ratio": 0.3},
}


def scenario(alg: str = "dpsgd", n: int = 400, rounds: int = 60, every: int = 10, **changes) -> dict:
    sc = {"name": f"windowed_{alg}", "run": {"seed": 5, "rounds": rounds, "until": 1.0e6, "trace_flush_every": 1000,
                                             "checkpoint_every_rounds": every},
          "agents": {"count": n, "compute_time": {"kind": "constant", "value": 0.01},
                     "activation": {"kind": "periodic", "period": 0.1}},
          "topology": {"kind": "random_regular", "degree": 4},
          "network": {"latency": {"kind": "constant", "value": 0.005}, "loss": 0.05},
          "data": {"kind": "synthetic", "samples": 40 * n, "features": 6, "partition": "iid"},
          "model": {"kind": "logistic"},
          "algorithm": dict(ALGORITHMS.get(alg, {})),
          "evaluation": {"every": 1.0e6, "metrics": ["loss", "accuracy", "agent_accuracy"]}}
    if alg == "dp_dpsgd":
        sc["privacy"] = {"delta": 1e-5}
    if alg == "push_gossip":  # the push driver: peers drawn ahead and models in inboxes between rounds
        sc["agents"]["activation"]["period"] = 1.0
        sc["agents"]["compute_time"]["value"] = 0.001
        sc["network"]["latency"] = {"kind": "uniform", "low": 0.01, "high": 0.5}
        sc["algorithm"] = {"name": "push_gossip", "lr": 0.5, "batch": 4}
    if alg == "barrier":  # barrier rounds on their own clocks (the lookahead windows): jittery Bernoulli activation,
        # per-agent compute times, latencies past the barrier's timeout (timeouts, stale rounds)
        sc["agents"] |= {"activation": {"kind": "bernoulli", "period": 0.1, "p": 0.8},
                         "clock_jitter": {"kind": "uniform", "low": 0.0, "high": 0.01},
                         "compute_time": {"kind": "uniform", "low": 0.002, "high": 0.03}}
        sc["network"]["latency"] = {"kind": "uniform", "low": 0.002, "high": 0.06}
        sc["algorithm"] = {**ALGORITHMS["dpsgd"], "round_timeout": 0.04}
    for key, value in changes.items():
        sc[key] = {**sc[key], **value}
    return sc


@pytest.fixture
def finals(monkeypatch) -> list[torch.Tensor]:
    """The final models of every run that ends in this process (``Simulation.finish``)."""
    got: list[torch.Tensor] = []
    real = Simulation.finish

    def finish(self, interrupted: bool = False) -> None:
        if not interrupted:
            got.append(self.world.bank.W.clone())
        real(self, interrupted)

    monkeypatch.setattr(Simulation, "finish", finish)
    return got


def write(tmp: Path, sc: dict) -> Path:
    path = tmp / f"{sc['name']}.toml"
    path.write_text(tomli_w.dumps(sc))
    return path


def same_outputs(a: Path, b: Path, skip: set[str] = frozenset()) -> None:
    """The files of two runs are the same bytes, and their summaries but for times and ``skip``."""
    for name in (TRACE_FILE, "metrics.csv", "agent_metrics.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    sa, sb = (json.loads((f / "summary.json").read_text()) for f in (a, b))
    skip = {"wall_time", "events_per_s", "resumed_by", "resume_wall_time", *skip}
    assert {k: v for k, v in sa.items() if k not in skip} == {k: v for k, v in sb.items() if k not in skip}


@pytest.mark.parametrize(("alg", "seed"), [("dpsgd", 0), ("dp_dpsgd", 1), ("barrier", 4),
                                           pytest.param("choco", 2, marks=pytest.mark.slow),
                                           pytest.param("push_gossip", 3, marks=pytest.mark.slow)])
def test_sigkill_at_random_point_then_restore_is_identical(tmp_path, finals, alg, seed):
    """... for synchronous rounds (a checkpoint every 10 rounds) and barrier rounds on their own clocks (lookahead
    windows: a checkpoint at the first window boundary past every 10 rounds' activations), both then the events
    engine's rows and models."""
    windows = alg == "barrier"
    sc = write(tmp_path, scenario(alg, n=100) if windows else scenario(alg))
    ref = api.run(sc, out=tmp_path / "ref", engine="windowed", interruptible=False)
    assert ("windows" in ref.summary) == windows
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "netsim", "run", str(sc), "--engine", "windowed", "--out", str(out),
                             "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 300
    while not checkpoint.checkpoints(out):
        assert proc.poll() is None, f"run ended before a checkpoint: {proc.stderr.read()}"
        assert time.monotonic() < end
        time.sleep(0.01)
    time.sleep(np.random.default_rng(seed).uniform(0.0, 0.4))  # a random moment after the first checkpoint
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not api.is_complete(out), "the run ended before it was killed: make it longer"
    ck = checkpoint.load(checkpoint.checkpoints(out)[-1])
    assert ck.meta["engine"] == "windowed" and ck.meta["state"]["windowed"]["round"] == ck.step
    assert ck.step % 10 == 0 if not windows else ck.meta["state"]["windowed"]["windows"] is not None
    killed = read_trace(out).table  # the killed run's trace reads up to its last flush: a prefix
    whole = read_trace(ref.out).table
    assert ck.meta["trace"]["events"] <= killed.num_rows and killed.equals(whole.slice(0, killed.num_rows))
    r = CliRunner().invoke(app, ["resume", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert f"resumed from {'window' if windows else 'round'} {ck.step} (restored, no recompute" in r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_by"] == "restore" and summary["engine"] == "windowed"
    same_outputs(out, ref.out, skip={"windows", "resumed_at_step"})
    assert torch.equal(finals[1], finals[0])  # the resumed run's final models are the uninterrupted run's
    assert checkpoint.checkpoints(out) == []
    if windows:  # the events engine's rows, metrics and models
        events = api.run(sc, out=tmp_path / "events", engine="events", interruptible=False)
        assert read_trace(events.out).table.equals(whole) and torch.equal(finals[2], finals[0])
        assert (events.out / "metrics.csv").read_bytes() == (ref.out / "metrics.csv").read_bytes()


def watched(m: pytest.MonkeyPatch) -> tuple[list[torch.Tensor], list[int]]:
    """Patched through ``m`` (a drawn test's context: no fixture): the final models of every run that ends, and a mark
    for every checkpoint written, until ``m`` undoes it."""
    models: list[torch.Tensor] = []
    written: list[int] = []
    finish, write = Simulation.finish, checkpoint.write

    def keep(self, interrupted: bool = False) -> None:
        if not interrupted:
            models.append(self.world.bank.W.clone())
        finish(self, interrupted)

    m.setattr(Simulation, "finish", keep)
    m.setattr(checkpoint, "write", lambda *a, **k: written.append(1) or write(*a, **k))
    return models, written


def killed_at(tmp_path: Path, sc: dict, nth: int, engine: str = "windowed") -> Path:
    """``sc`` run here and stopped dead (no outputs, no flush) right after its nth checkpoint."""
    real = checkpoint.write
    seen = []

    def write_then_die(*args, **kwargs):
        path = real(*args, **kwargs)
        seen.append(path)
        if len(seen) == nth:
            raise KeyboardInterrupt  # as a kill: nothing after the checkpoint is written
        return path

    out = tmp_path / f"killed_{engine}"
    checkpoint.write = write_then_die
    try:
        with pytest.raises(KeyboardInterrupt):
            api.run(scenario_from_dict(sc), out=out, engine=engine, interruptible=False)
    finally:
        checkpoint.write = real
    return out


@pytest.mark.parametrize("alg", ["dpsgd", "barrier"])
def test_a_restore_computes_only_the_rounds_after_the_checkpoint(tmp_path, monkeypatch, alg):
    """Resuming after round 40 of 60 evaluates 20 rounds of gradients, not 60 (an events engine's resume
    re-executes the 40 first: it evaluates all 60). Barrier rounds on their own clocks (lookahead windows,
    Bernoulli activation): the resume evaluates the gradients the checkpoint had not, those asked for before it and
    not yet in a batch among them."""
    from netsim.compute.gradients import GradientService

    n, rounds = 50, 60
    sc = scenario(alg, n=n, rounds=rounds, every=20)
    out = killed_at(tmp_path, sc, 2)
    evaluated = []
    real = GradientService.flush

    def counting(self):
        before = self.evaluated
        real(self)
        evaluated.append(self.evaluated - before)

    before = checkpoint.load(checkpoint.checkpoints(out)[-1]).meta["state"]["gradients"]["evaluated"]
    monkeypatch.setattr(GradientService, "flush", counting)
    res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore"
    total = res.summary["gradients"]  # the run's counts are the whole run's
    if alg == "dpsgd":
        assert res.summary["resumed_at_step"] == 40
        assert sum(evaluated) == (rounds - 40) * n and total == rounds * n
    else:
        assert 0.4 * total < before < 0.9 * total and sum(evaluated) == total - before
    events = killed_at(tmp_path, sc, 2, engine="events")
    evaluated.clear()
    again = api.resume(events, interruptible=False)
    assert again.summary["resumed_by"] == "re-execution" and sum(evaluated) == total


def test_windowed_checkpoints_change_neither_rows_nor_batches(tmp_path):
    """A windowed checkpoint keeps the rows not yet in a batch and flushes nothing: the trace has the same rows in
    the same batches with checkpoints as without (only its header, the scenario text, differs)."""
    import pyarrow as pa

    with_ck = scenario(n=40, rounds=30, every=3)
    without = {**with_ck, "run": {k: v for k, v in with_ck["run"].items() if k != "checkpoint_every_rounds"}}
    a = api.run(scenario_from_dict(with_ck), out=tmp_path / "a", engine="windowed", interruptible=False)
    b = api.run(scenario_from_dict(without), out=tmp_path / "b", engine="windowed", interruptible=False)
    batches = []
    for r in (a, b):
        with pa.ipc.open_stream(r.out / TRACE_FILE) as reader:
            batches.append([x.num_rows for x in reader])
    assert batches[0] == batches[1] and len(batches[0]) > 10 and len(set(batches[0])) > 1  # cut inside rounds
    assert read_trace(a.out).table.equals(read_trace(b.out).table)
    assert (a.out / "metrics.csv").read_bytes() == (b.out / "metrics.csv").read_bytes()


def test_an_interrupted_windowed_run_stops_between_rounds_and_resumes(tmp_path, finals):
    """SIGINT stops a windowed run after the round it is in, with a checkpoint there; the resume restores it."""
    sc = scenario(n=40, rounds=30, every=1000)
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)

    def progress(t: float) -> None:
        if t > 1.0:
            os.kill(os.getpid(), signal.SIGINT)

    stopped = api.run(scenario_from_dict(sc), out=tmp_path / "run", engine="windowed", progress=progress)
    assert stopped.summary["stop_reason"] == "interrupted"
    ck = checkpoint.load(checkpoint.checkpoints(stopped.out)[-1])
    assert ck.meta["kind"] == "interrupt" and 0 < ck.step < 30
    res = api.resume(stopped.out, interruptible=False)
    assert res.summary["resumed_by"] == "restore"
    same_outputs(res.out, ref.out)
    assert torch.equal(finals[-1], finals[0])


@pytest.mark.parametrize(("missed", "at"), [("streams", "state.rng"), ("batches", "state.windowed.agents[0][0]"),
                                           ("links", "state.network.links"), ("agents", "state.agents[0].round"),
                                           ("schedules", "state.agents[0].schedule.tick"),
                                           ("one agent", "state.agents[7].round")])
def test_a_restore_that_misses_state_is_refused_and_writes_nothing(tmp_path, monkeypatch, missed, at):
    """The restored run is captured again and compared with the checkpoint: a piece left out (the streams' states,
    the links' among them; where each agent's mini-batches drawn ahead stand; the links not made yet; the agents'
    plain values or their schedules', all or one agent's, compared column by column) is refused in one line naming
    it, exit 2, with the killed run's files untouched."""
    from netsim.sim import restore
    from netsim.sim.agent import Agent
    from netsim.sim.network import Network
    from netsim.sim.streams import Streams

    out = killed_at(tmp_path, scenario(n=30, rounds=20, every=5), 2)
    before = hashlib.sha256((out / TRACE_FILE).read_bytes()).hexdigest()
    if missed == "streams":
        monkeypatch.setattr(Streams, "restore", lambda self, names, rows: None)
    elif missed == "batches":
        monkeypatch.setattr(Agent, "resume_draws", lambda self, ahead, compute: None)
    elif missed == "links":  # (the restore's assignment of the links it makes when next used, dropped)
        monkeypatch.setattr(Network, "restored", property(lambda self: {}, lambda self, value: None), raising=False)
    else:  # the agents' plain values (or their schedules') not put back, or one agent's round put back wrong
        real = restore._assign_all

        def assign_all(objs, values, where, skip=""):
            if missed == ("schedules" if "schedule" in where else "agents"):
                return None
            read = real(objs, values, where, skip)  # (the checkpoint's columns: the capture compared with them)
            if missed == "one agent" and skip:
                objs[7].round -= 1
            return read

        monkeypatch.setattr(restore, "_assign_all", assign_all)
    r = CliRunner().invoke(app, ["resume", str(out)])
    assert r.exit_code == 2 and f"restored run differs from this checkpoint at {at}" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert hashlib.sha256((out / TRACE_FILE).read_bytes()).hexdigest() == before
    assert not api.is_complete(out)


def test_time_marks_checkpoint_after_the_round_that_reaches_them(tmp_path, monkeypatch):
    """checkpoint_every = 0.5 s with a round every 0.1 s: a checkpoint after the round whose last event reaches
    each mark (rounds 5, 10, ...: the k-th round's events end at k * 0.1 + 0.015 s)."""
    seen = []
    real = checkpoint.write

    def spy(sim, folder, keep, kind, header):
        seen.append((sim.steps, sim.env.now, kind))
        return real(sim, folder, keep, kind, header)

    monkeypatch.setattr(checkpoint, "write", spy)
    sc = scenario(n=20, rounds=23)
    del sc["run"]["checkpoint_every_rounds"]
    sc["run"]["checkpoint_every"] = 0.5
    api.run(scenario_from_dict(sc), out=tmp_path / "r", engine="windowed", interruptible=False)
    assert [k for k, _, _ in seen] == [5, 10, 15, 20]
    assert all(kind == "periodic" and 0.5 * k / 5 <= t < 0.5 * k / 5 + 0.1 for k, t, kind in seen)


def test_a_capped_ledger_is_restored_and_runs_out_where_it_would_have(tmp_path):
    """Muffliato with privacy.epsilon_cap: each ledger's running RDP curve is in the checkpoint (round 4), and the
    restored run's agents run out of budget in round 5 as the uninterrupted run's do."""
    import pyarrow.compute as pc

    sc = scenario(n=20, rounds=12, every=2, network={"loss": 0.0})
    sc["algorithm"] = {"name": "muffliato", "lr": 0.5, "batch": 8, "round_timeout": 0.02, "sigma": 2.0,
                       "gossip_steps": 2}
    sc["privacy"] = {"delta": 1e-5, "epsilon_cap": 5.0}
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)
    out = killed_at(tmp_path, sc, 2)
    ck = checkpoint.load(checkpoint.checkpoints(out)[-1])
    assert ck.step == 4 and all(f"ledger.{i}.rdp" in ck.arrays for i in range(20))
    res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore"
    same_outputs(out, ref.out)
    t = read_trace(out).table
    spent = t.filter(pc.equal(t["kind"], "budget_exhausted"))
    assert spent.num_rows == 20 and set(spent["round"].to_pylist()) == {5}


@pytest.fixture(scope="module", params=["dp_dpsgd", "barrier"])
def killed_windowed(tmp_path_factory, request) -> Path:
    """A small lossy windowed DP-D-PSGD run (or barrier rounds on their own clocks, lookahead windows: the driver's
    state between two windows) stopped dead after its second checkpoint; tests work on copies."""
    return killed_at(tmp_path_factory.mktemp("killed"), scenario(request.param, n=16, rounds=12, every=3), 2)


@search(20, suppress_health_check=list(HealthCheck))
@given(path=st.lists(st.integers(0, 1000), min_size=1, max_size=6), anywhere=st.booleans(),
       value=st.one_of(st.none(), st.booleans(), st.integers(-5, 1 << 70), st.floats(allow_nan=True),
                       st.text(max_size=8), st.lists(st.integers(-3, 3), max_size=6),
                       st.dictionaries(st.sampled_from(["@", "list", "dict", "set", "x"]), st.integers(), max_size=2)))
def test_fuzz_tampered_windowed_state(killed_windowed, path, anywhere, value):
    """A windowed checkpoint's state.json changed (its windowed part, or anywhere) with its checksums fixed up:
    resume refuses in one line (exit 2) and writes nothing, or goes on (a restore trusts a checkpoint whose
    checksums verify: docs/checkpoints.md) and completes; never a traceback."""
    from tests.test_checkpoint import _mutate

    _tampered_resume(killed_windowed, lambda meta: _mutate(meta if anywhere else meta["state"]["windowed"], path,
                                                           value))


def _tampered_resume(killed: Path, edit, names: str | None = None) -> None:
    """A copy of the killed run with each checkpoint's state.json changed by ``edit`` (its checksums fixed up):
    resume refuses in one line (exit 2; naming ``names`` where given) and writes nothing, or goes on and completes;
    never a traceback."""
    import shutil
    import tempfile

    from tests.test_checkpoint import _one_line_exit_2, _snapshot

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        shutil.copytree(killed, out)
        for ck in checkpoint.checkpoints(out):
            meta = json.loads((ck / "state.json").read_text())
            edit(meta)
            (ck / "state.json").write_text(json.dumps(meta))
            sums = {n: checkpoint._sha(ck / n) for n in ("arrays.npz", "state.json")}
            (ck / "SHA256SUMS").write_text(json.dumps(sums))
        before = _snapshot(out)
        r = CliRunner().invoke(app, ["resume", str(out), "-q"])
        assert "Traceback" not in r.output
        if r.exit_code == 0:
            assert api.is_complete(out)
            return
        _one_line_exit_2(r, out)
        assert names is None or names in r.output
        assert _snapshot(out) == before


@pytest.fixture(scope="module", params=["barrier", "push_gossip", "pushsum", "adpsgd", "do_adp", "event_triggered"])
def killed_lookahead(tmp_path_factory, request) -> Path:
    """Each pattern whose lookahead windows restore (barrier rounds on their own clocks, push gossip, the broadcast,
    pairwise, ticks and event-triggered drivers) stopped dead after its second checkpoint (the driver's whole state
    between two windows); tests work on copies."""
    from tests.test_lookahead_windows import checkpointed

    sc = scenario("barrier", n=16, rounds=12, every=3) if request.param == "barrier" else checkpointed(request.param)
    return killed_at(tmp_path_factory.mktemp("killed"), sc, 2)


@search(40, suppress_health_check=list(HealthCheck))
@given(path=st.lists(st.integers(0, 1000), min_size=1, max_size=7), own=st.booleans(),
       value=st.one_of(st.none(), st.booleans(), st.integers(-5, 1 << 70), st.floats(allow_nan=True),
                       st.text(max_size=8), st.lists(st.integers(-3, 3), max_size=6),
                       st.dictionaries(st.sampled_from(["t", "list", "tuple", "values", "3"]), st.integers(),
                                       max_size=2)))
def test_fuzz_tampered_lookahead_driver_state(killed_lookahead, path, own, value):
    """A value inside a lookahead driver's state (its JSON text in the checkpoint: the event queue, the tickets, its
    own part: each program's rounds, inboxes, locks, copies, the payloads' references) changed, the checksums fixed
    up: resume refuses in one line naming the key (exit 2) and writes nothing, or goes on and completes (a value no
    check can pin, such as a message's scalar, may make another run); never a crash."""
    from tests.test_checkpoint import _mutate

    def edit(meta: dict) -> None:
        held = meta["state"]["windowed"]["held"]["dict"]
        at = next(n for n, (k, _) in enumerate(held) if k == "json")
        plain = json.loads(held[at][1])
        _mutate(plain["own"] if own else plain, path, value)
        held[at][1] = json.dumps(plain)

    _tampered_resume(killed_lookahead, edit, "state.windowed.held")


def test_a_restored_run_makes_the_evaluations_after_its_checkpoint(tmp_path):
    """Evaluations inside the run (learning curves): those made before the checkpoint are in it (its metrics rows),
    the restored run makes the others where the uninterrupted run and the events engine make them (every 0.05 s
    with a round every 0.1 s: at the rounds' ticks, just after a checkpoint, and inside rounds, between the barriers
    completed by their last message and those timing out)."""
    sc = scenario(n=20, rounds=12, every=3)
    sc["evaluation"]["every"] = 0.05
    plain = {**sc, "run": {k: v for k, v in sc["run"].items() if k != "checkpoint_every_rounds"}}
    events = api.run(scenario_from_dict(plain), out=tmp_path / "events", engine="events", interruptible=False)
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)
    assert read_trace(ref.out).table.equals(read_trace(events.out).table)  # (the headers: each its scenario's)
    for name in ("metrics.csv", "agent_metrics.csv"):
        assert (ref.out / name).read_bytes() == (events.out / name).read_bytes(), name
    out = killed_at(tmp_path, sc, 2)
    ck = checkpoint.load(checkpoint.checkpoints(out)[-1])
    assert ck.step == 6 and 1 < len(ck.meta["metrics"]) < len(ref.metrics)
    res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore"
    same_outputs(out, ref.out)


@pytest.mark.parametrize(("nth", "engine_blocks"), [(1, False), (2, False), (1, True)])
def test_mini_batch_blocks_are_restored_partly_or_wholly_handed_out(tmp_path, finals, nth, engine_blocks):
    """The windows draw batches of 8 128 at a time (``RowsAhead.ahead_rows``: four of ``sample_rows``' blocks of 32):
    at round 64 each agent's block is half handed out and is drawn again from where it started when first read (the
    restore itself draws no block); at round 128 it is handed out in full and is not drawn again (the next batch
    comes from a new block, drawn where the stream stands). A checkpoint of blocks of 32 (saved with five values, as
    before the windows drew larger blocks), half handed out at round 16, resumes too: its block drawn again, then
    blocks of 128 from where its rows end. Either way the resumed run is the uninterrupted run, byte for byte."""
    from netsim.sim.agent import RowsAhead
    from netsim.sim.streams import DrawsAhead, RedrawnAhead, block_rows

    sc = scenario(n=30, rounds=140, every=16 if engine_blocks else 64)
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)
    rows = 32 if engine_blocks else 128
    with pytest.MonkeyPatch.context() as m:
        if engine_blocks:
            m.setattr(RowsAhead, "ahead_rows", lambda self, batch: block_rows(batch))
        out = killed_at(tmp_path, sc, nth)
    ck = checkpoint.load(checkpoint.checkpoints(out)[-1])
    saved = {tuple(a[0][3:]) for a in ck.meta["state"]["windowed"]["agents"]}
    assert saved == ({(16, 8)} if engine_blocks else {(64 * nth, 8, 128)})
    drawn, restored = [], []
    real = DrawsAhead.__init__

    def counting(self, *args):
        drawn.append(self)
        real(self, *args)

    def stop(self, sim, interruptible):
        restored.extend(a.batches_ahead for a in sim.agents)
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as m:
        m.setattr(DrawsAhead, "__init__", counting)
        m.setattr(api.RunFolder, "run", stop)
        with pytest.raises(KeyboardInterrupt):
            api.resume(out, interruptible=False)
    assert drawn == []  # (the run stopped before its first round)
    assert [type(h) for h in restored] == [RedrawnAhead if nth == 1 else DrawsAhead] * 30
    if nth == 1:  # the block drawn again when first read: the one the checkpoint's state started
        h = restored[0]
        first = h.block
        assert type(h) is DrawsAhead and first.shape == (rows, 8) and h.pos == rows // 2 and h.block is first
    res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore"
    same_outputs(out, ref.out)
    assert torch.equal(finals[-1], finals[0])


@pytest.mark.parametrize("alg", ["dpsgd", "barrier"])
def test_a_checkpoint_inside_the_first_block_of_draws_resumes_past_a_full_block(tmp_path, alg):
    """A checkpoint at round 5: each link's loss draws (and on the agents' own clocks their compute times) stand
    inside their first block of 32 values; the resumed run draws over 256 more, a full block's length: byte for byte
    the uninterrupted run (a first block drawn again 256 long once handed out the values after it twice)."""
    sc = scenario(alg, n=20, rounds=300, every=5)
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)
    out = killed_at(tmp_path, sc, 1)
    assert api.resume(out, interruptible=False).summary["resumed_by"] == "restore"
    same_outputs(out, ref.out, skip={"windows"})  # (the barrier windows' own counts of the play they timed)


class _Plain:
    def __init__(self, **values):
        self.__dict__.update(values)


def _objects(n: int = 12) -> list[_Plain]:
    """Objects like a run's agents: plain values of each kind, values of no plain type, and a schedule each."""
    return [_Plain(id=i, round=3 + i % 2, w=0.5 * i, on=i % 3 == 0, name=f"a{i}", rows=[i], seen=None,
                   schedule=_Plain(tick=i, period=0.1)) for i in range(n)]


@pytest.mark.parametrize("change", ["value", "int for float", "bool for int", "float for int", "nested", "name more",
                                    "name less", "entry less", "entry more"])
def test_columns_make_the_plain_dicts_and_tell_every_difference(change):
    """A restored run's capture holds the agents' plain values as columns (checkpoint.Columns): they make the very
    dicts the checkpoint holds (values, key order), ``equals`` those, and not a list that differs in one value, in
    one value's type only (== would take 1 for 1.0 or True), in a name, or in its length."""
    import copy

    from netsim.sim.checkpoint import Columns, _agents, _plain_vars

    objs = _objects()
    want = [{**_plain_vars(a), "schedule": _plain_vars(a.schedule)} for a in objs]
    ours = _agents(objs, columns=True)
    assert type(ours) is Columns and ours.dicts() == want and _agents(objs, columns=False) == want
    assert [list(d) for d in ours.dicts()] == [list(d) for d in want] and list(want[0]) == [
        "id", "name", "on", "round", "w", "schedule"]
    assert ours.equals(copy.deepcopy(want))
    ref = copy.deepcopy(want)
    if change == "value":
        ref[5]["round"] += 1
    elif change == "int for float":
        ref[4]["w"] = 2
    elif change == "bool for int":
        ref[1]["round"] = True  # == 1: a round of 1 would pass ==
        objs[1].round = 1
        ours = _agents(objs, columns=True)
    elif change == "float for int":
        ref[0]["id"] = 0.0
    elif change == "nested":
        ref[11]["schedule"]["tick"] = -1
    elif change == "name more":
        ref[2]["extra"] = 1
    elif change == "name less":
        del ref[9]["on"]
    elif change == "entry less":
        ref.pop()
    else:
        ref.append(copy.deepcopy(ref[0]))
    assert not ours.equals(ref)


def test_columns_where_a_name_is_plain_in_some_objects_only_fall_back_to_dicts():
    """A value of no plain type in one object where the others hold numbers (None for an int): each object's dict,
    as ``_plain_vars`` makes it."""
    from netsim.sim.checkpoint import _agents, _plain_vars

    objs = _objects()
    objs[3].round = None
    assert _agents(objs, columns=True) == [{**_plain_vars(a), "schedule": _plain_vars(a.schedule)} for a in objs]


def test_plain_values_put_back_column_by_column_or_refused_naming_the_object():
    """``_assign_all`` puts a checkpoint's plain values into many objects at once, and refuses a value of another
    type than the object's, or a name the object has not, naming that object's entry (as one by one)."""
    from netsim.sim.checkpoint import _plain_vars
    from netsim.sim.restore import _assign_all

    objs, saved = _objects(), _objects()
    for s in saved:
        s.round += 10
    values = [_plain_vars(s) for s in saved]
    _assign_all(objs, values, "state.agents[{}]")
    assert [_plain_vars(a) for a in objs] == values
    for bad, message in ((2.5, "state.agents[6].round is not a int"), (None, "state.agents[6].round is not a int")):
        values[6]["round"] = bad
        with pytest.raises(ValueError, match=re.escape(message)):
            _assign_all(_objects(), values, "state.agents[{}]")
    values[6]["round"] = 1
    values[6]["nope"] = 1
    with pytest.raises(ValueError, match=re.escape("state.agents[6].nope is not a NoneType")):
        _assign_all(_objects(), values, "state.agents[{}]")


def test_the_barrier_windows_keep_their_values_as_a_few_stacks_and_give_them_back_bit_for_bit():
    """A barrier-window checkpoint's values (payloads, the kernel's values kept on a part): tensors of the bank's dtype
    in one stack a shape (not one array a payload), other tensors as exact values (float64 in a float32 run, ints,
    bools), lists, tuples and plain values as they are; each given back bit for bit, of its type; a value of another
    kind is refused when restored, in one line naming it."""
    from netsim.rounds.barrier_windows import _Pool

    g = torch.Generator().manual_seed(3)
    rows = torch.randn(5, 7, generator=g)
    values = [rows[0], rows[3], torch.randn(1, 7, generator=g), torch.randn(7, generator=g, dtype=torch.float64) / 3,
              torch.tensor([1, 5, 9]), torch.tensor([True, False]), [rows[1], None, (2, 0.1)], 1.5, "x", None]
    pool = _Pool(torch.float32)
    saved = json.loads(json.dumps([pool.add(v) for v in values]))
    stacks = pool.tensors()
    assert pool.shapes() == [[7], [1, 7]] and {k: tuple(t.shape) for k, t in stacks.items()} == {
        "pool.0": (3, 7), "pool.1": (1, 1, 7)}
    back = _Pool.of(pool.shapes(), stacks, torch.device("cpu"))
    got = [back.get(v) for v in saved]

    def same(a, b) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        if isinstance(a, (list, tuple)):
            return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
        return type(a) is type(b) and a == b

    assert all(map(same, values, got)), got
    with pytest.raises(ValueError, match="a 'Generator' kept by the driver cannot be restored"):
        back.get(json.loads(json.dumps(_Pool(torch.float32).add(g))))
    with pytest.raises(ValueError, match=r"held.own.pool.0: not rows of shape \[6\]"):
        _Pool.of([[6]], stacks, torch.device("cpu"))
