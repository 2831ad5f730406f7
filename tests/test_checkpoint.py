"""Checkpoint and resume on the events engine (the windows': tests/test_checkpoint_windowed.py): a run killed
(SIGKILL) or interrupted (SIGINT) at random points and resumed gives the same final metrics and the same trace as the
uninterrupted run; corrupted checkpoints
are rejected and the previous one is used; a killed run's trace loads up to its last flush."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from netsim import api
from netsim.errors import InputError
from netsim.sim import checkpoint
from netsim.trace.io import TRACE_FILE, read_trace
from tests.search import search

ROOT = Path(__file__).resolve().parents[1]

BASE = """
[run]
seed = 3
until = {until}
checkpoint_every = {every}
trace_flush_every = 512

[agents]
count = 8
compute_time = {{ kind = "lognormal", mean = 0.05, sigma = 0.3 }}
activation = {activation}

[topology]
kind = "ring"

[network]
latency = {{ kind = "lognormal", mean = 0.02, sigma = 0.5 }}
loss = 0.05

[data]
kind = "synthetic"
samples = 2000
features = 10

[model]
kind = "logistic"

[evaluation]
every = 2.0

[algorithm]
{algorithm}
"""

CASES = {  # sync, async (pairwise, poisson wakes), async push-sum (mass in flight), DP with a ledger
    "dpsgd": dict(activation='{ kind = "periodic", period = 0.25 }',
                  algorithm='name = "dpsgd"\nlr = 0.5\nround_timeout = 0.15'),
    "adpsgd": dict(activation='{ kind = "poisson", rate = 4.0 }',
                   algorithm='name = "adpsgd"\nlr = 0.3\nreply_timeout = 0.2'),
    "pushsum": dict(activation='{ kind = "poisson", rate = 4.0 }', algorithm='name = "pushsum"\nlr = 0.3'),
    "dp_dpsgd": dict(activation='{ kind = "bernoulli", period = 0.25, p = 0.6 }',
                     algorithm='name = "dp_dpsgd"\nlr = 0.5\nbatch = 16\nround_timeout = 0.1\nclip = 1.0\n'
                               'noise_multiplier = 4.0\n\n[privacy]\ndelta = 1.0e-5'),
}


def scenario(tmp: Path, case: str, until: float = 24.0, every: float = 2.0) -> Path:
    p = tmp / f"{case}.toml"
    p.write_text(BASE.format(until=until, every=every, **CASES[case]))
    return p


def same_run(a: Path, b: Path) -> None:
    """Final metrics, trace rows and trace bytes equal; the summary's deterministic fields equal."""
    assert (a / "metrics.csv").read_bytes() == (b / "metrics.csv").read_bytes()
    assert read_trace(a).table.equals(read_trace(b).table)
    assert (a / TRACE_FILE).read_bytes() == (b / TRACE_FILE).read_bytes()
    sa, sb = (json.loads((f / "summary.json").read_text()) for f in (a, b))
    skip = {"wall_time", "events_per_s", "resumed_at_step", "resumed_by", "resume_wall_time"}
    assert {k: v for k, v in sa.items() if k not in skip} == {k: v for k, v in sb.items() if k not in skip}


def start(sc: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "netsim", "run", str(sc), "--engine", "events", "--out", str(out),
                             "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_checkpoints(out: Path, proc: subprocess.Popen, k: int, limit: float = 300.0) -> None:
    end = time.monotonic() + limit
    while len(checkpoint.checkpoints(out)) < k:
        assert proc.poll() is None, f"run ended before {k} checkpoints: {proc.stderr.read()}"
        assert time.monotonic() < end
        time.sleep(0.02)


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """Uninterrupted runs (with the same checkpoint settings) of every case."""
    tmp = tmp_path_factory.mktemp("ref")
    return {c: api.run(scenario(tmp, c), out=tmp / c, interruptible=False, engine="events").out for c in CASES}


@pytest.mark.parametrize("case,seed", [("dpsgd", 0), ("dpsgd", 1), ("adpsgd", 2), ("pushsum", 3),
                                       ("dp_dpsgd", 4)])
def test_sigkill_at_random_point_then_resume_is_identical(tmp_path, refs, case, seed):
    out = tmp_path / "run"
    proc = start(scenario(tmp_path, case), out)
    wait_for_checkpoints(out, proc, 1)
    time.sleep(np.random.default_rng(seed).uniform(0.0, 0.6))  # a random moment after the first checkpoint
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not api.is_complete(out)
    # the killed run's trace reads up to its last flush: a prefix of the uninterrupted trace
    killed = read_trace(out).table
    ref = read_trace(refs[case]).table
    ck = checkpoint.load(checkpoint.checkpoints(out)[-1])
    assert ck.meta["trace"]["events"] <= killed.num_rows <= ref.num_rows
    assert killed.equals(ref.slice(0, killed.num_rows))
    r = cli("resume", str(out), "-q")  # the command a user types, in-process
    assert r.exit_code == 0, r.output
    assert f"resumed from event {ck.step} (re-executed up to it" in r.stderr
    assert json.loads((out / "summary.json").read_text())["resumed_by"] == "re-execution"
    same_run(out, refs[case])
    assert checkpoint.checkpoints(out) == []  # a complete run keeps none


def test_checkpoints_do_not_change_the_run(tmp_path, refs):
    """Flushing the trace at checkpoint marks changes neither events nor metrics."""
    sc = scenario(tmp_path, "adpsgd", every=1000.0)
    plain = api.run(sc, out=tmp_path / "plain", interruptible=False, engine="events").out
    assert read_trace(plain).table.equals(read_trace(refs["adpsgd"]).table)
    assert (plain / "metrics.csv").read_bytes() == (refs["adpsgd"] / "metrics.csv").read_bytes()


def test_sigint_stops_cleanly_with_a_resume_hint(tmp_path):
    sc = scenario(tmp_path, "dp_dpsgd", until=80.0)  # long enough that the Ctrl-C falls inside the simulation
    ref = api.run(sc, out=tmp_path / "ref", interruptible=False, engine="events").out
    out = tmp_path / "run"
    proc = start(sc, out)
    wait_for_checkpoints(out, proc, 1)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert f"continue with: netsim resume {out}" in err and "Traceback" not in err
    partial = json.loads((out / api.PARTIAL_SUMMARY).read_text())
    assert partial["stop_reason"] == "interrupted" and Path(partial["checkpoint"]).is_dir()
    pos = checkpoint.load(Path(partial["checkpoint"])).meta["trace"]
    assert read_trace(out).table.num_rows == pos["events"] + pos["pending"]  # everything up to the stop
    r = cli("resume", str(out), "-q")
    assert r.exit_code == 0, r.output
    assert "resumed from event" in r.stderr
    same_run(out, ref)
    assert not (out / api.PARTIAL_SUMMARY).exists()


@pytest.fixture(scope="module")
def killed_template(tmp_path_factory):
    """A D-PSGD run killed (SIGKILL) after its second checkpoint; tests work on copies."""
    tmp = tmp_path_factory.mktemp("killed")
    out = tmp / "run"
    proc = start(scenario(tmp, "dpsgd"), out)
    wait_for_checkpoints(out, proc, 2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # a slow machine may kill it between writing a third checkpoint and pruning the oldest: keep the newest two
    for old in checkpoint.checkpoints(out)[:-2]:
        shutil.rmtree(old)
    assert len(checkpoint.checkpoints(out)) == 2
    return out


@pytest.fixture
def killed(tmp_path, killed_template) -> Path:
    out = tmp_path / "run"
    shutil.copytree(killed_template, out)
    return out


def cli(*args: str):
    from typer.testing import CliRunner

    from netsim.cli import app

    return CliRunner().invoke(app, list(args))


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupted_newest_checkpoint_is_rejected_and_previous_used(killed, refs):
    out = killed
    older, newest = checkpoint.checkpoints(out)[-2:]
    _flip(newest / "arrays.npz", 100)
    warnings: list[str] = []
    result = api.resume(out, warn=warnings.append, interruptible=False)
    assert len(warnings) == 1 and str(newest) in warnings[0] and "arrays.npz does not match its sha256" in warnings[0]
    assert result.summary["resumed_at_step"] == int(older.name.split("-")[1])
    same_run(out, refs["dpsgd"])


@pytest.mark.parametrize("damage", ["truncate_state", "drop_sums", "garbage_npz", "empty_folder"])
def test_every_checkpoint_corrupted_gives_one_line_exit_2(killed, damage):
    out = killed
    for ck in checkpoint.checkpoints(out):
        if damage == "truncate_state":
            (ck / "state.json").write_bytes((ck / "state.json").read_bytes()[:50])
        elif damage == "drop_sums":
            (ck / "SHA256SUMS").unlink()
        elif damage == "garbage_npz":
            (ck / "arrays.npz").write_bytes(b"not a zip")
        else:
            for f in ck.iterdir():
                f.unlink()
    touched = _snapshot(out)
    r = cli("resume", str(out))
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert sum(line.startswith("warning:") for line in lines) == 2  # each rejection named
    assert lines[-1].startswith(f"error: {out}: every checkpoint in checkpoints/ is corrupted")
    assert "Traceback" not in r.stderr
    assert _snapshot(out) == touched  # nothing written


def test_consistently_tampered_checkpoint_is_caught_by_the_rebuild(killed):
    """A checkpoint whose checksums verify but whose state is not what the run reaches (other code,
    data or platform) is refused, naming where it differs."""
    out = killed
    for ck in checkpoint.checkpoints(out):
        meta = json.loads((ck / "state.json").read_text())
        meta["state"]["network"]["next_id"] += 1
        (ck / "state.json").write_text(json.dumps(meta))
        sums = {n: checkpoint._sha(ck / n) for n in ("arrays.npz", "state.json")}
        (ck / "SHA256SUMS").write_text(json.dumps(sums))
    with pytest.raises(InputError, match=r"differs from this checkpoint at state\.network\.next_id"):
        api.resume(out, interruptible=False)


def test_resume_refuses_a_changed_scenario_and_a_complete_run(tmp_path, killed, refs):
    out = killed
    sc = out / "scenario.toml"
    sc.write_text(sc.read_text().replace("seed = 3", "seed = 4"))
    with pytest.raises(InputError, match="changed since the checkpoint was written"):
        api.resume(out)
    with pytest.raises(InputError, match="nothing to resume"):
        api.resume(refs["dpsgd"])
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "scenario.toml").write_text(scenario(tmp_path, "dpsgd").read_text())
    with pytest.raises(InputError, match="no checkpoint"):
        api.resume(tmp_path / "fresh")


def test_round_based_checkpoints(tmp_path, monkeypatch):
    """checkpoint_every_rounds = 10: one checkpoint each time the mean activation count passes 10k."""
    seen: list[tuple[int, float]] = []
    real = checkpoint.write

    def spy(sim, folder, keep, kind, header):
        seen.append((sim.activations, kind))
        return real(sim, folder, keep, kind, header)

    monkeypatch.setattr(checkpoint, "write", spy)
    res = api.run(scenario(tmp_path, "dpsgd"), overrides={"run.checkpoint_every": None,
                                                           "run.checkpoint_every_rounds": 10},
                  out=tmp_path / "r", interruptible=False, engine="events")
    n = res.summary["agents"]
    marks = [a // (10 * n) for a, _ in seen]
    assert marks == list(range(1, len(seen) + 1)) and len(seen) >= 8
    assert all(kind == "periodic" for _, kind in seen)


# fuzzing the checkpoint reader ---------------------------------------------------------------------------
FILES = ("state.json", "arrays.npz", "SHA256SUMS")


def _snapshot(folder: Path) -> dict[Path, bytes]:
    """Every output file (not the writer's lock, which a rejected resume may take over from a dead run)."""
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != api.LOCK_FILE}


def _one_line_exit_2(r, folder: Path) -> None:
    assert r.exit_code == 2, r.output
    errors = [ln for ln in r.stderr.splitlines() if not ln.startswith("warning:")]
    assert len(errors) == 1 and errors[0].startswith("error: ") and str(folder) in errors[0]
    assert "Traceback" not in r.output


@search(40, suppress_health_check=list(HealthCheck))
@given(damage=st.lists(st.tuples(st.sampled_from(FILES), st.sampled_from(["cut", "flip", "junk", "delete"]),
                                 st.integers(0, 1 << 20), st.binary(max_size=64)), min_size=2, max_size=2))
def test_fuzz_corrupted_checkpoints(killed_template, damage):
    """Every checkpoint damaged (cut, flipped, replaced, deleted): one error line, exit 2, nothing written."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        shutil.copytree(killed_template, out)
        for ck, (name, how, at, junk) in zip(checkpoint.checkpoints(out), damage):
            f = ck / name
            data = f.read_bytes()
            if how == "cut":
                f.write_bytes(data[: at % max(1, len(data))])
            elif how == "flip":
                _flip(f, at)
            elif how == "junk":
                f.write_bytes(junk)
            else:
                f.unlink()
        before = _snapshot(out)
        r = cli("resume", str(out), "-q")
        _one_line_exit_2(r, out)
        assert _snapshot(out) == before


def _mutate(obj, path: list, value):
    """Set obj[path] = value inside nested dicts/lists (path indices taken modulo the sizes)."""
    for i, k in enumerate(path):
        last = i == len(path) - 1
        if isinstance(obj, dict) and obj:
            key = sorted(obj)[k % len(obj)]
            if last or not isinstance(obj[key], (dict, list)) or not obj[key]:
                obj[key] = value
                return
            obj = obj[key]
        elif isinstance(obj, list) and obj:
            j = k % len(obj)
            if last or not isinstance(obj[j], (dict, list)) or not obj[j]:
                obj[j] = value
                return
            obj = obj[j]
        else:
            return


@search(12, suppress_health_check=list(HealthCheck))
@given(path=st.lists(st.integers(0, 1000), min_size=1, max_size=6),
       value=st.one_of(st.none(), st.booleans(), st.integers(-5, 1 << 40), st.floats(allow_nan=True),
                       st.text(max_size=8), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                                  st.integers(),
                                                                                                  max_size=2)))
def test_fuzz_consistently_tampered_state(killed_template, path, value):
    """state.json changed anywhere with its checksums fixed up: resume either refuses in one line (exit 2)
    without writing, or (a field it neither reads nor compares, e.g. the write date) completes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        shutil.copytree(killed_template, out)
        for ck in checkpoint.checkpoints(out):
            meta = json.loads((ck / "state.json").read_text())
            _mutate(meta, path, value)
            (ck / "state.json").write_text(json.dumps(meta))
            sums = {n: checkpoint._sha(ck / n) for n in ("arrays.npz", "state.json")}
            (ck / "SHA256SUMS").write_text(json.dumps(sums))
        before = _snapshot(out)
        r = cli("resume", str(out), "-q")
        if r.exit_code == 0:
            assert api.is_complete(out)
        else:
            _one_line_exit_2(r, out)
            assert _snapshot(out) == before


@pytest.mark.parametrize("seed", [5, 6])
def test_sigkill_while_checkpointing_often_leaves_a_loadable_checkpoint(tmp_path, seed):
    """Checkpoints every 0.1 simulated s (many writes and prunes per wall second): a kill at a random
    moment, likely inside a write, leaves the newest complete checkpoint loadable (no warning) and a trace
    that reads up to its last flush."""
    sc = scenario(tmp_path, "adpsgd", every=0.1)
    out = tmp_path / "run"
    proc = start(sc, out)
    wait_for_checkpoints(out, proc, 2)
    time.sleep(np.random.default_rng(seed).uniform(0.0, 0.5))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    warnings: list[str] = []
    ck = checkpoint.latest(out, warnings.append)
    assert warnings == []
    assert read_trace(out).table.num_rows >= ck.meta["trace"]["events"]


def test_sweep_goes_on_from_a_killed_members_checkpoint(killed, refs):
    """netsim sweep re-running a killed member resumes it rather than starting over."""
    from netsim.scenario import scenario_hash
    from netsim.sweep import RunTask, execute

    text = (killed / "scenario.toml").read_text()
    newest = checkpoint.checkpoints(killed)[-1]
    summary = execute(RunTask(0, "dpsgd", 3, {}, str(killed), text, scenario_hash(text)))
    assert summary["resumed_at_step"] == int(newest.name.split("-")[1])
    same_run(killed, refs["dpsgd"])


def test_programs_spawning_per_round_stay_bounded(tmp_path):
    """Agent.spawn's processes are kept for checkpoints; finished ones are forgotten, so a program that
    spawns a helper every round does not grow memory per round."""
    from netsim.sim.kernel import Simulation

    def helper(agent):
        yield agent.env.timeout(0.01)

    def spawner(agent, p):
        while True:
            yield agent.wake()
            agent.spawn(helper(agent))

    sim = Simulation(api.resolve_scenario(scenario(tmp_path, "dpsgd")), spawner, None)
    sim.run()
    n = len(sim.agents)
    assert sim.agents[0].round > 50
    assert len(sim.programs) <= 2 * (4 * n + 64)


def test_a_folder_being_written_is_refused_and_a_dead_writers_lock_taken_over(tmp_path, refs):
    sc = scenario(tmp_path, "dpsgd", until=200.0)
    out = tmp_path / "run"
    proc = start(sc, out)
    wait_for_checkpoints(out, proc, 1)
    try:
        for attempt in (lambda: api.run(sc, out=out, interruptible=False, engine="events"),
                        lambda: api.resume(out, interruptible=False)):
            with pytest.raises(InputError, match=f"process {proc.pid} is writing this run folder"):
                attempt()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (out / api.LOCK_FILE).read_text() == str(proc.pid)  # stale now
    assert not api.is_complete(out)


def test_a_kill_inside_the_prune_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    """Pruning renames the old checkpoint out of the listing before deleting it: a run killed inside the
    deletion (simulated: rmtree does nothing) still lists only complete checkpoints, and the next write
    clears what was left."""
    sim = api.prepare(api.resolve_scenario(scenario(tmp_path, "dpsgd")))
    header = {"scenario_sha256": "x", "netsim": "test", "seed": 0, "resumable": True}
    sim.start()
    real_rmtree = shutil.rmtree
    monkeypatch.setattr(checkpoint.shutil, "rmtree", lambda *a, **k: None)  # killed before deleting
    for step in (100, 200, 300):
        sim.advance(to_step=step)
        checkpoint.write(sim, tmp_path, 2, "periodic", header)
    root = tmp_path / checkpoint.FOLDER
    assert [p.name for p in checkpoint.checkpoints(tmp_path)] == ["ckpt-000000000200", "ckpt-000000000300"]
    assert [p.name for p in root.glob(".ckpt-*.tmp")] == [".ckpt-000000000100.tmp"]
    for ck in checkpoint.checkpoints(tmp_path):
        checkpoint.load(ck)  # both complete
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    sim.advance(to_step=400)
    checkpoint.write(sim, tmp_path, 2, "periodic", header)
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-000000000300", "ckpt-000000000400"]


def test_a_2000_agent_pdsl_checkpoint_holds_the_bank_once(capsys):
    """PDSL's programs hold every agent's momentum (``Agent.shared_state``, the whole (n, P) bank tensor) as
    a local: the checkpoint references the bank's copy instead of storing it once per agent (which was
    n^2 P: 338 MB here), so it is within 2x of the bank and the random streams' state (the named streams
    and each agent's noise generator)."""
    from netsim.scenario import scenario_from_dict

    n = 2000
    sc = scenario_from_dict({
        "name": "ck", "run": {"seed": 1, "rounds": 3},
        "agents": {"count": n, "compute_time": {"kind": "constant", "value": 0.05},
                   "activation": {"kind": "periodic", "period": 1.0}},
        "topology": {"kind": "ring"}, "network": {"latency": {"kind": "constant", "value": 0.01}},
        "data": {"kind": "synthetic", "samples": 20 * n, "features": 20, "validation": 200},
        "model": {"kind": "logistic"},
        "algorithm": {"name": "pdsl", "lr": 0.01, "batch": 8, "round_timeout": 0.3},
        "evaluation": {"every": 100.0}})
    sim = api.prepare(sc)
    sim.start()
    while sim.env.now <= 2.0:   # into round 2: programs suspended at barriers and at wake
        sim.advance(to_step=sim.steps + 500)
    assert sim.env.now < 3.0
    _, arrays = checkpoint.capture(sim)
    size = lambda prefix: sum(v.nbytes for k, v in arrays.items() if k.startswith(prefix))  # noqa: E731
    bank, streams, noise = size("bank."), size("streams"), sum(
        v.nbytes for k, v in arrays.items() if k.startswith("ledger.") and k.endswith(".noise"))
    total = sum(v.nbytes for v in arrays.values())
    u = sim.bank.state("pdsl.u")
    with capsys.disabled():
        print(f"\n2,000-agent PDSL checkpoint: {total:,} bytes of arrays; bank {bank:,}, named streams {streams:,}, "
              f"noise generators {noise:,}, programs' locals {size('program.'):,}; pdsl.u alone {u.nbytes:,}")
    assert u.nbytes > 0 and not any(v.shape == tuple(u.shape) for k, v in arrays.items() if k.startswith("program."))
    assert total <= 2 * (bank + streams + noise)


def test_a_complete_run_leaves_no_checkpoints_folder(tmp_path):
    """The checkpoints of a run that finished are removed, and their folder with them (it was left empty);
    a folder holding something else is left as it is."""
    res = api.run(scenario(tmp_path, "dpsgd", until=6.0, every=1.0), out=tmp_path / "r", interruptible=False,
                  engine="events")
    assert res.summary["stop_reason"] != "interrupted" and api.is_complete(res.out)
    assert not (res.out / checkpoint.FOLDER).exists()
    (res.out / checkpoint.FOLDER).mkdir()
    (res.out / checkpoint.FOLDER / "notes.txt").write_text("mine")
    again = api.run(scenario(tmp_path, "dpsgd", until=6.0, every=1.0), out=tmp_path / "r", interruptible=False,
                    engine="events")
    assert (again.out / checkpoint.FOLDER / "notes.txt").read_text() == "mine"
