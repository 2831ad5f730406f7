"""The Python API's result: summary, metrics and events as tables; run folders reopened from disk."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pytest

import netsim
from netsim.api import SUMMARY_FILE, RunResult, is_complete
from netsim.trace.io import read_trace


def test_run_result_tables_match_the_run_folder(tmp_path, scenario):
    res = netsim.run(scenario(run={"seed": 3, "until": 6.0}), out=tmp_path / "r")
    assert res.summary["seed"] == 3  # still a dict
    s = res.summary.to_pandas()
    assert s.shape[0] == 1 and s["accuracy"].iloc[0] == res.summary["accuracy"]
    assert json.loads((tmp_path / "r" / SUMMARY_FILE).read_text())["events"] == res.summary["events"]
    m = res.metrics.to_arrow()
    with open(tmp_path / "r" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert m.num_rows == len(rows) == len(res.metrics)
    assert m.column("time").to_pylist() == [float(r["time"]) for r in rows]
    assert m.column("accuracy").to_pylist() == [float(r["accuracy"]) for r in rows]
    ev = res.events
    assert isinstance(ev, pa.Table) and ev.num_rows == res.summary["events"]
    assert ev.equals(read_trace(res.out).table)
    assert res.events is ev  # read once
    kinds = ev.to_pandas()["kind"].value_counts()
    assert kinds["send"] == res.summary["messages_sent"]


def test_summary_is_written_last_and_a_reopened_folder_equals_the_result(tmp_path, scenario):
    res = netsim.run(scenario(run={"seed": 4, "until": 4.0}), out=tmp_path / "r")
    assert not (tmp_path / "r" / (SUMMARY_FILE + ".tmp")).exists()
    names = sorted((tmp_path / "r").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    assert names[-1].name == SUMMARY_FILE
    back = RunResult.load(tmp_path / "r")
    assert back.scenario == res.scenario
    assert back.summary["scenario_sha256"] == res.summary["scenario_sha256"]
    assert back.metrics.to_arrow().column("accuracy").to_pylist() == pytest.approx(
        res.metrics.to_arrow().column("accuracy").to_pylist(), rel=1e-6)  # CSV keeps ~17 digits


def test_a_folder_without_summary_is_incomplete_and_a_rerun_clears_a_stale_one(tmp_path, scenario):
    from netsim.errors import InputError

    folder = tmp_path / "r"
    folder.mkdir()
    assert not is_complete(folder)
    with pytest.raises(InputError, match="not a complete run folder"):
        RunResult.load(folder)
    (folder / SUMMARY_FILE).write_text('{"stale": true}')
    res = netsim.run(scenario(run={"seed": 1, "until": 2.0}), out=folder)
    assert "stale" not in json.loads((folder / SUMMARY_FILE).read_text())
    assert res.summary["seed"] == 1
