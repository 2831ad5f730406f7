"""``netsim explore``'s widgets, driven headless: the keys' descriptions, the footer, the help screen and the
command palette's key panel; the cursor's time and counts; the metric strips; the area pivot (against
pandas); the query bar's results; two runs' differences only; live mode's worker. On the committed small
traces of tests/test_explore.py."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from rich.console import Console

from netsim.explore.app import Explorer
from netsim.explore.draw import BARS, PLOT_ROWS, fit
from netsim.explore.help import APP_KEYS, LANES_KEYS, HelpScreen, legend
from netsim.explore.lanes import Lanes, epsilon_steps
from netsim.explore.model import RunData
from netsim.explore.panels import PivotPanel, ResultsPanel, StatusBar
from netsim.explore.pivot import pivot
from netsim.trace.io import read_trace
from tests.conftest import ROOT

TRACE = ROOT / "tests" / "data" / "explore_bursty"
PAIR = ROOT / "tests" / "data" / "explore_bursty_exit05"
PRIVATE = ROOT / "tests" / "data" / "explore_private"
SIZE = (110, 26)


def run_app(body, path=TRACE, size=SIZE, **kw):
    async def main():
        app = Explorer(path, **kw)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await body(app, pilot)
    asyncio.run(main())


def lanes(app) -> Lanes:
    return app.query_one(Lanes)


def status(app) -> str:
    return str(app.query_one(StatusBar).render())


def text_of(renderable, width: int = 120) -> str:
    c = Console(width=width, record=True, file=open("/dev/null", "w"))
    c.print(renderable)
    return c.export_text()


def screen_lines(app) -> list[str]:
    w, h = lanes(app).size
    return ["".join(seg.text for seg in strip) for strip in lanes(app).strips(w, h)]


# keys: described everywhere ---------------------------------------------------------------------------
def test_every_binding_has_a_description():
    from netsim.explore.app import Explorer as App_

    for owner in (Lanes, App_, HelpScreen, ResultsPanel):
        for b in owner.BINDINGS:
            assert b.description.strip(), (owner.__name__, b.key, b.action)
    keys = {b.key: b for b in Lanes.BINDINGS}
    for key, action in [("d", "pan(0.25)"), ("w", "zoom(0.5)"), ("x", "jump('drop', 1)"), ("enter", "follow"),
                        ("left", "cursor(-1)"), ("pagedown", "page(1)"), ("right_square_bracket", "jump('', 1)")]:
        assert keys[key].action == action and keys[key].description
    table = [k for _, rows in [*LANES_KEYS, *APP_KEYS] for keys_, *_ in rows for k in keys_.split(",")]
    assert len(table) == len(set(table))  # no key does two things


def test_help_footer_and_key_panel():
    """The footer shows the main keys; ? opens every key grouped with the glyph legend; the palette's key
    panel describes every binding (d and w among them); escape closes each."""
    from textual.widgets._footer import FooterKey
    from textual.widgets._key_panel import BindingsTable

    async def body(app, pilot):
        footer = {k.key_display: k.description for k in app.query(FooterKey)}
        for key, what in [("?", "help"), ("q", "quit"), ("t", "next round timeout"), ("/", "search"),
                          (":", "SQL"), ("v", "area")]:
            assert footer.get(key) == what, footer
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        body_text = text_of(app.screen.query_one("#help-keys").content, 140)
        legend_text = text_of(app.screen.query_one("#help-legend").content, 80)
        for group, rows in [*LANES_KEYS, *APP_KEYS]:
            assert group in body_text
            for _, _, desc, _ in rows:
                assert desc.split("|")[0] in body_text
        for glyph, _, meaning in legend():
            assert any(line.strip().startswith(f"{glyph} ") and meaning in line for line in legend_text.splitlines())
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("ctrl+p", *"keys")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        panel = text_of(app.screen.query_one(BindingsTable).render(), 140)
        lines = [" ".join(x.split()) for x in panel.splitlines()]
        assert "d shift+→ pan right a quarter of the window" in lines
        assert "w + = zoom in around the selected event, else the cursor" in lines
        await pilot.press("escape")
        assert not app.screen.query("HelpPanel")
        await pilot.press("g")
        assert app.query_one("#prompt").has_class("open")
        await pilot.press("escape")
        assert not app.query_one("#prompt").has_class("open") and lanes(app).has_focus
    run_app(body, size=(120, 40))


# small things that confused ----------------------------------------------------------------------------
def test_k_then_enter_clears_the_filter_and_keeps_the_zoom():
    async def body(app, pilot):
        await pilot.press("k", *"kind=timeout", "enter")
        v = lanes(app)
        assert v.filter_mask is not None and "filter: kind=timeout" in status(app)
        await pilot.press("w", "w", "d")
        window = (v.t0, v.t1)
        await pilot.press("k")
        assert app.query_one("#prompt").value == ""  # the prompt starts empty: enter clears
        await pilot.press("enter")
        assert v.filter_mask is None and v.filter_text == "" and "filter:" not in status(app)
        assert (v.t0, v.t1) == window
    run_app(body)


def test_status_time_agent_counts_and_under_event_agree():
    """Zoomed out (a cell is 0.2 s), the selected timeout's time is the status line's time, and the
    agent pane counts up to it, the timeout itself included."""
    run = RunData(TRACE)

    async def body(app, pilot):
        await pilot.press("t")
        v = lanes(app)
        row = v.selected
        t, a = float(run.t[row]), int(run.agent[row])
        assert abs(v.col_time(v.col) - t) > 1e-6  # the column's middle is not the event's time
        line = status(app)
        assert line.startswith(f"t={t:.6g}s  agent {a}  under: timeout @ {t:.6g}")
        rows = run.agent_rows(a)
        want = int(((run.kind[rows] == run.code["timeout"]) & (run.t[rows] <= t)).sum())
        assert want >= 1
        pane = str(app.query_one("#agent").render())
        assert f"agent {a} up to t = {t:.6g}" in pane and f"timeouts {want}" in pane
    run_app(body)


def bar_heights(lines: list[str], lw: int) -> np.ndarray:
    """Bar height per column (in eighths) of a metric strip's rows, top row first."""
    rows = [line[lw + 1:] for line in lines]
    return sum(np.array([BARS.index(c) if c in BARS else 0 for c in row]) * 8 ** 0 for row in rows)


def test_accuracy_strip_is_taller_and_two_panes_share_its_range():
    a, b = RunData(TRACE), RunData(PAIR)
    both = np.concatenate([a.evals()[1], b.evals()[1]])
    lo, hi = float(both.min()), float(both.max())
    assert (lo, hi) != (float(a.evals()[1].min()), float(a.evals()[1].max()))  # the ranges differ alone

    async def body(app, pilot):
        v = lanes(app)
        lines = screen_lines(app)
        tops = [i for i, x in enumerate(lines) if x.startswith(fit(hi, v.label_w).rjust(v.label_w))]
        assert len(tops) == 2  # one strip per pane, one y-range
        for top, r in zip(tops, (a, b)):
            strip = lines[top:top + PLOT_ROWS]
            assert strip[-1].startswith(fit(lo, v.label_w).rjust(v.label_w)) and strip[1].strip().startswith("acc")
            h = bar_heights(strip, v.label_w)
            w = v._geom[0]
            col_t = v.t0 + (np.arange(w) + 0.5) * (v.t1 - v.t0) / w
            t, val = r.evals()
            idx = np.searchsorted(t, col_t, side="right") - 1
            want = np.clip(((val[idx] - lo) / (hi - lo) * PLOT_ROWS * 8).astype(int), 1, None)
            assert np.array_equal(h[:w][idx >= 0], want[idx >= 0])
    run_app(body, other=RunData(PAIR), size=(110, 40))


def test_epsilon_lane_of_the_cursor_agent():
    priv = RunData(PRIVATE)
    w = 50
    col_t = (np.arange(w) + 0.5) * priv.t_max / w
    eps = epsilon_steps(priv, 0, col_t)
    want = [priv.epsilon(0, t) or 0.0 for t in col_t]
    assert np.allclose(eps, want, rtol=1e-12) and (np.diff(eps) >= 0).all() and eps[-1] > 0

    async def body(app, pilot):
        await pilot.press("A", "0", "enter")
        lines = screen_lines(app)
        label = [i for i, x in enumerate(lines) if x.strip().startswith("eps 0")]
        assert len(label) == 1
        top = lines[label[0] - 1]
        assert top.strip().startswith(fit(priv.epsilon(0, priv.t_max), lanes(app).label_w))
        assert "█" in "".join(lines[label[0] + 1])
    run_app(body, path=PRIVATE, size=(110, 30))


# the area pivot ------------------------------------------------------------------------------------------
def test_pivot_equals_a_pandas_recomputation():
    run = RunData(TRACE)
    df = read_trace(TRACE).table.to_pandas()
    for t0, t1, agents in [(2.0, 9.5, [1, 2, 3]), (0.0, 30.0, list(range(8))), (5.0, 5.5, [6])]:
        got = pivot(run, t0, t1, agents)
        area = df[(df.t >= t0) & (df.t <= t1) & df.agent.isin(agents)]
        kinds = area.kind.value_counts().to_dict()  # the trace's own kind names (compute_start, not "compute")
        assert got["by_kind"] == kinds and got["events"] == len(area)
        assert got["bytes"] == int(area[area.kind == "send"]["size"].sum())
        assert got["drops"] == int((area.kind == "drop").sum())
        assert got["releases"] == int((area.kind == "release").sum())
        lat = area[area.kind == "deliver"]["value"]
        assert (math.isnan(got["mean_latency_s"]) and lat.empty) or got["mean_latency_s"] == pytest.approx(lat.mean())
    assert pivot(run, 2.0, 9.5, [1, 2, 3])["drops"] > 0


def test_area_selection_opens_the_pivot_panel():
    run = RunData(TRACE)

    async def body(app, pilot):
        v = lanes(app)
        await pilot.press("down", "v")  # agent 1's lane, at the cursor column
        c0, cell = v.col, (v.t1 - v.t0) / v._geom[0]
        await pilot.press("down", "down", *["right"] * 30, "v")  # to agent 3's lane, 30 columns on
        panel = app.query_one(PivotPanel)
        assert panel.has_class("open")
        want = pivot(run, v.t0 + c0 * cell, v.t0 + (c0 + 30) * cell + cell, [1, 2, 3])
        assert panel.figures == want and want["events"] > 50
        assert f"drops {want['drops']:,}" in str(panel.render())
        assert "compute_start" in str(panel.render()) and "compute " not in str(panel.render())
        assert "other corner" not in status(app)  # the area is closed: the status line no longer asks for it
        await pilot.press("escape")
        assert not panel.has_class("open")
        await pilot.press("v")
        assert "area: move to the other corner and press v" in status(app)
        await pilot.press("escape")  # the first corner dropped: nothing left to ask
        assert v.mark is None and "other corner" not in status(app)
    run_app(body)


# the query bar -------------------------------------------------------------------------------------------
def test_query_bar_results_jump_and_pin():
    run = RunData(TRACE)
    drops = np.flatnonzero(run.kind == run.code["drop"])

    async def body(app, pilot):
        await pilot.press("colon", *"select t, agent, tag from trace where kind = 'drop' order by t", "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        res = app.query_one(ResultsPanel)
        assert res.has_class("open") and res.row_count == len(drops) and res.has_focus
        assert f"{len(drops)} rows" in status(app)
        await pilot.press("down", "down", "enter")  # the third drop
        v = lanes(app)
        assert v.selected == drops[2]
        await pilot.press("p")
        assert v.pinned is not None and len(v.pinned[0]) == len(drops) and f"pinned {len(drops)}" in status(app)
        pins = next(x for x in screen_lines(app) if x.strip().startswith("pins|"))
        assert pins.count("◆") == len({v.time_col(float(t)) for t in run.t[drops]})
        assert res.has_focus and res.size.height == 10  # the results stay, full height, and step on
        await pilot.press("down", "enter")  # the fourth drop, with the pins shown
        assert v.selected == drops[3] and v.pinned is not None
        assert res.has_focus
        await pilot.press("p")  # p again, from the results: unpinned
        assert v.pinned is None and f"pinned {len(drops)}" not in status(app)
        await pilot.press("escape")  # the results panel closes
        assert not res.has_class("open")
        await pilot.press("colon", *"select nonsense from trace", "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "SQL: Binder Error" in status(app) and '"nonsense" not found' in status(app)
    run_app(body)


# two runs: differences only -------------------------------------------------------------------------------
def test_differences_only_hides_the_cells_equal_in_both_runs():
    async def body(app, pilot):
        v = lanes(app)
        before = screen_lines(app)
        await pilot.press("u")
        assert v.diff_only and "differences only" in status(app)
        after = screen_lines(app)
        lw, w = v.label_w, v._geom[0]
        tops = [v.pane_top(0), v.pane_top(1)]
        n = 9  # the run lane and 8 agents
        shown = 0
        for li in range(n):
            a = [before[tops[0] + li][lw + 1:lw + 1 + w], before[tops[1] + li][lw + 1:lw + 1 + w]]
            d = [after[tops[0] + li][lw + 1:lw + 1 + w], after[tops[1] + li][lw + 1:lw + 1 + w]]
            for c in range(w):
                if c == v.col:
                    continue
                same = a[0][c] == a[1][c]
                assert (d[0][c], d[1][c]) == ((" ", " ") if same else (a[0][c], a[1][c])), (li, c)
                shown += not same
        assert shown > 10
        await pilot.press("u")
        assert screen_lines(app) == before
    run_app(body, other=RunData(PAIR), size=(110, 40))


# live mode: a worker follows the file -----------------------------------------------------------------------
def test_live_worker_appends_batches_off_the_ui_thread(tmp_path, monkeypatch):
    import pyarrow as pa

    from netsim.explore import app as app_mod
    from netsim.trace.io import EOS, SCHEMA, batch_message

    monkeypatch.setattr(app_mod, "POLL_S", 0.05)
    with pa.OSFile(str(TRACE / "trace.arrows")) as f:
        reader = pa.ipc.open_stream(f)
        meta, whole = reader.schema.metadata, reader.read_all().combine_chunks().to_batches()[0]
    live = tmp_path / "trace.arrows"
    live.write_bytes(SCHEMA.with_metadata(meta).serialize().to_pybytes() + batch_message(whole.slice(0, 900)))

    async def body(app, pilot):
        r = lanes(app).run_data
        assert app.follow and len(r.t) == 900 and "LIVE" in status(app)
        with open(live, "ab") as f:
            f.write(batch_message(whole.slice(900)) + EOS)
        for _ in range(100):
            await pilot.pause(0.05)
            if not app.follow:
                break
        assert len(r.t) == whole.num_rows and r.complete and "run complete" in status(app)
        assert "LIVE" not in status(app)
    run_app(body, path=live)


# the docs: every key listed, every query-bar recipe answered (against pandas) --------------------------------
DOC = ROOT / "docs" / "explore.md"


def test_the_docs_list_every_key():
    from netsim.explore.help import DISPLAY

    text = DOC.read_text()
    table = text[text.index("| key | does |"):text.index("Mouse: a click")]
    for _, rows in [*LANES_KEYS, *APP_KEYS]:
        for keys, *_ in rows:
            for k in keys.split(","):
                assert f"`{DISPLAY.get(k, k)}`" in table or f"`{k}`" in table, k


def recipes() -> dict[str, str]:
    text = DOC.read_text()
    blocks = text.split("```sql\n")[1:]
    out = {}
    for b in blocks:
        body = b[:b.index("```")].strip().splitlines()
        assert body[0].startswith("-- ")
        out[body[0][3:]] = " ".join(x.strip() for x in body[1:])
    return out


def expected(name: str):
    """The recipe's answer computed with pandas from the trace table."""
    import pandas as pd

    df = read_trace(TRACE).table.to_pandas()
    sends = df[df.kind == "send"][["msg", "agent", "peer", "t"]].rename(columns={"agent": "src", "peer": "dst"})
    got = df[df.kind == "deliver"].groupby("msg").t.min().rename("t_end")
    dl = sends.merge(got, left_on="msg", right_index=True)
    dl["latency"] = dl.t_end - dl.t
    if name == "drops by cause":
        n = df[df.kind == "drop"].tag.value_counts()
        return pd.DataFrame({"cause": n.index, "n": n.values})
    if name == "the links with the slowest deliveries":
        g = dl.groupby(["src", "dst"]).latency.agg(["count", "mean"]).reset_index()
        g.columns = ["src", "dst", "n", "mean_latency"]
        return g.sort_values(["mean_latency", "src", "dst"], ascending=[False, True, True]).head(5)
    if name == "the slowest deliveries, to step through (enter) or pin (p)":
        top = dl.sort_values(["latency", "t_end"], ascending=[False, True]).head(20)
        return pd.DataFrame({"t": top.t_end.values, "agent": top.dst.values, "src": top.src.values,
                             "latency": top.latency.values})
    if name == "round timeouts that waited for two or more messages":
        m = df[(df.kind == "timeout") & (df.value >= 2)]
        return pd.DataFrame({"t": m.t.values, "agent": m.agent.values, "round": m["round"].values,
                             "missing": m.value.values})
    raise KeyError(name)


def test_query_bar_answers_the_docs_recipes():
    from netsim.explore.panels import PromptBar

    todo = recipes()
    assert len(todo) == 4

    async def body(app, pilot):
        for name, sql in todo.items():
            await pilot.press("colon")
            app.query_one(PromptBar).value = sql
            await pilot.press("enter")
            await app.workers.wait_for_complete()
            await pilot.pause()
            got = app.query_one(ResultsPanel).result.to_pandas().reset_index(drop=True)
            want = expected(name).reset_index(drop=True)
            assert list(got.columns) == list(want.columns), name
            assert len(got) == len(want) > 0, name
            for c in got.columns:
                a, b = got[c].to_numpy(), want[c].to_numpy()
                if a.dtype.kind == "f" or b.dtype.kind == "f":
                    assert np.allclose(a.astype(float), b.astype(float), rtol=1e-12), (name, c)
                else:
                    assert a.tolist() == b.tolist(), (name, c)
            await pilot.press("escape")
    run_app(body)


def test_the_help_scrolls_to_its_last_row():
    """On a screen shorter than the keys table the help's body scrolls (its title says how, and stays), from
    the first key to the last, by the keys at once."""
    from textual.containers import VerticalScroll

    from netsim.explore.help import HELP_TITLE

    async def body(app, pilot):
        await pilot.press("question_mark")
        await pilot.pause()
        scroll = app.screen.query_one("#help-body", VerticalScroll)
        keys = app.screen.query_one("#help-keys")
        assert scroll.has_focus and scroll.max_scroll_y > 10 and keys.size.height > scroll.size.height
        assert "scroll" in HELP_TITLE and app.screen.query_one("#help-title").region.height >= 1
        await pilot.press("pagedown")
        await pilot.pause()
        assert scroll.scroll_y > 0
        await pilot.press("end")
        await pilot.pause()
        assert scroll.scroll_y == scroll.max_scroll_y
        last = keys.region.y + keys.region.height  # the keys table's last row (q quit) is on screen
        assert scroll.region.y <= last - 1 < scroll.region.y + scroll.region.height
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
    run_app(body, size=(110, 30))


def test_snapshot_help(snap_compare):
    assert snap_compare(Explorer(TRACE), press=["question_mark"], terminal_size=(110, 40))


def test_query_bar_on_a_live_run_asks_the_rows_the_lanes_show(tmp_path):
    """A partial trace: the query bar answers over the rows the explorer read, not the file's later ones."""
    import pyarrow as pa

    from netsim.explore.panels import PromptBar
    from netsim.trace.io import SCHEMA, batch_message

    with pa.OSFile(str(TRACE / "trace.arrows")) as f:
        reader = pa.ipc.open_stream(f)
        meta, whole = reader.schema.metadata, reader.read_all().combine_chunks().to_batches()[0]
    live = tmp_path / "trace.arrows"
    live.write_bytes(SCHEMA.with_metadata(meta).serialize().to_pybytes() + batch_message(whole.slice(0, 900)))

    async def body(app, pilot):
        with open(live, "ab") as f:
            f.write(batch_message(whole.slice(900, 500)))  # written after the explorer read
        await pilot.press("colon")
        app.query_one(PromptBar).value = "select count(*) as n, max(t) as t_max from trace"
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        got = app.query_one(ResultsPanel).result.to_pylist()[0]
        r = lanes(app).run_data
        assert got == {"n": 900, "t_max": float(r.t[-1])} and len(r.t) == 900
    run_app(body, path=live, follow=False)


def test_own_accuracy_strip_of_the_cursor_agent():
    """i: the accuracy strip shows the cursor agent's own model, over one y-range for every agent."""
    priv = RunData(PRIVATE)
    m = priv.agent_accuracy
    lo, hi = float(m[:, 3].min()), float(m[:, 3].max())
    mine = m[m[:, 1] == 2]

    async def body(app, pilot):
        await pilot.press("A", "2", "enter", "i")
        v = lanes(app)
        lines = screen_lines(app)
        at = [i for i, x in enumerate(lines) if x.strip().startswith("acc 2")]
        assert len(at) == 1 and v.own_acc
        strip = lines[at[0] - 1:at[0] - 1 + PLOT_ROWS]
        assert strip[0].strip().startswith(fit(hi, v.label_w)) and strip[-1].strip().startswith(fit(lo, v.label_w))
        w = v._geom[0]
        col_t = v.t0 + (np.arange(w) + 0.5) * (v.t1 - v.t0) / w
        idx = np.searchsorted(mine[:, 0], col_t, side="right") - 1
        want = np.clip(((mine[idx, 3] - lo) / (hi - lo) * PLOT_ROWS * 8).astype(int), 1, None)
        h = bar_heights(strip, v.label_w)[:w]
        assert np.array_equal(h[idx >= 0], want[idx >= 0]) and len(set(want.tolist())) > 3
        await pilot.press("i")
        labels = [x[:v.label_w].strip() for x in screen_lines(app)]
        assert not v.own_acc and "acc" in labels and "acc 2" not in labels  # the average model's again
    run_app(body, path=PRIVATE, size=(110, 30))

    async def none(app, pilot):
        await pilot.press("i")
        assert not lanes(app).own_acc and "no agent_metrics.csv" in status(app)
    run_app(none)
