"""The Python API; the CLI is a thin layer over it.

    >>> import netsim
    >>> result = netsim.run("scenarios/quickstart.toml", overrides={"run.seed": 1}, out="runs/q1")
    >>> result.summary["accuracy"]
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from netsim.errors import InputError, did_you_mean
from netsim.run_folder import (  # noqa: F401 - the API's names for a run folder's files and checks
    LOCK_FILE,
    PARTIAL_SUMMARY,
    RESULT_FILES,
    SUMMARY_FILE,
    RunFolder,
    check_fresh,
    is_complete,
)
from netsim.scenario import Scenario, load_scenario, scenario_hash, to_toml
from netsim.scenario.load import apply_overrides, scenario_from_dict, to_dict
from netsim.trace.io import TRACE_FILE, file_sha_ahead
from netsim.validation import check_closed_form, precheck  # noqa: F401 - precheck: validate --quick's checks

__version__ = "0.1.0"



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


def prepare(scenario: Scenario, writer=None, source: str | None = None, counts=None,
            restored_metrics: list[dict[str, float]] | None = None, restored_tracking: dict | None = None):
    """Build (but do not run) the simulation: every check that needs more than the file happens here
    (algorithm and its parameters, topology, data files). Errors name ``source``, the scenario file.
    ``counts``: the event counter the trace writer feeds; ``restored_metrics``: a checkpoint's metrics rows,
    reused while a resumed run is rebuilt up to it; ``restored_tracking``: its tracking oracle's warm start."""
    from netsim.algorithms import resolve
    from netsim.algorithms.registry import check_topology
    from netsim.sim import footprint
    from netsim.sim.kernel import Simulation

    try:
        footprint.check(scenario)  # refuse what cannot fit before building it (a dense graph at scale)
        program, params = resolve(scenario.algorithm)
        check_topology(scenario)
        check_closed_form(scenario, source)
        from netsim.privacy.ledger import new_ledger
        from netsim.privacy.views import mixing_log_for

        return Simulation(scenario, program, params, writer=writer, ledger=new_ledger, mixing=mixing_log_for,
                          counts=counts, restored_metrics=restored_metrics, restored_tracking=restored_tracking)
    except InputError as e:
        raise e.at(source) if source else e from None


def run(scenario: Scenario | str | Path, overrides: dict[str, Any] | None = None, out: str | Path | None = None,
        progress: Callable[[float], None] | None = None,
        setup: Callable[[Any], None] | None = None, interruptible: bool = True,
        engine: str = "auto") -> RunResult:
    """Validate, build, run and write one run folder. ``setup(sim)`` may adjust the
    built simulation before it runs (``netsim replay`` installs the recorded network this way). ``engine``: "auto"
    (the windowed engine where it is exact, else the events engine; the summary's ``engine`` says which ran and
    ``windowed_refused`` why not the windows), "events" (the reference) or "windowed" (refused where not exact).

    With ``interruptible`` (in the main thread), SIGINT (Ctrl-C) stops the run at the next event
    boundary: the trace is flushed, a checkpoint and ``summary.partial.json`` are written, and the
    result's ``summary["stop_reason"]`` is ``"interrupted"``; ``resume(folder)`` continues it."""
    check_engine(engine)  # before anything is read or built
    sc = resolve_scenario(scenario, overrides)
    text = to_toml(sc)
    folder = RunFolder(output_dir(sc, out), sc, text, scenario_hash(text), __version__, resumable=setup is None)
    # prepare: every check, nothing written (an InputError here leaves the folder as it was). The objects already
    # alive (the imported modules': none of it garbage) are left out of the collections made while the run is built
    # (at 10,000 agents those collections were ~45% of the set-up, scanning the same long-lived objects each time)
    gc.freeze()
    try:
        sim = prepare(sc, folder.trace_writer(), source_of(scenario), counts=folder.counts)
    finally:
        gc.unfreeze()
    if setup is not None:
        setup(sim)
    _choose_engine(sim, engine, source_of(scenario))
    folder.create()
    with folder.locked():
        folder.start_fresh()
        sim.start(progress)  # run, then write
        return RunResult(folder.path, sc, *folder.run(sim, interruptible))


def check_engine(engine: str) -> None:
    """Refuse an engine name no engine has (``--engine turbo``), with the likely intended one."""
    if engine not in ENGINES:
        raise InputError("--engine", f"unknown engine {engine!r}; {did_you_mean(engine, ENGINES)}one of: "
                                     f"{', '.join(ENGINES)}")


def _choose_engine(sim, engine: str, source: str | None) -> None:
    check_engine(engine)
    if engine in ("windowed", "auto"):
        from netsim.rounds import exactness, windowed

        if engine == "auto":  # the events engine where the windows refuse, and the summary says why in one line
            why = windowed.reason(sim) or exactness.refusal(sim)  # a plugin kernel: checked before it is batched
            if why is not None:
                sim.services.put("windowed_refused", why)
                return
        else:
            why = windowed.refusal(sim) or exactness.refusal(sim)
            if why is not None:
                raise InputError("--engine", f"windowed cannot run this scenario exactly: {why}; --engine auto (the "
                                             "default) runs it on the events engine", source)
        sim.use_runner("windowed", windowed.run)


# how a run is executed; both engines write the same trace (netsim/rounds/); auto (the default): windowed where it is
# exact, else events
ENGINES = ("events", "windowed", "auto")


def resume(folder: str | Path, progress: Callable[[float], None] | None = None,
           warn: Callable[[str], None] = lambda line: None, interruptible: bool = True) -> RunResult:
    """Continue an interrupted or killed run from its newest checkpoint that verifies (older ones are
    tried when the newest is corrupted; each rejection goes to ``warn``). A windowed run's checkpoint is
    restored (its state between rounds is explicit: sim/restore.py); an events run's is reached by rebuilding
    the run up to it without output (netsim/sim/checkpoint.py says why). Either way the state is checked
    against the checkpoint exactly, then the run goes on writing: its trace after the checkpoint and its final
    metrics equal the uninterrupted run's. ``summary["resumed_by"]`` says which ("restore" or "re-execution")."""
    folder = Path(folder)
    where = str(folder)
    if not folder.is_dir():
        raise InputError("", "no such run folder", where)
    if is_complete(folder):
        raise InputError("", f"the run is complete ({SUMMARY_FILE} exists): nothing to resume", where)
    sc_path = folder / "scenario.toml"
    if not sc_path.is_file():
        raise InputError("", "not a run folder (no scenario.toml)", where)
    sc = load_scenario(sc_path)
    text = to_toml(sc)
    run_folder = RunFolder(folder, sc, text, scenario_hash(sc_path.read_text()), __version__)
    with run_folder.locked():  # before reading checkpoints: a live writer may be replacing them
        return _resume(run_folder, sc_path, progress, warn, interruptible)


def _resume(run_folder: RunFolder, sc_path: Path, progress, warn, interruptible: bool) -> RunResult:
    from netsim.sim import checkpoint

    t0 = time.perf_counter()
    folder, sc = run_folder.path, run_folder.scenario
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
    if trace["file"] and trace["bytes"] and (not trace_path.is_file() or trace_path.stat().st_size < trace["bytes"]):
        raise InputError("", f"missing or shorter than the checkpoint's {trace['bytes']} bytes", str(trace_path))
    hashed = file_sha_ahead(trace_path, trace["bytes"]) if trace["file"] and trace["bytes"] else None
    writer = run_folder.trace_writer(silent=True)  # the rebuild up to the checkpoint writes nothing
    # the checkpoint's data (a container per agent, link and stream) is left out of the collections made while the
    # run is built and put back: each would scan it again, and none of it is garbage (10,000 agents: ~0.1 s)
    gc.freeze()
    try:
        sim, how, bad = _rebuild(sc, sc_path, run_folder, writer, ck, progress)
    finally:
        gc.unfreeze()
    if bad:
        raise InputError("", f"the {'restored' if how == 'restore' else 'rebuilt'} run differs from this checkpoint "
                             f"at {bad} (netsim, its data or the platform changed since it was written)", str(ck.path))
    if trace["file"]:
        try:
            writer.reopen(trace_path, trace["bytes"], trace["events"], trace["sha256"], hashed)
        except ValueError as e:
            raise InputError("", str(e), str(trace_path)) from None
    sim.resumed(how, time.perf_counter() - t0)
    result = RunResult(folder, sc, *run_folder.run(sim, interruptible))
    result.summary.setdefault("resumed_at_step", ck.step)
    return result


def _rebuild(sc: Scenario, sc_path: Path, run_folder: RunFolder, writer, ck, progress) -> tuple[Any, str, str | None]:
    """The run brought to the checkpoint: restored (a windowed run's state between rounds) or re-executed (an events
    run's); returns the simulation, which of the two, and where it differs from the checkpoint (None: nowhere)."""
    from netsim.sim import checkpoint

    head, trace = ck.meta, ck.meta["trace"]
    tracking = head.get("tracking")  # the ``tracking`` metric's warm start (its kinds checked when read)
    sim = prepare(sc, writer, str(sc_path), counts=run_folder.counts, restored_metrics=head["metrics"],
                  restored_tracking=tracking)
    if tracking is not None and len(tracking["theta"]) != sim.world.bank.W.shape[1]:
        raise InputError("", f"cannot be restored (its tracking oracle's warm start has {len(tracking['theta'])} "
                             f"values, the model {sim.world.bank.W.shape[1]} parameters)", str(ck.path))
    if head.get("engine", "events") == "windowed":  # explicit state between rounds: restored, nothing recomputed
        from netsim.rounds import lookahead
        from netsim.sim import restore

        _choose_engine(sim, "windowed", str(sc_path))
        sim.start(progress, evaluate=False)  # the recorder's rows are the checkpoint's
        try:
            known = restore.restore(sim, ck)
            lookahead.check_restored(sim)  # a lookahead driver's own state, by its driver, before anything is written
        except (KeyError, ValueError, TypeError, IndexError, AttributeError, OverflowError, RuntimeError) as e:
            raise InputError("", f"cannot be restored ({type(e).__name__}: {e})", str(ck.path)) from None
        bad = checkpoint.mismatch(ck, *checkpoint.capture(sim, normalise=False, columns=True, restored=True),
                                  restored=True, known=known)  # again
        how = "restore"
    else:  # a coroutine program's state is its generators: the run is re-executed up to the checkpoint
        if isinstance(head.get("windowed_refused"), str):  # started by --engine auto: why not the windows, as it said
            sim.services.put("windowed_refused", head["windowed_refused"])
        sim.start(progress)
        sim.advance(to_step=ck.step)
        if sim.boundary_due():
            sim.boundary()  # the checkpoint's own mark: flush as the original did (no checkpointer yet)
        bad = (f"the run stopped at event {sim.loop.steps}" if sim.loop.steps != ck.step
               else f"trace position {writer.count}+{len(writer.buffer)} events"
               if (writer.count, len(writer.buffer)) != (trace["events"], trace.get("pending", 0))
               else checkpoint.mismatch(ck, *checkpoint.capture(sim, normalise=False)))
        how = "re-execution"
    return sim, how, bad
