"""Parameter sweeps: one base scenario x configurations (a grid and/or a list of overrides) x seeds.

A sweep file (TOML)::

    scenario = "../scenarios/quickstart.toml"   # relative to the sweep file
    seeds = [1, 2, 3]                           # or a count: seeds = 3 -> 0, 1, 2
    out = "runs/sweeps/{name}"                  # {name}: the sweep file's stem
    metric = "accuracy"                         # metrics column plotted
    [set]                                       # overrides applied to every run
    "run.until" = 20.0
    [grid]                                      # cartesian product of these values
    "algorithm.lr" = [0.1, 0.5]
    "network.loss" = [0.0, 0.2]
    # [[configs]]                               # and/or an explicit list of override tables
    # "algorithm.lr" = 0.3

Every run is a normal run folder ``OUT/<config label>/seed=<seed>``. A run folder is complete when
its ``summary.json`` exists (netsim.api writes it last, atomically) and records the sha256 of the
same resolved scenario; complete runs are skipped, so an interrupted sweep resumes where it stopped.
The sweep writes ``runs.csv`` (one row per run), ``sweep.csv`` (mean and std over seeds per
configuration), ``sweep.json`` (the runs and their overrides) and plots. Every run evaluates its
gradients with ``threads`` torch threads (default 1: parallelism is across runs), so the same seeds
give byte-identical traces whether the runs go through the process pool, in-process or Ray.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import tomllib

from netsim.errors import InputError
from netsim.scenario.structure import at_least, field, structure

RUNS_FILE, TABLE_FILE, MANIFEST_FILE = "runs.csv", "sweep.csv", "sweep.json"
# Deterministic summary fields aggregated besides the final metrics columns (wall time is not).
COUNTERS = ("simulated_time", "messages_sent", "messages_dropped", "bytes_sent")


MAX_RUNS = 100_000  # configurations x seeds of one sweep


def _seeds_ok(v: Any) -> str | None:
    if isinstance(v, int):
        if v < 1:
            return f"a count must be >= 1, got {v}"
        return None if v <= MAX_RUNS else f"a count must be <= {MAX_RUNS}, got {v}"
    if not v:
        return "must list at least one seed"
    if any(s < 0 for s in v):
        return f"seeds must be >= 0, got {list(v)}"
    return None if len(set(v)) == len(v) else f"seeds must be distinct, got {list(v)}"


@attrs.frozen
class SweepSpec:
    """The sweep file's schema (strictly structured like a scenario: unknown keys are errors)."""

    scenario: str = field(doc="base scenario file, relative to the sweep file")
    seeds: tuple[int, ...] | int = field((0,), check=_seeds_ok, doc="run.seed values, or a count (0..n-1)")
    out: str = field("runs/sweeps/{name}", doc="sweep folder; {name} is the sweep file's stem")
    set: dict[str, Any] = attrs.field(factory=dict, metadata={"doc": "overrides applied to every run"})
    grid: dict[str, Any] = attrs.field(factory=dict, metadata={"doc": "key path -> list of values"})
    configs: tuple[dict[str, Any], ...] = field((), doc="explicit override tables, one per configuration")
    metric: str = field("accuracy", doc="metrics column plotted against time and the swept parameters")
    report: tuple[str, ...] | None = field(None, doc="summary fields aggregated (default: final metrics "
                                                     "and message counters)")
    threads: int = field(1, check=at_least(1), doc="torch threads per run")

    @property
    def seed_list(self) -> tuple[int, ...]:
        return tuple(range(self.seeds)) if isinstance(self.seeds, int) else self.seeds


@attrs.frozen
class RunTask:
    """One run of a sweep, self-contained (the resolved scenario travels as text, so a Ray worker on
    another machine needs neither the scenario file nor the sweep file)."""

    config: int
    label: str
    seed: int
    overrides: dict[str, Any]
    folder: str
    scenario_text: str
    sha256: str
    threads: int = 1


@attrs.frozen
class Sweep:
    source: Path
    spec: SweepSpec
    out: Path
    configs: tuple[dict[str, Any], ...]  # the swept overrides of each configuration (without [set])
    tasks: tuple[RunTask, ...]

    @property
    def swept(self) -> list[str]:
        """Key paths whose value differs between configurations, in order of first appearance."""
        keys = list(dict.fromkeys(k for c in self.configs for k in c))
        return [k for k in keys if len({_hashable(c.get(k)) for c in self.configs}) > 1] or keys


def _hashable(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


def _flatten(table: dict[str, Any], path: str, prefix: str = "") -> dict[str, Any]:
    """Nested TOML tables -> dotted key paths (``[grid.algorithm] lr = [...]`` == ``"algorithm.lr"``)."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, path, key + "."))
        else:
            out[key] = v
    return out


def _configs(spec: SweepSpec) -> list[dict[str, Any]]:
    grid = _flatten(spec.grid, "grid")
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise InputError(f"grid.{k}", f"expected a non-empty list of values, got {v!r}")
    listed = [_flatten(c, f"configs[{i}]") for i, c in enumerate(spec.configs)] or [{}]
    n = math.prod(len(v) for v in grid.values()) * len(listed)
    if n * len(spec.seed_list) > MAX_RUNS:
        raise InputError("grid", f"{n} configurations x {len(spec.seed_list)} seeds is more than {MAX_RUNS} runs")
    cells = [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    return [{**c, **g} for c in listed for g in cells]


def short_names(keys: list[str]) -> dict[str, str]:
    """Each swept key path's name in labels and legends: its last part (``lr``), or the whole path where
    that part would be read as something else: an output of the run (``network.loss``, beside the
    ``loss`` metric) or another swept key's last part (``agents.compute_time.mean``)."""
    from netsim.scenario.schema import METRIC_COLUMNS

    outputs = {c for cols in METRIC_COLUMNS.values() for c in cols} | set(COUNTERS) | {"time", "round_mean"}
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: k if n in outputs or last.count(n) > 1 else n for k, n in zip(keys, last, strict=True)}


def _label(i: int, overrides: dict[str, Any], short: dict[str, str]) -> str:
    """``c000_lr=0.1_network.loss=0.05``: index first (unique), then a readable, path-safe slug."""
    parts = []
    for k, v in overrides.items():
        text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
        parts.append(f"{short.get(k, k)}={text}")
    slug = re.sub(r"[^A-Za-z0-9._=,+-]+", "-", "_".join(parts))[:80]
    return f"c{i:03d}" + (f"_{slug}" if slug else "")


def load_sweep(path: str | Path, out: str | Path | None = None) -> Sweep:
    """Read and validate a sweep file and every run's scenario (before anything runs)."""
    from netsim.algorithms import resolve
    from netsim.scenario import load_scenario, scenario_hash, to_toml

    path = Path(path)
    src = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("", "file not found", src) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError("", f"cannot read: {e}", src) from None
    except tomllib.TOMLDecodeError as e:
        raise InputError("", f"not valid TOML: {e}", src) from None
    except RecursionError:
        raise InputError("", "not valid TOML: nested too deeply", src) from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise InputError("", f"not valid TOML: {e}", src) from None
    _not_a_scenario(data, src)
    try:
        spec = structure(data, SweepSpec)
        configs = _configs(spec)
    except InputError as e:
        raise e.at(src) from None
    except RecursionError:
        raise InputError("", "tables nested too deeply", src) from None
    base = path.parent / spec.scenario
    if not base.is_file():
        raise InputError("scenario", f"scenario file not found: {str(base)!r}", src)
    folder = Path(out) if out is not None else Path(spec.out.replace("{name}", path.stem))
    fixed = _flatten(spec.set, "set")
    tasks = []
    short = short_names(list(dict.fromkeys(k for c in configs for k in c)))
    for i, cfg in enumerate(configs):
        label = _label(i, cfg, short)
        where = "configs" if spec.configs else "grid"
        for seed in spec.seed_list:
            overrides = {**fixed, **cfg, "run.seed": seed}
            try:
                sc = load_scenario(base, overrides, path.parent)  # its paths follow the sweep file
                resolve(sc.algorithm)
            except InputError as e:
                shown = ", ".join(f"{k}={v!r}" for k, v in cfg.items()) or "[set]"
                raise InputError(where, f"configuration {label} ({shown}): {e.at(str(base))}", src) from None
            text = to_toml(sc)
            tasks.append(RunTask(i, label, seed, overrides, str(folder / label / f"seed={seed}"), text,
                                 scenario_hash(text), spec.threads))
    return Sweep(path, spec, folder, tuple(configs), tuple(tasks))


def _not_a_scenario(data: dict[str, Any], src: str) -> None:
    """Refuse a scenario file given as a sweep file in one line that says so (not "run: unknown key")."""
    from netsim.scenario.schema import Scenario

    if "scenario" not in data and set(data) & set(attrs.fields_dict(Scenario)):
        raise InputError("", f"a scenario file, not a sweep file (a sweep names its base scenario: scenario = "
                             f"\"...\", docs/sweeps.md); run it with: netsim run {src}", src)


def is_done(task: RunTask) -> bool:
    """Complete (summary.json written last) and made from this very scenario."""
    p = Path(task.folder) / "summary.json"
    try:
        summary = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # missing, not UTF-8, not JSON: not done
        return False
    return isinstance(summary, dict) and summary.get("scenario_sha256") == task.sha256


@contextmanager
def _threads(n: int) -> Iterator[None]:
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def execute(task: RunTask, folder: str | None = None) -> dict[str, Any]:
    """Run one task into ``folder`` (default: its own); returns the summary. Top-level, so that a
    spawned pool worker or a Ray worker can import it."""
    from netsim import api
    from netsim.scenario.load import scenario_from_dict
    from netsim.sim.checkpoint import checkpoints

    sc = scenario_from_dict(tomllib.loads(task.scenario_text), task.folder)
    target = Path(folder or task.folder)
    with _threads(task.threads):
        result = None
        if checkpoints(target) and not api.is_complete(target):  # a killed run: go on from its checkpoint
            try:
                result = api.resume(target, interruptible=False)
            except InputError:  # another scenario's, or none verifies: run it again
                result = None
        if result is None:
            result = api.run(sc, out=target, interruptible=False)
    if result.summary["scenario_sha256"] != task.sha256:  # pragma: no cover - canonical text is a fixpoint
        raise RuntimeError(f"{task.folder}: resolved scenario changed on the worker")
    return dict(result.summary)


def run_sweep(sweep: Sweep | str | Path, jobs: int = 1, out: str | Path | None = None,
              ray: str | None = None, gpus_per_run: float = 0.0,
              on_start: Callable[[int, int], None] | None = None,
              on_done: Callable[[RunTask], None] | None = None) -> SweepResult:
    """Run the sweep's missing runs (local process pool, in-process for ``jobs=1``, or Ray with
    ``ray`` = 'local', 'auto' or a cluster address), then aggregate every run folder.
    ``on_start(total, todo)`` and ``on_done(task)`` drive a progress bar."""
    sw = sweep if isinstance(sweep, Sweep) else load_sweep(sweep, out)
    if jobs < 1:
        raise InputError("--jobs", f"must be >= 1, got {jobs}")
    todo = [t for t in sw.tasks if not is_done(t)]
    if on_start is not None:
        on_start(len(sw.tasks), len(todo))
    sw.out.mkdir(parents=True, exist_ok=True)
    _write_manifest(sw)
    if ray is not None:
        from netsim.sweep_ray import run_ray

        run_ray(todo, ray, gpus_per_run, on_done)
    elif jobs == 1 or len(todo) <= 1:
        for t in todo:
            execute(t)
            if on_done is not None:
                on_done(t)
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=mp.get_context("spawn")) as ex:
            futures = {ex.submit(execute, t): t for t in todo}
            for f in as_completed(futures):
                f.result()  # re-raise a worker's error here
                if on_done is not None:
                    on_done(futures[f])
    return aggregate(sw, ran=len(todo))


def _write_manifest(sw: Sweep) -> None:
    runs = [{"config": t.config, "label": t.label, "seed": t.seed, "overrides": t.overrides,
             "folder": t.folder, "scenario_sha256": t.sha256} for t in sw.tasks]
    doc = {"sweep": str(sw.source), "scenario": sw.spec.scenario, "swept": sw.swept, "runs": runs}
    (sw.out / MANIFEST_FILE).write_text(json.dumps(doc, indent=2) + "\n")


# aggregation ------------------------------------------------------------------------------------------


@attrs.frozen
class SweepResult:
    """Aggregated outputs: ``runs`` (one row per run) and ``table`` (mean/std over seeds per
    configuration) as ``pyarrow.Table`` (``.to_pandas()``); ``ran`` = runs executed this time."""

    out: Path
    runs: Any
    table: Any
    ran: int
    plots: tuple[Path, ...]

    def to_pandas(self):
        return self.table.to_pandas()


def _column(values: list[Any]) -> list[Any]:
    """A parameter column Arrow can type: scalars of one kind stay; anything else becomes JSON text."""
    kinds = {type(v) for v in values}
    if kinds <= {int, float} or len(kinds) == 1 and kinds <= {str, bool}:
        return values
    return [v if isinstance(v, str) else _hashable(v) for v in values]


def _report_keys(spec: SweepSpec, summary: dict[str, Any], metric_cols: list[str]) -> list[str]:
    if spec.report is not None:
        return list(spec.report)
    keys = [c for c in metric_cols if c not in ("time", "round_mean")] + list(COUNTERS)
    if "privacy_epsilon_max" in summary:  # a private run: its worst agent's epsilon (privacy-utility)
        keys.append("privacy_epsilon_max")
    return [k for k in keys if _number_or_none(summary.get(k))]


def _numbers(values: list[Any]) -> list[Any]:
    """A report column Arrow can type: int64 when every value is one, else floats (inf past 1e308)."""
    if all(v is None or isinstance(v, int) and -2**63 <= v < 2**63 for v in values):
        return values
    return [None if v is None else float(v) if abs(v) < 2**1023 else math.copysign(math.inf, v) for v in values]


def _number_or_none(v: Any) -> bool:
    return v is None or isinstance(v, int | float) and not isinstance(v, bool)


def _mean_std(xs: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample std (ddof = 1; None for one seed) over the finite values."""
    v = [float(x) for x in xs if x is not None and abs(x) < 2**1023]  # larger ints overflow float()
    v = [x for x in v if math.isfinite(x)]
    if not v:
        return None, None
    m = math.fsum(v) / len(v)
    s = math.sqrt(math.fsum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else None
    return m, s


def aggregate(sw: Sweep, ran: int = 0) -> SweepResult:
    """Read every run folder of the sweep and write runs.csv, sweep.csv and the plots."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    from netsim.metrics.report import read_metrics, read_summary

    summaries, curves = [], []
    for t in sw.tasks:
        if not is_done(t):
            raise InputError("", "run folder is missing or incomplete; re-run the sweep", t.folder)
        summaries.append(read_summary(t.folder))
        curves.append(read_metrics(t.folder))
    cols = list(curves[0][0]) if curves and curves[0] else []
    keys = _report_keys(sw.spec, summaries[0], cols)
    missing = [k for k in keys if k not in summaries[0]]
    if missing and sw.spec.report is None:  # metrics columns its summary lacks: a damaged run folder
        raise InputError("", f"metrics columns {missing} are not in its summary.json (a damaged run folder: "
                             "delete it and re-run the sweep)", sw.tasks[0].folder)
    if missing:
        raise InputError("report", f"unknown summary field(s) {missing}; "
                                   f"available: {', '.join(summaries[0])}", str(sw.source))
    for t, summary in zip(sw.tasks, summaries, strict=True):
        bad = [k for k in keys if not _number_or_none(summary.get(k))]
        if bad and summary is summaries[0]:
            raise InputError("report", f"summary field {bad[0]!r} is not a number", str(sw.source))
        if bad:
            raise InputError(bad[0], f"expected a number or null, got {str(summary[bad[0]])[:40]!r}",
                             str(Path(t.folder) / "summary.json"))
    swept = sw.swept
    runs_cols: dict[str, list[Any]] = {"config": [t.config for t in sw.tasks],
                                       "label": [t.label for t in sw.tasks],
                                       "seed": [t.seed for t in sw.tasks]}
    for k in swept:
        runs_cols[k] = _column([sw.configs[t.config].get(k) for t in sw.tasks])
    for k in keys:
        runs_cols[k] = _numbers([s.get(k) for s in summaries])
    runs = pa.table(runs_cols)
    agg: dict[str, list[Any]] = {"config": [], "label": [], **{k: [] for k in swept}, "seeds": []}
    for k in keys:
        agg[f"{k}_mean"], agg[f"{k}_std"] = [], []
    for i, cfg in enumerate(sw.configs):
        idx = [j for j, t in enumerate(sw.tasks) if t.config == i]
        agg["config"].append(i)
        agg["label"].append(sw.tasks[idx[0]].label)
        for k in swept:
            agg[k].append(cfg.get(k))
        agg["seeds"].append(len(idx))
        for k in keys:
            m, s = _mean_std([summaries[j].get(k) for j in idx])
            agg[f"{k}_mean"].append(m)
            agg[f"{k}_std"].append(s)
    for k in swept:
        agg[k] = _column(agg[k])
    table = pa.table({k: pa.array(v, pa.float64()) if k.endswith(("_mean", "_std")) else v
                      for k, v in agg.items()})
    pcsv.write_csv(runs, sw.out / RUNS_FILE)
    pcsv.write_csv(table, sw.out / TABLE_FILE)
    plots = plot_sweep(sw, table, curves)
    points = privacy_utility(sw, table, summaries)
    if points:
        plots += (plot_privacy_utility(sw, points, summaries[0].get("privacy_delta")),)
    return SweepResult(sw.out, runs, table, ran, plots)


def read_table(path: str | Path):
    """A sweep's aggregated table (sweep.csv of a sweep folder) as a ``pyarrow.Table``."""
    import pyarrow.csv as pcsv

    p = Path(path)
    return pcsv.read_csv(p / TABLE_FILE if p.is_dir() else p)


def plot_sweep(sw: Sweep, table, curves: list[list[dict[str, Any]]]) -> tuple[Path, ...]:
    """``final_<metric>.png``: final metric (mean +- std over seeds) vs each swept parameter (``final_figure``);
    ``curves_<metric>.png``: metric vs simulated time per configuration,
    mean over seeds with a +- std band (seeds' evaluations aligned by index)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    metric = sw.spec.metric
    if not curves or not curves[0] or metric not in curves[0][0]:
        return ()
    out: list[Path] = []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, label in enumerate(table.column("label").to_pylist()):
        runs = [curves[j] for j, t in enumerate(sw.tasks) if t.config == i]
        n = min(len(r) for r in runs)
        t = np.mean([[row["time"] for row in r[:n]] for r in runs], axis=0)
        y = np.array([[np.nan if row[metric] is None else row[metric] for row in r[:n]] for r in runs], float)
        m, s = np.nanmean(y, axis=0), (np.nanstd(y, axis=0, ddof=1) if len(runs) > 1 else np.zeros(n))
        ax.plot(t, m, lw=1.4, label=label)
        ax.fill_between(t, m - s, m + s, alpha=0.2)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"{sw.source.stem}: {metric} (mean +- std over seeds)")
    fig.tight_layout()
    out.append(sw.out / f"curves_{metric}.png")
    fig.savefig(out[-1], dpi=110)
    plt.close(fig)
    if f"{metric}_mean" not in table.column_names or len(sw.configs) < 2:
        return tuple(out)
    fig = final_figure(sw.swept, table.to_pylist(), metric)
    out.append(sw.out / f"final_{metric}.png")
    fig.savefig(out[-1], dpi=110)
    plt.close(fig)
    return tuple(out)


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(x, int | float) and not isinstance(x, bool) for x in values)


def _unset(v: Any) -> bool:
    """A configuration that leaves the key to the scenario (None; ``null`` once a column mixes it with text)."""
    return v is None or v == "null"


def _categorical_groups(keys: list[str], rows: list[dict[str, Any]]) -> list[list[str]]:
    """The categorical swept keys, those that vary together in one group (``algorithm.name`` with the
    ``algorithm.calibration`` only one of the methods sets): each value of one names one value of the other."""
    groups: list[list[str]] = []
    for k in keys:
        for g in groups:
            pairs = {(_hashable(r[g[0]]), _hashable(r[k])) for r in rows}
            if len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs}):
                g.append(k)
                break
        else:
            groups.append([k])
    return groups


def final_figure(swept: list[str], rows: list[dict[str, Any]], metric: str):
    """``final_<metric>.png``'s figure: the final metric (mean +- std over seeds) against each swept key. A
    numeric key is an axis, one line per combination of the others; categorical keys (method names, switches,
    keys only some configurations set; those that vary together in one panel) have one tick per category,
    each combination of the other keys a point beside it (no line: categories have no order)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean_key, std_key = f"{metric}_mean", f"{metric}_std"
    numeric = [k for k in swept if _numeric([r[k] for r in rows])]
    panels = [[k] for k in numeric] + _categorical_groups([k for k in swept if k not in numeric], rows)
    short = short_names(swept)

    def label(r: dict[str, Any], keys: list[str]) -> str:
        return ", ".join(f"{short[k]}={r[k]}" for k in keys if not _unset(r[k]))

    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), squeeze=False)
    for ax, keys in zip(axes[0], panels, strict=True):
        others = [k for k in swept if k not in keys]
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(tuple(_hashable(r[k]) for k in others), []).append(r)
        ys = {id(r): math.nan if r[mean_key] is None else r[mean_key] for r in rows}  # None: no finite value
        if keys[0] in numeric:
            for rs in groups.values():
                ax.errorbar([r[keys[0]] for r in rs], [ys[id(r)] for r in rs],
                            yerr=[r[std_key] or 0.0 for r in rs], marker="o", capsize=3,
                            label=label(rs[0], others) or None)
        else:
            cats = list(dict.fromkeys(tuple(_hashable(r[k]) for k in keys) for r in rows))
            first = {c: next(r for r in rows if tuple(_hashable(r[k]) for k in keys) == c) for c in cats}
            step = min(0.15, 0.8 / max(len(groups), 1))
            for j, rs in enumerate(groups.values()):
                shift = (j - (len(groups) - 1) / 2) * step
                ax.errorbar([cats.index(tuple(_hashable(r[k]) for k in keys)) + shift for r in rs],
                            [ys[id(r)] for r in rs], yerr=[r[std_key] or 0.0 for r in rs], marker="o",
                            linestyle="none", capsize=3, label=label(rs[0], others) or None)
            ax.set_xticks(range(len(cats)), ["\n".join(str(first[c][k]) for k in keys if not _unset(first[c][k]))
                                             or "(unset)" for c in cats])
            ax.set_xlim(-0.6, len(cats) - 0.4)
        ax.set_xlabel(" / ".join(keys))
        ax.set_ylabel(f"final {metric}")
        ax.grid(alpha=0.3)
        if others:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


PRIVACY_UTILITY = "privacy_utility"  # .png and .csv in the sweep folder
_NOISE = re.compile(r"(^|_)(eps|epsilon|sigma|noise)")


def noise_keys(keys: list[str]) -> list[str]:
    """The swept keys that set a noise level or privacy budget (``algorithm.epsilon``, ``sigma``,
    ``noise_multiplier``): the x of a privacy-utility plot. The other swept keys tell methods apart."""
    return [k for k in keys if _NOISE.search(k.rsplit(".", 1)[-1])]


def privacy_utility(sw: Sweep, table, summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points of the privacy-utility plot, one per configuration: the method (the swept keys that are
    not noise levels), the noise level swept, the accountant's epsilon of the worst agent and the final
    metric, each as mean and sample std over seeds. Empty unless the sweep varies a noise level and every
    run is private."""
    swept, metric = sw.swept, sw.spec.metric
    noise = noise_keys(swept)
    eps_col, mean_col = "privacy_epsilon_max_mean", f"{metric}_mean"
    if not noise or len(sw.configs) < 2 or eps_col not in table.column_names or mean_col not in table.column_names:
        return []
    if any(not isinstance(s.get("privacy_epsilon_max"), int | float) for s in summaries):
        return []
    methods = [k for k in swept if k not in noise]
    short = short_names(swept)
    rows = table.to_pylist()
    combos = {tuple(r[k] for k in methods) for r in rows}
    by_name = "algorithm.name" in methods and len(combos) == len({r["algorithm.name"] for r in rows})
    out = []
    for r in rows:
        if by_name:
            method = str(r["algorithm.name"])
        else:
            method = ", ".join(f"{short[k]}={r[k]}" for k in methods if r[k] is not None) or "all runs"
        out.append({"method": method, **{k: r[k] for k in noise}, "seeds": r["seeds"],
                    "epsilon_mean": r[eps_col], "epsilon_std": r["privacy_epsilon_max_std"],
                    f"{metric}_mean": r[mean_col], f"{metric}_std": r[f"{metric}_std"]})
    out.sort(key=lambda p: (p["method"], math.inf if p["epsilon_mean"] is None else p["epsilon_mean"]))
    return out


def _accountant_label(sw: Sweep, delta: float | None) -> str:
    """How the runs' epsilon was counted (the summary's privacy_epsilon_max: RDP, the scenario's accounting)."""
    privacy = tomllib.loads(sw.tasks[0].scenario_text).get("privacy") or {}
    mode = privacy.get("accounting", "observed")
    delta = delta if delta is not None else privacy.get("delta", 1e-5)
    return f"RDP accountant, {mode} accounting, delta = {delta:g}"


def plot_privacy_utility(sw: Sweep, points: list[dict[str, Any]], delta: float | None = None) -> Path:
    """``privacy_utility.png``: the final metric against the worst agent's epsilon (log scale), mean +- std
    over seeds both ways, one line per method, the accountant named; ``privacy_utility.csv``: its points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pyarrow as pa
    import pyarrow.csv as pcsv

    metric = sw.spec.metric
    cols = list(dict.fromkeys(k for p in points for k in p))
    pcsv.write_csv(pa.table({c: _column([p.get(c) for p in points]) for c in cols}),
                   sw.out / f"{PRIVACY_UTILITY}.csv")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method in dict.fromkeys(p["method"] for p in points):
        ps = [p for p in points if p["method"] == method and p["epsilon_mean"] is not None]
        if not ps:
            continue
        ax.errorbar([p["epsilon_mean"] for p in ps],
                    [math.nan if p[f"{metric}_mean"] is None else p[f"{metric}_mean"] for p in ps],
                    xerr=[p["epsilon_std"] or 0.0 for p in ps], yerr=[p[f"{metric}_std"] or 0.0 for p in ps],
                    marker="o", capsize=3, lw=1.4, label=method)
    if all(p["epsilon_mean"] is not None and p["epsilon_mean"] > 0 for p in points):
        ax.set_xscale("log")
    ax.set_xlabel(f"epsilon of the worst agent ({_accountant_label(sw, delta)})")
    ax.set_ylabel(f"final {metric} (mean +- std over seeds)")
    ax.set_title(f"{sw.source.stem}: {metric} against privacy")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, title="method")
    fig.tight_layout()
    path = sw.out / f"{PRIVACY_UTILITY}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def default_jobs() -> int:
    return max(1, os.cpu_count() or 1)
