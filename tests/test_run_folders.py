"""Run folders that never mislead: a trace without its run's end is partial everywhere, replay says how
much of the recording it used, results are never overwritten without --force, and a run that crashes
in an algorithm keeps its partial trace and a summary naming the error."""

from __future__ import annotations

import contextlib
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


def test_an_interrupted_runs_trace_is_partial_until_resumed(tmp_path):
    """A run stopped at a checkpoint (as Ctrl-C stops it) has no end either; resuming it writes it."""
    from netsim import api

    sc = scenario_from_dict(merge(BASE, {"run": {"until": 6.0, "checkpoint_every": 2.0}}))
    folder = tmp_path / "r"
    with _interrupt_after_first_checkpoint():  # (the events engine's checkpoint at an event boundary)
        res = api.run(sc, out=folder, interruptible=False, engine="events")
    assert res.summary["stop_reason"] == "interrupted"
    tr = read_trace(folder)
    assert not tr.complete and 0 < tr.t_end <= 2.0  # the events before the first checkpoint mark
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
    """A trace rewritten (an edited recording) with netsim's write_trace has its end and its checksums; with
    pyarrow's own stream writer, it has its end, and batches without checksums: refused in one line that says
    how to write it, read unverified once the schema no longer claims them."""
    from netsim.trace.io import CHECKSUM_KEY, write_trace

    res = netsim.run(scenario_from_dict(merge(BASE, {"run": {"until": 2.0}})), out=tmp_path / "r")
    tr = read_trace(res.out)
    edited = tr.table.set_column(6, "value", pa.compute.multiply(tr.table.column("value"), 2.0))
    again = read_trace(write_trace(edited, tmp_path / "edited.arrows", flush_every=100))
    assert again.complete and again.checked and again.table.equals(edited)
    dst = tmp_path / "copy.arrows"
    with pa.OSFile(str(dst), "wb") as f, pa.ipc.new_stream(f, tr.table.schema) as w:
        w.write_table(tr.table)
    with pytest.raises(InputError, match="batch 1 .*checksum is missing .*netsim.trace.io.write_trace"):
        read_trace(dst)
    schema = tr.table.schema.with_metadata({k: v for k, v in tr.table.schema.metadata.items()
                                            if k.decode() != CHECKSUM_KEY})
    with pa.OSFile(str(dst), "wb") as f, pa.ipc.new_stream(f, schema) as w:
        w.write_table(tr.table)
    assert read_trace(dst).complete and not read_trace(dst).checked


# --- one run per folder ------------------------------------------------------------------------------

@contextlib.contextmanager
def _interrupt_after_first_checkpoint():
    """Ctrl-C right after the run's first periodic checkpoint (what SIGINT does, deterministically)."""
    from netsim.sim import checkpoint

    real = checkpoint.write

    def write_then_interrupt(sim, folder, keep, kind, header):
        path = real(sim, folder, keep, kind, header)
        if kind == "periodic":
            sim.interrupt()
        return path

    checkpoint.write = write_then_interrupt
    try:
        yield
    finally:
        checkpoint.write = real


AGENT_METRICS = {"evaluation": {"every": 1.0, "metrics": ["loss", "accuracy", "agent_accuracy"]}}


def test_force_then_ctrl_c_leaves_only_the_new_runs_files_and_resume_finishes_it(tmp_path, monkeypatch):
    """`netsim run --out DIR --force` into a complete run, stopped by Ctrl-C: none of the old run's outputs
    (metrics, per-agent metrics, plots, summary, its privacy report) stays beside the new run's trace;
    `netsim resume` then completes the new run and every reader reads it."""

    folder = tmp_path / "ck"
    old = tmp_path / "old.toml"
    old.write_text(tomli_w.dumps(merge(BASE, {"run": {"until": 3.0}, **AGENT_METRICS})))
    assert cli("run", old, "--out", folder, "-q").exit_code == 0
    assert cli("privacy", folder).exit_code == 0  # its report, privacy.json, joins the folder
    assert {"metrics.csv", "agent_metrics.csv", "plot.png", "agent_accuracy.png", "privacy.json",
            SUMMARY_FILE} <= {p.name for p in folder.iterdir()}
    new = tmp_path / "new.toml"
    new.write_text(tomli_w.dumps(merge(BASE, {"run": {"until": 6.0, "seed": 8, "checkpoint_every": 2.0},
                                              **AGENT_METRICS})))
    with _interrupt_after_first_checkpoint():
        stopped = cli("run", new, "--out", folder, "--force", "-q")
    assert stopped.exit_code == 130, stopped.output
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoints", "scenario.toml", PARTIAL_SUMMARY, TRACE_FILE]
    q = cli("query", folder, "SELECT (SELECT count(*) FROM metrics) AS m, (SELECT max(t) FROM trace) AS t")
    assert q.exit_code == 0 and q.stderr.startswith("warning: partial run, up to t = "), q.output
    assert " 0 " in q.stdout  # no metrics of another run
    resumed = cli("resume", folder, "-q")
    assert resumed.exit_code == 0, resumed.output
    s = json.loads((folder / SUMMARY_FILE).read_text())
    assert s["seed"] == 8 and set(s["files"]) == {"metrics.csv", "agent_metrics.csv", "plot.png",
                                                   "agent_accuracy.png"}
    assert read_trace(folder).complete
    q = cli("query", folder, "SELECT (SELECT max(time) FROM metrics) AS m, (SELECT max(time) FROM agent_metrics)"
                             " AS a, (SELECT max(t) FROM trace) AS t", "--csv")
    assert q.exit_code == 0 and q.stderr == "", q.output
    m, a, t = map(float, q.stdout.splitlines()[1].split(","))
    assert m == a == 6.0 and 5.0 < t <= 6.0  # one run: metrics and trace end together


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> dict[str, Path]:
    """A complete run A (until 3 s) and B, the same scenario run longer, interrupted at its first checkpoint."""
    from netsim import api

    root = tmp_path_factory.mktemp("two")
    a = netsim.run(scenario_from_dict(merge(BASE, {"run": {"until": 3.0}, **AGENT_METRICS})), out=root / "a").out
    sc = scenario_from_dict(merge(BASE, {"run": {"until": 8.0, "checkpoint_every": 2.0}, **AGENT_METRICS}))
    with _interrupt_after_first_checkpoint():
        b = api.run(sc, out=root / "b", interruptible=False).out
    c = netsim.run(scenario_from_dict(merge(BASE, {"run": {"until": 3.0, "seed": 11}, **AGENT_METRICS})),
                   out=root / "c").out
    return {"a": a, "b": b, "c": c}


def _mixed(two_runs, tmp_path, how: str) -> tuple[Path, list[str]]:
    """A folder holding files of two runs, and the files a refusal must name."""
    import shutil

    a, b, c = two_runs["a"], two_runs["b"], two_runs["c"]
    folder = tmp_path / how
    if how == "old metrics beside a partial run":  # the issue: an older --force into A, then Ctrl-C
        shutil.copytree(b, folder)
        for name in ("metrics.csv", "agent_metrics.csv", "plot.png", "agent_accuracy.png"):
            shutil.copy(a / name, folder / name)
        return folder, ["metrics.csv", "agent_metrics.csv"]
    shutil.copytree(a, folder)
    if how == "another scenario's trace":
        shutil.copy(c / TRACE_FILE, folder / TRACE_FILE)
        return folder, [TRACE_FILE, "scenario.toml", SUMMARY_FILE]
    shutil.copy(c / "metrics.csv", folder / "metrics.csv")  # "metrics of another run"
    return folder, ["metrics.csv"]


MIXES = ["old metrics beside a partial run", "another scenario's trace", "metrics of another run"]
READERS = {
    "query": ["query", "{run}", "SELECT (SELECT max(time) FROM metrics), (SELECT max(t) FROM trace)"],
    "privacy": ["privacy", "{run}", "--no-pld"],
    "explore --export": ["explore", "{run}", "--export", "{out}"],
    "compare": ["compare", "{run}", "--out", "{out}"],
    "replay": ["replay", "{run}", "--out", "{out}", "-q"],
    "timeline": ["timeline", "{run}", "--width", "80"],
}


@pytest.mark.parametrize("how", MIXES)
def test_every_reader_refuses_a_folder_of_two_runs_in_one_line(two_runs, tmp_path, how):
    from netsim.api import RunResult, read_metrics
    from netsim.explore.model import RunData
    from netsim.metrics.sql import query

    folder, names = _mixed(two_runs, tmp_path, how)
    for reader, args in READERS.items():
        out = tmp_path / f"out-{reader.split()[0]}" / "x.png"
        r = cli(*[a.format(run=folder, out=out) for a in args])
        assert r.exit_code == 2 and one_line(r.stderr), (reader, r.output)
        line = r.stderr
        assert line.startswith(f"error: {folder}: holds files of different runs") or \
            line.startswith(f"error: {folder}: summary.json"), (reader, line)
        assert all(n in line for n in names), (reader, line)
        assert not out.exists() and not out.parent.exists()
    readers = [lambda: read_trace(folder), lambda: read_trace(folder / TRACE_FILE), lambda: RunData(folder),
               lambda: query(folder, "SELECT 1"), lambda: read_metrics(folder)]
    if how != "old metrics beside a partial run":
        readers.append(lambda: RunResult.load(folder))
    for read in readers:
        with pytest.raises(InputError, match="holds files of different runs") as e:
            read()
        assert str(e.value).startswith(f"{folder}: ") and "\n" not in str(e.value)


def test_a_run_killed_while_writing_its_results_reads_as_its_own(two_runs, tmp_path):
    """A run writes metrics and plots after its trace's end, summary.json last: killed in between, its folder holds
    one run's files (a complete trace, no summary) and reads; with the trace cut as well it would be two runs."""
    import shutil

    from netsim.metrics.sql import query

    folder = tmp_path / "killed"
    shutil.copytree(two_runs["a"], folder)
    (folder / SUMMARY_FILE).unlink()
    assert read_trace(folder).complete and query(folder, "SELECT count(*) FROM metrics").num_rows == 1
    r = cli("query", folder, "SELECT max(time) FROM metrics")
    assert r.exit_code == 0, r.output
    data = (folder / TRACE_FILE).read_bytes()
    (folder / TRACE_FILE).write_bytes(data[:len(data) - len(EOS)])  # the end marker gone: a run cut earlier
    with pytest.raises(InputError, match="holds files of different runs"):
        read_trace(folder)


def test_a_complete_folder_whose_trace_lost_its_end_is_refused(two_runs, tmp_path):
    import shutil

    folder = tmp_path / "cut"
    shutil.copytree(two_runs["a"], folder)
    data = (folder / TRACE_FILE).read_bytes()
    (folder / TRACE_FILE).write_bytes(data[:len(data) // 2])
    r = cli("query", folder, "SELECT count(*) FROM trace")
    assert r.exit_code == 2 and one_line(r.stderr)
    assert r.stderr == (f"error: {folder}: summary.json says the run completed, but trace.arrows does not record "
                        "its end (cut, damaged, or another run's); run the scenario again\n")


def test_a_fresh_start_removes_every_file_of_the_run_before(tmp_path):
    """Every file a run and `netsim privacy` write is one a fresh start removes (RUN_FILES), and nothing else."""
    from netsim.run_folder import RUN_FILES

    folder = tmp_path / "r"
    sc = merge(BASE, {"run": {"until": 3.0, "checkpoint_every": 1.0}, "agents": {"count": 6},
                      "algorithm": {"name": "dp_dpsgd", "lr": 0.5, "batch": 16, "round_timeout": 0.2, "clip": 1.0,
                                    "noise_multiplier": 4.0},
                      "privacy": {"delta": 1.0e-5, "record": "payloads"}, **AGENT_METRICS})
    netsim.run(scenario_from_dict(sc), out=folder)
    assert cli("privacy", folder, "--no-pld", "--pairwise").exit_code == 0
    assert cli("privacy", folder, "--attack", "reconstruct", "--observers", "0").exit_code == 0
    (folder / "notes.txt").write_text("mine")
    written = {p.name for p in folder.iterdir()} - {"scenario.toml", "notes.txt", "checkpoints"}  # (emptied)
    assert {"pairwise.csv", "mixing.csv", "payloads.npz", "attack.csv"} <= written and set(RUN_FILES) >= written
    netsim.run(scenario_from_dict(merge(sc, {"run": {"until": 1.0}})), out=folder)  # the API starts afresh too
    s = json.loads((folder / SUMMARY_FILE).read_text())
    assert {p.name for p in folder.iterdir()} - {"checkpoints"} == {"scenario.toml", "notes.txt", TRACE_FILE,
                                                                   SUMMARY_FILE, *s["files"]}
    assert (folder / "notes.txt").read_text() == "mine"
