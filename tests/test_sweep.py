"""Sweeps: validation, aggregation against a hand computation, resume after a kill, CLI."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path

import pytest
import tomli_w
from typer.testing import CliRunner

from netsim.cli import app
from netsim.errors import InputError
from netsim.sweep import load_sweep, run_sweep

from .conftest import BASE, cli_env, netsim_cli

SMALL = {**BASE, "run": {"seed": 0, "until": 3.0}, "agents": {**BASE["agents"], "count": 4},
         "data": {"kind": "synthetic", "samples": 300, "features": 4}, "evaluation": {"every": 1.0}}


def write_sweep(tmp_path: Path, body: str, scenario: dict | None = None) -> Path:
    (tmp_path / "base.toml").write_text(tomli_w.dumps(scenario or SMALL))
    p = tmp_path / "s.toml"
    p.write_text('scenario = "base.toml"\n' + f'out = "{tmp_path / "out"}"\n' + body)
    return p


GRID = """seeds = [1, 2]
[grid]
"algorithm.lr" = [0.1, 0.5]
"""


def test_grid_times_seeds_expands_to_one_run_folder_each(tmp_path):
    sw = load_sweep(write_sweep(tmp_path, 'seeds = 3\n[set]\n"network.loss" = 0.1\n'
                                          '[grid.algorithm]\nlr = [0.1, 0.2]\nbatch = [4, 8]\n'))
    assert len(sw.configs) == 4 and len(sw.tasks) == 12
    assert sw.swept == ["algorithm.lr", "algorithm.batch"]
    assert {t.seed for t in sw.tasks} == {0, 1, 2}
    assert all(t.overrides["network.loss"] == 0.1 for t in sw.tasks)
    assert len({t.folder for t in sw.tasks}) == 12 and len({t.sha256 for t in sw.tasks}) == 12
    listed = load_sweep(write_sweep(tmp_path, 'seeds = [5]\n[[configs]]\n"agents.count" = 4\n[[configs]]\n'
                                              '"agents.count" = 6\n[grid]\n"algorithm.lr" = [0.1, 0.2]\n'))
    assert [c["agents.count"] for c in listed.configs] == [4, 4, 6, 6]


@pytest.mark.parametrize("body, needle", [
    ('seeds = [1]\nbogus = 1\n', "s.toml: bogus: unknown key; allowed keys here: scenario, seeds"),
    ('seeds = [1, 1]\n', "s.toml: seeds: seeds must be distinct"),
    ('seeds = 0\n', "s.toml: seeds: a count must be >= 1"),
    ('[grid]\n"algorithm.lr" = 0.1\n', "s.toml: grid.algorithm.lr: expected a non-empty list of values"),
    ('[grid]\n"network.loss" = [0.1, 1.5]\n',
     "s.toml: grid: configuration c001_network.loss=1.5 (network.loss=1.5): "),
    ('[set]\n"algorithm.momentum_typo" = 1\n', "algorithm.momentum_typo: unknown key"),
    ('threads = 0\n', "s.toml: threads: must be >= 1"),
])
def test_bad_sweep_files_name_the_file_and_key(tmp_path, body, needle):
    p = write_sweep(tmp_path, body)
    with pytest.raises(InputError) as e:
        load_sweep(p)
    assert needle in str(e.value)
    res = CliRunner().invoke(app, ["sweep", str(p), "-q"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1 and needle in res.output


def test_the_example_sweep_file_is_valid():
    sw = load_sweep(Path(__file__).parent.parent / "examples" / "sweep_quickstart.toml")
    assert len(sw.tasks) == 8 and sw.swept == ["algorithm.lr", "network.loss"]


def test_missing_scenario_file_is_an_input_error(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('scenario = "nope.toml"\n')
    with pytest.raises(InputError, match="s.toml: scenario: scenario file not found"):
        load_sweep(p)


def test_aggregated_table_equals_a_hand_computation_from_the_run_folders(tmp_path):
    res = run_sweep(write_sweep(tmp_path, GRID), jobs=1)
    assert res.ran == 4
    out = tmp_path / "out"
    with open(out / "sweep.csv") as f:
        table = list(csv.DictReader(f))
    assert [float(r["algorithm.lr"]) for r in table] == [0.1, 0.5]
    folders = sorted(p for p in out.glob("c*/seed=*") if p.is_dir())
    assert len(folders) == 4
    for row in table:
        runs = [json.loads((out / row["label"] / f"seed={s}" / "summary.json").read_text()) for s in (1, 2)]
        assert {r["seed"] for r in runs} == {1, 2}
        assert int(row["seeds"]) == 2
        for k in ("accuracy", "loss", "consensus", "messages_sent", "bytes_sent"):
            xs = [float(r[k]) for r in runs]
            assert float(row[f"{k}_mean"]) == pytest.approx(statistics.fmean(xs), rel=1e-12)
            assert float(row[f"{k}_std"]) == pytest.approx(statistics.stdev(xs), rel=1e-9, abs=1e-15)
        # each run really used its configuration's learning rate and seed
        sc = (out / row["label"] / "seed=2" / "scenario.toml").read_text()
        assert f"lr = {row['algorithm.lr']}" in sc and "seed = 2" in sc
    assert res.table.to_pandas()["accuracy_mean"].tolist() == pytest.approx(
        [float(r["accuracy_mean"]) for r in table])
    with open(out / "runs.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    assert {p.name for p in res.plots} == {"curves_accuracy.png", "final_accuracy.png"}
    assert all(p.stat().st_size > 1000 for p in res.plots)
    again = run_sweep(tmp_path / "s.toml", jobs=1)  # everything complete: nothing re-runs
    assert again.ran == 0 and again.table.equals(res.table)


def test_a_changed_configuration_reruns_only_its_runs(tmp_path):
    run_sweep(write_sweep(tmp_path, GRID), jobs=1)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("c*/seed=*/summary.json")}
    p = write_sweep(tmp_path, GRID + '[set]\n"network.loss" = 0.2\n')  # every scenario changes
    assert run_sweep(p, jobs=1).ran == 4
    p = write_sweep(tmp_path, GRID.replace("[1, 2]", "[1, 2, 3]") + '[set]\n"network.loss" = 0.2\n')
    assert run_sweep(p, jobs=1).ran == 2  # only seed 3 of each configuration
    assert all(p.stat().st_mtime_ns != t for p, t in before.items())


def test_killed_sweep_resumes_with_only_the_missing_runs(tmp_path):
    scenario = {**SMALL, "run": {"seed": 0, "until": 40.0}}  # each run ~1 s: time to kill in between
    p = write_sweep(tmp_path, 'seeds = [1, 2, 3, 4]\n', scenario)
    out = tmp_path / "out"
    proc = subprocess.Popen(netsim_cli("sweep", str(p), "-q", "--jobs", "1"),
                            cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=cli_env())
    deadline = time.monotonic() + 120
    while not list(out.glob("*/seed=*/summary.json")):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no run completed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/seed=*/summary.json")}
    assert 1 <= len(done) < 4, done
    res = run_sweep(p, jobs=1)
    assert res.ran == 4 - len(done)
    after = {q.parent.name: q.stat().st_mtime_ns for q in out.glob("*/seed=*/summary.json")}
    assert len(after) == 4 and all(after[k] == t for k, t in done.items())  # finished runs untouched
    assert res.table.column("seeds").to_pylist() == [4]


def test_process_pool_gives_the_same_traces_as_in_process(tmp_path):
    p = write_sweep(tmp_path, GRID)
    a = run_sweep(p, jobs=1, out=tmp_path / "a")
    b = run_sweep(p, jobs=2, out=tmp_path / "b")
    assert a.ran == b.ran == 4
    for t in load_sweep(p, tmp_path / "a").tasks:
        rel = Path(t.folder).relative_to(tmp_path / "a")
        trace = rel / "trace.arrows"
        assert (tmp_path / "a" / trace).read_bytes() == (tmp_path / "b" / trace).read_bytes()
    assert a.table.equals(b.table)
    assert not math.isnan(a.table.column("accuracy_mean")[0].as_py())


def test_cli_sweep_prints_the_table_and_writes_the_same_csv(tmp_path):
    p = write_sweep(tmp_path, GRID)
    res = CliRunner().invoke(app, ["sweep", str(p)])
    assert res.exit_code == 0, res.output
    assert "ran 4 of 4 runs" in res.output and "accuracy" in res.output
    first = (tmp_path / "out" / "sweep.csv").read_text()
    res = CliRunner().invoke(app, ["sweep", str(p), "-q"])
    assert "ran 0 of 4 runs" in res.output
    assert (tmp_path / "out" / "sweep.csv").read_text() == first


def test_final_plot_gives_categorical_keys_one_tick_per_category():
    """A method's name (and the calibration only one method sets) is no number: one tick per category, each
    noise level a point beside it, never every configuration stacked on one tick of a numeric axis."""
    import matplotlib.pyplot as plt

    from netsim.sweep import final_figure

    rows = [{"algorithm.name": n, "algorithm.epsilon": e, "algorithm.calibration": c, "seeds": 3,
             "accuracy_mean": acc, "accuracy_std": 0.01}
            for (n, c), base in ((("dp_dpsgd", "null"), 0.8), (("pdsl", "per_message_gaussian"), 0.9))
            for e, acc in ((0.1, base), (1.0, base + 0.05))]
    fig = final_figure(["algorithm.name", "algorithm.epsilon", "algorithm.calibration"], rows, "accuracy")
    try:
        eps, cat = fig.axes  # the name and the calibration vary together: one panel
        assert cat.get_xlabel() == "algorithm.name / algorithm.calibration"
        assert list(cat.get_xticks()) == [0, 1]
        assert [t.get_text() for t in cat.get_xticklabels()] == ["dp_dpsgd", "pdsl\nper_message_gaussian"]
        points = sorted((x, y) for line in cat.get_lines() if line.get_marker() == "o"
                        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True))
        assert len(points) == 4 and len({round(x, 6) for x, _ in points}) == 4  # side by side, not stacked
        for x, y in points:  # each point beside its own category's tick
            assert abs(x - round(x)) < 0.4 and min(abs(y - v) for v in ((0.8, 0.85), (0.9, 0.95))[round(x)]) < 1e-9
        assert all(line.get_linestyle() == "None" for line in cat.get_lines() if line.get_marker() == "o")
        assert sorted(t.get_text() for t in cat.get_legend().get_texts()) == ["epsilon=0.1", "epsilon=1.0"]
        assert eps.get_xlabel() == "algorithm.epsilon"  # a number stays an axis: one line per method
        lines = [ln for ln in eps.get_lines() if ln.get_marker() == "o"]
        assert sorted(list(ln.get_xdata()) for ln in lines) == [[0.1, 1.0], [0.1, 1.0]]
        assert sorted(t.get_text() for t in eps.get_legend().get_texts()) == [
            "name=dp_dpsgd", "name=pdsl, calibration=per_message_gaussian"]
    finally:
        plt.close(fig)
