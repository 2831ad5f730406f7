"""The Textual application of ``netsim explore``: lanes per agent over time, a cursor, panes.

The view is a window [t0, t1] of simulated time over a range of lanes; every refresh bins only the rows
of that window for the lanes on screen (``RunData.cells``). When the shown agents outnumber the rows,
lanes aggregate ``g`` agents each (``enter`` drills into one, ``escape`` comes back); ``m`` switches to
one scrolling lane per agent. Keys follow Perfetto's (WASD, +/-) plus jumps to the next drop, timeout,
stale message or DP release; see docs/explore.md.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Input, Static

from netsim.errors import InputError
from netsim.explore import query
from netsim.explore.follow import describe
from netsim.explore.model import RunData, fmt_t
from netsim.trace.timeline import glyphs

PLOT_ROWS = 2
BARS = " ▁▂▃▄▅▆▇█"
JUMPS = {"x": "drop", "t": "timeout", "o": "stale", "r": "release"}


class Lanes(Widget):
    """The time axis, the lanes and the metrics plot under them, sharing one column grid."""

    DEFAULT_CSS = "Lanes { height: 1fr; width: 1fr; }"

    def __init__(self, view: Explorer):
        super().__init__()
        self.view = view

    def render_line(self, y: int) -> Strip:
        """Line API: strips of segments, no rich-Text-to-Content conversion per refresh (a screen of
        10,000 agents' lanes has thousands of styled runs)."""
        strips = self.view.strips(self.size.width, self.size.height)
        return strips[y] if y < len(strips) else Strip.blank(self.size.width)

    def on_click(self, event) -> None:
        self.view.click(event.x, event.y, event.ctrl)

    def on_mouse_scroll_down(self, event) -> None:
        self.view.scroll_event(+1, event.ctrl, event.shift)

    def on_mouse_scroll_up(self, event) -> None:
        self.view.scroll_event(-1, event.ctrl, event.shift)


class Explorer(App):
    """``netsim explore RUN``."""

    TITLE = "netsim explore"
    CSS = """
    #side { width: 46; border-left: solid $accent; padding: 0 1; }
    #details { height: auto; }
    #agent { height: auto; margin-top: 1; }
    #status { height: 1; background: $boost; }
    #prompt { display: none; }
    #prompt.open { display: block; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("left", "cursor(-1)", "cursor left", show=False),
        Binding("right", "cursor(1)", "cursor right", show=False),
        Binding("a", "pan(-0.25)", "pan left", show=False),
        Binding("d", "pan(0.25)", "pan right", show=False),
        Binding("shift+left", "pan(-0.25)", show=False),
        Binding("shift+right", "pan(0.25)", show=False),
        Binding("w,plus,equals_sign", "zoom(0.5)", "zoom in", show=False),
        Binding("s,minus", "zoom(2)", "zoom out", show=False),
        Binding("up", "lane(-1)", show=False),
        Binding("down", "lane(1)", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("f", "fit", "fit all", show=False),
        Binding("g", "prompt('time')", "go to time", show=False),
        Binding("A", "prompt('agent')", "go to agent", show=False),
        Binding("slash", "prompt('search')", "search", show=False),
        Binding("k", "prompt('filter')", "filter", show=False),
        Binding("n", "match(1)", show=False),
        Binding("N", "match(-1)", show=False),
        Binding("x", "jump('drop', 1)", show=False),
        Binding("X", "jump('drop', -1)", show=False),
        Binding("t", "jump('timeout', 1)", show=False),
        Binding("T", "jump('timeout', -1)", show=False),
        Binding("o", "jump('stale', 1)", show=False),
        Binding("O", "jump('stale', -1)", show=False),
        Binding("r", "jump('release', 1)", show=False),
        Binding("R", "jump('release', -1)", show=False),
        Binding("right_square_bracket", "jump('', 1)", show=False),
        Binding("left_square_bracket", "jump('', -1)", show=False),
        Binding("enter", "follow", show=False),
        Binding("escape", "back", show=False),
        Binding("c", "causal", show=False),
        Binding("m", "aggregate", show=False),
        Binding("e", "export", show=False),
        Binding("b", "swap", show=False),
        Binding("D", "difference", show=False),
    ]

    def __init__(self, path: str | Path, run: RunData | None = None, filter_text: str = "",
                 follow: bool | None = None, other: RunData | None = None):
        super().__init__(ansi_color=True)
        self.other = other  # a second run to compare with (b: show it, D: first difference)
        self.trace_path = Path(path)
        self.run_data = run or RunData(path)
        r = self.run_data
        self.t0, self.t1 = 0.0, max(r.t_max, 1e-9)
        self.all_agents = np.arange(r.n)
        self.agents = self.all_agents  # shown (filter, drill-down)
        self.drill: list[np.ndarray] = []
        self.aggregate = True
        self.lane_top = 0  # first group on screen when scrolling
        self.lane = 1  # cursor lane on screen (0 = the run's own lane)
        self.col = 0
        self.selected: int | None = None
        self.filter_text = ""
        self.filter_mask: np.ndarray | None = None
        self.search_text = ""
        self.search_mask: np.ndarray | None = None
        self.causal: dict[int, float] | None = None
        self.message = ""
        self.prompt_mode = ""
        self._geom = (80, 20, 0, 1)  # width, lane rows, label width, group size of the last draw
        self._start_filter = filter_text
        # live mode: a run still being written (no end marker yet) is re-read as its batches land
        self.follow = (not self.run_data.complete) if follow is None else follow
        self._trace_bytes = _file_size(self.trace_path)
        self._grid: tuple | None = None  # (view key, cells) of the last draw
        self._drawn: tuple | None = None  # (state key, text) of the last draw
        self._strips: tuple | None = None  # (text, its lines as strips)

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Lanes(self)
            with Vertical(id="side"):
                yield Static(id="details")
                yield Static(id="agent")
        yield Input(id="prompt", disabled=True)
        yield Static(id="status")

    def on_mount(self) -> None:
        if self._start_filter:
            self.apply_filter(self._start_filter)
        self.call_after_refresh(self._first)  # once the lanes know their size
        if self.follow:
            self.set_interval(1.0, self.poll)

    def _first(self) -> None:
        self.refresh_all()
        # then, while the user reads the first screen, the columns and indexes that following needs
        self.run_worker(self.run_data.warm, thread=True, exclusive=True)

    def poll(self) -> bool:
        """Live mode: re-read the trace when it grew (whole batches only, as ``read_trace`` reads a
        partial run); rows only append, so the selection stays; a view that showed the end follows it.
        Returns whether new events arrived."""
        size = _file_size(self.trace_path)
        if size == self._trace_bytes:
            return False
        self._trace_bytes = size
        old = self.run_data
        try:
            new = RunData(self.trace_path)
        except InputError as e:
            self.message = f"error: {e}"
            self.refresh_all()
            return False
        if len(new.t) <= len(old.t):
            return False
        at_end = self.t1 >= old.t_max
        self.run_data = new
        if at_end:
            span = self.t1 - self.t0
            self.t1 = max(new.t_max, self.t1)
            self.t0 = 0.0 if self.t0 <= 0.0 else self.t1 - span
        if self.filter_text:
            self.filter_mask = query.mask(new, self.filter_text, "filter")
        if self.search_text:
            self.search_mask = query.mask(new, self.search_text)
        self._grid = self._drawn = None
        if new.complete:
            self.follow = False
            self.message = "run complete"
        else:
            self.message = f"live: {len(new.t):,} events"
        self.refresh_all()
        return True

    # geometry ------------------------------------------------------------------------------------
    @property
    def label_w(self) -> int:
        return max(5, len(str(max(self.run_data.n - 1, 0))) * 2 + 2)

    def lane_rows(self, height: int) -> int:
        return max(1, height - 2 - PLOT_ROWS)  # axis and run lanes, plot rows

    def group(self, rows: int) -> int:
        if self.aggregate and len(self.agents) > rows:
            return math.ceil(len(self.agents) / rows)
        return 1

    def groups(self) -> int:
        g = self._geom[3]
        return math.ceil(len(self.agents) / g) if len(self.agents) else 0

    def lane_agents(self, lane: int) -> list[int]:
        """Agents of a lane on screen (lane 0: the run's own rows, agent -1)."""
        if lane == 0:
            return [-1]
        g = self._geom[3]
        gi = self.lane_top + lane - 1
        return [int(a) for a in self.agents[gi * g:(gi + 1) * g]]

    def col_time(self, col: int) -> float:
        w = self._geom[0]
        return self.t0 + (col + 0.5) * (self.t1 - self.t0) / w

    def time_col(self, t: float) -> int:
        w = self._geom[0]
        return int((t - self.t0) / (self.t1 - self.t0) * w)

    def mask(self) -> np.ndarray | None:
        return self.filter_mask

    # drawing -------------------------------------------------------------------------------------
    def draw(self, width: int, height: int) -> Text:
        """The lanes as text; Textual asks for it more often than the state changes."""
        key = (width, height, self.t0, self.t1, self.lane_top, self.lane, self.col, self.selected,
               id(self.agents), id(self.filter_mask), id(self.causal), self.aggregate)
        if self._drawn is not None and self._drawn[0] == key:
            return self._drawn[1]
        text = self._draw(width, height)
        self._drawn = (key, text)
        return text

    def strips(self, width: int, height: int) -> list[Strip]:
        text = self.draw(width, height)
        if self._strips is None or self._strips[0] is not text:
            lines = text.split("\n", allow_blank=True)
            self._strips = (text, [Strip(list(line.render(self.console))).adjust_cell_length(width)
                                   for line in lines])
        return self._strips[1]

    def _draw(self, width: int, height: int) -> Text:
        r = self.run_data
        lw = self.label_w
        w = max(4, width - lw - 2)
        rows = self.lane_rows(height)
        g = self.group(rows)
        self._geom = (w, rows, lw, g)
        self.col = min(max(self.col, 0), w - 1)
        n_groups = self.groups()
        self.lane_top = max(0, min(self.lane_top, max(0, n_groups - rows)))
        shown = min(rows, n_groups - self.lane_top)
        self.lane = min(max(self.lane, 0), shown)
        lane_of = np.full(r.n + 1, -1, dtype=np.int64)
        lane_of[0] = 0
        pos = np.arange(len(self.agents))
        gi = pos // g - self.lane_top
        vis = (gi >= 0) & (gi < rows)
        lane_of[self.agents[vis] + 1] = gi[vis] + 1
        key = (self.t0, self.t1, w, shown, self.lane_top, g, id(self.agents), id(self.filter_mask))
        if self._grid is None or self._grid[0] != key:  # cursor moves restyle; they do not rebin
            self._grid = (key, r.cells(lane_of, shown + 1, self.t0, self.t1, w, self.mask()))
        grid = self._grid[1]
        known = glyphs()
        glyph_of = [(known[k][0], known[k][1]) if k in known else ("?", "white") for k in r.kind_names]
        sel_cell = None
        if self.selected is not None:
            sel_cell = (self._lane_of_agent(int(r.agent[self.selected])), self.time_col(float(r.t[self.selected])))
        out = Text(no_wrap=True, overflow="crop")
        out.append(self._axis(lw, w) + "\n")
        for li in range(shown + 1):
            agents = self.lane_agents(li)
            label = "run" if li == 0 else (f"{agents[0]}" if len(agents) == 1 else f"{agents[0]}-{agents[-1]}")
            style = "reverse bold" if li == self.lane else "bold"
            past = None
            if self.causal is not None and li > 0:
                hit = [self.causal[a] for a in agents if a in self.causal]
                past = max(hit) if hit else None
                if past is not None:
                    style += " magenta"
            out.append(f"{label:>{lw}}", style=style)
            out.append("|")
            cells = []
            for c, k in enumerate(grid[li].tolist()):
                ch, st = " ", ""
                if k >= 0:
                    ch, st = glyph_of[k]
                    if past is not None and self.col_time(c) > past:
                        st = "dim"
                if c == self.col:
                    st = (st + " on grey30").strip()
                if sel_cell == (li, c):
                    st = "reverse bold"
                cells.append((ch, st))
            for st, run in itertools.groupby(cells, key=lambda x: x[1]):  # one span per run of a style
                out.append("".join(ch for ch, _ in run), style=st or None)
            out.append("|\n")
        out.append(self._plot(lw, w))
        return out

    def _axis(self, lw: int, w: int) -> str:
        axis = [" "] * w
        for q in range(5):
            col = min(w - 1, round(q * (w - 1) / 4))
            lab = f"{self.t0 + q * (self.t1 - self.t0) / 4:.5g}"
            start = max(0, min(w - len(lab), col - (len(lab) if q == 4 else 0)))
            axis[start:start + len(lab)] = list(lab)
        return f"{'t (s)':>{lw}} " + "".join(axis)

    def _plot(self, lw: int, w: int) -> Text:
        """Accuracy of the average model over the window, as bars under the same columns."""
        t, v = self.run_data.evals()
        out = Text(no_wrap=True, overflow="crop")
        if not len(t):
            return out
        cols = np.array([self.col_time(c) for c in range(w)])
        idx = np.searchsorted(t, cols, side="right") - 1
        val = np.where(idx >= 0, v[np.clip(idx, 0, None)], np.nan)
        lo, hi = float(np.nanmin(v)), float(np.nanmax(v))
        levels = len(BARS) - 1
        for row in range(PLOT_ROWS - 1, -1, -1):
            label = f"{hi:.3f}" if row == PLOT_ROWS - 1 else f"{lo:.3f}"
            out.append(f"{label:>{lw}}", style="dim")
            out.append(" ")
            for x in val:
                if not np.isfinite(x):
                    out.append(" ")
                    continue
                h = (x - lo) / (hi - lo) * PLOT_ROWS * levels if hi > lo else PLOT_ROWS * levels
                cell = int(min(max(h - row * levels, 0), levels))
                out.append(BARS[cell], style="green")
            out.append("\n" if row else "")
        return out

    def _lane_of_agent(self, a: int) -> int:
        if a < 0:
            return 0
        where = np.searchsorted(self.agents, a)
        if where >= len(self.agents) or self.agents[where] != a:
            return -1
        return int(where // self._geom[3]) - self.lane_top + 1

    def refresh_all(self) -> None:
        self.query_one(Lanes).refresh()
        if self.selected is None:
            self._pick()
        r = self.run_data
        lines = describe(r, self.selected) if self.selected is not None else ["(no event under the cursor)"]
        self.query_one("#details", Static).update(Text("\n".join(lines)))
        agents = self.lane_agents(self.lane)
        t = self.col_time(self.col)
        if len(agents) == 1 and agents[0] >= 0:
            s = r.agent_stats(agents[0], t)
            eps = self._epsilon(agents[0], t)
            pane = (f"agent {agents[0]} up to t = {fmt_t(t)}\n"
                    f"activations {s['activations']}  timeouts {s['timeouts']}\n"
                    f"sent {s['sent']}  received {s['received']}  stale {s['stale']}\n"
                    f"dropped: of its sends {s['dropped_out']}, to it {s['dropped_in']}\n"
                    f"offline {s['offline_s']:.4g} s  releases {s['releases']}" + eps)
        else:
            pane = "run lane: evaluations" if agents == [-1] else f"agents {agents[0]}-{agents[-1]} (enter: drill down)"
        self.query_one("#agent", Static).update(Text(pane, style="cyan"))
        self.query_one("#status", Static).update(self.status_line())

    def _epsilon(self, a: int, t: float) -> str:
        r = self.run_data
        out = ""
        acc = r.accuracy_of(a, t)
        if acc is not None:
            out += f"\nown model's accuracy {acc:.4f}"
        eps = r.epsilon(a, t)
        if eps is not None:
            out += f"\nepsilon spent {eps:.4g} (delta {r.scenario.get('privacy', {}).get('delta', 1e-5):g})"
        if "budget_exhausted" in r.code:
            rows = r.agent_rows(a)
            m = rows[(r.kind[rows] == r.code["budget_exhausted"]) & (r.t[rows] <= t)]
            if len(m):
                out += f"\nbudget exhausted: eps {float(r.value[m[-1]]):.4g}"
        return out

    def status_line(self) -> Text:
        r = self.run_data
        agents = self.lane_agents(self.lane)
        who = "run" if agents == [-1] else (f"agent {agents[0]}" if len(agents) == 1 else
                                           f"agents {agents[0]}-{agents[-1]}")
        under = "-"
        if self.selected is not None:
            e = r.row(self.selected)
            under = f"{e['kind']} @ {fmt_t(e['t'])}" + (f" {e['agent']}->{e['peer']}" if e["peer"] >= 0 else "")
        g = self._geom[3]
        parts = [f"t={fmt_t(self.col_time(self.col))}s", who, f"under: {under}",
                 f"[{fmt_t(self.t0)}, {fmt_t(self.t1)}]"]
        if g > 1:
            parts.append(f"{g}/lane")
        if self.filter_text:
            parts.append(f"filter: {self.filter_text}")
        if self.search_text:
            parts.append(f"search: {self.search_text}")
        if self.message:
            parts.append(self.message)
        if r.partial:
            parts.append("LIVE" if self.follow else "PARTIAL")
        return Text("  ".join(parts), no_wrap=True, overflow="ellipsis")

    def _pick(self) -> None:
        """Select the event under the cursor."""
        agents = self.lane_agents(self.lane)
        tol = (self.t1 - self.t0) / self._geom[0] / 2
        self.selected = self.run_data.nearest(agents, self.col_time(self.col), tol, self.mask())

    def moved(self) -> None:
        self.selected = None
        self.refresh_all()

    # navigation ----------------------------------------------------------------------------------
    def action_cursor(self, step: int) -> None:
        w = self._geom[0]
        c = self.col + step
        if c < 0 or c >= w:
            self.action_pan(step / w)
        else:
            self.col = c
        self.moved()

    def action_pan(self, frac: float) -> None:
        d = (self.t1 - self.t0) * frac
        self.t0, self.t1 = self.t0 + d, self.t1 + d
        self.keep_selection()

    def action_zoom(self, factor: float) -> None:
        """Zoom around the selected event (else the cursor), which stays where it is on screen."""
        tc = float(self.run_data.t[self.selected]) if self.selected is not None else self.col_time(self.col)
        span = max((self.t1 - self.t0) * factor, 1e-9)
        f = min(max((tc - self.t0) / (self.t1 - self.t0), 0.0), 1.0)
        self.t0 = tc - f * span
        self.t1 = self.t0 + span
        self.keep_selection()

    def keep_selection(self) -> None:
        """After a zoom or pan: the cursor follows the selected event while it is in view."""
        if self.selected is not None and self.t0 <= self.run_data.t[self.selected] <= self.t1:
            self.col = min(self.time_col(float(self.run_data.t[self.selected])), self._geom[0] - 1)
            self.refresh_all()
        else:
            self.moved()

    def action_lane(self, step: int) -> None:
        rows = self._geom[1]
        shown = min(rows, self.groups() - self.lane_top)
        lane = self.lane + step
        if lane > shown and self.lane_top + rows < self.groups():
            self.lane_top += 1
        elif lane < 1 and self.lane_top > 0 and step < 0:
            self.lane_top -= 1
        else:
            self.lane = min(max(lane, 0), shown)
        self.moved()

    def action_page(self, step: int) -> None:
        rows = self._geom[1]
        self.lane_top = max(0, min(self.lane_top + step * rows, max(0, self.groups() - rows)))
        self.moved()

    def action_fit(self) -> None:
        lo, hi = query.window(self.filter_text) if self.filter_text else (None, None)
        self.t0 = 0.0 if lo is None else lo
        self.t1 = max(self.run_data.t_max, 1e-9) if hi is None else hi
        if self.t1 <= self.t0:
            self.t1 = self.t0 + 1e-9
        self.moved()

    def go_time(self, t: float) -> None:
        if not self.t0 <= t <= self.t1:
            span = self.t1 - self.t0
            self.t0, self.t1 = t - span / 2, t + span / 2
        self.col = self.time_col(t)

    def go_agent(self, a: int) -> bool:
        where = np.searchsorted(self.agents, a)
        if where >= len(self.agents) or self.agents[where] != a:
            return False
        g, rows = self._geom[3], self._geom[1]
        gi = int(where // g)
        if not self.lane_top <= gi < self.lane_top + rows:
            self.lane_top = max(0, gi - rows // 2)
        self.lane = gi - self.lane_top + 1
        return True

    def select(self, row: int) -> None:
        r = self.run_data
        if r.agent[row] >= 0:
            self.go_agent(int(r.agent[row]))
        else:
            self.lane = 0
        self.go_time(float(r.t[row]))
        self.selected = int(row)
        self.refresh_all()

    def action_jump(self, kind: str, direction: int) -> None:
        r = self.run_data
        if not kind:
            if self.selected is None:
                return
            kind = r.kind_of(self.selected)
        if kind not in r.code:
            self.message = f"no {kind} events in this run"
            self.refresh_all()
            return
        m = r.kind == r.code[kind]
        self._jump_to(m, direction, kind)

    def _jump_to(self, m: np.ndarray, direction: int, what: str) -> None:
        r = self.run_data
        if self.filter_mask is not None:
            m = m & self.filter_mask
        shown = np.zeros(r.n + 1, dtype=bool)
        shown[self.agents + 1] = True
        shown[0] = True
        m = m & shown[r.agent + 1]
        here = self.selected if self.selected is not None else (
            int(np.searchsorted(r.t, self.col_time(self.col))) - (1 if direction > 0 else 0))
        rows = np.flatnonzero(m)
        i = np.searchsorted(rows, here, side="right" if direction > 0 else "left")
        i = i if direction > 0 else i - 1
        if not 0 <= i < len(rows):
            self.message = f"no {'next' if direction > 0 else 'previous'} {what}"
            self.refresh_all()
            return
        self.message = ""
        self.select(int(rows[i]))

    def action_match(self, direction: int) -> None:
        if self.search_mask is None:
            self.message = "no search: press / first"
            self.refresh_all()
            return
        self._jump_to(self.search_mask, direction, "match")

    def action_follow(self) -> None:
        """Enter: a send goes to its delivery or drop, a delivery/drop/stale back to its send; on an
        aggregated lane, drill into its agents."""
        r = self.run_data
        agents = self.lane_agents(self.lane)
        if len(agents) > 1:
            self.drill.append(self.agents)
            self.agents = np.array(agents)
            self.lane_top, self.lane = 0, 1
            self.moved()
            return
        if self.selected is None or r.msg[self.selected] < 0:
            return
        rows = r.message(int(r.msg[self.selected]))
        if r.kind_of(self.selected) == "send":
            nxt = [x for x in rows if x != self.selected]
        else:
            nxt = [x for x in rows if r.kind_of(x) == "send"]
        if nxt:
            if self.drill and r.agent[nxt[0]] not in self.agents:
                self.agents = self.drill[0]
                self.drill.clear()
            self.select(nxt[0])

    def action_back(self) -> None:
        prompt = self.query_one("#prompt", Input)
        if prompt.has_class("open"):
            self._close_prompt()
            return
        if self.drill:
            self.agents = self.drill.pop()
            self.lane_top, self.lane = 0, 1
            self.moved()
        elif self.causal is not None:
            self.causal = None
            self.refresh_all()

    def action_swap(self) -> None:
        """Show the other run in the same window of time (two runs side by side, one at a time)."""
        if self.other is None:
            self.message = "one run: give two to compare (netsim explore RUN_A RUN_B)"
        else:
            self.run_data, self.other = self.other, self.run_data
            self.all_agents = np.arange(self.run_data.n)
            self.agents, self.drill = self.all_agents, []
            if self.selected is not None and self.selected >= len(self.run_data.t):
                self.selected = None
            self.filter_mask = query.mask(self.run_data, self.filter_text, "filter") if self.filter_text else None
            self.search_mask = query.mask(self.run_data, self.search_text) if self.search_text else None
            self._grid = self._drawn = None
            self.message = f"showing {self.run_data.name} ({Path(self.run_data.path).name})"
        self.refresh_all()

    def action_difference(self) -> None:
        """Select the first event at which the two runs differ, and say how."""
        from netsim.explore.diff import first_difference

        if self.other is None:
            self.message = "one run: give two to compare (netsim explore RUN_A RUN_B)"
            self.refresh_all()
            return
        row, cols = first_difference(self.run_data, self.other)
        if row is None:
            self.message = "the two traces are identical"
        elif row >= len(self.run_data.t):
            self.message = f"this trace is a prefix of the other (which goes on after row {row})"
        else:
            self.message = f"first difference at row {row}: {', '.join(cols)}"
            if row < len(self.other.t):
                e = self.other.row(row)
                self.message += f"; other: {e['kind']} @ {fmt_t(e['t'])} agent {e['agent']}"
            self.select(row)
            return
        self.refresh_all()

    def action_aggregate(self) -> None:
        self.aggregate = not self.aggregate
        self.lane_top, self.lane = 0, 1
        self.moved()

    def action_causal(self) -> None:
        """Highlight who could have influenced the cursor's agent by the cursor's time."""
        agents = self.lane_agents(self.lane)
        if len(agents) != 1 or agents[0] < 0:
            self.message = "causal past: put the cursor on one agent's lane"
        else:
            self.causal = causal_past(self.run_data, agents[0], self.col_time(self.col))
            self.message = f"causal past of {agents[0]}: {len(self.causal)} agents"
        self.refresh_all()

    def action_export(self) -> None:
        from netsim.explore.export import export_view

        p = Path(self.run_data.path)
        out = (p if p.is_dir() else p.parent) / "explore-view.json"
        try:
            n = export_view(self.run_data, out, self.t0, self.t1, self.agents, self.filter_mask)
            self.message = f"wrote {out.name} ({n} events)"
        except InputError as e:
            self.message = str(e)
        self.refresh_all()

    # clicks and wheel --------------------------------------------------------------------------
    def click(self, x: int, y: int, ctrl: bool) -> None:
        lw = self._geom[2]
        if y >= 1 and x > lw:
            self.lane = min(y - 1, min(self._geom[1], self.groups() - self.lane_top))
            self.col = min(x - lw - 1, self._geom[0] - 1)
            self.moved()

    def scroll_event(self, step: int, ctrl: bool, shift: bool) -> None:
        if ctrl:
            self.action_zoom(2 if step > 0 else 0.5)
        elif shift:
            self.action_pan(0.1 * step)
        else:
            self.action_lane(step)

    # the prompt ----------------------------------------------------------------------------------
    def action_prompt(self, mode: str) -> None:
        prompt = self.query_one("#prompt", Input)
        self.prompt_mode = mode
        prompt.placeholder = {"time": "go to time (s)", "agent": "go to agent id",
                              "search": "search: kind=drop src=3 ... (n/N: next/previous)",
                              "filter": "filter: kind=send,deliver agent=0-3 t>=10 t<=20 (empty: none)"}[mode]
        prompt.value = {"search": self.search_text, "filter": self.filter_text}.get(mode, "")
        prompt.disabled = False
        prompt.add_class("open")
        prompt.focus()

    def _close_prompt(self) -> None:
        prompt = self.query_one("#prompt", Input)
        prompt.remove_class("open")
        prompt.disabled = True
        self.set_focus(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        mode = self.prompt_mode
        self._close_prompt()
        r = self.run_data
        self.message = ""
        try:
            if mode == "time":
                try:
                    t = float(text)
                except ValueError:
                    raise InputError("time", f"expected seconds, got {text!r}") from None
                self.go_time(t)
                self.moved()
            elif mode == "agent":
                try:
                    a = int(text)
                except ValueError:
                    raise InputError("agent", f"expected an agent id, got {text!r}") from None
                if not 0 <= a < r.n:
                    raise InputError("agent", f"must be in [0, {r.n - 1}], got {a}")
                if not self.go_agent(a):
                    self.agents = self.all_agents
                    self.drill.clear()
                    self.go_agent(a)
                self.moved()
            elif mode == "search":
                self.search_mask = query.mask(r, text)
                self.search_text = text
                if self.search_mask is not None:
                    self.message = f"{int(self.search_mask.sum())} matches"
                    self._jump_to(self.search_mask, 1, "match")
                    return
                self.refresh_all()
            elif mode == "filter":
                self.apply_filter(text)
        except InputError as e:
            self.message = f"error: {e}"
            self.refresh_all()

    def apply_filter(self, text: str) -> None:
        r = self.run_data
        m = query.mask(r, text, "filter")
        self.filter_mask, self.filter_text = m, text
        agents = [v for k, op, v in query.parse(text) if k == "agent" and op == "="]
        self.agents = self.all_agents
        if agents:
            ids = query._ints(agents[0], "filter")
            self.agents = np.array(sorted({int(a) for a in ids if 0 <= a < r.n}), dtype=np.int64)
        self.drill.clear()
        self.lane_top, self.lane = 0, 1
        self.action_fit()


def _file_size(path: Path) -> int:
    from netsim.trace.io import resolve_trace_path

    try:
        return resolve_trace_path(path).stat().st_size
    except OSError:
        return -1


def causal_past(run: RunData, a: int, t: float) -> dict[int, float]:
    """{agent: latest time its state could still reach agent a by time t} over delivered messages
    (Lamport's happened-before): one sweep over deliveries backwards in time."""
    need = {a: t}
    if "deliver" not in run.code:
        return need
    rows = np.flatnonzero((run.kind == run.code["deliver"]) & (run.t <= t))
    dst, src = run.agent[rows], run.peer[rows]
    sent = run.t[rows] - run.value[rows]
    tt = run.t[rows]
    for i in range(len(rows) - 1, -1, -1):
        d = int(dst[i])
        if d in need and tt[i] <= need[d]:
            s = int(src[i])
            if need.get(s, -math.inf) < sent[i]:
                need[s] = float(sent[i])
    return need
