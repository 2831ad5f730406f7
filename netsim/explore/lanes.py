"""The lanes widget: lanes per agent over a window of time, a cursor, one or two runs' panes; it owns the
view (window, cursor, shown agents, filter, search, selection) as reactive attributes, and says what the
cursor is on with a ``ViewChanged`` message after any change (``announce``), once per batch of changes.

The view is a window [t0, t1] of simulated time over a range of lanes; a redraw bins only the rows of that
window for the lanes on screen (``RunData.cells``). When the shown agents outnumber the rows, lanes
aggregate ``g`` agents each (``enter`` drills into one, ``escape`` comes back); ``m`` switches to one
scrolling lane per agent. The keys are in ``help.LANES_KEYS``; their actions are in ``actions.LaneActions``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from textual.reactive import var
from textual.strip import Strip
from textual.widget import Widget

from netsim.explore import query
from netsim.explore.actions import LaneActions
from netsim.explore.draw import PLOT_ROWS, Painter, step_values
from netsim.explore.help import LANES_KEYS, bindings
from netsim.explore.messages import View, ViewChanged
from netsim.explore.model import RunData

WATCHED = ("t0", "t1", "col", "lane", "lane_top", "selected", "other_selected", "aggregate", "agents", "causal",
           "filter_text", "search_text", "active_pane", "diff_only", "mark", "pinned", "own_acc")


class Lanes(LaneActions, Widget, can_focus=True):
    """The time axis, per run its lanes and metric strips, sharing one column grid."""

    DEFAULT_CSS = "Lanes { height: 1fr; width: 1fr; }"
    BINDINGS = bindings(LANES_KEYS)
    BINDING_GROUP_TITLE = "Lanes"

    # the view: plain reactive attributes (var): a change does not repaint by itself; ``announce`` repaints once
    # per batch of changes, or, with ``repaint_on_announce`` off, whoever handles ``ViewChanged`` does, so that
    # the lanes and the panels that draw from the view change in one frame
    repaint_on_announce = True
    t0 = var(0.0)
    t1 = var(1.0)
    col = var(0)  # cursor column
    lane = var(1)  # cursor lane on screen (0: the run's own lane)
    lane_top = var(0)  # first lane group on screen
    selected: var[int | None] = var(None)  # row of the active run under the cursor
    other_selected: var[int | None] = var(None)  # the other pane's row under the cursor
    aggregate = var(True)
    agents = var(None, always_update=True)  # shown agent ids (filter, drill-down)
    causal = var(None, always_update=True)  # {agent: latest time it could reach the causal agent}
    filter_text = var("", always_update=True)
    search_text = var("", always_update=True)
    active_pane = var(0)  # the pane keys act on
    diff_only = var(False)  # two runs: hide the cells equal in both
    mark = var(None, always_update=True)  # (time, lane group) of an area's first corner
    pinned = var(None, always_update=True)  # (times, agents or None) of pinned query results
    own_acc = var(False)  # the accuracy strip shows the cursor agent's own model, not the average

    def __init__(self, runs: list[RunData], **kw):
        super().__init__(**kw)
        self.runs = runs  # panes, top down
        self.set_reactive(Lanes.t1, max(max(r.t_max for r in runs), 1e-9))
        self.set_reactive(Lanes.agents, np.arange(runs[0].n))
        self.all_agents = np.arange(runs[0].n)
        self.drill: list[np.ndarray] = []
        self.filter_mask: np.ndarray | None = None
        self.search_mask: np.ndarray | None = None
        self._pin_other = False  # other_selected was set (D: the other run's differing row), not picked
        self._geom = (80, 20, 0, 1)  # width, lane rows, label width, group size of the last draw
        self._grids: dict[tuple, np.ndarray] = {}  # view key -> cells, a few recent views
        self._plots: dict[tuple, list[Strip]] = {}
        self._masks: dict[tuple, np.ndarray | None] = {}
        self._drawn: tuple | None = None
        self._stale = True  # the view changed or a repaint was asked for since ``_drawn``
        self._pending = False
        self.painter: Painter | None = None

    def on_mount(self) -> None:
        self.painter = Painter(self.app.console)
        for name in WATCHED:
            self.watch(self, name, self._changed, init=False)

    @property
    def run_data(self) -> RunData:
        return self.runs[self.active_pane]

    @property
    def other(self) -> RunData | None:
        return self.runs[1 - self.active_pane] if len(self.runs) > 1 else None

    # telling the others ----------------------------------------------------------------------------
    def _changed(self) -> None:
        self._stale = True
        if not self._pending:
            self._pending = True
            self.call_later(self.announce)

    def announce(self) -> None:
        """Pick the event under the cursor (unless one was selected) and post what the view shows."""
        if self.selected is None:
            self._pick()
        self._pick_other()
        self._pending = False
        if self.repaint_on_announce:
            self.refresh()
        self.post_message(ViewChanged(self.view()))

    def view(self) -> View:
        r, agents = self.run_data, self.lane_agents(self.lane)
        sel = self.selected
        cell = (self.t1 - self.t0) / self._geom[0]
        t = float(r.t[sel]) if sel is not None else self.col_time(self.col)
        upto = float(r.t[sel]) if sel is not None else self.t0 + (self.col + 1) * cell
        modes = ["differences only"] if self.diff_only else []
        if self.pinned is not None:
            modes.append(f"pinned {len(self.pinned[0])}")
        if self.mark is not None:
            modes.append("area: move to the other corner and press v")
        return View(r, sel, agents, t, upto, (self.t0, self.t1), self._geom[3], self.filter_text,
                    self.search_text, "AB"[self.active_pane] if len(self.runs) > 1 else "", modes)

    # geometry ------------------------------------------------------------------------------------
    @property
    def label_w(self) -> int:
        return max(5, len(str(max(max(r.n for r in self.runs) - 1, 0))) * 2 + 2)

    def metric_rows(self) -> int:
        """Rows of metric strips under each pane: accuracy, and epsilon when a run is private."""
        acc = any(len(r.evals()[0]) or r.agent_accuracy is not None for r in self.runs)
        eps = any(r.has("release") for r in self.runs)
        return PLOT_ROWS * (int(acc) + int(eps))

    def lane_rows(self, height: int) -> int:
        """Agent lanes per pane: the axis, then per pane (a title with two) the run lane, pins and metrics."""
        extra = 1 + (self.pinned is not None) + self.metric_rows()
        if len(self.runs) == 1:
            return max(1, height - 1 - extra)
        return max(1, (height - 1) // 2 - 1 - extra)

    def pane_top(self, i: int) -> int:
        """The line of pane i's first lane (its run lane)."""
        if len(self.runs) == 1:
            return 1
        shown = min(self._geom[1], self.groups() - self.lane_top)
        return 1 + i * (1 + shown + 1 + (self.pinned is not None) + self.metric_rows()) + 1

    def group(self, rows: int) -> int:
        return math.ceil(len(self.agents) / rows) if self.aggregate and len(self.agents) > rows else 1

    def groups(self) -> int:
        return math.ceil(len(self.agents) / self._geom[3]) if len(self.agents) else 0

    def lane_agents(self, lane: int) -> list[int]:
        """Agents of a lane on screen (lane 0: the run's own rows, agent -1)."""
        if lane == 0:
            return [-1]
        g = self._geom[3]
        gi = self.lane_top + lane - 1
        return [int(a) for a in self.agents[gi * g:(gi + 1) * g]]

    def col_time(self, col: int) -> float:
        return self.t0 + (col + 0.5) * (self.t1 - self.t0) / self._geom[0]

    def time_col(self, t: float) -> int:
        return int((t - self.t0) / (self.t1 - self.t0) * self._geom[0])

    def _lane_of_agent(self, a: int) -> int:
        if a < 0:
            return 0
        where = np.searchsorted(self.agents, a)
        if where >= len(self.agents) or self.agents[where] != a:
            return -1
        return int(where // self._geom[3]) - self.lane_top + 1

    def mask_of(self, r: RunData) -> np.ndarray | None:
        """The filter's mask of either run (the active run's is ``filter_mask``)."""
        if r is self.run_data or not self.filter_text:
            return self.filter_mask if r is self.run_data else None
        key = (id(r), len(r.t), self.filter_text)
        if key not in self._masks:
            self._masks.clear()
            self._masks[key] = query.mask(r, self.filter_text, "filter")
        return self._masks[key]

    # the trace grew (live mode) ----------------------------------------------------------------------
    def grew(self, r, old_max: float) -> None:
        """Rows were appended to run r: a view that showed the end follows it; masks cover the new rows."""
        if self.t1 >= old_max:
            span = self.t1 - self.t0
            self.t1 = max(r.t_max, self.t1)
            self.t0 = 0.0 if self.t0 <= 0.0 else self.t1 - span
        if r is self.run_data:
            if r.n != len(self.all_agents):  # agents the trace's scenario did not count: lanes for them
                whole = self.agents is self.all_agents
                self.all_agents = np.arange(r.n)
                self.agents = self.all_agents if whole else self.agents
            if self.filter_text:
                self.filter_mask = query.mask(r, self.filter_text, "filter")
            if self.search_text:
                self.search_mask = query.mask(r, self.search_text)
        self._drawn = None
        self.refresh()
        self._changed()

    # mouse -----------------------------------------------------------------------------------------
    def on_click(self, event) -> None:
        lw = self._geom[2]
        x, y = event.x, event.y
        last = min(self._geom[1], self.groups() - self.lane_top)
        if len(self.runs) > 1:  # which pane: a click on the other one makes it the active one
            pane = [i for i in range(len(self.runs)) if self.pane_top(i) <= y <= self.pane_top(i) + last]
            if not pane or x <= lw:
                return
            if pane[0] != self.active_pane:
                self.action_swap()
            y -= self.pane_top(pane[0]) - 1
        if y >= 1 and x > lw:
            self.lane = min(y - 1, last)
            self.col = min(x - lw - 1, self._geom[0] - 1)
            self.moved()

    def scroll_event(self, step: int, ctrl: bool, shift: bool) -> None:
        if ctrl:
            self.action_zoom(2 if step > 0 else 0.5)
        elif shift:
            self.action_pan(0.1 * step)
        else:
            self.action_lane(step)

    def on_mouse_scroll_down(self, event) -> None:
        self.scroll_event(+1, event.ctrl, event.shift)

    def on_mouse_scroll_up(self, event) -> None:
        self.scroll_event(-1, event.ctrl, event.shift)

    # drawing -------------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        """Line API: strips of segments, no rich-Text-to-Content conversion per refresh."""
        strips = self.strips(self.size.width, self.size.height)
        return strips[y] if y < len(strips) else Strip.blank(self.size.width)

    def refresh(self, *regions, **kw):
        self._stale = True  # a repaint: the view may have changed since the lines were drawn
        return super().refresh(*regions, **kw)

    def strips(self, width: int, height: int) -> list[Strip]:
        """The widget's lines; Textual asks for them line by line, and more often than the view changes: the
        view's key (twenty reactive reads, 4 ms a screen at 10,000 agents) is looked at once per repaint."""
        drawn = self._drawn
        if drawn is not None and not self._stale and drawn[0][:2] == (width, height):
            return drawn[1]
        self._stale = False
        key = (width, height, self.t0, self.t1, self.lane_top, self.lane, self.col, self.selected,
               self.other_selected, self.active_pane, id(self.agents), id(self.filter_mask), id(self.causal),
               self.aggregate, self.diff_only, id(self.pinned), self.own_acc, tuple(len(r.t) for r in self.runs))
        if self._drawn is None or self._drawn[0] != key:
            self._drawn = (key, self._draw(width, height))
        return self._drawn[1]

    def _draw(self, width: int, height: int) -> list[Strip]:
        """The time axis, then per run (one, or two one above the other) its lanes and its strips."""
        lw = self.label_w
        w = max(4, width - lw - 2)
        rows = self.lane_rows(height)
        geom = (w, rows, lw, self.group(rows))
        if geom != self._geom:
            self._geom = geom
            self._changed()  # lanes and columns mean other agents and times now
        self.col = min(max(self.col, 0), w - 1)
        self.lane_top = max(0, min(self.lane_top, max(0, self.groups() - rows)))
        shown = min(rows, self.groups() - self.lane_top)
        self.lane = min(max(self.lane, 0), shown)
        g = geom[3]
        lane_of = np.full(max(r.n for r in self.runs) + 1, -1, dtype=np.int64)
        lane_of[0] = 0
        gi = np.arange(len(self.agents)) // g - self.lane_top
        vis = (gi >= 0) & (gi < rows)
        lane_of[self.agents[vis] + 1] = gi[vis] + 1
        lines = [self.painter.axis(lw, w, self.t0, self.t1, width)]
        grids = [self._grid(r, lane_of[:r.n + 1], shown, w) for r in self.runs]
        if self.diff_only and len(grids) == 2:
            same = grids[0] == grids[1]
            grids = [np.where(same, -1, x).astype(np.int16) for x in grids]
        for i, r in enumerate(self.runs):
            if len(self.runs) > 1:
                active = i == self.active_pane
                lines.append(self.painter.line(f"{'▶' if active else ' '} {'AB'[i]}: {r.name} ({Path(r.path).name})",
                                               width, "reverse bold" if active else "bold"))
            lines += self._pane(i, r, grids[i], shown, lw, w, width)
        return lines

    def _grid(self, r: RunData, lane_of: np.ndarray, shown: int, w: int) -> np.ndarray:
        """A pane's cells (``RunData.cells``), kept for the last few views: cursor moves only restyle."""
        mask = self.mask_of(r)
        key = (id(r), len(r.t), self.t0, self.t1, w, shown, self.lane_top, self._geom[3], id(self.agents), id(mask))
        grid = self._grids.get(key)
        if grid is None:
            grid = self._grids[key] = r.cells(lane_of, shown + 1, self.t0, self.t1, w, mask)
            while len(self._grids) > 8:  # zooming back or swapping panes redraws at once
                del self._grids[next(iter(self._grids))]
        return grid

    def _pane(self, i: int, r: RunData, grid: np.ndarray, shown: int, lw: int, w: int, width: int) -> list[Strip]:
        """One run's lanes (the run's own, then the agents'), the pinned lane and the metric strips."""
        active = i == self.active_pane
        labels, past = [], []
        for li in range(shown + 1):
            agents = self.lane_agents(li)
            labels.append("run" if li == 0 else f"{agents[0]}" if len(agents) == 1 else f"{agents[0]}-{agents[-1]}")
            hit = [self.causal[a] for a in agents if a in self.causal] if active and self.causal and li else []
            past.append(max(hit) if hit else None)
        sel = self.selected if active else self.other_selected
        sel_cell = None
        if sel is not None and sel < len(r.t):
            sel_cell = (self._lane_of_agent(int(r.agent[sel])), self.time_col(float(r.t[sel])))
        col_t = self.t0 + (np.arange(w) + 0.5) * (self.t1 - self.t0) / w  # as col_time
        out = self.painter.lanes(grid, r.kind_names, labels, lw, width, self.col, self.lane, sel_cell, past, col_t)
        if self.pinned is not None:
            t, ag = self.pinned
            keep = np.ones(len(t), dtype=bool) if ag is None else np.isin(ag, self.agents) | (ag < 0)
            cols = ((t[keep] - self.t0) / (self.t1 - self.t0) * w).astype(np.int64)
            out.append(self.painter.pins(cols[(t[keep] >= self.t0) & (t[keep] <= self.t1)], lw, w, width))
        return out + self._metrics(r, lw, w, width, col_t)

    def _metrics(self, r: RunData, lw: int, w: int, width: int, col_t: np.ndarray) -> list[Strip]:
        """Accuracy of the average model (``i``: of the cursor agent's own), then the cursor agent's epsilon,
        each over one y-range for both panes; kept for the last few windows (scrolling lanes does not change
        them)."""
        agents = self.lane_agents(self.lane)
        a = agents[0] if len(agents) == 1 and agents[0] >= 0 else None
        key = (id(r), len(r.t), self.t0, self.t1, lw, w, width, a, self.own_acc)
        got = self._plots.get(key)
        if got is not None:
            return got
        got = []
        if self.own_acc and any(x.agent_accuracy is not None for x in self.runs):
            m = r.agent_accuracy  # (time, agent, loss, accuracy) rows; one y-range: every agent of both runs
            every = np.concatenate([x.agent_accuracy[:, 3] for x in self.runs if x.agent_accuracy is not None])
            mine = m[m[:, 1] == a] if m is not None and a is not None else np.zeros((0, 4))
            got += self.painter.bars(step_values(mine[:, 0], mine[:, 3], col_t), float(every.min()),
                                     float(every.max()), "acc" if a is None else f"acc {a}", "green", lw, width)
        elif any(len(x.evals()[0]) for x in self.runs):
            t, v = r.evals()
            both = np.concatenate([x.evals()[1] for x in self.runs])
            got += self.painter.bars(step_values(t, v, col_t), float(both.min()), float(both.max()),
                                     "acc", "green", lw, width)
        if PLOT_ROWS * 2 == self.metric_rows():
            val = np.full(w, np.nan)
            hi = 0.0
            if a is not None:
                for x in self.runs:
                    hi = max(hi, x.epsilon(a, x.t_max) or 0.0) if a < x.n else hi
                val = epsilon_steps(r, a, col_t)
            got += self.painter.bars(val, 0.0, hi, "eps" if a is None else f"eps {a}", "magenta", lw, width)
        self._plots[key] = got
        while len(self._plots) > 8:
            del self._plots[next(iter(self._plots))]
        return got


def epsilon_steps(r: RunData, a: int, col_t: np.ndarray) -> np.ndarray:
    """Agent a's epsilon spent by each column time: composed once per distinct count of its releases."""
    if a >= r.n or "release" not in r.code:
        return np.full(len(col_t), np.nan)
    rows = r.agent_rows(a)
    rel_t = r.t[rows[r.kind[rows] == r.code["release"]]]
    count = np.searchsorted(rel_t, col_t, side="right")
    out = np.zeros(len(col_t))  # nothing spent before its first release
    for c in np.unique(count):
        if c:
            out[count == c] = r.epsilon(a, float(rel_t[c - 1])) or np.nan
    return out
