"""External traces: per-link measurement CSV and FedScale-style availability, and their errors."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from netsim.errors import InputError
from netsim.sim.churn import read_availability
from netsim.sim.links import read_link_trace
from tests.conftest import cli_env, netsim_cli
from tests.test_network_models import by_kind, make_net, send_at

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_link_trace_sets_latency_bandwidth_and_loss_piecewise(tmp_path):
    p = write(tmp_path, "l.csv", "time,src,dst,latency,bandwidth,loss\n"
                                 "0,0,1,0.05,,0\n"
                                 "10,0,1,0.2,1000,\n"
                                 "20,0,1,,,1\n"
                                 "0,1,0,0.01,,\n")
    env, net, events, _ = make_net({"trace": str(p), "latency": {"kind": "constant", "value": 0.5},
                                    "loss": 0.0})
    send_at(env, net, [(1.0, 0, 1, 100), (5.0, 1, 0, 100), (5.0, 2, 3, 100), (12.0, 0, 1, 100),
                       (21.0, 0, 1, 100)])
    sends = {(e.agent, e.peer, e.t): e.value for e in by_kind(events, "send")}
    assert sends[(0, 1, 1.0)] == pytest.approx(0.05)
    assert sends[(0, 1, 12.0)] == pytest.approx(0.2 + 100 / 1000)  # CSV bandwidth 1000 B/s
    assert sends[(0, 1, 21.0)] == pytest.approx(0.5)  # empty latency cell: the scenario's model
    assert sends[(1, 0, 5.0)] == pytest.approx(0.01)
    assert sends[(2, 3, 5.0)] == pytest.approx(0.5)  # a link the CSV does not have
    assert [(e.agent, e.peer, e.t, e.tag) for e in by_kind(events, "drop")] == [(0, 1, 21.0, "loss")]


def test_shipped_examples_load():
    series = read_link_trace(ROOT / "traces" / "links_example.csv", 8)
    assert len(series) == 16 and all(len(s.times) == 25 for s in series.values())
    s = series[(2, 3)]
    assert s.loss[s.index(75.0)] == 0.5 and s.loss[s.index(85.0)] == 0.01
    assert s.bandwidth[s.index(45.0)] == 2e5
    avail = read_availability(ROOT / "traces" / "availability_example.json", 8)
    assert len(avail) == 8 and all(iv.period == 120.0 for iv in avail.values())


@pytest.mark.parametrize("text,line,what", [
    ("time,src,dst,latency\n0,0,1,0.1\n", 1, "header must be time,src,dst,latency,bandwidth,loss"),
    ("time,src,dst,latency,bandwidth,loss\n0,0,1,0.1,,\n5,0,1,abc,,\n", 3, "could not convert"),
    ("time,src,dst,latency,bandwidth,loss\n0,0,1,0.1,,\n5,0,1", 3, "expected 6 fields, got 3"),
    ("time,src,dst,latency,bandwidth,loss\n0,0,9,0.1,,\n", 2, r"agent ids in \[0, 3\]"),
    ("time,src,dst,latency,bandwidth,loss\n0,0,1,0.1,,1.5\n", 2, r"loss must be in \[0, 1\]"),
    ("time,src,dst,latency,bandwidth,loss\n0,0,1,-0.1,,\n", 2, "latency must be >= 0"),
])
def test_malformed_link_trace_names_file_and_line(tmp_path, text, line, what):
    p = write(tmp_path, "bad.csv", text)
    with pytest.raises(InputError, match=f"line {line}: .*{what}") as e:
        read_link_trace(p, 4)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("text,what", [
    ('{"1": {"active": [0, 5], "inactive": [3]}}', "equally long"),
    ('{"1": {"active": [0, 2], "inactive": [3, 4]}}', "active\\[m\\] <= inactive\\[m\\]"),
    ('{"a": {"active": [0], "inactive": [3]}}', "must be integers"),
    ('{"1": {"active": [0], "inactive": [3]}', "line 1: not valid JSON"),
    ('{"1": {"active": [0], "inactive": [3]}}', "has 1 clients, the scenario needs 2"),
])
def test_malformed_availability_is_a_clear_error(tmp_path, text, what):
    p = write(tmp_path, "a.json", text)
    with pytest.raises(InputError, match=what):
        read_availability(p, 2 if "needs" in what else 1)


def test_cli_reports_a_bad_trace_in_one_line_with_exit_2(tmp_path):
    bad = write(tmp_path, "bad.csv", "time,src,dst,latency,bandwidth,loss\n0,0,1,0.1,,\n7,1,0,0.1,x,\n")
    sc = write(tmp_path, "s.toml", f"""
[run]
until = 5.0
[agents]
count = 4
[algorithm]
name = "dpsgd"
[network]
trace = "{bad}"
""")
    p = subprocess.run(netsim_cli("validate", str(sc)), capture_output=True, text=True, cwd=tmp_path, env=cli_env())
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr
    assert p.stderr.startswith(f"error: {bad}: network.trace: line 3:")
    missing = write(tmp_path, "m.toml", sc.read_text().replace(str(bad), "nope.csv"))
    p = subprocess.run(netsim_cli("validate", str(missing)), capture_output=True, text=True, cwd=tmp_path,
                       env=cli_env())
    assert p.returncode == 2 and "network.trace" in p.stderr and "nope.csv" in p.stderr


def test_stunner_converter_keeps_online_intervals_and_period(tmp_path):
    import gzip

    from netsim.trace.importers import main

    src = tmp_path / "s.csv.gz"
    with gzip.open(src, "wt") as f:
        f.write("segment,user,segment_start_epoch_ms,tz_offset_h,online,start_offset_ms,end_offset_ms\n"
                "0,u1,0,2,1,0,4000\n0,u1,0,2,0,4000,6000\n0,u1,0,2,1,6000,10000\n"
                "1,u2,0,2,0,0,1000\n1,u2,0,2,1,1000,8000\n"
                "2,u3,0,2,1,0,5000\n")
    out = tmp_path / "a.json"
    assert main(["stunner", str(src), str(out), "--agents", "2", "--scale", "0.5"]) == 0
    iv = read_availability(out, 2)
    assert iv[0].period == 5.0 and iv[0].end_of(2.5) == 3.0 and iv[0].end_of(1.0) is None
    assert iv[1].period == 4.0 and iv[1].end_of(0.2) == 0.5 and iv[1].end_of(4.2) == 4.5  # repeats
    assert main(["stunner", str(src), str(out), "--agents", "4"]) == 2  # only 3 segments


def test_aws_ping_converter_halves_rtt_and_writes_edges(tmp_path, capsys):
    from netsim.trace.importers import main

    src = tmp_path / "p.csv"
    src.write_text("source,dest,size,time,source_region,dest_region\n"
                   "node-0,node-1,64,90.0,EU,US\nnode-0,node-1,24,1.0,EU,US\nnode-0,node-1,64,92.0,EU,US\n"
                   "node-1,node-0,64,80.0,US,EU\nnode-0,node-9,64,5.0,EU,EU\n")
    out, edges = tmp_path / "l.csv", tmp_path / "e.txt"
    args = ["aws-ping", str(src), str(out), "--agents", "2", "--interval", "2", "--edges", str(edges)]
    assert main(args) == 0
    series = read_link_trace(out, 2)
    assert series[(0, 1)].times == [0.0, 2.0] and series[(0, 1)].latency == [0.045, 0.046]
    assert series[(1, 0)].latency == [0.04] and edges.read_text() == "0 1\n"
    src.write_text("source,dest,size,time,source_region,dest_region\nnode-0,node-1,64,abc,EU,US\n")
    assert main(["aws-ping", str(src), str(out), "--agents", "2"]) == 2
    assert "line 2" in capsys.readouterr().err
