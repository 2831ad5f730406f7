"""Command line: a thin layer over netsim.api. Heavy modules are imported inside the commands,
so ``netsim --help`` answers at once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import attrs
import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="netsim: asynchronous discrete-event simulator for decentralized, private learning.")

SetOpt = typer.Option(None, "--set", help="override a scenario key: --set network.loss=0.1 (repeatable)")
PluginOpt = typer.Option(None, "--plugin", help="Python file that registers algorithms, models, datasets, "
                                                "closed forms, accountants, event kinds, link models, "
                                                "activation schedules... (repeatable)")


def _version(value: bool) -> None:
    if value:
        from netsim import __version__

        typer.echo(f"netsim {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print netsim's version and exit")) -> None:
    """netsim: asynchronous discrete-event simulator for decentralized, private learning."""


def _fail(err) -> None:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(2)


def _warn_unchecked(path: Path) -> None:
    """A trace written without batch checksums is read, unverified, with this warning (docs/traces.md)."""
    from netsim.trace.io import unchecked_note

    note = unchecked_note(path)
    if note:
        typer.echo(f"warning: {note}", err=True)


def _crashed(err) -> None:
    """A run that crashed inside the simulation (a program error, not bad input): one line, exit 1."""
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(1)


ForceOpt = typer.Option(False, "--force", help="replace the results already in the output folder")


def _overrides(items: list[str] | None) -> dict:
    from netsim.scenario import parse_override

    return dict(parse_override(i) for i in items or [])


def _plugins(paths: list[str] | None) -> None:
    from netsim.algorithms import load_plugin

    for p in paths or []:
        load_plugin(p)


def _summary_table(summary: dict):
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"{summary['scenario']} · {summary['algorithm']} · {summary['agents']} agents · "
                    f"seed {summary['seed']}", show_header=False)
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")

    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    if isinstance(summary.get("diverged"), dict):  # first: every figure below is of a diverged run
        t.add_row("[bold red]DIVERGED", f"[bold red]{_diverged_line(summary['diverged'])}")
    head = summary.get("headline")
    if isinstance(head, dict) and head.get("value") is not None:
        t.add_row(f"headline: {head['metric']}", f"[bold green]{fmt(head['value'])}")
    rows = [("test accuracy (average model)", "accuracy"), ("test loss (average model)", "loss"),
            ("consensus distance", "consensus"), ("mean agent accuracy", "agent_accuracy_mean"),
            ("training objective f(x̄)", "train_loss"), ("suboptimality f(x̄) − f*", "suboptimality"),
            ("messages sent", "messages_sent"), ("messages dropped", "messages_dropped"),
            ("stale messages", "messages_stale"), ("round timeouts", "round_timeouts"),
            ("bytes sent", "bytes_sent"), ("gradients (batched calls)", "gradients"),
            ("simulated time (s)", "simulated_time"), ("stopped by", "stop_reason"),
            ("wall time (s)", "wall_time"), ("engine", "engine"), ("events", "events"),
            ("events/s", "events_per_s"),
            ("spectral gap", "spectral_gap")]
    rows += [("time to target accuracy (s)", "time_to_target"), ("trigger sends skipped", "trigger_skipped"),
             ("fraction saved by triggers", "trigger_saved_fraction"),
             ("gradient staleness (mean)", "adpsgd_staleness_mean"),
             ("gossip refused (busy)", "gossip_refused")]
    eps_label = "worst agent epsilon (RDP)" if summary.get("privacy_guarantee") is not False else \
        "worst agent epsilon (RDP): NOT a guarantee, trigger-decided releases"
    rows += [(eps_label, "privacy_epsilon_max"), ("at delta", "privacy_delta"),
             ("privacy releases", "privacy_releases"), ("agents out of budget", "privacy_exhausted")]
    for label, key in rows:
        if key in summary and summary[key] is not None:
            v = fmt(summary[key])
            if key == "gradients":
                v += f" ({fmt(summary['gradient_batches'])})"
            t.add_row(label, v)
            if key == "engine" and summary.get("windowed_refused"):
                t.add_row("why not windowed", Text(summary["windowed_refused"], justify="left"))  # prose: read it
            if key == "engine" and isinstance(summary.get("windows"), dict):
                w = summary["windows"]  # lookahead windows: why the run is as fast as it is
                t.add_row("lookahead windows", f"{fmt(w['windows'])} of {fmt(w['lookahead_s'])} s")
                t.add_row("events per window (mean, min)",
                          f"{fmt(w['events_per_window_mean'])}, {fmt(w['events_per_window_min'])}")
                t.add_row("time in batched tensor calls", f"{100 * w['tensor_share']:.0f}% (gradients "
                                                          f"{100 * w['gradient_share']:.0f}%)")
                if "control_cpu_s" in w:  # near the wall time: the control (per-event Python) bounds the run
                    t.add_row("control CPU", f"{fmt(w['control_cpu_s'])} s")
    if summary.get("resumed_by") is not None:
        t.add_row("resumed by", f"{summary['resumed_by']} ({fmt(summary['resume_wall_time'])} s)")
    return t


def _diverged_line(d: dict) -> str:
    """summary.json's ``diverged`` in words: when, in which agent, what."""
    after = f" (sound at t = {d['after']:.6g} s)" if d.get("after") is not None else ""
    many = f", {d['agents']} agents in all" if d.get("agents", 0) > 1 else ""
    return f"at t = {d['t']:.6g} s{after}, agent {d['agent']}{many}: {d['what']}"


def _progress(name: str, horizon: float | None, quiet: bool, work):
    """Run ``work(progress)`` under a rich progress bar on stderr (simulated time out of ``horizon``). The
    bar appears with the first progress report, so an error found while setting up prints one line only."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    clock = "t = {task.completed:,.1f} / {task.total:,.1f} s" if horizon is not None else "t = {task.completed:,.1f} s"
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn(clock), TimeElapsedColumn(),
                   console=Console(stderr=True), disable=quiet, transient=False)
    task = bar.add_task(name, total=horizon)
    shown = False

    def progress(t: float) -> None:
        nonlocal shown
        if not shown:
            bar.start()
            shown = True
        bar.update(task, completed=t)

    try:
        result = work(progress)
        progress(result.summary["simulated_time"])
    finally:
        if shown:
            bar.stop()
    return result


def _report(result, quiet: bool) -> None:
    """The summary table and where the run went; an interrupted run says how to go on (exit 130)."""
    from rich.console import Console

    s = result.summary
    if s.get("stop_reason") == "interrupted":
        typer.echo(f"interrupted at t = {s['simulated_time']:.6g} s; trace flushed, checkpoint written to "
                   f"{s['checkpoint']}", err=True)
        typer.echo(f"continue with: netsim resume {result.out}", err=True)
        raise typer.Exit(130)
    if not quiet:
        Console().print(_summary_table(s))
    if isinstance(s.get("diverged"), dict):  # one line, quiet or not: the run's figures are of diverged models
        stop = ("stopped there (run.stop_on_divergence)" if s.get("stop_reason") == "diverged" else
                "run.stop_on_divergence = true stops there")
        typer.echo(f"warning: the run diverged {_diverged_line(s['diverged'])}; {stop}", err=True)
    extra = ", agent_metrics.csv, agent_accuracy.png" if (result.out / "agent_metrics.csv").is_file() else ""
    typer.echo(f"wrote {result.out}/ (trace.arrows, metrics, summary.json, plot.png{extra})")


@app.command()
def run(scenario: Path = typer.Argument(..., help="scenario TOML file"),
        set_: Optional[list[str]] = SetOpt,
        out: Optional[Path] = typer.Option(None, "--out", help="output folder (default: run.out)"),
        plugin: Optional[list[str]] = PluginOpt,
        force: bool = ForceOpt,
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar or table"),
        explore: bool = typer.Option(False, "--explore", help="follow the run in netsim explore while it is "
                                                              "simulated (the run itself is unchanged)"),
        engine: str = typer.Option("auto", "--engine", help="auto (default): windowed where it is exact, else events "
                                   "(the summary says which ran, and why not the windows: the rule and what to "
                                   "change); events: one event per message (any scenario, the reference); windowed: "
                                   "a round-kernel algorithm's rounds played as batched windows (D-PSGD, DP-D-PSGD, "
                                   "CHOCO-SGD, gossip learning, Muffliato, DFedSAM/DFedAvg, kernel plugins; "
                                   "asynchronous gossip, push SGD and push-sum as lookahead windows), the same trace, "
                                   "refused where it could differ")) -> None:
    """Run a scenario; write trace, metrics, summary and plot to its output folder (refused if it already
    holds results, unless --force). Ctrl-C stops it cleanly with a checkpoint (netsim resume continues)."""
    from netsim import api
    from netsim.errors import InputError, RunCrashed

    try:
        api.check_engine(engine)  # before a plugin, the scenario or the data is read
        _plugins(plugin)
        sc = api.resolve_scenario(scenario, _overrides(set_))
        folder = api.output_dir(sc, out)
        from netsim.sim.checkpoint import checkpoints

        if not force:
            api.check_fresh(folder)
        elif checkpoints(folder) and not api.is_complete(folder):
            typer.echo(f"warning: {folder} held an unfinished run with a checkpoint; starting over "
                       f"(netsim resume {folder} would have continued it)", err=True)
        if explore:
            if engine == "windowed":
                raise InputError("--engine", "--explore follows a run of the events engine; leave --engine out")
            if not sc.run.trace:
                raise InputError("run.trace", "--explore follows the trace: run.trace must be true").at(str(scenario))
            raise typer.Exit(_run_explored(scenario, set_ or [], folder, plugin or [], force))
        result = _progress(sc.name, sc.run.until, quiet,
                           lambda progress: api.run(scenario, _overrides(set_), out=out, progress=progress,
                                                    engine=engine))
    except InputError as e:
        _fail(e)
    except RunCrashed as e:
        _crashed(e)
    _report(result, quiet)


def _run_explored(scenario: Path, sets: list[str], folder: Path, plugins: list[str], force: bool) -> int:
    """``run --explore``: the run in a child process, the explorer following its trace (netsim/explore/live.py)."""
    from netsim.explore import live
    from netsim.trace.io import TRACE_FILE

    proc, log = live.start(live.child_command(scenario, sets, folder, plugins, force))
    try:
        tr = live.wait_for_trace(proc, folder / TRACE_FILE)
    except KeyboardInterrupt:
        tr = None
    if tr is not None and tr.table.num_rows:
        from netsim.explore.app import Explorer
        from netsim.explore.model import RunData

        Explorer(folder, RunData(folder), "", None, None).run()
    rc = live.finish(proc, log, typer.echo)
    if rc == 0 and (folder / "summary.json").is_file():  # the child ran quietly: its table, as a plain run's
        from rich.console import Console

        from netsim.metrics.report import read_summary

        Console().print(_summary_table(read_summary(folder)))
    return rc


@app.command()
def resume(run_folder: Path = typer.Argument(..., help="folder of an interrupted or killed run"),
           plugin: Optional[list[str]] = PluginOpt,
           quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar or table")) -> None:
    """Continue a run from its last good checkpoint: same final metrics and same trace after the
    checkpoint as an uninterrupted run (docs/checkpoints.md)."""
    from netsim import api
    from netsim.errors import InputError, RunCrashed
    from netsim.scenario import load_scenario

    try:
        _plugins(plugin)
        sc_path = run_folder / "scenario.toml"
        sc = load_scenario(sc_path) if sc_path.is_file() else None
        name = f"{sc.name} (resumed)" if sc else "resume"
        result = _progress(name, sc.run.until if sc else None, quiet,
                           lambda progress: api.resume(run_folder, progress,
                                                       warn=lambda line: typer.echo(f"warning: {line}", err=True)))
    except InputError as e:
        _fail(e)
    except RunCrashed as e:
        _crashed(e)
    s = result.summary
    if s.get("resumed_by") == "restore":
        typer.echo(f"resumed from round {s['resumed_at_step']} (restored, no recompute; "
                   f"{s['resume_wall_time']:.2f} s)", err=True)
    else:
        typer.echo(f"resumed from event {s['resumed_at_step']} (re-executed up to it; "
                   f"{s.get('resume_wall_time', 0.0):.2f} s)", err=True)
    _report(result, quiet)


@app.command()
def validate(scenario: Path = typer.Argument(..., help="scenario TOML file"),
             set_: Optional[list[str]] = SetOpt, plugin: Optional[list[str]] = PluginOpt,
             quick: bool = typer.Option(False, "--quick", help="only the keys, types, ranges, the algorithm's name, "
                                        "the topology and the memory estimate: no data read or generated (data "
                                        "files looked for, a warning if absent), no model, no algorithm "
                                        "parameters; its ok says so")
             ) -> None:
    """Check a scenario (keys, types, ranges, files, data, model, algorithm and its parameters, topology) as
    building it does, without running it; without torch (well under a second) unless it reads data files, loads a
    plugin or has checks that need the built simulation."""
    from netsim.errors import InputError
    from netsim.scenario import load_scenario
    from netsim.validation import QUICK_SKIPS, check, data_absent, precheck

    try:
        _plugins(plugin)
        sc = load_scenario(scenario, _overrides(set_))
        gap = precheck(sc, str(scenario)) if quick else check(sc, str(scenario), plugins=bool(plugin))
    except InputError as e:
        _fail(e)
    gap = "n/a" if gap is None else f"{gap:.4f}"
    head = "ok"
    if quick:  # what the keys alone cannot tell, said: and the data files that are not there, found without reading
        head = f"ok (quick: {QUICK_SKIPS})"
        absent = data_absent(sc)
        if absent is not None:
            typer.echo(f"warning: {absent.at(str(scenario))}; netsim validate without --quick, and netsim run, "
                       "refuse it", err=True)
            head = f"ok (quick: {QUICK_SKIPS}; data files absent)"
    typer.echo(f"{head}: {sc.name}: {sc.agents.count} agents, {sc.topology.kind} ({sc.topology.mixing_kind}, "
               f"spectral gap {gap}), algorithm {sc.algorithm.name}")


@app.command()
def keys(section: Optional[str] = typer.Argument(  # noqa: UP045 - typer needs Optional on 3.10
             None, help="one section: run, agents, topology, network, data, model, algorithm, evaluation, "
                        "privacy, distribution, scenario (top level)"),
         markdown: bool = typer.Option(False, "--markdown", help="the whole reference as Markdown "
                                                                 "(docs/scenario-reference.md)"),
         plugin: Optional[list[str]] = PluginOpt) -> None:  # noqa: UP045
    """The scenario reference: every key with its type, default, allowed values and meaning (with --plugin,
    also the [model] and [data] keys of the models and datasets it registers)."""
    from netsim.errors import InputError
    from netsim.scenario.reference import markdown as as_markdown
    from netsim.scenario.reference import plugin_rows, sections, text

    if markdown:
        typer.echo(as_markdown(), nl=False)
        return
    if section is not None and section not in sections():
        typer.echo(f"error: keys: unknown section {section!r}; allowed: {', '.join(sections())}", err=True)
        raise typer.Exit(2)
    extra = None
    if plugin:  # a plugin's model and dataset keys (the registries import torch: only when asked)
        try:
            _plugins(plugin)
        except InputError as e:
            _fail(e)
        from netsim.compute.data import DATASET_PARAMS
        from netsim.compute.model_registry import MODEL_PARAMS

        extra = {"model": plugin_rows("model", MODEL_PARAMS), "data": plugin_rows("data", DATASET_PARAMS)}
    typer.echo(text(section, extra), nl=False)


def _registered(what: str, name: str | None, plugin: list[str] | None) -> None:
    """``netsim models`` / ``netsim datasets``: the registered names, each with its one-line summary (its
    factory's docstring) and own keys, or one described; without torch (the registries are lean)."""
    import shutil

    from netsim.algorithm_reference import first_paragraph, listing
    from netsim.errors import InputError
    from netsim.scenario.reference import describe, kind_rows

    try:
        _plugins(plugin)
        if what == "model":
            from netsim.compute.model_registry import MODEL_PARAMS as params
            from netsim.compute.model_registry import MODELS as table
        else:
            from netsim.compute.data import DATASET_PARAMS as params
            from netsim.compute.data import DATASETS as table
    except InputError as e:
        _fail(e)
    section = "model" if what == "model" else "data"
    if name is None:
        entries = {}
        for n in sorted(table):
            cls = params[n]
            own = [r["key"].split(".", 1)[1] for r in kind_rows(section, n)]
            own += [f"{f.name}={f.default!r}" for f in attrs.fields(cls)] if cls is not None else []
            entries[n] = first_paragraph(table[n]) + (f" (own keys: {', '.join(own)})" if own else "")
        columns = shutil.get_terminal_size().columns if sys.stdout.isatty() else 10_000  # piped: one line each
        typer.echo(listing(entries, columns, f"(netsim {what}s NAME describes one; netsim keys {section} lists "
                                             "the common keys)"), nl=False)
        return
    if name not in table:
        from netsim.errors import unknown_name

        _fail(f"{what}s: {unknown_name(what, name, table)}")
    typer.echo(describe(what, name, table[name], params[name], section), nl=False)


@app.command()
def models(name: Optional[str] = typer.Argument(None, help="one model: its description and own keys"),  # noqa: UP045
           plugin: Optional[list[str]] = PluginOpt) -> None:  # noqa: UP045
    """List the registered models (model.kind) and their own [model] keys; with NAME, describe one."""
    _registered("model", name, plugin)


@app.command()
def datasets(name: Optional[str] = typer.Argument(None, help="one dataset: its description and own keys"),  # noqa: UP045
             plugin: Optional[list[str]] = PluginOpt) -> None:  # noqa: UP045
    """List the registered datasets (data.kind) and their own [data] keys; with NAME, describe one."""
    _registered("dataset", name, plugin)


@app.command()
def algorithms(name: Optional[str] = typer.Argument(  # noqa: UP045
                   None, help="one algorithm: its description and parameters"),
               plugin: Optional[list[str]] = PluginOpt,  # noqa: UP045
               api: bool = typer.Option(False, "--api", help="print the Agent API reference algorithms "
                                                              "are written against")) -> None:
    """List registered algorithms and their parameters; with NAME, describe one."""
    if api:
        from netsim.sim.reference import agent_api_markdown

        typer.echo(agent_api_markdown())
        return
    import shutil

    from netsim.algorithm_reference import SUMMARIES, describe, listing, summary

    columns = shutil.get_terminal_size().columns if sys.stdout.isatty() else 10_000  # piped: one line each
    if name is None and not plugin:  # the built-ins, without importing them (torch)
        typer.echo(listing(SUMMARIES, columns), nl=False)
        return
    from netsim.algorithms import REGISTRY, names
    from netsim.algorithms.registry import source_of
    from netsim.errors import InputError

    try:
        _plugins(plugin)
        registered = names()
    except InputError as e:
        _fail(e)
    if name is None:
        typer.echo(listing({n: summary(n, source_of(REGISTRY[n][0])) for n in registered}, columns), nl=False)
        return
    if name not in REGISTRY:
        from netsim.errors import unknown_name

        _fail(f"algorithms: {unknown_name('algorithm', name, registered)}")
    typer.echo(describe(name, source_of(REGISTRY[name][0]), REGISTRY[name][1]), nl=False)


@app.command()
def compare(runs: list[Path] = typer.Argument(..., help="run folders"),
            out: Path = typer.Option(Path("compare.png"), "--out", help="PNG to write"),
            metric: str = typer.Option("accuracy", "--metric", help="metrics column to overlay"),
            labels: Optional[str] = typer.Option(  # noqa: UP045 - typer needs Optional on 3.10
                None, "--labels", help="comma-separated legend labels, one per run (default: folder names)"),
            target: Optional[float] = typer.Option(  # noqa: UP045
                None, "--target", help="target value of --metric (default: each run's target_accuracy)"),
            x: str = typer.Option("time", "--x", help="x axis: time (simulated s), rounds or bytes (sent)")) -> None:
    """Overlay accuracy (or --metric) of several runs vs simulated time, rounds or bytes; print when each
    reached the target (--target, or for accuracy the runs' evaluation.target_accuracy)."""
    from netsim.errors import InputError
    from netsim.metrics.compare import compare_plot

    try:
        names = None if labels is None else [s.strip() for s in labels.split(",")]
        table = compare_plot(runs, out, metric, labels=names, target=target, x=x)
    except InputError as e:
        _fail(e)
    for r in table:
        typer.echo(_compare_line(r, metric))
    typer.echo(f"wrote {out}")


def _compare_line(r: dict, metric: str) -> str:
    """One run of ``netsim compare``: its last value, when it reached the target (only where there is one),
    its traffic."""
    parts = [f"{r['label']}: {metric} {r[metric]:.4g} at the end"]
    if r["target"] is not None:
        goal, t = f"{metric} {r['reached_by']} {r['target']:g}", r["time_to_target"]
        if r.get("settles"):  # consensus starts at 0: when it settles, not when it first dips
            parts.append(f"never settled at {goal}" if t is None else f"{goal} from t = {t:.4g} s on")
        else:
            parts.append(f"never reached {goal}" if t is None else f"reached {goal} at t = {t:.4g} s")
    for key, unit in (("messages_sent", "messages"), ("bytes_sent", "bytes")):
        if isinstance(r[key], int | float):
            parts.append(f"{r[key]:,} {unit}")
    return ", ".join(parts)


@app.command()
def privacy(run_folder: Path = typer.Argument(..., help="run folder (or its trace.arrows)"),
            delta: Optional[float] = typer.Option(  # noqa: UP045 - typer needs Optional on 3.10
                None, "--delta", help="report epsilon(delta) (default: privacy.delta)"),
            accounting: Optional[str] = typer.Option(  # noqa: UP045
                None, "--accounting", help="observed | amplified (default: privacy.accounting)"),
            pld: bool = typer.Option(
                False, "--pld/--no-pld", help="also run the PLD accountant (tighter; can take minutes)"),
            strict: bool = typer.Option(False, "--strict",
                                        help="exit 2 if a closed form's condition fails"),
            accountant: Optional[list[str]] = typer.Option(  # noqa: UP045
                None, "--accountant", help="also a registered accountant's column, e.g. one a --plugin "
                                           "registers (repeatable)"),
            pairwise: bool = typer.Option(
                False, "--pairwise", help="also what each observer learns about each victim (exact for linear "
                                          "Gaussian algorithms; needs privacy.record = \"mixing\"): pairwise.csv"),
            victims: Optional[str] = typer.Option(  # noqa: UP045
                None, "--victims", help="--pairwise: only these victims, e.g. 0,3,5-7"),
            observers: Optional[str] = typer.Option(  # noqa: UP045
                None, "--observers", help="--pairwise, --audit: only these observers, e.g. 0,3,5-7; --attack: the "
                                          "one set of colluding observers (default: every agent alone)"),
            attack: Optional[str] = typer.Option(  # noqa: UP045
                None, "--attack", help="reconstruct: which releases the observers recover exactly from their "
                                       "messages (El Mrini et al.; needs privacy.record): attack.csv"),
            audit: bool = typer.Option(
                False, "--audit", help="an empirical lower bound on epsilon from the run's canaries "
                                       "(privacy.audit), beside the accounted pairwise epsilon: audit.csv"),
            plugin: Optional[list[str]] = PluginOpt) -> None:  # noqa: UP045
    """Per-agent epsilon(delta) of a run's releases: RDP, PLD and the paper's closed form; --pairwise: per
    (victim, observer) pair; --attack, --audit: what an attack achieves from the run's messages."""
    from netsim.errors import InputError

    if attack is not None or audit:  # the attacks alone (netsim/privacy/attack.py, audit.py)
        from netsim.privacy.attack import run_attacks

        try:
            _plugins(plugin)
            lines = run_attacks(run_folder, attack, audit, observers)
        except InputError as e:
            _fail(e)
        for line in lines:
            typer.echo(line)
        return
    from netsim.privacy.report import PLOT_FILE, REPORT_FILE, privacy_report
    from netsim.trace.io import has_end_marker, read_trace, resolve_trace_path

    def warn_partial() -> None:  # a killed or crashed run: epsilon covers only what was recorded
        typer.echo(f"warning: {read_trace(run_folder).partial_note()}; releases after it are not counted")

    try:
        _plugins(plugin)
        _warn_unchecked(run_folder)
        warned = resolve_trace_path(run_folder).is_file() and not has_end_marker(run_folder)
        if warned:  # first, whatever the report says next
            warn_partial()
        rep = privacy_report(run_folder, delta, accounting, pld=pld, strict=strict, accountants=accountant or (),
                             pairwise=pairwise, victims=victims, observers=observers)
        if not warned and rep.get("trace_complete") is False:  # the end is there, a batch is not sound
            warn_partial()
    except InputError as e:
        _fail(e)
    folder = run_folder.parent if run_folder.is_file() else run_folder
    if rep["status"] == "unknown":  # a cut trace without releases: no figure, and not "not private" either
        typer.echo(rep["message"])
        typer.echo(f"wrote {folder}/{REPORT_FILE}")
        raise typer.Exit(1)
    if not rep["private"]:
        typer.echo(rep["message"])
        typer.echo("(no agent made a release through Agent.privatize; noise added any other way is not accounted)")
        typer.echo(f"wrote {folder}/{REPORT_FILE}")
        return
    _print_privacy(rep, folder, REPORT_FILE, PLOT_FILE)


PRIVACY_HEADS = {"epsilon": "epsilon", "releases": "releases", "ticks": "ticks", "rdp_observed": "RDP observed",
                 "rdp_amplified": "RDP amplified", "pld_observed": "PLD observed", "pld_amplified": "PLD amplified",
                 "paper": "paper", "conservative": "conservative", "exhausted_at": "cap hit (s)"}
"""``netsim privacy``'s column headers (on screen the second word goes under the first)."""


def _privacy_columns(rep: dict) -> list[str]:
    """The report's columns worth a place on screen: the recommended accountant's own column is the
    ``epsilon`` column already; ticks and the amplified columns only where they differ from releases and
    the observed figures (some agent skipped ticks); the cap column only where a cap was hit."""
    agents, acc = rep["agents"], rep["recommended"]["accountant"]
    cols = [c for c in rep["columns"] if c != f"{acc}_observed"]

    def same(c: str, other: str) -> bool:
        return all(r.get(c) == r.get(other) for r in agents)

    keep = []
    for c in cols:
        if c == "ticks" and same("ticks", "releases"):
            continue
        if c.endswith("_amplified") and same(c, c.replace("_amplified", "_observed")):
            continue
        if c == "exhausted_at" and all(r["exhausted_at"] is None for r in agents):
            continue
        keep.append(c)
    return keep


def _print_privacy(rep: dict, folder: Path, report_file: str, plot_file: str) -> None:
    """``netsim privacy``'s table and notes, readable in 80 columns: short spelled-out headers, columns that
    would repeat another left out (and said so), explanations wrapped under themselves."""
    import shutil
    import textwrap

    from rich.console import Console
    from rich.table import Table, box

    mode, cols_doc, rec = rep["accounting"], rep["columns"], rep["recommended"]
    guarantee = rep["guarantee"]
    acc = rec["accountant"].upper()
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 0  # piped: one line per note

    def say(text: str, indent: str = "", more: str = "    ") -> None:
        if not width:
            typer.echo(indent + text)
            return
        typer.echo(textwrap.fill(text, max(width, 40), initial_indent=indent,
                                 subsequent_indent=" " * len(indent) + more, break_on_hyphens=False))

    def fmt(v, inf=False):
        return "inf" if inf else "-" if v is None else f"{v:.4g}"

    say(f"privacy · delta = {rep['delta']:g} · recommended: {acc} observed"  # a line: a title wraps to the table
        + ("" if guarantee else " · NOT A GUARANTEE"))
    say(f"per agent: every release seen directly (what its neighbours could learn at most); {rep['credits']}")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    cols = _privacy_columns(rep)
    t.add_column("agent", justify="right")
    for c in cols:
        t.add_column(PRIVACY_HEADS.get(c, c).replace(" ", "\n", 1), justify="right",
                     style="bold" if c == "epsilon" else None)
    for r in rep["agents"]:
        cells = [str(r["agent"])]
        for c in cols:
            if c in ("paper", "conservative"):
                f = r.get("closed_form", {})
                cells.append(fmt(f.get(c)) + (" !" if c == "paper" and f.get("violations") else ""))
            elif c in ("releases", "ticks"):
                cells.append(str(r[c]))
            elif c == "exhausted_at":
                cells.append(fmt(r[c]))
            else:
                cells.append(fmt(r.get(c), r["epsilon_infinite"]))
        t.add_row(*cells)
    for col in t.columns:  # a number is never cut ("0.099…"): each column as wide as its longest cell and word,
        col.min_width = max([len(str(c)) for c in col.cells] + [len(w) for w in str(col.header).split()])
    need = Console(width=10_000).measure(t).minimum  # and the console as wide as that needs (a narrow terminal
    Console(width=max(Console().width, need + len(t.columns))).print(t)  # wraps the lines; slack: rich rounds)
    say(("" if guarantee else "! ") + rep["message"])
    say(f"worst agent: {rec['worst_agent']} (epsilon {fmt(rec['epsilon'], rec['epsilon_infinite'])}, {acc}, "
        f"observed accounting, delta {rep['delta']:g}); the scenario's own accounting (summary.json): {mode}")
    hidden = [PRIVACY_HEADS.get(c, c) for c in rep["columns"] if c not in cols and c.endswith("_amplified")]
    if hidden:
        say(f"not shown: {', '.join(hidden)} (equal to the observed figures: no agent skipped an activation "
            "tick) and ticks (equal to releases)")
    typer.echo("assumptions of the recommended epsilon:")
    for a in rec["assumptions"]:
        say(a, "  - ", more="")
    typer.echo("columns:")
    for c in cols:
        say(f"{PRIVACY_HEADS.get(c, c)}: {cols_doc[c]}", "  ")
    notes = sorted({v for r in rep["agents"] for v in r.get("closed_form", {}).get("violations", [])})
    for v in notes:
        say(f"! condition of {rep['closed_form_paper']} (closed_form = {rep['closed_form']!r}) violated: {v}")
    forms = {r["closed_form"]["note"] for r in rep["agents"] if r.get("closed_form", {}).get("note")}
    for n in sorted(forms)[:1]:
        say(f"note ({rep['closed_form_paper']}): {n}")
    for b in rep.get("closed_form_blank", []):  # a bound that does not apply: its cells are '-', here is why
        who = _agent_ranges(b["agents"])
        say(f"- {' and '.join(b['columns'])} blank for agent{'s' if len(b['agents']) > 1 else ''} {who} "
            f"(closed_form = {rep['closed_form']!r} does not apply): agent {b['agents'][0]}: {b['reason']}")
    if rep["over_time"]:
        typer.echo("epsilon over time (RDP observed, at the evaluations):")
        ot = rep["over_time"]
        for p in [ot[k] for k in sorted({round(j * (len(ot) - 1) / 7) for j in range(8)})]:
            typer.echo(f"  t = {p['t']:>9.4g} s   worst {fmt(p['epsilon_max'], p['epsilon_max'] is None)}   "
                       f"mean {fmt(p['epsilon_mean'], p['epsilon_mean'] is None)}   releases {p['releases']}")
    typer.echo(f"wrote {folder}/{report_file} (over_time: epsilon at every evaluation)"
               + (f" and {plot_file}" if rep.get("plot") else ""))
    if "pairwise" in rep:
        from netsim.privacy.pairwise import pairwise_lines

        for line in pairwise_lines(rep["pairwise"], str(folder)):
            typer.echo(line)


def _agent_ranges(agents: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    out, start = [], None
    for k, a in enumerate(agents):
        if start is None:
            start = a
        if k + 1 == len(agents) or agents[k + 1] != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = None
    return ", ".join(out)


@app.command()
def query(run_folder: Path = typer.Argument(..., help="run folder (or its trace.arrows)"),
          sql: str = typer.Argument(..., help="a query over the tables trace, messages, metrics, agent_metrics, "
                                              "releases, e.g. \"SELECT kind, count(*) FROM trace GROUP BY kind\""),
          csv_: bool = typer.Option(False, "--csv", help="print the result as CSV (every row) instead of a table"),
          parquet: Optional[Path] = typer.Option(  # noqa: UP045
              None, "--parquet", help="also write the result to this Parquet file"),
          rows: int = typer.Option(100, "--rows", help="rows shown in the table (--csv prints them all)")) -> None:
    """Ask a run anything in SQL (DuckDB): recipes in docs/traces.md, "Asking the trace in SQL"."""
    from netsim.errors import InputError
    from netsim.metrics.sql import query as run_query
    from netsim.trace.io import has_end_marker, read_trace, resolve_trace_path

    try:
        if rows < 1:
            raise InputError("--rows", f"must be >= 1, got {rows}")
        _warn_unchecked(run_folder)
        if resolve_trace_path(run_folder).is_file() and not has_end_marker(run_folder):  # a live or killed run
            typer.echo(f"warning: {read_trace(run_folder).partial_note()}", err=True)
        result = run_query(run_folder, sql)
        if parquet is not None:
            import pyarrow.parquet as pq

            try:
                pq.write_table(result, parquet)
            except OSError as e:
                raise InputError("--parquet", f"cannot write: {e.strerror or e}", str(parquet)) from None
    except InputError as e:
        _fail(e)
    if csv_:
        import pyarrow.csv as pcsv

        sink = sys.stdout.buffer
        pcsv.write_csv(result, sink)
        sink.flush()
    else:
        _print_result(result, rows)
    if parquet is not None:
        typer.echo(f"wrote {parquet} ({result.num_rows} rows)", err=csv_)


def _print_result(table, limit: int) -> None:
    """A query's result as a rich table (numbers right-aligned, 6 significant digits), every header whole
    (``netsim.table_fit``: folded at its word breaks where the screen, or a pipe's 80 columns, is narrow)."""
    from rich.table import Table

    from netsim.table_fit import print_fitted

    t = Table(show_edge=False, header_style="bold")
    cols = table.column_names
    numeric = [table.schema.field(c).type.num_fields == 0 and str(table.schema.field(c).type).startswith(
        ("int", "uint", "double", "float", "decimal")) for c in cols]
    for c, num in zip(cols, numeric):
        t.add_column(c, justify="right" if num else "left")

    def cell(v) -> str:
        if v is None:
            return "null"
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    for r in table.slice(0, limit).to_pylist():
        t.add_row(*(cell(r[c]) for c in cols))
    print_fitted(t)
    more = table.num_rows - limit
    typer.echo(f"({table.num_rows} rows" + (f"; {more} not shown: --rows N, --csv or --parquet FILE)"
                                            if more > 0 else ")"))


@app.command()
def replay(trace: Path = typer.Argument(..., help="run folder or trace.arrows to replay"),
           scenario: Path | None = typer.Option(None, "--scenario",
                                                help="run this scenario under the recorded network instead"),
           window: float = typer.Option(1.0, "--window",
                                        help="--scenario: a message takes the outcome of the recorded one on "
                                             "its link sent nearest in time, within this many seconds"),
           set_: list[str] | None = SetOpt,
           out: Path | None = typer.Option(None, "--out",
                                           help="output folder (default: beside the run, RUN-replay, or "
                                                "RUN-replay-SCENARIO with --scenario)"),
           plugin: list[str] | None = PluginOpt,
           force: bool = ForceOpt,
           quiet: bool = typer.Option(False, "--quiet", "-q", help="no table")) -> None:
    """Re-run a recorded trace bit-for-bit, or another scenario under its network (docs/traces.md). A
    partial trace (a killed, interrupted or crashed run) is refused."""
    from rich.console import Console

    from netsim.errors import InputError, RunCrashed
    from netsim.replay import replay as do_replay

    try:
        _plugins(plugin)
        if window <= 0:
            raise InputError("--window", f"must be > 0, got {window}")
        _warn_unchecked(trace)
        result = do_replay(trace, scenario, out, window, _overrides(set_), force=force)
    except InputError as e:
        _fail(e)
    except RunCrashed as e:
        _crashed(e)
    s = result.summary
    if not quiet:
        Console().print(_summary_table(s))
    for line in s["replay_warnings"]:
        typer.echo(f"warning: {line}", err=True)
    typer.echo(f"replay ({s['replay_mode']}): {s['replay_messages_matched']} messages and "
               f"{s['replay_activations']} activations from the recording; {s['replay_messages_fallback']} "
               f"messages and {s['replay_activations_fallback']} activations from the scenario's own models; "
               f"{s['replay_activations_skipped']} recorded activations skipped")
    extra = ", agent_metrics.csv, agent_accuracy.png" if (result.out / "agent_metrics.csv").is_file() else ""
    typer.echo(f"wrote {result.out}/ (trace.arrows, metrics, summary.json, plot.png{extra})")


@app.command()
def timeline(trace: Path = typer.Argument(..., help="run folder or trace.arrows"),
             agents: str | None = typer.Option(None, "--agents", help="agents to show, e.g. '0-3,7'"),
             links: str | None = typer.Option(None, "--links",
                                              help="message links, e.g. '0>1,2-3' ('-' = both ways)"),
             kinds: str | None = typer.Option(None, "--kinds", help="event kinds, e.g. 'send,drop,activate'"),
             t_from: float | None = typer.Option(None, "--from", help="window start (simulated s)"),
             t_to: float | None = typer.Option(None, "--to", help="window end (simulated s)"),
             max_lanes: int = typer.Option(40, "--max-lanes",
                                           help="aggregate agents into at most this many lanes"),
             group: int | None = typer.Option(None, "--group",
                                              help="agents per lane (overrides --max-lanes)"),
             width: int | None = typer.Option(None, "--width", help="columns (default: the terminal's)"),
             no_summary: bool = typer.Option(False, "--no-summary", help="lanes and legend only"),
             chrome: Path | None = typer.Option(None, "--chrome",
                                                help="also write Chrome/Perfetto JSON here"),
             plugin: list[str] | None = PluginOpt,
             ) -> None:
    """Show a trace as one lane per agent: activations, compute, sends, deliveries, drops, releases."""
    from rich.console import Console

    from netsim.errors import InputError
    from netsim.trace.timeline import Timeline, render, write_chrome

    try:
        _plugins(plugin)
        if max_lanes < 1 or (group is not None and group < 1):
            raise InputError("--max-lanes" if max_lanes < 1 else "--group", "must be >= 1")
        _warn_unchecked(trace)
        tl = Timeline(trace, agents, links, kinds, t_from, t_to)
        render(tl, Console(width=width) if width else Console(), max_lanes, group, not no_summary)
        if chrome is not None:
            n = write_chrome(tl, chrome)
            typer.echo(f"wrote {chrome} ({n} trace events; open in ui.perfetto.dev or chrome://tracing)")
    except InputError as e:
        _fail(e)


@app.command()
def explore(runs: list[Path] = typer.Argument(..., metavar="RUN [RUN_B]",
                                             help="run folder or trace.arrows; a second one to compare"),
            filter_: str = typer.Option("", "--filter", help="start filtered, e.g. 'kind=drop,timeout agent=0-3'"),
            export: Path | None = typer.Option(None, "--export",
                                               help="write the filtered trace as Chrome/Perfetto JSON and exit"),
            follow: Optional[bool] = typer.Option(None, "--follow/--no-follow",
                                                  help="re-read the trace as a run writes it (default: when "
                                                       "the trace has no end marker yet)"),
            plugin: list[str] | None = PluginOpt) -> None:
    """Explore a trace in a full-screen terminal app: zoom, follow messages, see why rounds time out."""
    from netsim.errors import InputError

    try:
        _plugins(plugin)
        if len(runs) > 2:
            raise InputError("RUN", f"at most two runs (to compare), got {len(runs)}")
        run = runs[0]
        for r in runs:
            _warn_unchecked(r)
        from netsim.explore.model import RunData
        from netsim.explore.query import mask

        data = RunData(run)
        m = mask(data, filter_, "--filter")
        if export is not None:
            from netsim.explore.export import export_view

            n = export_view(data, export, 0.0, data.t_max, None, m)
            if data.partial:
                typer.echo(f"warning: {data.partial}", err=True)
            typer.echo(f"wrote {export} ({n} trace events; open in ui.perfetto.dev or chrome://tracing)")
            return
        from netsim.explore.app import Explorer

        other = RunData(runs[1]) if len(runs) == 2 else None
        app_ = Explorer(run, data, filter_, follow, other)
    except InputError as e:
        _fail(e)
    app_.run()


RayOpt = typer.Option(None, "--ray", metavar="[ADDRESS]",
                      help="run on Ray: --ray (private local instance), --ray auto (this machine's "
                           "cluster) or --ray ray://HEAD:10001")


def _bare_ray(argv: list[str]) -> list[str]:
    """``--ray`` without an address (last, or before another option) means ``--ray local``."""
    out = []
    for i, a in enumerate(argv):
        out.append(a)
        if a == "--ray" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append("local")
    return out


@app.command()
def sweep(sweep_file: Path = typer.Argument(..., help="sweep TOML file (docs/sweeps.md)"),
          jobs: int = typer.Option(1, "--jobs", "-j", help="runs in parallel on a local process pool"),
          out: Optional[Path] = typer.Option(None, "--out", help="sweep folder (default: the file's out)"),
          ray: Optional[str] = RayOpt,
          gpus_per_run: float = typer.Option(0.0, "--gpus-per-run", help="GPUs requested by each Ray task"),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar or table")) -> None:
    """Run a sweep (base scenario x grid/list of overrides x seeds); resume by skipping complete runs;
    write runs.csv, sweep.csv (mean and std over seeds) and plots."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from netsim.errors import InputError, RunCrashed
    from netsim.sweep import load_sweep, run_sweep

    console = Console(stderr=True)
    try:
        sw = load_sweep(sweep_file, out)
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, disable=quiet) as bar:
            task = bar.add_task(f"{sweep_file.stem}", total=len(sw.tasks))

            def start(total: int, todo: int) -> None:
                bar.update(task, completed=total - todo)
                if todo < total:
                    console.print(f"skipping {total - todo} complete run(s) of {total}")

            result = run_sweep(sw, jobs, ray=ray, gpus_per_run=gpus_per_run, on_start=start,
                               on_done=lambda t: bar.advance(task))
    except InputError as e:
        _fail(e)
    except RunCrashed as e:  # a member's algorithm raised: its folder keeps the partial trace and summary
        _crashed(e)
    if not quiet:
        from netsim.table_fit import print_fitted

        print_fitted(_sweep_table(sweep_file.stem, sw.swept, sw.spec.metric, result.table))
    typer.echo(f"ran {result.ran} of {len(sw.tasks)} runs; wrote {result.out}/ (sweep.csv, runs.csv, "
               f"{', '.join(p.name for p in result.plots)})")


def _sweep_table(name: str, swept: list[str], metric: str, table):
    """The sweep's table: the swept keys as written (``network.loss``), the seeds, and the final metric, loss
    and drops as mean ±std (a narrow screen wraps the std under its mean)."""
    from rich.table import Table, box

    t = Table(title=f"{name}: mean ± std over seeds", box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False, collapse_padding=True)
    shown = dict.fromkeys([metric, "loss", "messages_dropped"])
    cols = swept + ["seeds"] + [f"{k}_mean" for k in shown if f"{k}_mean" in table.column_names]
    for c in cols:  # the runs' outputs as "final ..." (test loss), never mistaken for a swept key
        t.add_column(c if not c.endswith("_mean") else "final " + c.removesuffix("_mean").replace("_", " "),
                     justify="right")
    for r in table.to_pylist():
        cells = []
        for c in cols:
            v = r[c]
            if c.endswith("_mean"):
                s = r[c.removesuffix("_mean") + "_std"]
                v = "-" if v is None else f"{v:.4g}" + ("" if s is None else f" ±{s:.2g}")
            cells.append("-" if v is None else str(v))
        t.add_row(*cells)
    return t


@app.command()
def check(name: Optional[str] = typer.Argument(  # noqa: UP045 - typer needs Optional on 3.10
              None, help="a round-kernel algorithm (default: every one the --plugin files register)"),
          plugin: Optional[list[str]] = PluginOpt,  # noqa: UP045
          set_: Optional[list[str]] = typer.Option(  # noqa: UP045
              None, "--set", help="one of the algorithm's parameters for the check: --set momentum=0.5 "
                                  "(default: its defaults; repeatable)")) -> None:
    """Check a round kernel's exactness: each tensor hook on a batch of B rows and on B batches of one, with drawn
    inputs (seeded; float32 and float64; a few sizes), must give every row the same bits, and every Params field a
    hook reads must be declared in its reads. A violation is one line naming the hook, exit 1 (docs/extending.md)."""
    from netsim.algorithm_reference import check_registered
    from netsim.errors import InputError

    try:
        _plugins(plugin)
        sets = {k.removeprefix("algorithm."): v for k, v in _overrides(set_).items()}
        outcomes = check_registered(name, plugin or [], sets)
    except InputError as e:
        _fail(e)
    for o in outcomes:
        if o.violation is None:
            typer.echo(o.summary())
        else:
            typer.echo(f"error: {o.violation}", err=True)
    if any(o.violation is not None for o in outcomes):
        raise typer.Exit(1)


def main() -> None:
    try:
        app(args=_bare_ray(sys.argv[1:]))
    except KeyboardInterrupt:  # a second Ctrl-C, or one before the simulation started
        typer.echo("interrupted (no checkpoint written now; netsim resume uses the last periodic one, if any)",
                   err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
