"""Command line: a thin layer over netsim.api. Heavy modules are imported inside the commands,
so ``netsim --help`` answers at once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="netsim: asynchronous discrete-event simulator for decentralized, private learning.")

SetOpt = typer.Option(None, "--set", help="override a scenario key: --set network.loss=0.1 (repeatable)")
PluginOpt = typer.Option(None, "--plugin", help="Python file that registers algorithms (repeatable)")


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


def _overrides(items: list[str] | None) -> dict:
    from netsim.scenario import parse_override

    return dict(parse_override(i) for i in items or [])


def _plugins(paths: list[str] | None) -> None:
    from netsim.algorithms import load_plugin

    for p in paths or []:
        load_plugin(p)


def _summary_table(summary: dict):
    from rich.table import Table

    t = Table(title=f"{summary['scenario']} · {summary['algorithm']} · {summary['agents']} agents · "
                    f"seed {summary['seed']}", show_header=False)
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")

    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

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
            ("wall time (s)", "wall_time"), ("events", "events"), ("events/s", "events_per_s"),
            ("spectral gap", "spectral_gap")]
    rows += [("time to target accuracy (s)", "time_to_target"), ("trigger sends skipped", "trigger_skipped"),
             ("fraction saved by triggers", "trigger_saved_fraction"),
             ("gradient staleness (mean)", "adpsgd_staleness_mean"),
             ("gossip refused (busy)", "gossip_refused")]
    rows += [("worst agent epsilon (RDP)", "privacy_epsilon_max"), ("at delta", "privacy_delta"),
             ("privacy releases", "privacy_releases"), ("agents out of budget", "privacy_exhausted")]
    for label, key in rows:
        if key in summary and summary[key] is not None:
            v = fmt(summary[key])
            if key == "gradients":
                v += f" ({fmt(summary['gradient_batches'])})"
            t.add_row(label, v)
    return t


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
    extra = ", agent_metrics.csv, agent_accuracy.png" if (result.out / "agent_metrics.csv").is_file() else ""
    typer.echo(f"wrote {result.out}/ (trace.arrows, metrics, summary.json, plot.png{extra})")


@app.command()
def run(scenario: Path = typer.Argument(..., help="scenario TOML file"),
        set_: Optional[list[str]] = SetOpt,
        out: Optional[Path] = typer.Option(None, "--out", help="output folder (default: run.out)"),
        plugin: Optional[list[str]] = PluginOpt,
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar or table")) -> None:
    """Run a scenario; write trace, metrics, summary and plot to its output folder. Ctrl-C stops it
    cleanly with a checkpoint (netsim resume continues)."""
    from netsim import api
    from netsim.errors import InputError

    try:
        _plugins(plugin)
        sc = api.resolve_scenario(scenario, _overrides(set_))
        folder = api.output_dir(sc, out)
        from netsim.sim.checkpoint import checkpoints

        if checkpoints(folder) and not api.is_complete(folder):
            typer.echo(f"warning: {folder} held an unfinished run with a checkpoint; starting over "
                       f"(netsim resume {folder} would have continued it)", err=True)
        result = _progress(sc.name, sc.run.until, quiet,
                           lambda progress: api.run(scenario, _overrides(set_), out=out, progress=progress))
    except InputError as e:
        _fail(e)
    _report(result, quiet)


@app.command()
def resume(run_folder: Path = typer.Argument(..., help="folder of an interrupted or killed run"),
           plugin: Optional[list[str]] = PluginOpt,
           quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar or table")) -> None:
    """Continue a run from its last good checkpoint: same final metrics and same trace after the
    checkpoint as an uninterrupted run (docs/architecture.md, "Checkpoint and resume")."""
    from netsim import api
    from netsim.errors import InputError
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
    typer.echo(f"resumed from event {result.summary['resumed_at_step']}", err=True)
    _report(result, quiet)


@app.command()
def validate(scenario: Path = typer.Argument(..., help="scenario TOML file"),
             set_: Optional[list[str]] = SetOpt, plugin: Optional[list[str]] = PluginOpt) -> None:
    """Check a scenario (keys, types, ranges, files, algorithm, topology) without running it."""
    from netsim import api
    from netsim.errors import InputError

    try:
        _plugins(plugin)
        sc = api.resolve_scenario(scenario, _overrides(set_))
        sim = api.prepare(sc, source=str(scenario))
    except InputError as e:
        _fail(e)
    gap = "n/a" if sim.gap is None else f"{sim.gap:.4f}"
    typer.echo(f"ok: {sc.name}: {sc.agents.count} agents, {sc.topology.kind} ({sc.topology.mixing_kind}, "
               f"spectral gap {gap}), algorithm {sc.algorithm.name}")


@app.command()
def keys(section: Optional[str] = typer.Argument(  # noqa: UP045 - typer needs Optional on 3.10
             None, help="one section: run, agents, topology, network, data, model, algorithm, evaluation, "
                        "privacy, distribution, scenario (top level)"),
         markdown: bool = typer.Option(False, "--markdown", help="the whole reference as Markdown "
                                                                 "(docs/scenario-reference.md)")) -> None:
    """The scenario reference: every key with its type, default, allowed values and meaning."""
    from netsim.scenario.reference import markdown as as_markdown
    from netsim.scenario.reference import sections, text

    if markdown:
        typer.echo(as_markdown(), nl=False)
        return
    if section is not None and section not in sections():
        typer.echo(f"error: keys: unknown section {section!r}; allowed: {', '.join(sections())}", err=True)
        raise typer.Exit(2)
    typer.echo(text(section), nl=False)


@app.command()
def algorithms(name: Optional[str] = typer.Argument(  # noqa: UP045
                   None, help="one algorithm: its description and parameters"),
               plugin: Optional[list[str]] = PluginOpt) -> None:  # noqa: UP045
    """List registered algorithms and their parameters; with NAME, describe one."""
    import attrs

    from netsim.algorithms import REGISTRY, names
    from netsim.errors import InputError

    try:
        _plugins(plugin)
        registered = names()
    except InputError as e:
        _fail(e)
    if name is None:
        for n in registered:
            params = ", ".join(f"{f.name}={f.default!r}" for f in attrs.fields(REGISTRY[n][1]))
            typer.echo(f"{n}: {params}")
        typer.echo("(netsim algorithms NAME describes one)")
        return
    if name not in REGISTRY:
        _fail(f"algorithms: unknown algorithm {name!r}; registered: {', '.join(registered)}")
    from netsim.algorithms.registry import describe

    typer.echo(describe(name), nl=False)


@app.command()
def compare(runs: list[Path] = typer.Argument(..., help="run folders"),
            out: Path = typer.Option(Path("compare.png"), "--out", help="PNG to write"),
            metric: str = typer.Option("accuracy", "--metric", help="metrics column to overlay"),
            labels: Optional[str] = typer.Option(  # noqa: UP045 - typer needs Optional on 3.10
                None, "--labels", help="comma-separated legend labels, one per run (default: folder names)"),
            target: Optional[float] = typer.Option(  # noqa: UP045
                None, "--target", help="target value of --metric (default: each run's target_accuracy)"),
            x: str = typer.Option("time", "--x", help="x axis: time (simulated s), rounds or bytes (sent)")) -> None:
    """Overlay accuracy (or --metric) of several runs vs simulated time, rounds or bytes; print time to target."""
    from netsim.errors import InputError
    from netsim.metrics.compare import compare_plot

    try:
        names = None if labels is None else [s.strip() for s in labels.split(",")]
        table = compare_plot(runs, out, metric, labels=names, target=target, x=x)
    except InputError as e:
        _fail(e)
    for r in table:
        ttt = "never" if r["time_to_target"] is None else f"{r['time_to_target']:.4g} s"
        goal = "" if r["target"] is None else f" {r['target']:g}"
        typer.echo(f"{r['label']}: {metric} {r[metric]:.4f}, time to target{goal} {ttt}, "
                   f"{r['messages_sent']} messages, {r['bytes_sent']} bytes")
    typer.echo(f"wrote {out}")


@app.command()
def privacy(run_folder: Path = typer.Argument(..., help="run folder (or its trace.arrows)"),
            delta: Optional[float] = typer.Option(  # noqa: UP045 - typer needs Optional on 3.10
                None, "--delta", help="report epsilon(delta) (default: privacy.delta)"),
            accounting: Optional[str] = typer.Option(  # noqa: UP045
                None, "--accounting", help="observed | amplified (default: privacy.accounting)"),
            pld: bool = typer.Option(
                False, "--pld/--no-pld", help="also run the PLD accountant (tighter; can take minutes)"),
            strict: bool = typer.Option(False, "--strict",
                                        help="exit 2 if a closed form's condition fails")) -> None:
    """Per-agent epsilon(delta) of a run's releases: RDP, PLD and the seed paper's closed form."""
    from rich.console import Console
    from rich.table import Table

    from netsim.errors import InputError
    from netsim.privacy.report import PLOT_FILE, REPORT_FILE, privacy_report

    try:
        rep = privacy_report(run_folder, delta, accounting, pld=pld, strict=strict)
    except InputError as e:
        _fail(e)
    mode = rep["accounting"]
    t = Table(title=f"privacy · delta = {rep['delta']:g} · accounting: {mode} · "
                    f"closed form: {rep['closed_form']}")
    fmt = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
    cols = ["agent", "releases", "ticks", "rdp_observed", "rdp_amplified"] + (
        [f"pld_{mode}"] if pld else [])
    short = {"releases": "rel.", "rdp_observed": "RDP obs.", "rdp_amplified": "RDP ampl.",
             "pld_observed": "PLD obs.", "pld_amplified": "PLD ampl."}
    for c in cols:
        t.add_column(short.get(c, c), justify="right")
    if rep["closed_form"] != "none":
        t.add_column("paper", justify="right")
        t.add_column("conserv.", justify="right")
    if any(r["exhausted_at"] is not None for r in rep["agents"]):
        t.add_column("cap hit (s)", justify="right")
    for r in rep["agents"]:
        cells = [str(r["agent"]), str(r["releases"]), str(r["ticks"])] + [fmt(r[c]) for c in cols[3:]]
        if rep["closed_form"] != "none":
            f = r["closed_form"]
            cells += [fmt(f["paper"]) + (" !" if f["violations"] else ""), fmt(f["conservative"])]
        if any(x["exhausted_at"] is not None for x in rep["agents"]):
            cells.append(fmt(r["exhausted_at"]))
        t.add_row(*cells)
    Console().print(t)
    notes = sorted({v for r in rep["agents"] for v in r.get("closed_form", {}).get("violations", [])})
    for v in notes:
        typer.echo(f"! condition of {rep['closed_form']} violated: {v}")
    typer.echo(f"worst agent: {rep['worst_agent']} (epsilon {fmt(rep['worst_epsilon'])}, RDP, {mode})")
    typer.echo(rep["explain"])
    plotted = any(r["releases"] for r in rep["agents"])
    typer.echo(f"wrote {run_folder}/{REPORT_FILE}" + (f" and {PLOT_FILE}" if plotted else ""))


@app.command()
def replay(trace: Path = typer.Argument(..., help="run folder or trace.arrows to replay"),
           scenario: Path | None = typer.Option(None, "--scenario",
                                                help="run this scenario under the recorded network instead"),
           window: float = typer.Option(1.0, "--window",
                                        help="--scenario: a message takes the outcome of the recorded one on "
                                             "its link sent nearest in time, within this many seconds"),
           set_: list[str] | None = SetOpt,
           out: Path | None = typer.Option(None, "--out", help="output folder (default: <run.out>-replay)"),
           plugin: list[str] | None = PluginOpt,
           quiet: bool = typer.Option(False, "--quiet", "-q", help="no table")) -> None:
    """Re-run a recorded trace bit-for-bit, or another scenario under its network (docs/traces.md)."""
    from rich.console import Console

    from netsim.errors import InputError
    from netsim.trace.replay import replay as do_replay

    try:
        _plugins(plugin)
        if window <= 0:
            raise InputError("--window", f"must be > 0, got {window}")
        result = do_replay(trace, scenario, out, window, _overrides(set_))
    except InputError as e:
        _fail(e)
    s = result.summary
    if not quiet:
        Console().print(_summary_table(s))
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
             ) -> None:
    """Show a trace as one lane per agent: activations, compute, sends, deliveries, drops, releases."""
    from rich.console import Console

    from netsim.errors import InputError
    from netsim.trace.timeline import Timeline, render, write_chrome

    try:
        if max_lanes < 1 or (group is not None and group < 1):
            raise InputError("--max-lanes" if max_lanes < 1 else "--group", "must be >= 1")
        tl = Timeline(trace, agents, links, kinds, t_from, t_to)
        render(tl, Console(width=width) if width else Console(), max_lanes, group, not no_summary)
        if chrome is not None:
            n = write_chrome(tl, chrome)
            typer.echo(f"wrote {chrome} ({n} trace events; open in ui.perfetto.dev or chrome://tracing)")
    except InputError as e:
        _fail(e)


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

    from netsim.errors import InputError
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
    if not quiet:
        from rich.table import Table

        t = Table(title=f"{sweep_file.stem}: mean ± std over seeds")
        rows = result.table.to_pylist()
        shown = dict.fromkeys([sw.spec.metric, "loss", "messages_dropped"])
        cols = sw.swept + ["seeds"] + [f"{k}_mean" for k in shown if f"{k}_mean" in result.table.column_names]
        for c in cols:
            t.add_column(c.removesuffix("_mean"), justify="right")
        for r in rows:
            cells = []
            for c in cols:
                v = r[c]
                if c.endswith("_mean"):
                    s = r[c.removesuffix("_mean") + "_std"]
                    v = "-" if v is None else f"{v:.4g}" + ("" if s is None else f" ± {s:.2g}")
                cells.append(str(v))
            t.add_row(*cells)
        Console().print(t)
    typer.echo(f"ran {result.ran} of {len(sw.tasks)} runs; wrote {result.out}/ (sweep.csv, runs.csv, "
               f"{', '.join(p.name for p in result.plots)})")


def main() -> None:
    try:
        app(args=_bare_ray(sys.argv[1:]))
    except KeyboardInterrupt:  # a second Ctrl-C, or one before the simulation started
        typer.echo("interrupted (no checkpoint written now; netsim resume uses the last periodic one, if any)",
                   err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
