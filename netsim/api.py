"""The Python API; the CLI is a thin layer over it.

    >>> import netsim
    >>> result = netsim.run("scenarios/quickstart.toml", overrides={"run.seed": 1}, out="runs/q1")
    >>> result.summary["accuracy"]
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from netsim.errors import InputError
from netsim.scenario import Scenario, load_scenario, scenario_hash, to_toml
from netsim.scenario.load import apply_overrides, scenario_from_dict, to_dict
from netsim.trace.io import TRACE_FILE

__version__ = "0.1.0"


SUMMARY_FILE = "summary.json"  # written last, atomically: its presence marks a complete run folder


class Summary(dict):
    """The run's summary: a dict (``summary["accuracy"]``) that is also a one-row table."""

    def to_arrow(self):
        import pyarrow as pa

        return pa.Table.from_pylist([dict(self)])

    def to_pandas(self):
        return self.to_arrow().to_pandas()


class Metrics(list):
    """The evaluation rows (one dict per evaluation time) that are also a table."""

    def to_arrow(self):
        import pyarrow as pa

        return pa.Table.from_pylist(list(self))

    def to_pandas(self):
        return self.to_arrow().to_pandas()


@attrs.frozen(slots=False)
class RunResult:
    """One run folder, for notebooks: ``summary`` and ``metrics`` work as dict/list and as tables
    (``.to_arrow()``, ``.to_pandas()``); ``events`` is the trace as an Arrow table, read on first use."""

    out: Path
    scenario: Scenario
    summary: Summary = attrs.field(converter=Summary)
    metrics: Metrics = attrs.field(converter=Metrics)

    @property
    def trace_path(self) -> Path:
        return self.out / TRACE_FILE

    @functools.cached_property
    def trace(self):
        from netsim.trace.io import read_trace

        return read_trace(self.trace_path)

    @property
    def events(self):
        """Every trace event as a ``pyarrow.Table`` (columns of netsim.trace.io.SCHEMA)."""
        return self.trace.table

    @classmethod
    def load(cls, folder: str | Path) -> RunResult:
        """Reopen a complete run folder (its summary.json, scenario.toml and metrics table)."""
        from netsim.metrics.report import read_summary

        folder = Path(folder)
        if not is_complete(folder):
            raise InputError("", f"not a complete run folder (no {SUMMARY_FILE})", str(folder))
        sc = load_scenario(folder / "scenario.toml")
        return cls(folder, sc, read_summary(folder), read_metrics(folder))


def is_complete(folder: str | Path) -> bool:
    return (Path(folder) / SUMMARY_FILE).is_file()


def read_metrics(folder: str | Path) -> list[dict[str, Any]]:
    """A run folder's metrics table (CSV or Parquet) as rows; blanks (CSV of None) become None; a
    malformed table is an InputError naming the file (netsim.metrics.report.read_metrics)."""
    from netsim.metrics.report import read_metrics as read

    return read(folder)


def resolve_scenario(scenario: Scenario | str | Path, overrides: dict[str, Any] | None = None) -> Scenario:
    if isinstance(scenario, Scenario):
        if overrides:
            return scenario_from_dict(apply_overrides(to_dict(scenario), overrides))
        return scenario
    return load_scenario(scenario, overrides)


def output_dir(scenario: Scenario, out: str | Path | None) -> Path:
    return Path(out) if out is not None else Path(scenario.run.out.replace("{name}", scenario.name))


def source_of(scenario: Scenario | str | Path) -> str | None:
    return None if isinstance(scenario, Scenario) else str(scenario)


def prepare(scenario: Scenario, writer=None, source: str | None = None):
    """Build (but do not run) the simulation: every check that needs more than the file happens here
    (algorithm and its parameters, topology, data files). Errors name ``source``, the scenario file."""
    from netsim.algorithms import resolve
    from netsim.sim import footprint
    from netsim.sim.kernel import Simulation

    try:
        footprint.check(scenario)  # refuse what cannot fit before building it (a dense graph at scale)
        program, params = resolve(scenario.algorithm)
        _check_closed_form(scenario, source)
        from netsim.privacy.ledger import new_ledger
        from netsim.privacy.views import mixing_log_for

        return Simulation(scenario, program, params, writer=writer, ledger=new_ledger, mixing=mixing_log_for)
    except InputError as e:
        raise e.at(source) if source else e from None


def precheck(scenario: Scenario, source: str | None = None) -> float | None:
    """The checks that import no torch and build no tensors (``netsim validate --quick``): the memory estimate,
    the closed form's name, the algorithm's name and the topology with its mixing weights; returns their spectral
    gap. The algorithm's parameters and checks, the data and the model need ``prepare``."""
    from netsim.algorithm_reference import SUMMARIES
    from netsim.algorithms import REGISTRY
    from netsim.sim import footprint
    from netsim.sim.streams import Streams
    from netsim.sim.topology import spectral_gap, weighted_graph

    try:
        footprint.check(scenario)
        if scenario.algorithm.name not in SUMMARIES and scenario.algorithm.name not in REGISTRY:
            from netsim.algorithms import resolve

            resolve(scenario.algorithm)  # an entry point's algorithm, or the one-line error naming the known ones
        _check_closed_form(scenario, source)
        _, W = weighted_graph(scenario.topology, scenario.agents.count, Streams(scenario.run.seed).seed_for("topology"))
        return spectral_gap(W)
    except InputError as e:
        raise e.at(source) if source else e from None


def _check_closed_form(scenario: Scenario, source: str | None) -> None:
    """``[privacy] closed_form`` must name a registered closed form (a plugin's is registered by now); an
    old name works and prints a one-line note."""
    name = scenario.privacy.closed_form if scenario.privacy is not None else "none"
    if name == "none":
        return
    import sys

    from netsim.privacy import closed_forms as cf

    cf.lookup(name)
    note = cf.deprecation_note(name)
    if note:
        print(f"note: {source or 'scenario'}: {note}", file=sys.stderr)


PARTIAL_SUMMARY = "summary.partial.json"  # an interrupted run's summary so far (netsim resume continues it)


def run(scenario: Scenario | str | Path, overrides: dict[str, Any] | None = None, out: str | Path | None = None,
        progress: Callable[[float], None] | None = None,
        setup: Callable[[Any], None] | None = None, interruptible: bool = True,
        engine: str = "events") -> RunResult:
    """Validate, build, run and write one run folder. ``setup(sim)`` may adjust the
    built simulation before it runs (``netsim replay`` installs the recorded network this way).

    With ``interruptible`` (in the main thread), SIGINT (Ctrl-C) stops the run at the next event
    boundary: the trace is flushed, a checkpoint and ``summary.partial.json`` are written, and the
    result's ``summary["stop_reason"]`` is ``"interrupted"``; ``resume(folder)`` continues it."""
    from netsim.metrics.summary import EventCounts
    from netsim.sim import checkpoint
    from netsim.trace.io import TraceWriter

    sc = resolve_scenario(scenario, overrides)
    text = to_toml(sc)
    folder = output_dir(sc, out)
    counts = EventCounts()
    meta = {"netsim.scenario": text, "netsim.scenario_sha256": scenario_hash(text), "netsim.version": __version__}
    writer = TraceWriter(folder / TRACE_FILE if sc.run.trace else None, meta, sc.run.trace_flush_every,
                         on_batch=counts, lazy=True)
    sim = prepare(sc, writer, source_of(scenario))  # raises InputError before anything is written
    sim.counts = counts
    if setup is not None:
        setup(sim)
    if engine not in ENGINES:
        raise InputError("--engine", f"unknown engine {engine!r}; one of: {', '.join(ENGINES)}")
    if engine == "windowed":
        from netsim.rounds import windowed

        why = windowed.refusal(sim)
        if why is not None:
            raise InputError("--engine", f"windowed cannot run this scenario exactly: {why}; use the default "
                                         "engine (events)", source_of(scenario))
        sim.engine, sim.runner = engine, windowed.run
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError("run.out", f"cannot create output folder {str(folder)!r}: {e.strerror or e}") from None
    with _folder_lock(folder):
        (folder / SUMMARY_FILE).unlink(missing_ok=True)  # the folder is incomplete until this run finishes
        (folder / PARTIAL_SUMMARY).unlink(missing_ok=True)
        for old in checkpoint.checkpoints(folder):  # a previous run's checkpoints must never be resumed here
            shutil.rmtree(old)
        (folder / "scenario.toml").write_text(text)
        sim.start(progress)
        return _complete(sim, folder, counts, meta, resumable=setup is None, interruptible=interruptible)


ENGINES = ("events", "windowed")  # how a run is executed; both write the same trace (netsim/rounds/)
LOCK_FILE = ".netsim.lock"
RESULT_FILES = (SUMMARY_FILE, PARTIAL_SUMMARY, TRACE_FILE, "metrics.csv", "metrics.parquet")


def check_fresh(folder: str | Path) -> None:
    """Refuse (InputError, one line) an output folder that already holds a run's results, so nothing is
    replaced without the user asking (the CLI's ``--force``); a missing or empty folder, or one with other
    files only, is fine. A folder with an unfinished run's checkpoint points to ``netsim resume``."""
    from netsim.sim.checkpoint import checkpoints

    folder = Path(folder)
    if not folder.is_dir():
        return
    other = _live_writer(folder)
    if other is not None:
        raise InputError("", f"process {other} is writing this run folder; choose another folder with --out",
                         str(folder))
    if not is_complete(folder) and checkpoints(folder):
        raise InputError("", f"holds an unfinished run with a checkpoint: continue it with `netsim resume "
                             f"{folder}`, choose another folder with --out, or start over with --force",
                         str(folder))
    held = [name for name in RESULT_FILES if (folder / name).exists()]
    if held:
        what = "a complete run" if is_complete(folder) else "a partial run (killed, interrupted or crashed)"
        raise InputError("", f"already holds {what} ({', '.join(held)}); choose another folder with --out, "
                             "or replace it with --force", str(folder))


def _live_writer(folder: Path) -> int | None:
    """The PID in the folder's lock if that process is alive and not this one."""
    try:
        other = int((folder / LOCK_FILE).read_text())
    except (OSError, ValueError):
        return None
    if other == os.getpid():
        return None
    try:
        os.kill(other, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    except OverflowError:
        return None
    return other


@contextmanager
def _folder_lock(folder: Path):
    """One writer per run folder: a second ``run``/``resume`` on a folder another live netsim process is
    writing is refused (a killed process leaves a stale lock, which is taken over)."""
    lock = folder / LOCK_FILE
    other = _live_writer(folder)
    if other is not None:
        raise InputError("", f"process {other} is writing this run folder (delete {LOCK_FILE} if it is "
                             "not netsim)", str(folder))
    lock.write_text(str(os.getpid()))
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def resume(folder: str | Path, progress: Callable[[float], None] | None = None,
           warn: Callable[[str], None] = lambda line: None, interruptible: bool = True) -> RunResult:
    """Continue an interrupted or killed run from its newest checkpoint that verifies (older ones are
    tried when the newest is corrupted; each rejection goes to ``warn``). The run is rebuilt up to the
    checkpoint without output and checked against it exactly (netsim/sim/checkpoint.py says why), then
    goes on writing: its trace after the checkpoint and its final metrics equal the uninterrupted run's."""
    folder = Path(folder)
    where = str(folder)
    if not folder.is_dir():
        raise InputError("", "no such run folder", where)
    if is_complete(folder):
        raise InputError("", f"the run is complete ({SUMMARY_FILE} exists): nothing to resume", where)
    sc_path = folder / "scenario.toml"
    if not sc_path.is_file():
        raise InputError("", "not a run folder (no scenario.toml)", where)
    with _folder_lock(folder):  # before reading checkpoints: a live writer may be replacing them
        return _resume(folder, sc_path, progress, warn, interruptible)


def _resume(folder: Path, sc_path: Path, progress, warn, interruptible: bool) -> RunResult:
    from netsim.metrics.summary import EventCounts
    from netsim.sim import checkpoint
    from netsim.trace.io import TraceWriter

    sc = load_scenario(sc_path)
    text = to_toml(sc)
    ck = checkpoint.latest(folder, warn)
    head = ck.meta
    if head.get("resumable") is False:
        raise InputError("", "this run was started with a setup hook (netsim replay); it cannot be "
                             "rebuilt from its folder, run it again", str(ck.path))
    if scenario_hash(sc_path.read_text()) != head["scenario_sha256"]:
        raise InputError("", "changed since the checkpoint was written (its sha256 differs); resume needs "
                             "the scenario the run started with", str(sc_path))
    if head.get("netsim") != __version__:
        warn(f"{ck.path}: written by netsim {head.get('netsim')}, this is {__version__}; the rebuilt run "
             "is checked against it")
    trace = head["trace"]
    trace_path = folder / TRACE_FILE
    if trace["file"] and (not trace_path.is_file() or trace_path.stat().st_size < trace["bytes"]):
        raise InputError("", f"missing or shorter than the checkpoint's {trace['bytes']} bytes", str(trace_path))
    counts = EventCounts()
    meta = {"netsim.scenario": text, "netsim.scenario_sha256": head["scenario_sha256"],
            "netsim.version": __version__}
    writer = TraceWriter(None, meta, sc.run.trace_flush_every, on_batch=counts, lazy=True)  # silent rebuild
    sim = prepare(sc, writer, str(sc_path))
    sim.counts = counts
    sim.restored_metrics = list(head["metrics"])
    sim.start(progress)
    sim.advance(to_step=ck.step)
    if sim.boundary_due():
        sim.boundary()  # the checkpoint's own mark: flush as the original did (no checkpointer yet)
    bad = (f"the run stopped at event {sim.steps}" if sim.steps != ck.step
           else f"trace position {writer.count}+{len(writer.buffer)} events"
           if (writer.count, len(writer.buffer)) != (trace["events"], trace.get("pending", 0))
           else checkpoint.mismatch(ck, *checkpoint.capture(sim)))
    if bad:
        raise InputError("", f"the rebuilt run differs from this checkpoint at {bad} (netsim, its data or the "
                             "platform changed since it was written)", str(ck.path))
    if trace["file"]:
        try:
            writer.reopen(trace_path, trace["bytes"], trace["events"], trace["sha256"])
        except ValueError as e:
            raise InputError("", str(e), str(trace_path)) from None
    result = _complete(sim, folder, counts, meta, resumable=True, interruptible=interruptible)
    result.summary.setdefault("resumed_at_step", ck.step)
    return result


def _complete(sim, folder: Path, counts, meta: dict[str, str], resumable: bool, interruptible: bool) -> RunResult:
    """Run a started simulation to its end (or an interrupt) and write the run folder."""
    from netsim.sim import checkpoint

    sc = sim.scenario
    header = {"scenario_sha256": meta["netsim.scenario_sha256"], "netsim": __version__, "seed": sc.run.seed,
              "resumable": resumable}
    if sc.run.checkpoint_every is not None or sc.run.checkpoint_every_rounds is not None:
        sim.checkpointer = lambda s, kind: checkpoint.write(s, folder, sc.run.checkpoint_keep, kind, header)
    # The handler stays while the outputs are written: a Ctrl-C after the simulation ended is ignored (the
    # outputs take a moment and the run is done); a second one aborts at once.
    with _sigint_stops(sim, interruptible):
        try:
            sim.advance()
        except Exception as exc:  # noqa: BLE001 - an algorithm's bug: keep what the run did, then re-raise
            _write_crash(sim, folder, counts, meta, exc)
        stopped = sim.interrupted
        return _write_outputs(sim, folder, counts, meta, header, stopped)


def _write_outputs(sim, folder: Path, counts, meta: dict[str, str], header: dict[str, Any],
                   stopped: bool) -> RunResult:
    from netsim.metrics.report import plot_metrics, write_agent_metrics, write_metrics, write_summary
    from netsim.sim import checkpoint

    sc = sim.scenario
    path = checkpoint.write(sim, folder, sc.run.checkpoint_keep, "interrupt", header) if stopped else None
    sim.finish(stopped)
    summary = _summary(sim, counts, meta)
    if path is not None:
        summary["checkpoint"] = str(path)
        write_summary(summary, folder / PARTIAL_SUMMARY)
        return RunResult(folder, sc, summary, sim.metrics)
    write_metrics(sim.metrics, folder / "metrics", sc.evaluation.format)
    plot_metrics(sim.metrics, folder / "plot.png", f"{sc.name}: {sc.algorithm.name}, {sc.agents.count} agents")
    write_agent_metrics(sim.agent_metrics, folder, f"{sc.name}: {sc.algorithm.name}, each agent's own model")
    if sc.privacy is not None and sc.privacy.record is not None:
        from netsim.privacy.views import write_mixing

        write_mixing(sim, folder)
    write_summary(summary, folder / SUMMARY_FILE)  # last and atomic: a killed run never looks complete
    (folder / PARTIAL_SUMMARY).unlink(missing_ok=True)
    for old in checkpoint.checkpoints(folder):  # a complete run needs none (they hold whole parameter banks)
        shutil.rmtree(old, ignore_errors=True)
    return RunResult(folder, sc, summary, sim.metrics)


def _crash_site(exc: BaseException) -> str:
    """``file:line in function`` of the innermost frame of the traceback that is not in Python's own
    library or an installed package (the algorithm's line, or netsim's); else the innermost frame."""
    import sysconfig
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    skip = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
    own = [f for f in frames if not f.filename.startswith(skip) or "/netsim/" in f.filename]
    f = (own or frames)[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


def _inside_netsim(exc: BaseException) -> bool:
    """Whether the exception was raised in netsim's own machinery (the kernel, network, compute, trace, privacy
    layers, the API or replay) rather than in an algorithm's program or a plugin: then it is netsim's bug, not
    the program's, even when a program's call led there."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if Path(f.filename).resolve().is_relative_to(Path(__file__).resolve().parent)]
    if not own or own[-1] is not frames[-1] and not _library(frames[-1].filename):
        return False
    rel = Path(own[-1].filename).resolve().relative_to(Path(__file__).resolve().parent).parts
    return rel[0] not in ("algorithms", "rounds", "comm")


def _library(filename: str) -> bool:
    """A frame of the standard library or an installed package (torch, simpy): not a program's own."""
    import sysconfig

    return filename.startswith(tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}))


def _write_crash(sim, folder: Path, counts, meta: dict[str, str], exc: Exception):
    """An exception inside the simulation: flush the trace (left without its end, so it reads as partial),
    write ``summary.partial.json`` naming the error, where, which agent and when, then raise: the
    InputError itself (bad input found at run time), otherwise RunCrashed from the original exception."""
    import traceback

    from netsim.errors import RunCrashed
    from netsim.metrics.report import write_summary

    # simpy re-raises a failed process's exception as a copy whose __cause__ is the original
    cause = exc.__cause__ if type(exc.__cause__) is type(exc) else None
    root = cause or exc
    agent = next((i for i, proc in sim.programs if proc.triggered and not proc.ok and proc.value is root), None)
    t = float(sim.env.now)
    error = {"type": type(root).__name__, "message": str(root), "where": _crash_site(root), "agent": agent,
             "t": t, "inside_netsim": _inside_netsim(root),
             "traceback": traceback.format_exception(type(root), root, root.__traceback__)}
    sim.stop_reason = "error"
    sim.writer.sync()  # every event so far; no end-of-stream marker: the trace is partial
    sc = sim.scenario
    k = counts.kinds
    summary = {"scenario": sc.name, "algorithm": sc.algorithm.name, "seed": sc.run.seed, "agents": sc.agents.count,
               "simulated_time": t, "stop_reason": "error", "error": error,
               "messages_sent": k["send"], "messages_delivered": k["deliver"], "messages_dropped": k["drop"],
               "activations": k["activate"], "events": counts.total,
               "wall_time": sim.wall_time(),
               "scenario_sha256": meta["netsim.scenario_sha256"], "python": platform.python_version()}
    write_summary(summary, folder / PARTIAL_SUMMARY)
    if isinstance(exc, InputError):
        raise exc
    raise RunCrashed(folder, error) from root


@contextmanager
def _sigint_stops(sim, enabled: bool):
    """SIGINT asks the simulation to stop at the next event boundary; a second one stops at once."""
    import signal
    import threading

    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if sim.interrupted:
            raise KeyboardInterrupt
        sim.interrupt()

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _summary(sim, counts, meta: dict[str, str]) -> dict[str, Any]:
    sc = sim.scenario
    final = sim.metrics[-1]
    k = counts.kinds
    summary = {
        "scenario": sc.name, "algorithm": sc.algorithm.name, "seed": sc.run.seed, "agents": sc.agents.count,
        **{k_: v for k_, v in final.items() if k_ != "time"},
        "simulated_time": float(sim.env.now), "stop_reason": sim.stop_reason,
        "messages_sent": k["send"], "messages_delivered": k["deliver"], "messages_dropped": k["drop"],
        "messages_stale": k["stale"], "round_timeouts": k["timeout"], "bytes_sent": counts.bytes_sent,
        "activations": k["activate"], "gradients": k["compute_start"],
        "gradient_batches": sim.gradients.calls,
        "mean_gradient_batch": sim.gradients.evaluated / max(1, sim.gradients.calls),
        "events": counts.total, "wall_time": sim.wall, "events_per_s": counts.total / max(sim.wall, 1e-9),
        "spectral_gap": sim.gap, "device": str(sim.device), "scenario_sha256": meta["netsim.scenario_sha256"],
        "python": platform.python_version(),
    }
    summary.update(_comm_fields(sim))
    if sim.engine != "events":
        summary["engine"] = sim.engine  # the trace is the engine's; the wall time is not
    head = sc.evaluation.headline
    if head is not None:
        summary["headline"] = {"metric": head, "value": final.get(head)}
    if any(a.existing_ledger is not None for a in sim.agents):
        from netsim.privacy.report import run_summary

        summary.update(run_summary(sim))  # worst agent's epsilon (netsim privacy RUN for the full report)
    return summary


def _comm_fields(sim) -> dict[str, Any]:
    """Time to the target accuracy and the communication parts' counters."""
    from netsim.comm.stats import comm_summary
    from netsim.metrics.compare import time_to_target

    out: dict[str, Any] = {}
    target = sim.scenario.evaluation.target_accuracy
    if target is not None:
        out["target_accuracy"] = target
        out["time_to_target"] = time_to_target(sim.metrics, target)
    out.update(comm_summary(sim))
    return out
