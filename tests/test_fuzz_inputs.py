"""Fuzzed inputs: malformed scenario and sweep files, CSV/JSON network traces, cut or corrupted
trace files and run folders, fed to every command that reads them. Each command either works or prints
exactly one line ``error: FILE: ...`` on stderr and exits 2; never a traceback; a rejected input leaves
every file already written as it was.

The example budget is fixed and the search derandomized (``derandomize=True``), so CI time is bounded
and every run tries the same inputs; ``NETSIM_FUZZ_SCALE=10`` multiplies every budget for a longer
search. Checkpoint files are fuzzed with the checkpoint tests.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import string
from pathlib import Path

import pyarrow as pa
import pytest
import tomli_w
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import netsim
from netsim.api import RunResult
from netsim.cli import app
from netsim.errors import InputError
from netsim.scenario import scenario_from_dict
from netsim.trace.folder import END_FILES, SUMMARY_FILE
from netsim.trace.io import TRACE_FILE, read_trace
from tests.conftest import BASE, merge

runner = CliRunner()
SCALE = float(os.environ.get("NETSIM_FUZZ_SCALE", "1"))  # more examples for a longer local search


def budget(n: int) -> int:
    return max(1, round(n * SCALE))


FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                   HealthCheck.data_too_large, HealthCheck.filter_too_much])

# A tiny DP run (releases for `netsim privacy`), flushed every 64 events so its trace has several batches.
SMALL = merge(BASE, {
    "run": {"seed": 3, "until": 3.0, "trace_flush_every": 40},
    "agents": {"count": 4, "activation": {"kind": "bernoulli", "period": 0.5, "p": 0.8},
               "offline": [{"agent": 3, "start": 1.0, "end": 1.6}]},
    "data": {"samples": 200, "features": 4},
    "algorithm": {"name": "dp_dpsgd", "lr": 0.3, "batch": 8, "round_timeout": 0.2, "clip": 1.0,
                  "noise_multiplier": 6.0},
    "evaluation": {"every": 1.0},
    "privacy": {"closed_form": "do_adp"},
})


def cli(*args) -> object:
    """Invoke the CLI in-process; it must succeed (0) or reject the input in one line (2). (``netsim
    sweep`` may say first which runs it skips: progress, not part of the error.)"""
    res = runner.invoke(app, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"netsim {' '.join(map(str, args))}: uncaught {res.exception!r}") from res.exception
    assert "Traceback" not in res.output
    assert res.exit_code in (0, 2), (res.exit_code, res.output)
    if res.exit_code == 2:
        lines = res.stderr.strip().splitlines()
        if args[0] == "sweep":
            lines = [line for line in lines if not line.startswith("skipping ")]
        assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) > 10, res.stderr
    return res


def rejected_naming(res, *names: Path | str) -> bool:
    """True when ``res`` was a rejection; then its line names one of ``names``."""
    if res.exit_code != 2:
        return False
    line = res.stderr.strip().splitlines()[-1]
    assert any(str(n) in line for n in names), (line, names)
    return True


def snapshot(*roots: Path) -> dict[str, bytes]:
    out = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        out.update({str(p): p.read_bytes() for p in files})
    return out


def mutate_bytes(data: bytes, draw) -> bytes:
    """Cut, flip, empty, random or non-UTF-8 bytes."""
    how = draw(st.sampled_from(["cut", "flip", "empty", "random", "latin1", "append"]))
    if how == "cut":
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if how == "flip":
        b = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            if b:
                b[draw(st.integers(0, len(b) - 1))] = draw(st.integers(0, 255))
        return bytes(b)
    if how == "empty":
        return b""
    if how == "random":
        return draw(st.binary(max_size=300))
    if how == "latin1":
        return data.decode("utf-8", "replace").replace("a", "\xe9").encode("latin-1", "replace")
    return data + draw(st.binary(min_size=1, max_size=40))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return netsim.run(scenario_from_dict(SMALL), out=tmp_path_factory.mktemp("fuzz") / "run").out


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("work")


def fresh(work: Path, run_dir: Path, name: str) -> Path:
    """A scratch copy of the run folder (rewritten by every example)."""
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(run_dir, folder)
    return folder


# --- trace files: netsim timeline, privacy, replay, compare; RunResult.load(...).events -------------------

def batch_ends(data: bytes) -> list[int]:
    """Byte offsets where each record batch of a trace ends (the writer writes raw IPC messages)."""
    src = pa.BufferReader(data)
    pa.ipc.read_message(src)  # the schema
    ends = []
    while True:
        try:
            pa.ipc.read_message(src)
        except EOFError:
            return ends
        ends.append(src.tell())


def test_a_cut_trace_reads_up_to_its_last_complete_batch(run_dir, work):
    data = (run_dir / TRACE_FILE).read_bytes()
    ends = batch_ends(data)
    full = read_trace(run_dir).table
    assert len(ends) >= 3 and read_trace(run_dir).complete
    sizes = [0]
    reader = pa.ipc.open_stream(pa.BufferReader(data))
    for b in reader:
        sizes.append(sizes[-1] + b.num_rows)
    folder = fresh(work, run_dir, "cut")
    for name in (SUMMARY_FILE, *END_FILES):  # what a killed run leaves: no summary.json, no metrics
        (folder / name).unlink(missing_ok=True)
    for cut in sorted({e + d for e in ends[:-1] for d in (-1, 0, 1, 57)} | {len(data) - 1}):
        (folder / TRACE_FILE).write_bytes(data[:cut])
        tr = read_trace(folder)
        whole = sum(e <= cut for e in ends)
        assert tr.table.num_rows == sizes[whole] and tr.table.equals(full.slice(0, sizes[whole]))
        assert not tr.complete  # whole batches or not, the run's end (end-of-stream marker) is cut off
        res = cli("timeline", folder, "--width", 80, "--no-summary")
        assert res.exit_code == 0 and "partial run, up to t = " in res.stdout


@settings(max_examples=budget(30), **FUZZ)
@given(data=st.data())
def test_fuzzed_traces_load_or_fail_in_one_line(run_dir, work, data):
    original = (run_dir / TRACE_FILE).read_bytes()
    folder = fresh(work, run_dir, "trace")
    bad = mutate_bytes(original, data.draw)
    (folder / TRACE_FILE).write_bytes(bad)
    before = snapshot(folder)
    try:
        n = RunResult.load(folder).events.num_rows
        assert n <= read_trace(run_dir).table.num_rows
    except InputError as e:
        assert str(folder) in str(e) and "\n" not in str(e)
    res = cli("timeline", folder, "--width", 80)
    if rejected_naming(res, folder):
        assert snapshot(folder) == before
    res = cli("privacy", folder, "--no-pld")
    after = snapshot(folder)
    if rejected_naming(res, folder):
        assert after == before
    else:  # the report is the only thing it writes
        assert {k: v for k, v in after.items() if not k.endswith(("privacy.json", "privacy.png"))} == before


@settings(max_examples=budget(12), **FUZZ)
@given(data=st.data())
def test_fuzzed_traces_replay_or_fail_in_one_line(run_dir, work, data):
    original = (run_dir / TRACE_FILE).read_bytes()
    folder = fresh(work, run_dir, "replay")
    (folder / TRACE_FILE).write_bytes(mutate_bytes(original, data.draw))
    before = snapshot(folder)
    out = work / "replay-out"
    shutil.rmtree(out, ignore_errors=True)
    other = []
    if data.draw(st.booleans(), label="under another scenario"):  # conditions mode: recorded churn too
        other = ["--scenario", work / "other.toml"]
        sc = merge(SMALL, {"run": {"seed": 5}})
        del sc["agents"]["offline"]
        other[1].write_text(tomli_w.dumps(sc))
    res = cli("replay", folder, "--out", out, "-q", *other)
    assert snapshot(folder) == before
    if rejected_naming(res, folder):
        assert not out.exists()


# --- run folders: summary.json and metrics for compare and RunResult.load ------------------------------

_LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
JSONISH = _LEAF | st.lists(_LEAF, max_size=3) | st.dictionaries(
    st.text(max_size=6), _LEAF | st.lists(_LEAF, max_size=3), max_size=3)


def mutate_summary(text: str, draw) -> bytes:
    how = draw(st.sampled_from(["bytes", "value", "json"]))
    if how == "bytes":
        return mutate_bytes(text.encode(), draw)
    if how == "json":
        return json.dumps(draw(JSONISH)).encode()
    summary = json.loads(text)
    key = draw(st.sampled_from(["target_accuracy", "time_to_target", "scenario", "messages_sent", "accuracy",
                                "scenario_sha256"]))
    summary[key] = draw(JSONISH)
    return json.dumps(summary).encode()


def mutate_metrics_csv(text: str, draw) -> bytes:
    if draw(st.booleans()):
        return mutate_bytes(text.encode(), draw)
    rows = [line.split(",") for line in text.splitlines()]
    r = draw(st.integers(0, len(rows) - 1))
    c = draw(st.integers(0, len(rows[r]) - 1))
    rows[r][c] = draw(st.sampled_from(["", "nan", "inf", "-1", "abc", "1e999", '"', "time", "x,y", "\n"]))
    if draw(st.booleans()):
        rows[r] = rows[r][: draw(st.integers(0, len(rows[r])))]
    return "\n".join(",".join(row) for row in rows).encode()


@settings(max_examples=budget(30), **FUZZ)
@given(data=st.data())
def test_fuzzed_run_folders_compare_or_fail_in_one_line(run_dir, work, data):
    folder = fresh(work, run_dir, "folder")
    which = data.draw(st.sampled_from(["summary.json", "metrics.csv", "metrics.parquet"]))
    if which == "summary.json":
        (folder / which).write_bytes(mutate_summary((run_dir / which).read_text(), data.draw))
    elif which == "metrics.csv":
        (folder / which).write_bytes(mutate_metrics_csv((run_dir / which).read_text(), data.draw))
    else:  # a parquet run folder, cut or flipped
        import pyarrow.csv as pcsv
        import pyarrow.parquet as pq

        (folder / "metrics.csv").unlink()
        sink = pa.BufferOutputStream()
        pq.write_table(pcsv.read_csv(run_dir / "metrics.csv"), sink)
        (folder / which).write_bytes(mutate_bytes(sink.getvalue().to_pybytes(), data.draw))
    before = snapshot(folder)
    out = work / "cmp.png"
    out.unlink(missing_ok=True)
    res = cli("compare", run_dir, folder, "--out", out)
    assert snapshot(folder) == before
    if rejected_naming(res, folder):
        assert not out.exists()
    try:
        RunResult.load(folder)
    except InputError as e:
        assert str(folder) in str(e) and "\n" not in str(e)


# --- scenario files: netsim validate and netsim run ------------------------------------------------------

def _fields() -> list[tuple[str, str]]:
    """(section, key) of every field of every scenario section, read from the schema."""
    import attrs

    from netsim.scenario.schema import Scenario

    out = []
    for f in attrs.fields(Scenario):
        if attrs.has(f.type if isinstance(f.type, type) else type(None)):
            out += [(f.name, g.name) for g in attrs.fields(f.type)]
    return out


def _section_types() -> list[tuple[str, str]]:
    import typing

    import attrs

    from netsim.scenario.schema import Scenario

    hints = typing.get_type_hints(Scenario)
    out = []
    for name, tp in hints.items():
        inner = [a for a in (typing.get_args(tp) or (tp,)) if attrs.has(a)]
        for cls in inner:
            out += [(name, g.name) for g in attrs.fields(cls)]
    return sorted(set(out))


FIELDS = _section_types()
WRONG = st.one_of(
    st.sampled_from([10**30, -10**30, 2**63, 2**64 + 1, float("inf"), float("-inf"), float("nan"), 1e308, 5e-324,
                     -0.0, "", "x" * 200, "\u00e9\u0000", True, False, [], [[[1]]], {}, {"a": {"b": 1}}, [1, "a"]]),
    st.integers(-3, 10**4), st.floats(allow_nan=True, allow_infinity=True, width=32), st.text(string.printable,
                                                                                                max_size=10),
)


def test_every_scenario_section_is_fuzzed():
    sections = {s for s, _ in FIELDS}
    assert {"run", "agents", "network", "topology", "data", "model", "algorithm", "evaluation", "privacy"} <= sections


@settings(max_examples=budget(120), **FUZZ)
@given(edits=st.lists(st.tuples(st.sampled_from(FIELDS), WRONG), min_size=1, max_size=3))
def test_wrong_types_and_huge_numbers_in_every_section(work, edits):
    data = merge(BASE, {"run": {"seed": 1, "until": 2.0}, "agents": {"count": 4}, "data": {"samples": 200}})
    for (section, key), value in edits:
        node = data.setdefault(section, {})
        if not isinstance(node, dict):
            data[section] = node = {}
        node[key] = value
    path = work / "wrong.toml"
    try:
        path.write_text(tomli_w.dumps(data))
    except (TypeError, ValueError):  # TOML cannot hold it (nan in a table key, ...): nothing to test
        return
    res = cli("validate", path)
    rejected_naming(res, path)


def _scenario_bytes(draw) -> bytes:
    base = tomli_w.dumps(merge(BASE, {"run": {"seed": 1, "until": 2.0}})).encode()
    how = draw(st.sampled_from(["mutate", "deep_array", "deep_table", "deep_header", "huge"]))
    if how == "mutate":
        return mutate_bytes(base, draw)
    depth = draw(st.sampled_from([50, 900, 5000]))
    if how == "deep_array":
        return base + b"\n[extra]\nv = " + b"[" * depth + b"]" * depth + b"\n"
    if how == "deep_table":
        return b"x = " + b"{a = " * depth + b"1" + b"}" * depth + b"\n" + base
    if how == "deep_header":
        return base + b"\n[" + b".".join([b"k"] * depth) + b"]\nv = 1\n"
    return base.replace(b"count = 8", b"count = " + b"9" * draw(st.sampled_from([20, 400, 5000])))


@settings(max_examples=budget(60), **FUZZ)
@given(data=st.data())
def test_scenario_bytes_validate_or_fail_in_one_line(work, data):
    path = work / "bytes.toml"
    path.write_bytes(_scenario_bytes(data.draw))
    res = cli("validate", path)
    if rejected_naming(res, path):  # and `netsim run` rejects it before writing anything
        out = work / "run-out"
        out.mkdir(exist_ok=True)
        (out / "keep.txt").write_text("already here")
        before = snapshot(out)
        res = cli("run", path, "--out", out, "-q")
        assert rejected_naming(res, path) and snapshot(out) == before


# --- CSV and JSON network traces: network.trace, agents.availability, topology edges, importers ---------

TOKENS = st.sampled_from(["0", "1", "2", "-1", "0.5", "nan", "inf", "-inf", "1e999", "", " ", "abc", "9" * 20,
                          '"', "\x00", "\u00e9", "\n", "1_0", "0x1", "-0"])
LINKS = "time,src,dst,latency,bandwidth,loss\n0,0,1,0.05,,0\n1,0,1,0.2,1000,\n2,1,0,,,1\n0,1,2,0.01,,\n"
AVAIL = {"0": {"active": [0, 5], "inactive": [3, 8], "finish_time": 10}, "1": {"active": [1], "inactive": [2]},
         "2": {"active": [0], "inactive": [9]}, "3": {"active": [], "inactive": []}}


def csv_mutation(text: str, draw) -> bytes:
    if draw(st.booleans()):
        return mutate_bytes(text.encode(), draw)
    rows = [line.split(",") for line in text.splitlines()]
    for _ in range(draw(st.integers(1, 3))):
        r = draw(st.integers(0, len(rows) - 1))
        if rows[r]:
            rows[r][draw(st.integers(0, len(rows[r]) - 1))] = draw(TOKENS)
        if draw(st.integers(0, 4)) == 0:
            rows[r] = rows[r][: draw(st.integers(0, len(rows[r])))]
    return "\n".join(",".join(row) for row in rows).encode("utf-8", "surrogatepass")


def json_mutation(draw) -> bytes:
    how = draw(st.sampled_from(["bytes", "value", "shape"]))
    if how == "bytes":
        return mutate_bytes(json.dumps(AVAIL).encode(), draw)
    if how == "shape":
        return json.dumps(draw(JSONISH)).encode()
    data = copy.deepcopy(AVAIL)
    client = data[draw(st.sampled_from(sorted(data)))]
    key = draw(st.sampled_from(["active", "inactive", "finish_time"]))
    value = draw(st.sampled_from([float("nan"), float("inf"), -1, 10**400, True, "5", None, [1, 2, 3], [-1], [1e308]]))
    client[key] = value
    return json.dumps(data).encode()  # NaN and Infinity as Python's json writes them


def scenario_with(work: Path, name: str, **extra) -> Path:
    path = work / f"{name}.toml"
    path.write_text(tomli_w.dumps(merge(BASE, {"run": {"seed": 1, "until": 2.0}, "agents": {"count": 4},
                                                "data": {"samples": 200}, **extra})))
    return path


@settings(max_examples=budget(50), **FUZZ)
@given(data=st.data())
def test_fuzzed_link_trace_csv(work, data):
    csv_path = work / "links.csv"
    csv_path.write_bytes(csv_mutation(LINKS, data.draw))
    sc = scenario_with(work, "links", network={"trace": str(csv_path), "latency": {"kind": "constant", "value": 0.01}})
    rejected_naming(cli("validate", sc), csv_path, sc)


@settings(max_examples=budget(40), **FUZZ)
@given(data=st.data())
def test_fuzzed_availability_json(work, data):
    path = work / "avail.json"
    path.write_bytes(json_mutation(data.draw))
    sc = scenario_with(work, "avail", agents={"count": 4, "availability": str(path)})
    rejected_naming(cli("validate", sc), path, sc)


@settings(max_examples=budget(30), **FUZZ)
@given(data=st.data())
def test_fuzzed_edges_file(work, data):
    path = work / "edges.txt"
    path.write_bytes(csv_mutation("0 1\n1 2 0.5\n2 3\n# ring\n3,0\n", data.draw))
    sc = scenario_with(work, "edges", topology={"kind": "edges_file", "path": str(path)})
    rejected_naming(cli("validate", sc), path, sc)


TABLE = "x1,x2,label,site\n0.5,1,a,s0\n-1,2.5,b,s1\n2,0,a,s2\n0.1,-3,b,s3\n1,1,a,s0\n-2,0.5,b,s1\n3,3,a,s2\n"


@settings(max_examples=budget(40), **FUZZ)
@given(data=st.data())
def test_fuzzed_table_csv(work, data):
    path = work / "table.csv"
    path.write_bytes(csv_mutation(TABLE, data.draw))
    sc = scenario_with(work, "table", data={"kind": "table", "path": str(path), "group": "site",
                                            "partition": "groups", "test_fraction": 0.3})
    rejected_naming(cli("validate", sc), path, sc)


@settings(max_examples=budget(30), **FUZZ)
@given(data=st.data())
def test_fuzzed_partition_json(work, data):
    path = work / "parts.json"
    good = [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9, 150]]
    how = data.draw(st.sampled_from(["bytes", "shape", "value"]))
    if how == "bytes":
        raw = mutate_bytes(json.dumps(good).encode(), data.draw)
    elif how == "shape":
        raw = json.dumps(data.draw(JSONISH)).encode()
    else:
        good[data.draw(st.integers(0, 3))][0] = data.draw(st.sampled_from(
            [-1, 10**400, 1e308, 1.5, True, "5", None, [1], float("nan"), 159, 160]))
        raw = json.dumps(good).encode()
    path.write_bytes(raw)
    sc = scenario_with(work, "parts", data={"samples": 200, "partition": "file", "partition_file": str(path)})
    rejected_naming(cli("validate", sc), path, sc)


STUNNER = ("segment,user,segment_start_epoch_ms,tz_offset_h,online,start_offset_ms,end_offset_ms\n"
           "0,u,0,0,1,0,1000\n0,u,0,0,0,1000,2000\n1,v,0,0,1,500,900\n")
AWS = "source,dest,size,time,x\nnode-0,node-1,64,1.5,a\nnode-1,node-0,64,2.0,b\nnode-0,node-1,1500,3,c\n"


@settings(max_examples=budget(60), **FUZZ)
@given(data=st.data())
def test_fuzzed_importer_inputs(work, data):
    import gzip

    from netsim.trace.importers import main

    fmt, text = data.draw(st.sampled_from([("stunner", STUNNER), ("aws-ping", AWS)]))
    raw = csv_mutation(text, data.draw)
    src = work / "in.csv"
    if data.draw(st.booleans()):  # gzip, then maybe cut or flip the compressed bytes
        src = work / "in.csv.gz"
        gz = gzip.compress(raw)
        raw = mutate_bytes(gz, data.draw) if data.draw(st.booleans()) else gz
    src.write_bytes(raw)
    out = work / "imported.out"
    out.unlink(missing_ok=True)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([fmt, str(src), str(out), "--agents", "2"])
    assert code in (0, 2)
    if code == 2:
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {src}"), err.getvalue()
        assert not out.exists()


# --- sweep files, and the run folders a sweep resumes from ---------------------------------------------

SWEEP_SMALL = merge(BASE, {"run": {"seed": 0, "until": 2.0}, "agents": {"count": 4},
                           "data": {"samples": 200, "features": 4}, "evaluation": {"every": 1.0}})
SWEEP_KEYS = ["scenario", "seeds", "out", "set", "grid", "configs", "metric", "report", "threads", "bogus"]
SWEEP_VALUES = st.one_of(WRONG, JSONISH, st.sampled_from([
    "base.toml", "nope.toml", {"algorithm.lr": [0.1, 0.2]}, {"algorithm.lr": 0.1}, {"network.loss": [2.0]},
    {"a": {"b": {"c": [1]}}}, [{"algorithm.lr": 0.3}], [{"agents.count": "many"}], [1, 1], [0, 1], 3, 0,
    ["accuracy"], ["stop_reason"], {"run.until": -1}]))


@settings(max_examples=budget(60), **FUZZ)
@given(data=st.data())
def test_fuzzed_sweep_files(work, data):
    from netsim.sweep import load_sweep

    folder = work / "sweep"
    folder.mkdir(exist_ok=True)
    (folder / "base.toml").write_text(tomli_w.dumps(SWEEP_SMALL))
    spec = {"scenario": "base.toml", "seeds": [1], "out": str(folder / "out"), "grid": {"algorithm.lr": [0.1]}}
    path = folder / "s.toml"
    if data.draw(st.booleans()):
        for _ in range(data.draw(st.integers(1, 3))):
            spec[data.draw(st.sampled_from(SWEEP_KEYS))] = data.draw(SWEEP_VALUES)
        try:
            text = tomli_w.dumps(spec)
        except (TypeError, ValueError):
            return
        path.write_text(text)
    else:
        path.write_bytes(mutate_bytes(tomli_w.dumps(spec).encode(), data.draw))
    try:
        load_sweep(path)
    except InputError as e:
        assert "\n" not in str(e)
        before = snapshot(folder)
        res = cli("sweep", path, "-q", "--out", folder / "out")
        assert rejected_naming(res, path) and snapshot(folder) == before


@pytest.fixture(scope="module")
def done_sweep(work):
    from netsim.sweep import run_sweep

    folder = work / "done"
    folder.mkdir()
    (folder / "base.toml").write_text(tomli_w.dumps(SWEEP_SMALL))
    path = folder / "s.toml"
    path.write_text(tomli_w.dumps({"scenario": "base.toml", "seeds": [1], "out": str(folder / "out"),
                                   "grid": {"algorithm.lr": [0.1, 0.5]}}))
    run_sweep(path)
    return path


@settings(max_examples=budget(5), **FUZZ)
@given(data=st.data())
def test_fuzzed_member_run_folders_of_a_sweep(work, done_sweep, data):
    """Resuming a sweep reads its members' summary.json and metrics: a damaged member is re-run (its
    summary no longer proves it complete) or named in one line; the other members are left alone."""
    src = done_sweep.parent
    copy_dir = work / "resumed"
    shutil.rmtree(copy_dir, ignore_errors=True)
    shutil.copytree(src, copy_dir)
    members = sorted((copy_dir / "out").glob("c*/seed=*"))
    member = members[data.draw(st.integers(0, len(members) - 1))]
    which = data.draw(st.sampled_from(["summary.json", "metrics.csv"]))
    text = (member / which).read_text()
    (member / which).write_bytes(mutate_summary(text, data.draw) if which == "summary.json"
                                 else mutate_metrics_csv(text, data.draw))
    others = snapshot(*(m for m in members if m != member))
    sweep_file = copy_dir / "s.toml"
    res = cli("sweep", sweep_file, "-q", "--out", copy_dir / "out")
    assert snapshot(*(m for m in members if m != member)) == others
    rejected_naming(res, member)


# --- extreme finite values in every numeric key: netsim validate, then a bounded run ---------------------

def _numeric_keys() -> list[tuple[tuple[str, ...], type, dict]]:
    """(key path, int or float, the table it sits in) for every numeric key of the scenario, read from the
    schema: each section's fields, nested records (activation, churn, burst, dynamic topology), every
    parameter of every distribution under each kind that takes it, and the algorithm's parameters."""
    import typing

    import attrs

    from netsim.algorithms import REGISTRY, names
    from netsim.scenario.schema import Dist, Scenario

    names()  # the built-in algorithms registered

    dist_tables = {"value": [{"kind": "constant"}], "low": [{"kind": "uniform", "high": 1.0}],
                   "high": [{"kind": "uniform", "low": 0.0}],
                   "mean": [{"kind": "exponential"}, {"kind": "normal", "sigma": 0.001},
                            {"kind": "lognormal", "sigma": 0.5}],
                   "sigma": [{"kind": "normal", "mean": 0.0}, {"kind": "lognormal", "mean": 0.01}]}
    out = []

    def walk(cls, path):
        hints = typing.get_type_hints(cls)
        for f in attrs.fields(cls):
            tp = hints[f.name]
            inner = [a for a in (typing.get_args(tp) or (tp,)) if a is not type(None)]
            if typing.get_origin(tp) is not None and typing.get_origin(tp) not in (typing.Union, type(int | None)):
                continue  # lists, tables, literals
            here = (*path, f.name)
            if Dist in inner:
                out.extend(((*here, p), float, t) for p, ts in dist_tables.items() for t in ts)
            elif any(attrs.has(a) for a in inner):
                if here != ("topology", "dynamic", "graphs"):
                    walk(next(a for a in inner if attrs.has(a)), here)
            elif inner and inner[0] in (int, float):
                out.append((here, inner[0], {}))

    walk(Scenario, ())
    out += [(("algorithm", f.name), typing.get_type_hints(REGISTRY["dpsgd"][1])[f.name], {})
            for f in attrs.fields(REGISTRY["dpsgd"][1])]
    return [k for k in out if k[0][0] != "name"]


NUMERIC = _numeric_keys()
EXTREME_FLOATS = st.one_of(
    st.sampled_from([1e308, -1e308, 1.7976931348623157e308, 1e300, -1e300, 1e200, 1e20, -1e20, 1e9, 2.0**63,
                     5e-324, -5e-324, 1e-300, 0.0, -0.0, -1.0]),
    st.floats(allow_nan=False, allow_infinity=False))
EXTREME_INTS = st.sampled_from([2**63 - 1, -2**63, 2**62, 10**18, 2**53 + 1, 2**31, 10**6, 0, -1, 1])


def test_every_numeric_key_is_fuzzed_with_extremes():
    paths = {k[0] for k in NUMERIC}
    for key in [("agents", "clock_offset", "high"), ("agents", "clock_drift", "sigma"), ("agents", "count"),
                ("agents", "activation", "period"), ("network", "latency", "mean"), ("agents", "churn", "mean_online"),
                ("network", "burst", "p_enter"), ("topology", "dynamic", "period"), ("run", "until"),
                ("evaluation", "every"), ("privacy", "delta"), ("algorithm", "lr"), ("data", "samples")]:
        assert key in paths, key


RUN_STEPS = 1500  # a run with extreme values goes this many events (enough to activate, send, evaluate)


@settings(max_examples=budget(200), phases=[Phase.generate], **FUZZ)  # no shrinking: a stall costs 10 s a try
@given(data=st.data())
def test_extreme_finite_values_validate_and_run_or_fail_in_one_line(work, data):
    """Extreme finite values (1e308, 5e-324, 2^63 - 1, ...) in any numeric key, distribution parameters
    included: ``netsim validate`` accepts the scenario or names the key in one line (exit 2), and a
    scenario it accepts builds and runs (a bounded number of events) without an exception."""
    from netsim import api
    from netsim.errors import InputError
    from netsim.scenario import load_scenario

    sc = merge(BASE, {"run": {"seed": 1, "until": 2.0}, "agents": {"count": 4}, "data": {"samples": 200}})
    for _ in range(data.draw(st.integers(1, 2), label="edits")):
        path, tp, table = data.draw(st.sampled_from(NUMERIC), label="key")
        value = data.draw(EXTREME_INTS if tp is int else st.one_of(EXTREME_FLOATS, EXTREME_INTS), label="value")
        node = sc
        for part in path[:-1]:
            if not isinstance(node.get(part), dict) or (table and part == path[-2]):
                node[part] = dict(table) if part == path[-2] and table else {}
                if path[:2] == ("agents", "churn") or path[:2] == ("network", "burst"):
                    node[part].update({"mean_online": 5.0, "mean_offline": 1.0} if path[1] == "churn"
                                      else {"p_enter": 0.1, "p_exit": 0.5})
            node = node[part]
        node[path[-1]] = value
    file = work / "extreme.toml"
    file.write_text(tomli_w.dumps(sc))
    res = cli("validate", file)
    if rejected_naming(res, file):
        return
    scenario = load_scenario(file)
    if (scenario.agents.count > 64 or scenario.data.samples * scenario.data.features > 10**6
            or scenario.algorithm.params.get("batch", 0) > 4096):
        return  # valid, but too big to run here
    try:
        sim = api.prepare(scenario)
    except InputError:
        raise AssertionError("netsim validate accepted what the run refuses") from None
    with _wall_limit(10.0):  # a value that stalls simulated time (a loop at one instant) fails, not hangs
        sim.start()
        sim.advance(to_step=RUN_STEPS)
        sim.finish()
    assert sim.metrics and sim.steps > 0


@contextlib.contextmanager
def _wall_limit(seconds: float):
    import signal

    def expired(signum, frame):
        raise AssertionError(f"no progress: {RUN_STEPS} events took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("key, dist", [
    ("clock_offset", {"kind": "uniform", "low": 0.0, "high": 1e308}),
    ("clock_offset", {"kind": "constant", "value": 1e300}),
    ("clock_drift", {"kind": "normal", "mean": 0.0, "sigma": 1e300}),
    ("clock_drift", {"kind": "uniform", "low": 0.0, "high": 1e308}),
    ("clock_drift", {"kind": "uniform", "low": -1e308, "high": 1e308}),
    ("compute_time", {"kind": "lognormal", "mean": 0.01, "sigma": 1e200}),
    ("clock_jitter", {"kind": "exponential", "mean": 1e308}),
])
def test_extreme_clock_distributions_are_one_line_errors_before_anything_is_written(work, key, dist):
    file = work / "clock.toml"
    file.write_text(tomli_w.dumps(merge(BASE, {"run": {"seed": 1, "until": 2.0}, "agents": {"count": 4, key: dist},
                                               "data": {"samples": 200}})))
    out = work / "clock-run"
    shutil.rmtree(out, ignore_errors=True)
    res = cli("run", file, "--out", out, "-q")
    assert res.exit_code == 2 and f"agents.{key}" in res.stderr and str(file) in res.stderr
    assert not out.exists()


def test_a_distribution_built_in_code_is_checked_where_it_is_sampled():
    import numpy as np

    from netsim import api
    from netsim.scenario.schema import Dist
    from netsim.sim.dists import sampler

    with pytest.raises(InputError, match=r"network.latency.high: high - low must be a finite number"):
        sampler(Dist("uniform", low=-1e308, high=1e308), np.random.default_rng(0), "network.latency")
    sc = scenario_from_dict(merge(BASE, {"run": {"seed": 1, "until": 2.0}, "agents": {"count": 4},
                                         "data": {"samples": 200}}))
    bad = attrs_evolve(sc, agents=attrs_evolve(sc.agents, clock_offset=Dist("uniform", low=0.0, high=1e308)))
    with pytest.raises(InputError, match=r"agents.clock_offset: draws values up to 1e\+308 s"):
        api.prepare(bad)


def attrs_evolve(obj, **changes):
    import attrs

    return attrs.evolve(obj, **changes)
