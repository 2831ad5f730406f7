"""A run folder: the one object that owns what a run writes (docs/architecture.md, "Run folders").

``api.run`` and ``api.resume`` read as prepare -> run -> write: the API builds the simulation (every check,
nothing written), then a ``RunFolder`` takes it from there: its lock (one writer per folder), the fresh start
(every file of a previous run removed, its checkpoints too, before anything is written; then
``scenario.toml``), the trace writer and its event
counts, the checkpoints while the run goes, the SIGINT handler, the crash files when a program fails
(``summary.partial.json`` naming the error), and the outputs at the end (metrics, plots, ``summary.json``
last and atomically: its presence marks a complete run, its ``files`` the files the run wrote, which readers
check: ``netsim.trace.folder``).
"""

from __future__ import annotations

import os
import platform
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from netsim.errors import InputError
from netsim.trace.folder import (  # noqa: F401 - the folder's names: defined where every reader can see them
    END_FILES,
    LOCK_FILE,
    PARTIAL_SUMMARY,
    RUN_FILES,
    SCENARIO_FILE,
    SUMMARY_FILE,
    end_files,
)
from netsim.trace.folder import live_writer as _live_writer
from netsim.trace.io import TRACE_FILE

RESULT_FILES = RUN_FILES  # a folder holding any of these holds a run's results: refused without --force


def is_complete(folder: str | Path) -> bool:
    return (Path(folder) / SUMMARY_FILE).is_file()


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


class RunFolder:
    """One run's folder and what it writes: ``path``, the trace metadata (``meta``: the scenario's canonical
    text, its sha256, netsim's version), the event counts the trace writer feeds (``counts``) and the
    checkpoints' header."""

    def __init__(self, path: Path, scenario, text: str, sha256: str, version: str, resumable: bool = True):
        from netsim.metrics.summary import EventCounts

        self.path, self.scenario, self.text = Path(path), scenario, text
        self.meta = {"netsim.scenario": text, "netsim.scenario_sha256": sha256, "netsim.version": version}
        self.counts = EventCounts()
        self.header = {"scenario_sha256": sha256, "netsim": version, "seed": scenario.run.seed,
                       "resumable": resumable}

    def trace_writer(self, silent: bool = False):
        """The trace writer for this folder (lazy: nothing is written before the first flush); ``silent``
        writes nothing at all (a resumed run rebuilding up to its checkpoint)."""
        from netsim.trace.io import TraceWriter

        sc = self.scenario
        path = self.path / TRACE_FILE if sc.run.trace and not silent else None
        return TraceWriter(path, self.meta, sc.run.trace_flush_every, on_batch=self.counts, lazy=True)

    # the lock and the fresh start ---------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """One writer per run folder: a second ``run``/``resume`` on a folder another live netsim process is
        writing is refused (a killed process leaves a stale lock, which is taken over)."""
        lock = self.path / LOCK_FILE
        other = _live_writer(self.path)
        if other is not None:
            raise InputError("", f"process {other} is writing this run folder (delete {LOCK_FILE} if it is "
                                 "not netsim)", str(self.path))
        lock.write_text(str(os.getpid()))
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)

    def create(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError("run.out", f"cannot create output folder {str(self.path)!r}: {e.strerror or e}") \
                from None

    def start_fresh(self) -> None:
        """Inside the lock, before anything of this run is written: every file of a previous run removed
        (``RUN_FILES``: its summary first, so the folder never looks complete meanwhile, then its trace, metrics,
        plots, reports and their temporary files), and its checkpoints, which must never be resumed here. So a
        run stopped at any point (Ctrl-C, a kill) leaves only its own files beside ``scenario.toml``."""
        from netsim.sim import checkpoint

        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
            (self.path / (name + ".tmp")).unlink(missing_ok=True)
        for old in checkpoint.checkpoints(self.path):
            shutil.rmtree(old)
        (self.path / SCENARIO_FILE).write_text(self.text)

    # the run ---------------------------------------------------------------------------------------------
    def run(self, sim, interruptible: bool) -> tuple[dict[str, Any], list]:
        """Run a started simulation to its end (or an interrupt), checkpointing as the scenario asks, then
        write the outputs: (summary, metrics rows). An exception inside the run writes the crash files and
        is raised (``write_crash``)."""
        from netsim.sim import checkpoint

        sc = sim.world.scenario
        if sc.run.checkpoint_every is not None or sc.run.checkpoint_every_rounds is not None:
            sim.checkpoint_with(lambda s, kind: checkpoint.write(s, self.path, sc.run.checkpoint_keep, kind,
                                                                 self.header))
        # The handler stays while the outputs are written: a Ctrl-C after the simulation ended is ignored (the
        # outputs take a moment and the run is done); a second one aborts at once.
        with _sigint_stops(sim, interruptible):
            try:
                sim.advance()
            except Exception as exc:  # noqa: BLE001 - an algorithm's bug: keep what the run did, then re-raise
                self.write_crash(sim, exc)
            return self.write(sim, sim.interrupted)

    def write(self, sim, stopped: bool) -> tuple[dict[str, Any], list]:
        """The outputs of a run that ended (``summary.json`` last), or of one that was stopped (a checkpoint
        and ``summary.partial.json``)."""
        from netsim.metrics.report import plot_metrics, write_agent_metrics, write_metrics, write_summary
        from netsim.sim import checkpoint

        sc, folder, rec = sim.world.scenario, self.path, sim.recorder
        path = checkpoint.write(sim, folder, sc.run.checkpoint_keep, "interrupt", self.header) if stopped else None
        sim.finish(stopped)
        summary = self.summary(sim)
        if path is not None:
            summary["checkpoint"] = str(path)
            write_summary(summary, folder / PARTIAL_SUMMARY)
            return summary, rec.metrics
        write_metrics(rec.metrics, folder / "metrics", sc.evaluation.format)
        plot_metrics(rec.metrics, folder / "plot.png", f"{sc.name}: {sc.algorithm.name}, {sc.agents.count} agents")
        write_agent_metrics(rec.agent_metrics, folder, f"{sc.name}: {sc.algorithm.name}, each agent's own model")
        if sc.privacy is not None and sc.privacy.record is not None:
            from netsim.privacy.views import write_mixing

            write_mixing(sim, folder)
        summary["files"] = end_files(folder)  # what this run wrote: readers refuse any other beside it
        write_summary(summary, folder / SUMMARY_FILE)  # last and atomic: a killed run never looks complete
        (folder / PARTIAL_SUMMARY).unlink(missing_ok=True)
        for old in checkpoint.checkpoints(folder):  # a complete run needs none (they hold whole parameter banks)
            shutil.rmtree(old, ignore_errors=True)
        with suppress(OSError):  # nor their folder, once empty (anything else in it stays)
            (folder / checkpoint.FOLDER).rmdir()
        return summary, rec.metrics

    def write_crash(self, sim, exc: Exception):
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
        t = float(sim.loop.env.now)
        error = {"type": type(root).__name__, "message": str(root), "where": _crash_site(root), "agent": agent,
                 "t": t, "inside_netsim": _inside_netsim(root),
                 "traceback": traceback.format_exception(type(root), root, root.__traceback__)}
        sim.crashed()  # every event so far; no end-of-stream marker: the trace is partial
        sc = sim.world.scenario
        k = self.counts.kinds
        summary = {"scenario": sc.name, "algorithm": sc.algorithm.name, "seed": sc.run.seed,
                   "agents": sc.agents.count, "simulated_time": t, "stop_reason": "error", "error": error,
                   "messages_sent": k["send"], "messages_delivered": k["deliver"], "messages_dropped": k["drop"],
                   "activations": k["activate"], "events": self.counts.total,
                   "wall_time": sim.wall_time(),
                   "scenario_sha256": self.meta["netsim.scenario_sha256"], "python": platform.python_version()}
        write_summary(summary, self.path / PARTIAL_SUMMARY)
        if isinstance(exc, InputError):
            raise exc
        raise RunCrashed(self.path, error) from root

    def summary(self, sim) -> dict[str, Any]:
        sc, world, loop = sim.world.scenario, sim.world, sim.loop
        final = sim.recorder.metrics[-1]
        counts = self.counts
        k = counts.kinds
        summary = {
            "scenario": sc.name, "algorithm": sc.algorithm.name, "seed": sc.run.seed, "agents": sc.agents.count,
            **{k_: v for k_, v in final.items() if k_ != "time"},
            "simulated_time": float(loop.env.now), "stop_reason": loop.stop_reason,
            "messages_sent": k["send"], "messages_delivered": k["deliver"], "messages_dropped": k["drop"],
            "messages_stale": k["stale"], "round_timeouts": k["timeout"], "bytes_sent": counts.bytes_sent,
            "activations": k["activate"], "gradients": k["compute_start"],
            "gradient_batches": world.gradients.calls,
            "mean_gradient_batch": world.gradients.evaluated / max(1, world.gradients.calls),
            "events": counts.total, "wall_time": loop.wall, "events_per_s": counts.total / max(loop.wall, 1e-9),
            "spectral_gap": world.gap, "device": str(world.device),
            "scenario_sha256": self.meta["netsim.scenario_sha256"], "python": platform.python_version(),
        }
        summary.update(_comm_fields(sim))
        summary["engine"] = loop.engine  # the trace is the engine's either way; the wall time is not
        refused = sim.services.find("windowed_refused")  # --engine auto that fell back on the events engine: why
        if refused is not None:
            summary["windowed_refused"] = refused
        if loop.engine != "events":
            windows = sim.services.find("windows")  # rounds/lookahead.py: why the run is as fast as it is
            if windows is not None:
                summary["windows"] = windows.summary()
        if sim.recorder.diverged is not None:  # when, where and what (sim/recorder.py ``watch``)
            summary["diverged"] = sim.recorder.diverged
        if sim.recorder.resumed is not None:  # how the resumed run reached its checkpoint, and how long that took
            summary["resumed_by"], summary["resume_wall_time"] = sim.recorder.resumed
        head = sc.evaluation.headline
        if head is not None:
            summary["headline"] = {"metric": head, "value": final.get(head)}
        if any(a.existing_ledger is not None for a in loop.agents):
            from netsim.privacy.report import run_summary

            summary.update(run_summary(sim))  # worst agent's epsilon (netsim privacy RUN for the full report)
        return summary


def _comm_fields(sim) -> dict[str, Any]:
    """Time to the target accuracy and the communication parts' counters."""
    from netsim.comm.stats import comm_summary
    from netsim.metrics.compare import time_to_target

    out: dict[str, Any] = {}
    target = sim.world.scenario.evaluation.target_accuracy
    if target is not None:
        out["target_accuracy"] = target
        out["time_to_target"] = time_to_target(sim.recorder.metrics, target)
    out.update(comm_summary(sim))
    return out


def _crash_site(exc: BaseException) -> str:
    """``file:line in function`` of the innermost frame of the traceback that is not in Python's own
    library or an installed package (the algorithm's line, or netsim's); else the innermost frame."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    own = [f for f in frames if not _library(f.filename) or "/netsim/" in f.filename]
    f = (own or frames)[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


def _inside_netsim(exc: BaseException) -> bool:
    """Whether the exception was raised in netsim's own machinery (the kernel, network, compute, trace, privacy
    layers, the API or replay) rather than in an algorithm's program or a plugin: then it is netsim's bug, not
    the program's, even when a program's call led there."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    here = Path(__file__).resolve().parent
    own = [f for f in frames if Path(f.filename).resolve().is_relative_to(here)]
    if not own or own[-1] is not frames[-1] and not _library(frames[-1].filename):
        return False
    rel = Path(own[-1].filename).resolve().relative_to(here).parts
    return rel[0] not in ("algorithms", "rounds", "comm")


def _library(filename: str) -> bool:
    """A frame of the standard library or an installed package (torch, simpy): not a program's own."""
    import sysconfig

    return filename.startswith(tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}))


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
