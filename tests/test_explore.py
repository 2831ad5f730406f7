"""``netsim explore``: the indexed trace, following messages and timeouts, queries, the Chrome export,
and the Textual app driven headless (keys, mouse, resize) on a small committed trace
(tests/data/explore_bursty: scenarios/dpsgd_bursty.toml with run.until = 20; explore_bursty_exit05: the
same with network.burst.p_exit = 0.5, to compare two runs)."""

from __future__ import annotations

import asyncio
import json
import subprocess

import numpy as np
import pytest

from netsim.errors import InputError
from netsim.explore import query
from netsim.explore.app import Explorer
from netsim.explore.causal import causal_past
from netsim.explore.export import check_trace_events, trace_events
from netsim.explore.follow import describe, drop_cause, missing_at_timeout
from netsim.explore.lanes import Lanes
from netsim.explore.model import RunData
from netsim.trace.io import read_trace
from tests.conftest import ROOT, cli_env, netsim_cli

TRACE = ROOT / "tests" / "data" / "explore_bursty"
PAIR = ROOT / "tests" / "data" / "explore_bursty_exit05"  # the same run with shorter loss bursts
SIZE = (110, 24)


@pytest.fixture(scope="module")
def run() -> RunData:
    return RunData(TRACE)


def rows_of(run: RunData, kind: str) -> np.ndarray:
    return np.flatnonzero(run.kind == run.code[kind])


# the indexed trace ---------------------------------------------------------------------------------
def test_indexes_agree_with_the_table(run):
    tab = read_trace(TRACE).table
    assert len(run.t) == tab.num_rows and run.n == 8 and run.complete
    assert np.array_equal(run.t, tab.column("t").to_numpy())
    for a in range(-1, run.n):
        rows = run.agent_rows(a)
        assert (run.agent[rows] == a).all() and (np.diff(rows) > 0).all()
    assert sum(len(run.agent_rows(a)) for a in range(-1, run.n)) == len(run.t)
    for s in rows_of(run, "send")[:50]:
        rows = run.message(int(run.msg[s]))
        assert rows[0] == s and len(rows) in (1, 2, 3)
        assert {run.kind_of(r) for r in rows[1:]} <= {"deliver", "drop", "stale"}


def test_cells_match_a_cell_by_cell_count(run):
    """Each cell holds the most important instant kind among the events binned into it."""
    t0, t1, w = 3.0, 9.0, 37
    inst = ~np.isin(run.kind, run.codes(("compute", "offline")))
    lane_of = np.full(run.n + 1, -1)
    lane_of[[3 + 1, 5 + 1]] = [1, 2]  # agents 3 and 5 on lanes 1 and 2, the rest hidden
    lane_of[0] = 0
    grid = run.cells(lane_of, 3, t0, t1, w, inst)
    want = np.full((3, w), -1)
    for r in np.flatnonzero(inst & (run.t >= t0) & (run.t <= t1)):
        lane = lane_of[run.agent[r] + 1]
        if lane < 0:
            continue
        c = min(int((run.t[r] - t0) * w / (t1 - t0)), w - 1)
        if want[lane, c] < 0 or run.kind[r] < want[lane, c]:
            want[lane, c] = run.kind[r]
    assert np.array_equal(grid, want)
    assert (grid[2] >= 0).sum() > 5  # not a vacuous comparison


def test_window_through_the_agent_index_equals_the_global_window(run):
    for t0, t1 in ((0.0, 20.0), (3.3, 7.9), (9.0, 9.2)):
        every = run.window(t0, t1)
        some = run.window(t0, t1, agents=np.array([-1, 2, 6]))
        assert np.array_equal(some, every[np.isin(run.agent[every], [-1, 2, 6])]) and len(some)
    lane_of = np.full(run.n + 1, -1)
    lane_of[[0, 2 + 1]] = [0, 1]
    run.n, n = 100, run.n  # as if among many agents: the cells read through the index
    try:
        few = run.cells(lane_of, 2, 2.0, 6.0, 50)
    finally:
        run.n = n
    assert np.array_equal(few, run.cells(lane_of, 2, 2.0, 6.0, 50)) and (few >= 0).sum() > 20


def test_spans_fill_the_cells_they_cover(run):
    off = rows_of(run, "offline")[0]
    a, t, d = int(run.agent[off]), float(run.t[off]), float(run.value[off])
    lane_of = np.full(run.n + 1, -1)
    lane_of[a + 1] = 0
    only = run.kind == run.code["offline"]
    grid = run.cells(lane_of, 1, t - d, t + 2 * d, 30, only)
    covered = np.flatnonzero(grid[0] == run.code["offline"])
    assert covered[0] == 10 and covered[-1] in (19, 20) and len(covered) == covered[-1] - 9


def test_binning_in_slices_equals_one_pass(run, monkeypatch):
    """A view of many lanes bins its rows in slices (``CHUNK``): the grid is that of one pass."""
    from netsim.explore import model

    lane_of = np.arange(run.n + 1)  # the run's lane and every agent: the contiguous path
    args = (lane_of, run.n + 1, 2.0, 15.0, 400)
    one = run.cells(*args)
    monkeypatch.setattr(model, "CHUNK", 97)  # ~20 slices, spans cut across them
    assert np.array_equal(run.cells(*args), one)
    assert {run.code["offline"], run.code["compute"], run.code["send"]} <= set(np.unique(one).tolist())


def _corrupt(whole, column: str, row: int, value):
    import pyarrow as pa

    i = whole.schema.get_field_index(column)
    vals = whole.column(i).to_pylist()
    vals[row] = value
    cols = list(whole.columns)
    cols[i] = pa.array(vals, whole.schema.field(i).type)
    return pa.record_batch(cols, schema=whole.schema)


@pytest.mark.parametrize("column,value", [("t", -1.0), ("agent", 8), ("peer", -2), ("value", None)])
@pytest.mark.parametrize("checked", [True, False])
def test_tail_reader_stops_where_read_trace_does(tmp_path, column, value, checked):
    """The incremental reader's vectorized checks find the same batch as ``read_trace`` (time < 0, agent id
    past agents.count, peer < -1, a null): with checksums (the batch's CRC sound, so the writer wrote it) both
    refuse it in one line; in a trace without them, the readable part ends there for both."""
    from netsim.errors import InputError
    from netsim.trace.io import TraceTail

    meta, whole = _whole()
    bad = _corrupt(whole.slice(700, 700), column, 123, value)
    write_trace(tmp_path / "trace.arrows", meta, [whole.slice(0, 700), bad, whole.slice(1400)], checked=checked)
    if checked:
        for read in (lambda: read_trace(tmp_path), lambda: TraceTail(tmp_path).read()):
            with pytest.raises(InputError, match=r"trace.arrows: batch 2 \(at byte [0-9,]+\) is damaged: it holds"):
                read()
        return
    tr = read_trace(tmp_path)
    tail = TraceTail(tmp_path)
    got = tail.read()
    assert tr.table.num_rows == sum(b.num_rows for b in got) == 700
    assert not tr.complete and not tail.complete and not tail.sound
    assert tail.read() == []  # a bad batch ends the readable part for good


# following -----------------------------------------------------------------------------------------
def test_every_timeout_is_explained_by_exactly_its_missing_messages(run):
    reasons = set()
    for r in rows_of(run, "timeout"):
        miss = missing_at_timeout(run, r)
        assert len(miss) == round(float(run.value[r])), run.row(r)
        reasons |= {why.split(" ")[0] for _, why in miss}
    assert {"dropped", "late:", "never", "sent"} <= reasons


def test_first_timeout_names_the_dropped_neighbour_and_the_burst_model(run):
    first = rows_of(run, "timeout")[0]
    lines = describe(run, first)
    assert lines[0].startswith("timeout at t = ")
    assert any("from 6: dropped (loss" in x and "Gilbert-Elliott burst" in x for x in lines), lines


def test_drop_causes(run):
    causes = {run.tag(r): drop_cause(run, r) for r in rows_of(run, "drop")}
    assert set(causes) == {"loss", "offline"}
    assert "Gilbert-Elliott burst (p_enter=0.02, p_exit=0.25)" in causes["loss"]
    assert "offline (churn)" in causes["offline"] and "agent " in causes["offline"]


def test_send_is_followed_to_its_delivery(run):
    s = next(r for r in rows_of(run, "send") if len(run.message(int(run.msg[r]))) == 2
             and run.kind_of(run.message(int(run.msg[r]))[1]) == "deliver")
    d = run.message(int(run.msg[s]))[1]
    lines = describe(run, s)
    assert f"delivered at {run.t[d]:.6g}" in "\n".join(lines)
    assert abs(run.t[d] - run.t[s] - run.value[d]) < 1e-9  # the latency shown is the delay


def test_causal_past_is_the_closure_over_deliveries(run):
    a, t = 0, 1.2
    got = causal_past(run, a, t)
    dl = rows_of(run, "deliver")
    need = {a: t}
    changed = True
    while changed:  # fixed point of: j reaches i by time need[i] if a delivery j -> i lands by then
        changed = False
        for r in dl:
            i, j, sent = int(run.agent[r]), int(run.peer[r]), float(run.t[r] - run.value[r])
            if i in need and run.t[r] <= need[i] and need.get(j, -1.0) < sent:
                need[j] = sent
                changed = True
    assert got.keys() == need.keys() and all(abs(got[k] - need[k]) < 1e-12 for k in need)
    assert sorted(got) == [0, 1, 2, 3, 7]  # a ring: by 1.2 s news travelled two hops one way, one the other


# queries -------------------------------------------------------------------------------------------
def test_search_terms(run):
    m = query.mask(run, "kind=drop src=3")
    want = (run.kind == run.code["drop"]) & (run.agent == 3)
    assert np.array_equal(m, want) and m.sum() > 0
    m = query.mask(run, "kind=deliver,stale src=2 t>=5 t<10")
    recv = np.isin(run.kind, run.codes(("deliver", "stale")))
    assert np.array_equal(m, recv & (run.peer == 2) & (run.t >= 5) & (run.t < 10))
    offline = np.array([run.tag(i) == "offline" for i in range(len(run.t))])
    assert np.array_equal(query.mask(run, "agent=0-2,7 tag=offline"), np.isin(run.agent, [0, 1, 2, 7]) & offline)
    assert query.mask(run, "  ") is None
    assert query.window("kind=send t>=2 t<=5") == (2.0, 5.0)


@pytest.mark.parametrize("text, msg", [
    ("kind=bogus", "unknown kind(s) bogus; allowed: drop,"),
    ("colour=red", "unknown key 'colour'; allowed: kind, agent"),
    ("drop", "expected key=value terms"),
    ("src=a", "expected integers or ranges"),
    ("t>=soon", "expected a number after t>="),
    ("kind>drop", "only kind=... is allowed"),
])
def test_bad_queries_say_what_is_allowed(run, text, msg):
    with pytest.raises(InputError, match=None) as e:
        query.mask(run, text)
    assert msg in str(e.value)


# export --------------------------------------------------------------------------------------------
def test_export_is_valid_trace_event_json(run):
    data = trace_events(run, 2.0, 8.0, np.array([0, 1, 2]))
    assert check_trace_events(data) == []
    ev = data["traceEvents"]
    starts = {e["id"] for e in ev if e["ph"] == "s"}
    # every message delivered within the window between two shown agents is an arrow
    want = {int(run.msg[r]) for r in rows_of(run, "deliver")
            if 2.0 <= run.t[r] <= 8.0 and run.agent[r] in (0, 1, 2) and run.peer[r] in (0, 1, 2)
            and 2.0 <= run.t[r] - run.value[r]}
    assert starts == want and len(want) > 10
    assert {e["tid"] for e in ev if e["ph"] != "M"} <= {-1, 0, 1, 2}


def test_trace_event_checker_catches_broken_documents():
    ok = {"ph": "i", "name": "a", "ts": 1.0, "pid": 0, "tid": 0}
    assert check_trace_events({"traceEvents": [ok]}) == []
    bad = [ok, {**ok, "ts": 0.5}, {"ph": "s", "name": "m", "id": 1, "ts": 2.0, "pid": 0, "tid": 1},
           {"ph": "f", "name": "m", "id": 2, "ts": 3.0, "pid": 0, "tid": 2}]
    problems = check_trace_events({"traceEvents": bad})
    assert any("before" in p for p in problems)
    assert sum("start without finish" in p for p in problems) == 2


def test_cli_export_and_errors(tmp_path):
    out = tmp_path / "view.json"
    p = subprocess.run(netsim_cli("explore", str(TRACE), "--filter", "kind=send,deliver agent=0-3",
                                  "--export", str(out)), capture_output=True, text=True, env=cli_env())
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    assert check_trace_events(data) == []
    assert {e["name"] for e in data["traceEvents"] if e["ph"] == "i"} == {"send", "deliver"}
    for args, msg in [(["--filter", "kind=nope"], "error: --filter: unknown kind(s) nope"),
                      (["--filter", "src"], "error: --filter: expected key=value")]:
        p = subprocess.run(netsim_cli("explore", str(TRACE), *args), capture_output=True, text=True,
                           env=cli_env())
        assert p.returncode == 2 and p.stderr.startswith(msg) and p.stderr.count("\n") == 1, p.stderr
    p = subprocess.run(netsim_cli("explore", str(tmp_path / "none")), capture_output=True, text=True,
                       env=cli_env())
    assert p.returncode == 2 and "trace not found" in p.stderr and "Traceback" not in p.stderr


def test_help_does_not_import_textual():
    p = subprocess.run([netsim_cli()[0], "-X", "importtime", "-m", "netsim", "--help"],
                       capture_output=True, text=True, env=cli_env())
    assert p.returncode == 0 and "explore" in p.stdout
    assert "textual" not in p.stderr and "netsim.explore" not in p.stderr


# the app, headless -------------------------------------------------------------------------------
def drive(coro_fn, size=SIZE):
    async def main():
        app = Explorer(TRACE)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await coro_fn(app, pilot)
    asyncio.run(main())


def lanes(app) -> Lanes:
    return app.query_one(Lanes)


def details(app) -> str:
    return str(app.query_one("#details").render())


def status(app) -> str:
    return str(app.query_one("#status").render())


def test_timeout_explained_one_keystroke_from_the_start(run):
    first = rows_of(run, "timeout")[0]

    async def go(app, pilot):
        v = lanes(app)
        await pilot.press("t")
        assert v.selected == first
        assert "waited for 1 missing message(s)" in details(app) and "from 6: dropped (loss" in details(app)
        assert "under: timeout @ 1.3269" in status(app)
        await pilot.press("t")
        assert v.selected == rows_of(run, "timeout")[1]
        await pilot.press("T")
        assert v.selected == first
    drive(go)


def test_follow_a_send_and_jump_between_drops(run):
    drops = rows_of(run, "drop")

    async def go(app, pilot):
        v = lanes(app)
        await pilot.press("x")
        assert v.selected == drops[0]
        await pilot.press("x", "x", "X")
        assert v.selected == drops[1]
        await pilot.press("enter")  # a drop goes back to its send
        assert run.kind_of(v.selected) == "send" and run.msg[v.selected] == run.msg[drops[1]]
        await pilot.press("enter")  # and the send forward to its drop
        assert v.selected == drops[1]
        await pilot.press("left_square_bracket")  # previous event of the same kind
        assert v.selected == drops[0]
    drive(go)


def test_zoom_pan_fit_and_goto(run):
    async def go(app, pilot):
        v = lanes(app)
        span = v.t1 - v.t0
        await pilot.press("w")
        assert abs((v.t1 - v.t0) - span / 2) < 1e-9
        await pilot.press("minus", "plus", "plus")
        assert abs((v.t1 - v.t0) - span / 4) < 1e-9
        t0 = v.t0
        await pilot.press("d")
        assert abs(v.t0 - (t0 + span / 16)) < 1e-9
        await pilot.press("f")
        assert (v.t0, v.t1) == (0.0, run.t_max)
        await pilot.press("g", *"12.5", "enter")
        assert abs(v.col_time(v.col) - 12.5) <= (v.t1 - v.t0) / v._geom[0]
        await pilot.press("A", "6", "enter")
        assert v.lane_agents(v.lane) == [6] and "agent 6 up to t" in str(app.query_one("#agent").render())
        await pilot.press("g", *"soon", "enter")
        assert "error: time: expected seconds, got 'soon'" in status(app)
    drive(go)


def test_search_and_filter(run):
    matches = np.flatnonzero(query.mask(run, "kind=drop src=3"))

    async def go(app, pilot):
        v = lanes(app)
        await pilot.press("slash", *"kind=drop src=3", "enter")
        assert v.selected == matches[0]
        assert len(matches) == 2
        await pilot.press("n")
        assert v.selected == matches[1]
        await pilot.press("n")
        assert v.selected == matches[1] and "no next match" in status(app)
        await pilot.press("N")
        assert v.selected == matches[0]
        await pilot.press("k", *"kind=timeout agent=2-4 t>=5 t<=10", "enter")
        assert list(v.agents) == [2, 3, 4] and (v.t0, v.t1) == (5.0, 10.0)
        await pilot.press("x")
        assert "no next drop" in status(app)  # drops are filtered out
        await pilot.press("t")
        sel = v.selected
        assert run.kind_of(sel) == "timeout" and run.agent[sel] in (2, 3, 4) and 5 <= run.t[sel] <= 10
        await pilot.press("k", *"kind=nothing", "enter")
        assert "error: filter: unknown kind(s) nothing" in status(app)
    drive(go)


def test_mouse_click_and_wheel(run):
    async def go(app, pilot):
        v = lanes(app)
        await pilot.click(v, offset=(v.label_w + 1 + 20, 4))  # the third agent lane, column 20
        assert v.lane == 3 and v.col == 20 and v.lane_agents(3) == [2]
        span = v.t1 - v.t0
        v.scroll_event(-1, ctrl=True, shift=False)  # ctrl+wheel zooms (the pilot has no wheel)
        assert abs((v.t1 - v.t0) - span / 2) < 1e-9
        v.scroll_event(1, ctrl=False, shift=False)  # the wheel alone moves the lane cursor
        assert v.lane == 4
    drive(go)


def test_resize_aggregates_lanes_and_drills_down(run):
    async def go(app, pilot):
        v = lanes(app)
        assert v._geom[3] == 1
        await pilot.resize_terminal(100, 13)  # 5 rows for 8 agents: two per lane
        await pilot.pause()
        assert v._geom[3] == 2 and v.lane_agents(1) == [0, 1]
        await pilot.press("down", "enter")  # drill into agents 2-3
        assert list(v.agents) == [2, 3] and v._geom[3] == 1
        await pilot.press("escape")
        assert len(v.agents) == 8
        await pilot.press("m")  # one lane per agent, scrolling
        assert v._geom[3] == 1
        await pilot.press("pagedown")
        assert v.lane_top > 0
    drive(go)


# snapshots (SVG under tests/__snapshots__; docs/explore.md shows them) ------------------------------
def test_snapshot_first_screen(snap_compare):
    assert snap_compare(Explorer(TRACE), terminal_size=SIZE)


def test_snapshot_timeout_explained(snap_compare):
    assert snap_compare(Explorer(TRACE), press=["t", "w", "w", "w"], terminal_size=SIZE)


def test_snapshot_aggregated_lanes(snap_compare):
    assert snap_compare(Explorer(TRACE), press=["x"], terminal_size=(100, 13))


def test_snapshot_two_runs(snap_compare):
    assert snap_compare(Explorer(TRACE, other=RunData(PAIR)), press=["D"], terminal_size=(110, 36))


def test_agent_pane_of_a_private_run():
    """epsilon so far and each agent's own accuracy, against the run's own summary (privacy_activation,
    4 agents, 6 s: privacy_epsilon_max 0.024936354829607297 of agent 0, agent_accuracy_min 0.580624997...)."""
    priv = RunData(TRACE.parent / "explore_private")
    eps = [priv.epsilon(a, priv.t_max) for a in range(4)]
    assert max(eps) == pytest.approx(0.024936354829607297, rel=1e-9) and int(np.argmax(eps)) == 0
    assert 0 < priv.epsilon(0, 2.0) < eps[0]  # grows with the releases made so far
    assert min(priv.accuracy_of(a, priv.t_max) for a in range(4)) == pytest.approx(0.5806249976158142)
    assert priv.accuracy_of(0, -1.0) is None and RunData(TRACE).epsilon(0, 5.0) is None

    async def go(app, pilot):
        v = lanes(app)
        await pilot.press("A", "0", "enter", "f")
        v.col = v._geom[0] - 1
        v.moved()
        await pilot.pause()
        pane = str(app.query_one("#agent").render())
        assert "epsilon spent 0.02494" in pane and "own model's accuracy" in pane
    async def main():
        app = Explorer(TRACE.parent / "explore_private")
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await go(app, pilot)
    asyncio.run(main())


def test_live_mode_follows_batches_as_they_land(tmp_path):
    """A trace being written (no end marker): the app re-reads it when it grows and keeps following the
    end of the run; the end marker ends live mode."""
    import pyarrow as pa

    from netsim.trace.io import EOS, SCHEMA, batch_message

    with pa.OSFile(str(TRACE / "trace.arrows")) as f:
        reader = pa.ipc.open_stream(f)
        meta, whole = reader.schema.metadata, reader.read_all().combine_chunks().to_batches()[0]
    batches = [whole.slice(0, 700), whole.slice(700, 700), whole.slice(1400)]  # three flushes
    live = tmp_path / "trace.arrows"
    live.write_bytes(SCHEMA.with_metadata(meta).serialize().to_pybytes() + batch_message(batches[0]))

    def append(*data: bytes) -> None:
        with open(live, "ab") as f:
            f.write(b"".join(data))

    async def main():
        app = Explorer(live)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            v = lanes(app)
            n0, end0 = len(v.run_data.t), v.t1
            assert app.follow and n0 == batches[0].num_rows and "LIVE" in status(app)
            await pilot.press("t")
            sel = v.selected
            assert not app.poll()  # nothing new
            append(batch_message(batches[1]))
            assert app.poll()
            assert len(v.run_data.t) == n0 + batches[1].num_rows and v.t1 > end0
            assert v.selected == sel and run_kind(app, sel) == "timeout"  # rows only append
            append(*[batch_message(b) for b in batches[2:]], EOS)
            assert app.poll() and not app.follow and "run complete" in status(app)
            assert len(v.run_data.t) == sum(b.num_rows for b in batches)
    asyncio.run(main())


def _whole():
    """The committed trace's schema metadata and all its rows as one record batch."""
    import pyarrow as pa

    with pa.OSFile(str(TRACE / "trace.arrows")) as f:
        reader = pa.ipc.open_stream(f)
        return reader.schema.metadata, reader.read_all().combine_chunks().to_batches()[0]


def assert_same_model(a: RunData, b: RunData) -> None:
    for name in ("t", "agent", "value", "peer", "msg", "size", "round", "by_agent", "starts", "by_msg"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert [a.kind_names[k] for k in a.kind] == [b.kind_names[k] for k in b.kind]
    assert a._tag.to_pylist() == b._tag.to_pylist()
    assert (a.n, a.t_end, a.t_max, a.max_span, a.complete, a.partial) == (b.n, b.t_end, b.t_max, b.max_span,
                                                                          b.complete, b.partial)
    assert all(np.array_equal(x, y) for x, y in zip(a.evals(), b.evals()))


def test_refresh_reads_only_the_batches_appended_since(tmp_path, monkeypatch):
    """Live mode's refresh: a trace written in two halves, the second one first cut mid-batch, reads as the
    whole file does; each refresh reads the bytes after the last whole batch only, and a batch half
    written is left for the next one."""
    from netsim.trace.io import EOS, SCHEMA, TraceTail, batch_message

    meta, whole = _whole()
    header = SCHEMA.with_metadata(meta).serialize().to_pybytes()
    first, second = (batch_message(b) for b in (whole.slice(0, 1100), whole.slice(1100)))
    live = tmp_path / "trace.arrows"
    live.write_bytes(header + first)
    r = RunData(live)
    r.warm()  # the indexes exist: a refresh must not leave them stale
    assert len(r.t) == 1100 and not r.complete and r.partial.startswith("partial run, up to t = ")
    assert r._reader.offset == len(header) + len(first)
    read = []
    orig = TraceTail._bytes
    monkeypatch.setattr(TraceTail, "_bytes", lambda self: read.append(orig(self)) or read[-1])

    def append(data: bytes) -> None:
        with open(live, "ab") as f:
            f.write(data)

    append(second[:len(second) // 2])
    assert r.refresh() == 0 and len(r.t) == 1100 and r._reader.offset == len(header) + len(first)
    append(second[len(second) // 2:] + EOS)
    assert r.refresh() == whole.num_rows - 1100
    assert [b.size for b in read] == [len(second) // 2, len(second) + len(EOS)]
    assert r.complete and r.refresh() == 0
    assert_same_model(r, RunData(TRACE))


def run_kind(app, row: int) -> str:
    return lanes(app).run_data.kind_of(row)


def write_trace(path, meta, batches, end: bool = True, checked: bool = True) -> None:
    """Batches as the trace writer writes them (``checked``: each with its checksum), or as a netsim before
    checksums did."""
    from netsim.trace.io import CHECKSUM_KEY, EOS, SCHEMA, batch_message

    if not checked:
        meta = {k: v for k, v in meta.items() if k != CHECKSUM_KEY.encode()}
    path.write_bytes(SCHEMA.with_metadata(meta).serialize().to_pybytes()
                     + b"".join(batch_message(b) if checked else b.serialize().to_pybytes() for b in batches)
                     + (EOS if end else b""))


def test_two_runs_first_difference(tmp_path, run):
    import pyarrow as pa

    from netsim.explore.diff import first_difference

    with pa.OSFile(str(TRACE / "trace.arrows")) as f:
        reader = pa.ipc.open_stream(f)
        meta, whole = reader.schema.metadata, reader.read_all().combine_chunks().to_batches()[0]
    value = whole.column("value").to_numpy().copy()
    value[1000] += 1e-9  # one delay differs in its last digits
    changed = pa.record_batch([*whole.columns[:6], pa.array(value), *whole.columns[7:]], schema=whole.schema)
    (tmp_path / "b").mkdir()
    write_trace(tmp_path / "b" / "trace.arrows", meta, [changed])
    write_trace(tmp_path / "prefix.arrows", meta, [whole.slice(0, 1500)])
    other = RunData(tmp_path / "b")
    assert first_difference(run, other) == (1000, ["value"])
    assert first_difference(run, RunData(tmp_path / "prefix.arrows")) == (1500, ["length"])
    assert first_difference(run, RunData(TRACE)) == (None, [])

    async def main():
        app = Explorer(TRACE, run, other=other)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            v = lanes(app)
            await pilot.press("D")
            assert v.selected == 1000 and "first difference at row 1000: value" in status(app)
            t0, t1 = v.t0, v.t1
            await pilot.press("b")
            assert v.run_data is other and (v.t0, v.t1) == (t0, t1) and v.selected == 1000
            await pilot.press("b")
            assert v.run_data is run
    asyncio.run(main())
    p = subprocess.run(netsim_cli("explore", str(TRACE), str(TRACE), str(TRACE)), capture_output=True, text=True,
                       env=cli_env())
    assert p.returncode == 2 and "at most two runs (to compare), got 3" in p.stderr


def screen_lines(app) -> list[str]:
    v = lanes(app)
    w, h = v.size
    return ["".join(seg.text for seg in strip) for strip in v.strips(w, h)]


def test_two_runs_in_two_panes(run):
    """Two runs one above the other: one time axis, one cursor; D selects the first difference in both panes
    (each its own event); zooming moves both; b or a click on the other pane makes it the active one."""
    other = RunData(PAIR)

    async def main():
        app = Explorer(TRACE, run, other=other)
        async with app.run_test(size=(110, 36)) as pilot:
            await pilot.pause()
            v = lanes(app)
            lines = screen_lines(app)
            assert lines[0].startswith("t (s)") and v._geom[3] == 1  # 8 agents per pane, one per lane
            assert lines[1].startswith("▶ A: dpsgd_bursty · dpsgd (explore_bursty)")
            b_top = v.pane_top(1)
            assert lines[b_top - 1].startswith("  B: dpsgd_bursty · dpsgd (explore_bursty_exit05)")
            assert lines[2].strip().startswith("run|") and lines[b_top].strip().startswith("run|")
            await pilot.press("D")
            assert v.selected == 179 and v.other_selected == 179
            assert "[A]" in status(app) and "first difference at row 179: kind, peer, msg, value, tag" in status(app)
            lw, col = v.label_w, v.time_col(float(run.t[179]))
            for i, r in enumerate((run, other)):  # each pane reverses its own event, same lane and column
                y = v.pane_top(i) + v._lane_of_agent(2)
                w, h = app.query_one("Lanes").size
                at, hit = 0, []
                for seg in v.strips(w, h)[y]:
                    if seg.style is not None and seg.style.reverse and at > lw:  # past the lane label
                        hit.append((at, seg.text))
                    at += len(seg.text)
                glyph = {"drop": "x", "send": ">"}[r.kind_of(179)]
                assert hit == [(lw + 1 + col, glyph)], (i, hit)
            assert (run.kind_of(179), other.kind_of(179)) == ("drop", "send")
            span = v.t1 - v.t0
            await pilot.press("w")
            assert abs((v.t1 - v.t0) - span / 2) < 1e-9 and screen_lines(app)[0].startswith(f"t (s) {v.t0:.5g} ")
            await pilot.press("b")
            assert v.run_data is other and v.selected == 179 and v.other_selected == 179
            assert "[B]" in status(app) and "under: send @ 1.93119 2->3" in status(app)
            assert screen_lines(app)[b_top - 1].startswith("▶ B:")
            await pilot.click("Lanes", offset=(lw + 1 + 20, v.pane_top(0) + 1))  # agent 0's lane in pane A
            assert v.run_data is run and v.lane == 1 and v.col == 20
    asyncio.run(main())


def test_causal_key_and_export_key(tmp_path, run):
    import shutil

    shutil.copy(TRACE / "trace.arrows", tmp_path / "trace.arrows")

    async def main():
        app = Explorer(tmp_path, RunData(tmp_path))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            v = lanes(app)
            await pilot.press("g", *"1.2", "enter")
            v.lane = 1  # agent 0
            v.moved()
            await pilot.press("c")
            want = causal_past(run, 0, v.col_time(v.col))
            assert v.causal == want and f"causal past of 0: {len(want)} agents" in status(app)
            await pilot.press("escape")
            assert v.causal is None
            await pilot.press("w", "e")
            out = tmp_path / "explore-view.json"
            data = json.loads(out.read_text())
            assert check_trace_events(data) == [] and data["otherData"]["window_s"] == [v.t0, v.t1]
            assert f"wrote explore-view.json ({len(data['traceEvents'])} events)" in status(app)
    asyncio.run(main())


def test_run_explore_opens_on_the_live_trace_and_leaves_the_run_unchanged(tmp_path, monkeypatch):
    """``netsim run --explore``: the run is a plain child run (byte-identical trace), the explorer opens on
    its first flushed batch, and the child's own output comes back when it ends."""
    from netsim import cli

    opened = []

    class FakeExplorer:  # the app itself is driven headless above; here: what it is given
        def __init__(self, folder, data, filter_, follow, other):
            opened.append((folder, len(data.t)))

        def run(self):
            pass

    monkeypatch.setattr("netsim.explore.app.Explorer", FakeExplorer)
    said = []
    monkeypatch.setattr(cli.typer, "echo", lambda line="", **_: said.append(str(line)))
    sets = ["run.until=40", "run.trace_flush_every=256"]
    folder = tmp_path / "live"
    rc = cli._run_explored(ROOT / "scenarios" / "quickstart.toml", sets, folder, [], False)
    assert rc == 0 and (folder / "summary.json").exists()
    assert len(opened) == 1 and opened[0][0] == folder and opened[0][1] > 0
    plain = subprocess.run(netsim_cli("run", str(ROOT / "scenarios" / "quickstart.toml"), "--out",
                                      str(tmp_path / "plain"), "-q", *[a for s in sets for a in ("--set", s)]),
                           capture_output=True, text=True, env=cli_env())
    assert plain.returncode == 0, plain.stderr
    assert (folder / "trace.arrows").read_bytes() == (tmp_path / "plain" / "trace.arrows").read_bytes()


def test_run_explore_refuses_an_untraced_run(tmp_path):
    p = subprocess.run(netsim_cli("run", str(ROOT / "scenarios" / "quickstart.toml"), "--explore", "--out",
                                  str(tmp_path / "x"), "--set", "run.trace=false"),
                       capture_output=True, text=True, env=cli_env())
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "quickstart.toml: run.trace: --explore follows the trace" in p.stderr
    assert not (tmp_path / "x").exists()
