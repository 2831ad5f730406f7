"""Run folders that never mislead: a trace without its run's end is partial everywhere, replay says how
much of the recording it used, results are never overwritten without --force, and a run that crashes
in an algorithm keeps its partial trace and a summary naming the error."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pytest
import tomli_w
from typer.testing import CliRunner

import netsim
from netsim.api import PARTIAL_SUMMARY, SUMMARY_FILE
from netsim.cli import app
from netsim.errors import InputError
from netsim.scenario.load import scenario_from_dict
from netsim.trace.io import EOS, TRACE_FILE, read_trace
from tests.conftest import BASE, cli_env, merge, netsim_cli

DP = merge(BASE, {"run": {"seed": 2, "until": 20.0, "trace_flush_every": 64},
                  "agents": {"count": 6},
                  "algorithm": {"name": "dp_dpsgd", "lr": 0.5, "batch": 16, "round_timeout": 0.2, "clip": 1.0,
                                "noise_multiplier": 4.0},
                  "privacy": {"delta": 1.0e-5}})


def cli(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def last_t(path: Path) -> float:
    return read_trace(path).table.column("t")[-1].as_py()


def one_line(text: str) -> bool:
    return text.count("\n") == 1 and "Traceback" not in text


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """A DP run killed with SIGKILL mid-run (long `until`): trace.arrows without summary.json."""
    tmp = tmp_path_factory.mktemp("killed")
    sc = tmp / "long.toml"
    sc.write_text(tomli_w.dumps(merge(DP, {"run": {"until": 100000.0}})))
    out = tmp / "run"
    proc = subprocess.Popen(netsim_cli("run", str(sc), "--out", str(out), "-q"), env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 300
    trace = out / TRACE_FILE
    while not (trace.is_file() and trace.stat().st_size > 60_000):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < end
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (out / SUMMARY_FILE).exists()
    return out


def test_a_killed_runs_trace_is_partial(killed):
    tr = read_trace(killed)
    assert tr.table.num_rows > 0
    assert not tr.complete
    assert tr.t_end == tr.table.column("t")[-1].as_py() and 0 < tr.t_end < 100000.0


def test_a_trace_cut_at_a_batch_boundary_is_partial(tmp_path):
    """What a SIGKILL leaves: whole batches, no end-of-stream marker."""
    res = netsim.run(scenario_from_dict(merge(BASE, {"run": {"until": 4.0, "trace_flush_every": 50}})),
                     out=tmp_path / "r")
    data = res.trace_path.read_bytes()
    assert data.endswith(EOS) and read_trace(res.out).complete
    cut = tmp_path / "cut.arrows"
    cut.write_bytes(data[: -len(EOS)])
    tr = read_trace(cut)
    assert tr.table.equals(read_trace(res.out).table)  # every event is there, but the run's end is not
    assert not tr.complete


def test_replay_of_a_killed_run_is_refused_in_one_line(killed, tmp_path):
    t_end = last_t(killed)
    r = cli("replay", killed, "--out", tmp_path / "o", "-q")
    assert r.exit_code == 2, r.output
    assert one_line(r.stderr) and f"partial run, up to t = {t_end:.6g}" in r.stderr
    assert "replay (exact)" not in r.stdout
    assert not (tmp_path / "o").exists()


def test_timeline_of_a_killed_run_says_partial(killed):
    t_end = last_t(killed)
    r = cli("timeline", killed, "--width", 100, "--no-summary")
    assert r.exit_code == 0, r.output
    assert f"partial run, up to t = {t_end:.6g}" in r.stdout


def test_privacy_of_a_killed_run_starts_with_a_partial_warning(killed, tmp_path):
    import shutil

    folder = tmp_path / "k"
    shutil.copytree(killed, folder)
    t_end = last_t(folder)
    r = cli("privacy", folder, "--no-pld")
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert first.startswith("warning: partial run, up to t = ") and f"{t_end:.6g}" in first


def test_an_interrupted_runs_trace_is_partial_until_resumed(tmp_path, monkeypatch):
    """A run stopped at a checkpoint (as Ctrl-C stops it) has no end either; resuming it writes it."""
    from netsim import api
    from netsim.sim import checkpoint

    real = checkpoint.write

    def write_then_interrupt(sim, folder, keep, kind, header):  # Ctrl-C right after the first checkpoint
        path = real(sim, folder, keep, kind, header)
        if kind == "periodic":
            sim.interrupt()
        return path

    monkeypatch.setattr(checkpoint, "write", write_then_interrupt)
    sc = scenario_from_dict(merge(BASE, {"run": {"until": 6.0, "checkpoint_every": 2.0}}))
    folder = tmp_path / "r"
    res = api.run(sc, out=folder, interruptible=False)
    assert res.summary["stop_reason"] == "interrupted"
    tr = read_trace(folder)
    assert not tr.complete and 0 < tr.t_end <= 2.0  # the events before the first checkpoint mark
    monkeypatch.setattr(checkpoint, "write", real)
    api.resume(folder, interruptible=False)
    assert read_trace(folder).complete


# --- replay --scenario onto a bigger setup ---------------------------------------------------------

SMALL_NET = merge(BASE, {"run": {"seed": 5, "until": 6.0}, "agents": {"count": 4},
                         "network": {"latency": {"kind": "lognormal", "mean": 0.03, "sigma": 0.5},
                                     "loss": 0.1}})


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return netsim.run(scenario_from_dict(SMALL_NET), out=tmp_path_factory.mktemp("small") / "run").out


def test_replay_onto_a_bigger_setup_warns_that_most_messages_are_not_recorded(small, tmp_path):
    other = tmp_path / "big.toml"
    other.write_text(tomli_w.dumps(merge(SMALL_NET, {"agents": {"count": 24}})))
    r = cli("replay", small, "--scenario", other, "--out", tmp_path / "o", "-q")
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "o" / SUMMARY_FILE).read_text())
    fallback, matched = s["replay_messages_fallback"], s["replay_messages_matched"]
    assert fallback > matched  # the setup: most messages are on links the recording never had
    pct = round(100 * matched / (matched + fallback))
    warning = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert f"only {pct}% of the messages ({matched} of {matched + fallback})" in warning[0]
    assert "scenario's own link model" in warning[0]
    acts, own = s["replay_activations"], s["replay_activations_fallback"]
    assert own > acts and f"only {round(100 * acts / (acts + own))}% of the activations" in warning[1]
    assert s["replay_warnings"] == [w.removeprefix("warning: ") for w in warning]


def test_replay_under_the_same_setup_does_not_warn(small, tmp_path):
    other = tmp_path / "same.toml"
    other.write_text(tomli_w.dumps(merge(SMALL_NET, {"algorithm": {"name": "dpsgd", "lr": 0.2, "batch": 8,
                                                                   "round_timeout": 0.2}})))
    r = cli("replay", small, "--scenario", other, "--out", tmp_path / "o", "-q")
    assert r.exit_code == 0, r.output
    assert "warning" not in r.stderr
    assert json.loads((tmp_path / "o" / SUMMARY_FILE).read_text())["replay_warnings"] == []


# --- never overwrite results without --force -------------------------------------------------------

def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_run_into_the_same_folder_is_refused_unless_forced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sc = tmp_path / "s.toml"
    sc.write_text(tomli_w.dumps(merge(BASE, {"run": {"until": 2.0}})))
    first = cli("run", sc, "-q")
    assert first.exit_code == 0, first.output
    folder = tmp_path / "runs" / "t"  # run.out = "runs/{name}"
    before = _snapshot(folder)
    second = cli("run", sc, "--set", "run.seed=9", "-q")
    assert second.exit_code == 2 and one_line(second.stderr), second.output
    assert str(folder.relative_to(tmp_path)) in second.stderr and "--force" in second.stderr
    assert _snapshot(folder) == before  # nothing written
    forced = cli("run", sc, "--set", "run.seed=9", "-q", "--force")
    assert forced.exit_code == 0, forced.output
    assert json.loads((folder / SUMMARY_FILE).read_text())["seed"] == 9


def test_a_run_into_a_folder_with_an_unfinished_checkpointed_run_points_to_resume(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "checkpoints" / "ckpt-000000000100").mkdir(parents=True)
    (folder / "scenario.toml").write_text("")
    (folder / TRACE_FILE).write_bytes(b"x")
    sc = tmp_path / "s.toml"
    sc.write_text(tomli_w.dumps(merge(BASE, {"run": {"until": 2.0}})))
    before = _snapshot(folder)
    r = cli("run", sc, "--out", folder, "-q")
    assert r.exit_code == 2 and one_line(r.stderr), r.output
    assert f"netsim resume {folder}" in r.stderr
    assert _snapshot(folder) == before


def test_replays_of_two_runs_go_to_two_folders_and_a_second_replay_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sc = scenario_from_dict(merge(BASE, {"run": {"until": 2.0}}))
    a = netsim.run(sc, out=tmp_path / "a").out
    b = netsim.run(sc, overrides={"run.seed": 4}, out=tmp_path / "b").out
    for folder in (a, b):
        r = cli("replay", folder, "-q")
        assert r.exit_code == 0, r.output
        assert (tmp_path / f"{folder.name}-replay" / TRACE_FILE).read_bytes() == (folder / TRACE_FILE).read_bytes()
    before = _snapshot(tmp_path / "a-replay")
    again = cli("replay", a, "-q")
    assert again.exit_code == 2 and one_line(again.stderr), again.output
    assert "--force" in again.stderr
    assert _snapshot(tmp_path / "a-replay") == before
    assert cli("replay", a, "-q", "--force").exit_code == 0


# --- a crash inside an algorithm ---------------------------------------------------------------------

PLUGIN = '''
import attrs

from netsim.algorithms.registry import register


@attrs.frozen
class P:
    at: int = 4


@register("crashes_at_round", P)
def crashes_at_round(agent, p):
    while True:
        yield agent.wake()
        if agent.id == 2 and agent.round == p.at:
            1 / 0
        yield agent.gradient(batch=8)
'''


def test_a_crash_in_an_algorithm_keeps_the_partial_trace_and_names_the_error(tmp_path):
    plugin = tmp_path / "crashy.py"
    plugin.write_text(PLUGIN)
    sc = tmp_path / "s.toml"
    sc.write_text(tomli_w.dumps(merge(BASE, {"run": {"until": 20.0, "trace_flush_every": 16},
                                             "algorithm": {"name": "crashes_at_round", "at": 4}})))
    out = tmp_path / "r"
    r = cli("run", sc, "--plugin", plugin, "--out", out, "-q")
    assert r.exit_code == 1, r.output
    assert one_line(r.stderr), r.stderr
    line = (PLUGIN.splitlines().index("            1 / 0") + 1)
    assert "ZeroDivisionError" in r.stderr and f"{plugin}:{line}" in r.stderr and "agent 2" in r.stderr
    assert not (out / SUMMARY_FILE).exists()  # not a complete run
    s = json.loads((out / PARTIAL_SUMMARY).read_text())
    assert s["stop_reason"] == "error"
    err = s["error"]
    assert err["type"] == "ZeroDivisionError" and err["agent"] == 2
    assert err["where"] == f"{plugin}:{line} in crashes_at_round"
    assert "1 / 0" in "".join(err["traceback"])
    tr = read_trace(out)
    assert not tr.complete and tr.table.num_rows == s["events"]  # every event up to the crash
    assert tr.t_end == s["simulated_time"] == err["t"]
    acts = tr.to_pandas().query("kind == 'activate' and agent == 2")
    assert len(acts) == 4 and acts.t.iloc[-1] == err["t"]


def test_a_crash_through_the_api_raises_with_the_folder(tmp_path):
    from netsim.algorithms import load_plugin
    from netsim.errors import RunCrashed

    plugin = tmp_path / "crashy2.py"
    plugin.write_text(PLUGIN.replace("crashes_at_round", "crashes_at_round_api"))
    load_plugin(str(plugin))
    sc = scenario_from_dict(merge(BASE, {"run": {"until": 20.0},
                                         "algorithm": {"name": "crashes_at_round_api", "at": 2}}))
    with pytest.raises(RunCrashed) as info:
        netsim.run(sc, out=tmp_path / "r", interruptible=False)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert info.value.folder == tmp_path / "r" and (tmp_path / "r" / PARTIAL_SUMMARY).is_file()
    assert not isinstance(info.value, InputError)


def test_arrow_stream_written_by_pyarrow_is_complete(tmp_path):
    """A trace rewritten with pyarrow's own stream writer (edited recordings) has its end."""
    res = netsim.run(scenario_from_dict(merge(BASE, {"run": {"until": 2.0}})), out=tmp_path / "r")
    tr = read_trace(res.out)
    dst = tmp_path / "copy.arrows"
    with pa.OSFile(str(dst), "wb") as f, pa.ipc.new_stream(f, tr.table.schema) as w:
        w.write_table(tr.table)
    assert read_trace(dst).complete
