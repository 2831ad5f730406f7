"""Each explorer widget on its own, in a bare app that records the messages it posts: the lanes, the status
line, the details and agent panels, the prompt, the pivot and the results panels (committed small trace of
tests/test_explore.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pyarrow as pa
from textual.app import App

from netsim.explore.follow import describe
from netsim.explore.lanes import Lanes
from netsim.explore.messages import Answered, JumpTo, PinRequest, View, ViewChanged
from netsim.explore.model import RunData
from netsim.explore.panels import AgentPanel, DetailsPanel, PivotPanel, PromptBar, ResultsPanel, StatusBar, agent_text
from netsim.explore.pivot import pivot, pivot_lines
from tests.conftest import ROOT

TRACE = ROOT / "tests" / "data" / "explore_bursty"
RUN = RunData(TRACE)


class Bare(App):
    """One widget, and the messages that reach the app."""

    def __init__(self, widget):
        super().__init__()
        self.widget, self.got = widget, []

    def compose(self):
        yield self.widget

    def on_mount(self):
        if self.widget is not None:
            self.widget.focus()

    def on_view_changed(self, m):
        self.got.append(m)

    def on_answered(self, m):
        self.got.append(m)

    def on_jump_to(self, m):
        self.got.append(m)

    def on_pin_request(self, m):
        self.got.append(m)


def alone(widget, body, size=(100, 24)):
    async def main():
        app = Bare(widget)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await body(app, pilot)
    asyncio.run(main())


def first(kind: str) -> int:
    return int(np.flatnonzero(RUN.kind == RUN.code[kind])[0])


def view(row: int | None, agents: list[int], t: float, **kw) -> View:
    return View(RUN, row, agents, t, t, (0.0, 24.0), **kw)


def test_lanes_alone_announce_the_view_after_each_key():
    async def body(app, pilot):
        app.got.clear()
        await pilot.press("t")
        changes = [m for m in app.got if isinstance(m, ViewChanged)]
        assert len(changes) == 1  # one announcement per key, however many attributes changed
        v = changes[0].view
        assert v.selected == first("timeout") and v.agents == [int(RUN.agent[v.selected])]
        assert v.t == v.t_upto == float(RUN.t[v.selected])
        await pilot.press("down")
        v, lanes = app.got[-1].view, app.widget
        assert v.agents == [int(RUN.agent[first("timeout")]) + 1]
        tol = (lanes.t1 - lanes.t0) / lanes._geom[0] / 2  # the moved cursor picks the event under it anew
        assert v.selected == RUN.nearest(v.agents, lanes.col_time(lanes.col), tol) and v.selected is not None
    alone(Lanes([RUN]), body)


def test_status_bar_says_time_lane_event_window_and_notes():
    row = first("drop")
    e = RUN.row(row)

    async def body(app, pilot):
        bar = app.widget
        bar.view = view(row, [e["agent"]], e["t"], filter_text="kind=drop", pane="B", modes=["differences only"])
        bar.note, bar.live = "no next drop", "LIVE"
        assert str(bar.render()) == (f"[B]  t={e['t']:.6g}s  agent {e['agent']}  under: drop @ {e['t']:.6g} "
                                     f"{e['agent']}->{e['peer']}  [0, 24]  filter: kind=drop  differences only  "
                                     "no next drop  LIVE")
        bar.view = view(None, [0, 1, 2], 3.0, group=3)
        bar.note, bar.live = "", ""
        assert str(bar.render()) == "t=3s  agents 0-2  under: -  [0, 24]  3/lane"
    alone(StatusBar(), body, size=(250, 3))


def test_details_and_agent_panels():
    row = first("timeout")
    a, t = int(RUN.agent[row]), float(RUN.t[row])

    async def body(app, pilot):
        d, ag = app.query_one(DetailsPanel), app.query_one(AgentPanel)
        d.show(view(row, [a], t))
        assert str(d.render()).splitlines() == describe(RUN, row)
        d.show(view(None, [a], t))
        assert str(d.render()) == "(no event under the cursor)"
        ag.show(view(row, [a], t))
        s = RUN.agent_stats(a, t)
        assert str(ag.render()) == agent_text(RUN, [a], t) and f"timeouts {s['timeouts']}" in str(ag.render())
        assert s["timeouts"] == 1  # the selected timeout counts
        assert agent_text(RUN, [-1], t) == "run lane: evaluations"
        assert agent_text(RUN, [2, 3], t) == "agents 2-3 (enter: drill down)"

    class Two(Bare):
        def compose(self):
            yield DetailsPanel()
            yield AgentPanel()
    async def main():
        app = Two(None)
        async with app.run_test(size=(120, 30)) as pilot:
            await body(app, pilot)
    asyncio.run(main())


def test_prompt_posts_its_answer_and_closes():
    async def body(app, pilot):
        p = app.widget
        assert not p.is_open
        p.open("time", "")
        await pilot.pause()
        assert p.is_open and p.has_focus and p.placeholder == "go to time (s)"
        await pilot.press(*"12.5", "enter")
        assert [(m.mode, m.text) for m in app.got if isinstance(m, Answered)] == [("time", "12.5")]
        assert not p.is_open
    alone(PromptBar(disabled=True), body)


def test_pivot_panel_shows_the_figures():
    p = pivot(RUN, 2.0, 9.5, [1, 2, 3])

    async def body(app, pilot):
        panel = app.widget
        panel.show(p)
        assert panel.has_class("open") and str(panel.render()).splitlines() == pivot_lines(p)
        lines = pivot_lines(p)
        assert lines[0] == "area: agents 1-3 (3), t in [2, 9.5]" and f"drops {p['drops']:,}" in lines
        panel.close()
        assert not panel.has_class("open")
    alone(PivotPanel(), body)


def test_results_panel_jumps_and_pins():
    tab = pa.table({"t": [1.5, None, 7.25], "agent": [3, None, 0], "what": ["a", "b", "c"]})

    async def body(app, pilot):
        res = app.widget
        res.show(tab)
        assert res.is_open and res.row_count == 3 and res.has_focus
        t, agents = res.pins()
        assert t.tolist() == [1.5, 7.25] and agents.tolist() == [3, 0]
        await pilot.press("enter")
        await pilot.press("down", "enter")  # a row without a time: nothing to go to
        await pilot.press("down", "enter", "p")
        jumps = [(m.t, m.agent) for m in app.got if isinstance(m, JumpTo)]
        assert jumps == [(1.5, 3), (7.25, 0)] and isinstance(app.got[-1], PinRequest)
        res.show(pa.table({"kind": ["send"], "n": [3]}))
        assert res.pins()[0].size == 0
        await pilot.press("enter")
        assert len([m for m in app.got if isinstance(m, JumpTo)]) == 2
    alone(ResultsPanel(), body)
