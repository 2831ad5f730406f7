"""What the lanes widget's keys, clicks and prompt answers do to its view (``help.LANES_KEYS`` names them).

Each action sets the widget's reactive attributes; the widget redraws and announces the new view itself.
Kept apart from drawing so that each module reads on its own; ``LaneActions`` is mixed into ``Lanes``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from netsim.errors import InputError
from netsim.explore import query
from netsim.explore.messages import AreaSelected, Ask, Note, PinRequest
from netsim.explore.model import fmt_t

JUMPS = {"x": "drop", "t": "timeout", "o": "stale", "r": "release"}


class LaneActions:
    """Actions of the lanes widget (see ``lanes.Lanes`` for the state they change)."""

    def note(self, text: str) -> None:
        self.post_message(Note(text))

    def moved(self) -> None:
        """The cursor moved: pick the event under it anew."""
        self.selected = None
        self._pin_other = False
        self._changed()

    def _pick(self) -> None:
        tol = (self.t1 - self.t0) / self._geom[0] / 2
        self.selected = self.run_data.nearest(self.lane_agents(self.lane), self.col_time(self.col), tol,
                                              self.filter_mask)

    def _pick_other(self) -> None:
        """The other pane's event under the shared cursor (unless D pinned its differing row)."""
        o = self.other
        if o is None or self._pin_other:
            return
        agents = [a for a in self.lane_agents(self.lane) if a < o.n]
        tol = (self.t1 - self.t0) / self._geom[0] / 2
        self.other_selected = o.nearest(agents, self.col_time(self.col), tol, self.mask_of(o)) if agents else None

    # moving ----------------------------------------------------------------------------------------
    def action_cursor(self, step: int) -> None:
        c = self.col + step
        if c < 0 or c >= self._geom[0]:
            self.action_pan(step / self._geom[0])
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
        t0 = 0.0 if lo is None else lo
        t1 = max(max(r.t_max for r in self.runs), 1e-9) if hi is None else hi
        self.t0, self.t1 = t0, (t1 if t1 > t0 else t0 + 1e-9)
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

    def show_agent(self, a: int) -> None:
        """Put agent a on screen, leaving a filter's or drill-down's agents when it is not among them."""
        if not self.go_agent(a):
            self.agents = self.all_agents
            self.drill.clear()
            self.go_agent(a)

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

    def jump_to_time(self, t: float, agent: int | None) -> None:
        """A results row: its agent's lane (else the run's), the event there nearest t."""
        r = self.run_data
        if agent is not None and 0 <= agent < r.n:
            self.show_agent(agent)
        self.go_time(t)
        agents = self.lane_agents(self.lane) if agent is None else [agent]
        row = r.nearest(agents, t, max(self.t1 - self.t0, 1e-9), self.filter_mask)
        if row is None:
            self.moved()
        else:
            self.select(row)

    # jumps -----------------------------------------------------------------------------------------
    def action_jump(self, kind: str, direction: int) -> None:
        r = self.run_data
        if not kind:
            if self.selected is None:
                return
            kind = r.kind_of(self.selected)
        if kind not in r.code:
            self.note(f"no {kind} events in this run")
            return
        self._jump_to(r.kind == r.code[kind], direction, kind)

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
            self.note(f"no {'next' if direction > 0 else 'previous'} {what}")
            return
        self.note("")
        self.select(int(rows[i]))

    def action_match(self, direction: int) -> None:
        if self.search_mask is None:
            self.note("no search: press / first")
        else:
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

    def back(self) -> bool:
        """Escape on the lanes: leave a drill-down, else drop the area mark, else the causal highlight."""
        if self.drill:
            self.agents = self.drill.pop()
            self.lane_top, self.lane = 0, 1
            self.moved()
        elif self.mark is not None:
            self.mark = None
        elif self.causal is not None:
            self.causal = None
        else:
            return False
        return True

    # views -----------------------------------------------------------------------------------------
    def action_aggregate(self) -> None:
        self.aggregate = not self.aggregate
        self.lane_top, self.lane = 0, 1
        self.moved()

    def action_causal(self) -> None:
        """Highlight who could have influenced the cursor's agent by the cursor's time."""
        from netsim.explore.causal import causal_past

        agents = self.lane_agents(self.lane)
        if len(agents) != 1 or agents[0] < 0:
            self.note("causal past: put the cursor on one agent's lane")
        else:
            self.causal = causal_past(self.run_data, agents[0], self.col_time(self.col))
            self.note(f"causal past of {agents[0]}: {len(self.causal)} agents")

    def action_export(self) -> None:
        from netsim.explore.export import export_view

        p = Path(self.run_data.path)
        out = (p if p.is_dir() else p.parent) / "explore-view.json"
        try:
            n = export_view(self.run_data, out, self.t0, self.t1, self.agents, self.filter_mask)
            self.note(f"wrote {out.name} ({n} events)")
        except InputError as e:
            self.note(str(e))

    def _two(self) -> bool:
        if self.other is None:
            self.note("one run: give two to compare (netsim explore RUN_A RUN_B)")
        return self.other is not None

    def action_swap(self) -> None:
        """Two runs: keys act on the other pane now (same window of time, same cursor)."""
        if not self._two():
            return
        n_before = self.run_data.n
        sel, other_sel = self.selected, self.other_selected
        self.active_pane = 1 - self.active_pane
        self.selected, self.other_selected = other_sel, sel
        if self.run_data.n != n_before:  # the lanes are the shown agents of the active run
            self.all_agents = np.arange(self.run_data.n)
            self.agents, self.drill = self.all_agents, []
        r = self.run_data
        self.filter_mask = query.mask(r, self.filter_text, "filter") if self.filter_text else None
        self.search_mask = query.mask(r, self.search_text) if self.search_text else None
        self.note(f"active: {'AB'[self.active_pane]} {r.name}")

    def action_difference(self) -> None:
        """Select the first event at which the two runs differ in both panes, and say how."""
        from netsim.explore.diff import first_difference

        if not self._two():
            return
        row, cols = first_difference(self.run_data, self.other)
        if row is None:
            self.note("the two traces are identical")
        elif row >= len(self.run_data.t):
            self.note(f"this trace is a prefix of the other (which goes on after row {row})")
        else:
            msg = f"first difference at row {row}: {', '.join(cols)}"
            if row < len(self.other.t):
                e = self.other.row(row)
                msg += f"; other: {e['kind']} @ {fmt_t(e['t'])} agent {e['agent']}"
            self.note(msg)
            self.select(row, row if row < len(self.other.t) else None)

    def action_diff_only(self) -> None:
        if self._two():
            self.diff_only = not self.diff_only

    def action_own_accuracy(self) -> None:
        if any(r.agent_accuracy is not None for r in self.runs):
            self.own_acc = not self.own_acc
        else:
            self.note("own accuracy: the run has no agent_metrics.csv (the agent_accuracy metric)")

    def action_mark(self) -> None:
        """v: the area's first corner at the cursor; v again: the area from there to the cursor, summarised."""
        gi = self.lane_top + self.lane - 1 if self.lane > 0 else None
        cell = (self.t1 - self.t0) / self._geom[0]
        here = (self.t0 + self.col * cell, gi)
        if self.mark is None:
            self.mark = here  # the status line's modes say what to do next, as long as the mark stands
            return
        (ta, ga), (tb, gb) = self.mark, here
        self.mark = None
        g = self._geom[3]
        if ga is None or gb is None:
            lo, hi = 0, self.groups() - 1
        else:
            lo, hi = min(ga, gb), max(ga, gb)
        t0, t1 = min(ta, tb), max(ta, tb) + cell
        self.post_message(AreaSelected(self.run_data, t0, t1, self.agents[lo * g:(hi + 1) * g]))

    def action_pin(self) -> None:
        if self.pinned is not None:
            self.pinned = None
            self.note("unpinned")
        else:
            self.post_message(PinRequest())

    # the prompt ------------------------------------------------------------------------------------
    def action_ask(self, mode: str) -> None:
        """Open the prompt; the search starts from the current search, the filter empty (enter clears it)."""
        self.post_message(Ask(mode, self.search_text if mode == "search" else ""))

    def answer(self, mode: str, text: str) -> None:
        """The prompt's answer for the lanes (time, agent, search, filter); InputError on a bad one."""
        r = self.run_data
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
            self.show_agent(a)
            self.moved()
        elif mode == "search":
            self.search_mask = query.mask(r, text)
            self.search_text = text
            if self.search_mask is not None:
                self.note(f"{int(self.search_mask.sum())} matches")
                self._jump_to(self.search_mask, 1, "match")
        elif mode == "filter":
            self.apply_filter(text)

    def apply_filter(self, text: str) -> None:
        """Hide the events the filter does not match and show only its agents; a filter that names a time
        window fits the view to it; an empty one clears the filter and keeps the view's window."""
        r = self.run_data
        self.filter_mask = query.mask(r, text, "filter")
        self.filter_text = text
        agents = [v for k, op, v in query.parse(text) if k == "agent" and op == "="]
        self.agents = self.all_agents
        if agents:
            ids = query._ints(agents[0], "filter")
            self.agents = np.array(sorted({int(a) for a in ids if 0 <= a < r.n}), dtype=np.int64)
        self.drill.clear()
        self.lane_top, self.lane = 0, 1
        if text and query.window(text) != (None, None):
            self.action_fit()
        else:
            self.moved()
