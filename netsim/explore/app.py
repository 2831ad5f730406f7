"""The Textual application of ``netsim explore``: lanes per agent over time, a cursor, panes.

The view is a window [t0, t1] of simulated time over a range of lanes; every refresh bins only the rows
of that window for the lanes on screen (``RunData.cells``). When the shown agents outnumber the rows,
lanes aggregate ``g`` agents each (``enter`` drills into one, ``escape`` comes back); ``m`` switches to
one scrolling lane per agent. Keys follow Perfetto's (WASD, +/-) plus jumps to the next drop, timeout,
stale message or DP release; see docs/explore.md.
"""

from __future__ import annotations

import gc
import math
from pathlib import Path

import numpy as np
from rich.segment import Segment
from rich.style import Style
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
_NULL = Style.null()


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
        self.trace_path = Path(path)
        self.run_data = run or RunData(path)  # the run keys act on (with two: the active pane's)
        self.other = other  # a second run, in a pane under the first (b: make it the active one)
        self.runs = [self.run_data] if other is None else [self.run_data, other]  # panes, top down
        self.other_selected: int | None = None  # the other pane's event under the cursor
        self._pin_other = False  # other_selected was set (D: the other run's differing row), not picked
        r = self.run_data
        self.t0, self.t1 = 0.0, max(max(x.t_max for x in self.runs), 1e-9)  # both runs, with two
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
        self._grids: dict[tuple, np.ndarray] = {}  # view key -> cells, a few recent views
        self._drawn: tuple | None = None  # (state key, strips) of the last draw
        self._styles: dict[str, Style] = {}
        self._plots: dict[tuple, list[Strip]] = {}  # plot key -> its lines
        self._masks: dict[tuple, np.ndarray | None] = {}  # the filter's mask of the other pane's run

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
        self.run_worker(self._warm, thread=True, exclusive=True)
        # the app's long-lived objects (widgets, styles, modules) leave the collector's view: a full
        # collection would otherwise walk them all, some 30 ms, every dozen or so redraws
        gc.freeze()

    def on_unmount(self) -> None:
        gc.unfreeze()

    def _warm(self) -> None:
        for r in self.runs:
            r.warm()

    def poll(self) -> bool:
        """Live mode: append the batches written since the last look (``RunData.refresh`` reads only the
        new bytes; a batch still being written waits for the next poll); rows only append, so the
        selection stays; a view that showed the end follows it. Returns whether new events arrived."""
        size = _file_size(self.trace_path)
        if size == self._trace_bytes:
            return False
        self._trace_bytes = size
        r = self.runs[0]
        old_max = r.t_max
        try:
            new = r.refresh()
        except InputError as e:
            self.message = f"error: {e}"
            self.refresh_all()
            return False
        if not new and not r.complete:
            return False
        if self.t1 >= old_max:  # the view showed the end: follow it
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
        if r.complete:
            self.follow = False
            self.message = "run complete"
        else:
            self.message = f"live: {len(r.t):,} events"
        self.refresh_all()
        return bool(new)

    # geometry ------------------------------------------------------------------------------------
    @property
    def label_w(self) -> int:
        return max(5, len(str(max(max(r.n for r in self.runs) - 1, 0))) * 2 + 2)

    def lane_rows(self, height: int) -> int:
        """Agent lanes per pane: the axis, then per pane (a title with two), the run lane and the plot."""
        if len(self.runs) == 1:
            return max(1, height - 2 - PLOT_ROWS)
        return max(1, (height - 1) // 2 - 2 - PLOT_ROWS)

    def pane_top(self, i: int) -> int:
        """The line of pane i's first lane (its run lane)."""
        if len(self.runs) == 1:
            return 1
        rows = self._geom[1]
        shown = min(rows, self.groups() - self.lane_top)
        return 1 + i * (1 + shown + 1 + PLOT_ROWS) + 1

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

    def mask_of(self, r: RunData) -> np.ndarray | None:
        """The filter's mask of either run (the active run's is ``filter_mask``)."""
        if r is self.run_data or not self.filter_text:
            return self.filter_mask if r is self.run_data else None
        key = (id(r), len(r.t), self.filter_text)
        if key not in self._masks:
            self._masks.clear()
            self._masks[key] = query.mask(r, self.filter_text, "filter")
        return self._masks[key]

    # drawing -------------------------------------------------------------------------------------
    def draw(self, width: int, height: int) -> list[Strip]:
        """The lines of the lanes widget; Textual asks for them more often than the state changes."""
        key = (width, height, self.t0, self.t1, self.lane_top, self.lane, self.col, self.selected,
               self.other_selected, id(self.run_data), id(self.agents), id(self.filter_mask), id(self.causal),
               self.aggregate, tuple(len(r.t) for r in self.runs))
        if self._drawn is not None and self._drawn[0] == key:
            return self._drawn[1]
        lines = self._draw(width, height)
        self._drawn = (key, lines)
        return lines

    def strips(self, width: int, height: int) -> list[Strip]:
        return self.draw(width, height)

    def _draw(self, width: int, height: int) -> list[Strip]:
        """The time axis, then per run (one, or two one above the other) its lanes and its plot."""
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
        n = max(r.n for r in self.runs)
        lane_of = np.full(n + 1, -1, dtype=np.int64)
        lane_of[0] = 0
        pos = np.arange(len(self.agents))
        gi = pos // g - self.lane_top
        vis = (gi >= 0) & (gi < rows)
        lane_of[self.agents[vis] + 1] = gi[vis] + 1
        lines = [Strip([Segment(self._axis(lw, w))]).adjust_cell_length(width)]
        for i, r in enumerate(self.runs):
            if len(self.runs) > 1:
                lines.append(self._header(i, r, width))
            lines += self._pane(r, lane_of[:r.n + 1], shown, lw, w, width)
        return lines

    def _header(self, i: int, r: RunData, width: int) -> Strip:
        """A pane's title line: which run, and whether keys act on it (the active pane)."""
        active = r is self.run_data
        text = f"{'▶' if active else ' '} {'AB'[i]}: {r.name} ({Path(r.path).name})"
        return Strip([Segment(text, self._style("reverse bold" if active else "bold"))]).adjust_cell_length(width)

    def _style(self, name: str) -> Style:
        """A style by name, parsed once (rich Text would parse it per span per redraw)."""
        st = self._styles.get(name)
        if st is None:
            st = self._styles[name] = self.console.get_style(name, default=_NULL) if name else _NULL
        return st

    def _pane(self, r: RunData, lane_of: np.ndarray, shown: int, lw: int, w: int, width: int) -> list[Strip]:
        """One run's lanes (the run's own, then the agents') and its accuracy plot.

        Each lane is binned once per view (``RunData.cells``, cached: cursor moves only restyle) and becomes
        a strip of segments directly, one per run of equal style, found with numpy, the same segments rich
        would make of the equivalent Text (label, '|', a span per run of style, '|'), without building
        it: a screen of 10,000 agents' lanes has thousands of styled runs."""
        active = r is self.run_data
        mask = self.mask_of(r)
        key = (id(r), len(r.t), self.t0, self.t1, w, shown, self.lane_top, self._geom[3], id(self.agents),
               id(mask))
        grid = self._grids.get(key)
        if grid is None:
            grid = r.cells(lane_of, shown + 1, self.t0, self.t1, w, mask)
            self._grids[key] = grid
            while len(self._grids) > 8:  # a few recent views: zooming back or swapping panes redraws at once
                del self._grids[next(iter(self._grids))]
        known = glyphs()
        chars = [known[k][0] if k in known else "?" for k in r.kind_names] + [" "]  # code -1: empty
        chars = np.array(chars, dtype="<U1" if all(len(c) == 1 for c in chars) else object)
        names = [known[k][1] if k in known else "white" for k in r.kind_names]
        distinct = list(dict.fromkeys(["", "dim", *names]))
        styles = [self._style(x) for x in distinct]
        style_ix = np.array([distinct.index(x) for x in names] + [0], dtype=np.int32)  # code -1: ""
        sel = self.selected if active else self.other_selected
        sel_cell = None
        if sel is not None and sel < len(r.t):
            sel_cell = (self._lane_of_agent(int(r.agent[sel])), self.time_col(float(r.t[sel])))
        col_t = self.t0 + (np.arange(w) + 0.5) * (self.t1 - self.t0) / w  # as col_time
        exact = lw + w + 2 == width
        out = []
        for li in range(shown + 1):
            agents = self.lane_agents(li)
            label = "run" if li == 0 else (f"{agents[0]}" if len(agents) == 1 else f"{agents[0]}-{agents[-1]}")
            lstyle = "reverse bold" if li == self.lane else "bold"
            past = None
            if active and self.causal is not None and li > 0:
                hit = [self.causal[a] for a in agents if a in self.causal]
                past = max(hit) if hit else None
                if past is not None:
                    lstyle += " magenta"
            codes = grid[li]
            ix = style_ix[codes]  # -1 indexes the last entry: empty
            if past is not None:
                ix = np.where((codes >= 0) & (col_t > past), 1, ix)  # "dim"
            # the cursor's and the selection's cells get styles of their own: ids past the named ones
            lane_styles = [*styles, self._style((distinct[ix[self.col]] + " on grey30").strip())]
            ix = ix.copy()
            ix[self.col] = len(styles)
            if sel_cell is not None and sel_cell[0] == li and 0 <= sel_cell[1] < w:
                lane_styles.append(self._style("reverse bold"))
                ix[sel_cell[1]] = len(styles) + 1
            cuts = [0, *(np.flatnonzero(ix[1:] != ix[:-1]) + 1).tolist(), w]
            run_ix = ix[cuts[:-1]].tolist()
            picked = chars[codes]
            text = picked.tobytes().decode("utf-32-le") if picked.dtype != object else "".join(picked.tolist())
            segs = [Segment(f"{label:>{lw}}", self._style(lstyle))]
            plain = "|"  # unstyled text runs on until the next styled run, as in rich's rendering
            for lo, hi, sx in zip(cuts, cuts[1:], run_ix):
                if not sx:
                    plain += text[lo:hi]
                    continue
                st = lane_styles[sx]
                if plain:
                    segs.append(Segment(plain, _NULL))
                    plain = ""
                segs.append(Segment(text[lo:hi], st))
            segs.append(Segment(plain + "|", _NULL))
            out.append(Strip(segs, width) if exact else Strip(segs).adjust_cell_length(width))
        out += self._plot_strips(r, lw, w, width)
        return out

    def _plot_strips(self, r: RunData, lw: int, w: int, width: int) -> list[Strip]:
        """The plot's lines, for the last few windows (scrolling lanes does not change them)."""
        key = (id(r), len(r.t), self.t0, self.t1, lw, w, width)
        got = self._plots.get(key)
        if got is None:
            plot = self._plot(lw, w, r)
            got = [] if not plot.plain else [Strip(list(line.render(self.console))).adjust_cell_length(width)
                                             for line in plot.split("\n", allow_blank=True)]
            if len(self.runs) > 1:  # both panes keep their size with or without a plot
                got += [Strip.blank(width)] * (PLOT_ROWS - len(got))
            self._plots[key] = got
            while len(self._plots) > 8:
                del self._plots[next(iter(self._plots))]
        return got

    def _axis(self, lw: int, w: int) -> str:
        axis = [" "] * w
        for q in range(5):
            col = min(w - 1, round(q * (w - 1) / 4))
            lab = f"{self.t0 + q * (self.t1 - self.t0) / 4:.5g}"
            start = max(0, min(w - len(lab), col - (len(lab) if q == 4 else 0)))
            axis[start:start + len(lab)] = list(lab)
        return f"{'t (s)':>{lw}} " + "".join(axis)

    def _plot(self, lw: int, w: int, run: RunData) -> Text:
        """Accuracy of the average model over the window, as bars under the same columns."""
        t, v = run.evals()
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
        self._pick_other()
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
        if self.other is not None:  # which pane the cursor's details are of
            parts.insert(0, f"[{'AB'[self.runs.index(r)]}]")
        if r.partial:
            parts.append("LIVE" if self.follow else "PARTIAL")
        return Text("  ".join(parts), no_wrap=True, overflow="ellipsis")

    def _pick(self) -> None:
        """Select the event under the cursor."""
        agents = self.lane_agents(self.lane)
        tol = (self.t1 - self.t0) / self._geom[0] / 2
        self.selected = self.run_data.nearest(agents, self.col_time(self.col), tol, self.mask())

    def _pick_other(self) -> None:
        """The other pane's event under the shared cursor (unless D pinned its differing row)."""
        o = self.other
        if o is None or self._pin_other:
            return
        agents = [a for a in self.lane_agents(self.lane) if a < o.n]
        tol = (self.t1 - self.t0) / self._geom[0] / 2
        self.other_selected = o.nearest(agents, self.col_time(self.col), tol, self.mask_of(o)) if agents else None

    def moved(self) -> None:
        self.selected = None
        self._pin_other = False
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
        self.t1 = max(max(r.t_max for r in self.runs), 1e-9) if hi is None else hi
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

    def select(self, row: int, other_row: int | None = None) -> None:
        """Select a row of the active run (and, with two runs, pin ``other_row`` in the other pane)."""
        r = self.run_data
        if r.agent[row] >= 0:
            self.go_agent(int(r.agent[row]))
        else:
            self.lane = 0
        self.go_time(float(r.t[row]))
        self.selected = int(row)
        self._pin_other = other_row is not None
        self.other_selected = other_row
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
        """Two runs: keys act on the other pane now (same window of time, same cursor)."""
        if self.other is None:
            self.message = "one run: give two to compare (netsim explore RUN_A RUN_B)"
        else:
            self.run_data, self.other = self.other, self.run_data
            self.selected, self.other_selected = self.other_selected, self.selected
            if self.run_data.n != self.other.n:  # the lanes are the shown agents of the active run
                self.all_agents = np.arange(self.run_data.n)
                self.agents, self.drill = self.all_agents, []
            self.filter_mask = query.mask(self.run_data, self.filter_text, "filter") if self.filter_text else None
            self.search_mask = query.mask(self.run_data, self.search_text) if self.search_text else None
            self._drawn = None
            self.message = f"active: {'AB'[self.runs.index(self.run_data)]} {self.run_data.name}"
        self.refresh_all()

    def action_difference(self) -> None:
        """Select the first event at which the two runs differ in both panes, and say how."""
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
            self.select(row, row if row < len(self.other.t) else None)
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
        last = min(self._geom[1], self.groups() - self.lane_top)
        if len(self.runs) > 1:  # which pane: a click on the other one makes it the active one
            pane = [i for i in range(len(self.runs)) if self.pane_top(i) <= y <= self.pane_top(i) + last]
            if not pane or x <= lw:
                return
            if self.runs[pane[0]] is not self.run_data:
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
