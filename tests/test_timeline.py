"""The terminal timeline as a user sees it (tmux, fixed size), its summary and the Chrome export."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time

import pytest

import netsim
from netsim.errors import InputError
from netsim.scenario.load import scenario_from_dict
from netsim.trace.io import read_trace
from netsim.trace.timeline import Timeline, chrome_trace
from tests.conftest import cli_env, netsim_cli

SC = {
    "run": {"seed": 4, "until": 6.0},
    "agents": {"count": 4, "compute_time": {"kind": "constant", "value": 0.05},
               "activation": {"kind": "periodic", "period": 0.5},
               "offline": [{"agent": 3, "start": 2.0, "end": 3.0}]},
    "topology": {"kind": "ring"},
    "network": {"latency": {"kind": "constant", "value": 0.02}, "loss": 0.25},
    "data": {"samples": 200, "features": 4},
    "algorithm": {"name": "dpsgd", "lr": 0.2, "batch": 8, "round_timeout": 0.2},
    "evaluation": {"every": 2.0, "metrics": ["accuracy"]},
}
NETSIM = shlex.join(netsim_cli())  # typed at the tmux prompt


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return netsim.run(scenario_from_dict(SC), out=tmp_path_factory.mktemp("tl") / "run").out


@pytest.fixture(scope="module")
def events(run_dir):
    return read_trace(run_dir).to_pandas()


def expected_cols(events, agent, kind, t0, t1, width):
    e = events[(events.kind == kind) & (events.agent == agent) & (events.t >= t0) & (events.t <= t1)]
    return {min(width - 1, int((t - t0) * width / (t1 - t0))) for t in e.t}


class Tmux:
    """A detached tmux session of fixed size running one command; ours only, killed by name."""

    def __init__(self, name: str, cols: int = 120, rows: int = 40):
        self.name = name
        self.runs = 0
        # PYTHONPATH explicitly: a tmux server that was already running has its own environment
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", str(cols), "-y", str(rows),
                        "env", "PS1=$ ", "TERM=xterm-256color", f"PYTHONPATH={cli_env()['PYTHONPATH']}",
                        "bash", "--norc", "--noprofile"], check=True)

    def run(self, command: str, timeout: float = 300.0) -> list[str]:
        """Type ``command`` at the prompt; the screen once it has finished (an end marker is printed)."""
        self.runs += 1
        marker = f"END-OF-RUN-{self.runs + 1000}"  # typed as an expansion, so only the output matches
        typed = f"clear; {command}; echo END-OF-RUN-$(({self.runs} + 1000))"
        subprocess.run(["tmux", "send-keys", "-t", self.name, typed, "Enter"], check=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True,
                                 text=True, check=True).stdout
            if any(line.strip() == marker for line in out.splitlines()):
                return out.splitlines()
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for the command to finish:\n{out}")

    def close(self):
        subprocess.run(["tmux", "kill-session", "-t", self.name], check=False)


@pytest.fixture
def tmux():
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux): the terminal rendering test needs it")
    t = Tmux(f"netsim-tl-{os.getpid()}")
    yield t
    t.close()


def lanes(screen: list[str]) -> dict[str, str]:
    """label -> the cells between the bars, as the user sees them."""
    out = {}
    for line in screen:
        if "|" in line and line.rstrip().endswith("|"):
            label, _, rest = line.partition("|")
            out[label.strip()] = rest.rstrip()[:-1]
    return out


def test_timeline_in_a_real_terminal_shows_lanes_glyphs_and_filters(tmux, run_dir, events):
    width = 120 - 5 - 3  # terminal columns - label - bars
    screen = tmux.run(f"{NETSIM} timeline {run_dir} --from 0 --to 6 --no-summary")
    ln = lanes(screen)
    assert list(ln) == ["run", "0", "1", "2", "3"]
    assert all(len(cells) == width for cells in ln.values())
    assert any(line.startswith("legend:") and "x drop" in line for line in screen)
    assert "~" * 10 in ln["3"]  # one second offline = 1/6 of the lane
    assert set(ln["run"].replace(" ", "")) == {"*"}
    # only drops: every 'x' exactly where the trace has a drop of that agent, nothing else drawn
    screen = tmux.run(f"{NETSIM} timeline {run_dir} --from 0 --to 6 --kinds drop --agents 0-2 --no-summary")
    ln = lanes(screen)
    assert list(ln) == ["0", "1", "2"]
    for a in range(3):
        got = {i for i, ch in enumerate(ln[str(a)]) if ch != " "}
        assert set(ln[str(a)]) <= {"x", " "}
        assert got == expected_cols(events, a, "drop", 0.0, 6.0, width)
        assert got  # the lossy network dropped something of each agent's
    # a zoomed window and one link: sends 0 -> 1 only
    screen = tmux.run(f"{NETSIM} timeline {run_dir} --from 1 --to 3 --kinds send --links '0>1' --no-summary")
    ln = lanes(screen)
    sends = events[(events.kind == "send") & (events.peer == 1) & (events.t >= 1) & (events.t <= 3)]
    assert {i for i, ch in enumerate(ln["0"]) if ch == ">"} == {
        min(width - 1, int((t - 1) * width / 2)) for t in sends[sends.agent == 0].t}
    assert set(ln["1"]) == {" "} and set(ln["2"]) == {" "}


def test_summary_table_counts_match_the_trace(run_dir, events):
    tl = Timeline(run_dir)
    rows = {r["agent"]: r for r in tl.summary()}
    for a in range(4):
        mine = events[events.agent == a]
        assert rows[a]["sent"] == (mine.kind == "send").sum()
        assert rows[a]["dropped"] == (mine.kind == "drop").sum()
        assert rows[a]["delivered"] == (mine.kind == "deliver").sum()
        assert rows[a]["bytes"] == mine[mine.kind == "send"]["size"].sum()
        n_compute = (mine.kind == "compute_start").sum()
        off = 1.0 if a == 3 else 0.0
        span = events.t.max()
        assert rows[a]["idle"] == pytest.approx(1 - (0.05 * n_compute + off) / span, abs=0.06 / span)


def test_large_runs_aggregate_lanes(run_dir):
    tl = Timeline(run_dir)
    lanes_, g = tl.lanes(50, max_lanes=2)
    assert g == 2 and [lab for lab, _ in lanes_] == ["run", "0-1", "2-3"]


def test_chrome_export_is_valid_trace_event_json(run_dir, events, tmp_path):
    out = tmp_path / "t.json"
    subprocess.run(netsim_cli("timeline", str(run_dir), "--no-summary", "--width", "80", "--chrome", str(out)),
                   check=True, capture_output=True, env=cli_env())
    data = json.loads(out.read_text())
    evs = data["traceEvents"]
    for e in evs:
        assert {"ph", "name", "pid", "tid"} <= set(e)
        assert e["ph"] == "M" or (isinstance(e["ts"], float) and e["ts"] >= 0)
    xs = [e for e in evs if e["ph"] == "X" and e["name"] == "compute"]
    assert len(xs) == (events.kind == "compute_start").sum()
    assert all(e["dur"] == pytest.approx(0.05e6) for e in xs)
    starts = {e["id"] for e in evs if e["ph"] == "s"}
    ends = {e["id"] for e in evs if e["ph"] == "f"}
    assert ends <= starts and len(ends) == (events.kind == "deliver").sum()
    assert len(chrome_trace(Timeline(run_dir))["traceEvents"]) == len(evs)


def test_bad_filters_and_traces_are_one_line_errors(run_dir, tmp_path):
    with pytest.raises(InputError, match="--agents"):
        Timeline(run_dir, agents="0-9")
    with pytest.raises(InputError, match="unknown kind"):
        Timeline(run_dir, kinds="sends")
    bad = tmp_path / "t.arrows"
    bad.write_bytes(b"\x00" * 10)
    p = subprocess.run(netsim_cli("timeline", str(bad)), capture_output=True, text=True, env=cli_env())
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not a netsim trace" in p.stderr
    p = subprocess.run(netsim_cli("timeline", str(run_dir), "--from", "5", "--to", "1"), capture_output=True,
                       text=True, env=cli_env())
    assert p.returncode == 2 and "window must be non-empty" in p.stderr


