"""The Textual application of ``netsim explore``: it composes the widgets and routes their messages.

The lanes (``lanes.Lanes``) own the view; the side panels, the status line, the prompt, the pivot and the
results panels (``panels``) draw what they are told. The app owns only the run's source: in live mode a
worker thread follows the growing trace (reading the new batches off the UI thread) and hands them over;
SQL queries (``netsim.metrics.sql``) run in a worker too. Keys: ``help``; see docs/explore.md.
"""

from __future__ import annotations

import gc
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer

from netsim.errors import InputError
from netsim.explore.help import APP_KEYS, HelpScreen, bindings
from netsim.explore.lanes import Lanes
from netsim.explore.messages import Answered, AreaSelected, Ask, JumpTo, Note, PinRequest, ViewChanged
from netsim.explore.model import RunData
from netsim.explore.panels import AgentPanel, DetailsPanel, PivotPanel, PromptBar, ResultsPanel, StatusBar

POLL_S = 1.0  # live mode: how often the trace's size is looked at


class Explorer(App):
    """``netsim explore RUN [RUN_B]``."""

    TITLE = "netsim explore"
    CSS = """
    #side { width: 46; border-left: solid $accent; padding: 0 1; }
    #details { height: auto; }
    #agent { height: auto; margin-top: 1; }
    #pivot { margin-top: 1; }
    #status { height: 1; background: $boost; }
    """
    BINDINGS = bindings(APP_KEYS)

    def __init__(self, path: str | Path, run: RunData | None = None, filter_text: str = "",
                 follow: bool | None = None, other: RunData | None = None):
        super().__init__(ansi_color=True)
        self.trace_path = Path(path)
        self.first_run = run or RunData(path)
        self.other_run = other
        self._start_filter = filter_text
        # live mode: a run still being written (no end marker yet) is re-read as its batches land
        self.follow = (not self.first_run.complete) if follow is None else follow
        self._trace_bytes = _file_size(self.trace_path)
        self._warmed = False

    def compose(self) -> ComposeResult:
        runs = [self.first_run] if self.other_run is None else [self.first_run, self.other_run]
        lanes = Lanes(runs)
        lanes.repaint_on_announce = False  # repainted with the panels (on_view_changed): one frame a key
        with Horizontal():
            yield lanes
            with Vertical(id="side"):
                yield DetailsPanel(id="details")
                yield AgentPanel(id="agent")
                yield PivotPanel(id="pivot")
        yield ResultsPanel(id="results")
        yield PromptBar(id="prompt", disabled=True)
        yield StatusBar(id="status")
        yield Footer()

    @property
    def lanes(self) -> Lanes:
        return self.query_one(Lanes)

    def on_mount(self) -> None:
        self.lanes.focus()
        if self.first_run.partial:
            self.query_one(StatusBar).live = "LIVE" if self.follow else "PARTIAL"
        if self._start_filter:
            self.lanes.apply_filter(self._start_filter)
        if self.follow:
            self.follow_trace()

    def _first(self) -> None:
        """After the first screen and its panels: read, in a thread while the user reads the screen, the
        columns and indexes that following needs (not before: the agent pane's counts build the per-agent
        index on this thread, and two threads would build it twice)."""
        self._warmed = True
        self.run_worker(self._warm, thread=True, exclusive=True, group="warm")
        # the app's long-lived objects leave the collector's view: a full collection would otherwise walk
        # them all, some 30 ms, every dozen or so redraws
        gc.freeze()

    def on_unmount(self) -> None:
        gc.unfreeze()

    def _warm(self) -> None:
        for r in self.lanes.runs:
            r.warm()

    # routing -----------------------------------------------------------------------------------------
    def on_view_changed(self, m: ViewChanged) -> None:
        for panel in self.query("DetailsPanel, AgentPanel"):  # none while the app closes
            panel.show(m.view)
        for bar in self.query(StatusBar):
            bar.view = m.view
        for lanes in self.query(Lanes):  # the lanes repaint with the panels, in one frame
            lanes.refresh()
        if not self._warmed:
            self.call_after_refresh(self._first)

    def on_note(self, m: Note) -> None:
        for bar in self.query(StatusBar):
            bar.note = m.text

    def on_ask(self, m: Ask) -> None:
        self.query_one(PromptBar).open(m.mode, m.value)

    def on_answered(self, m: Answered) -> None:
        self.lanes.focus()
        self.query_one(StatusBar).note = ""
        if m.mode == "sql":
            if m.text:
                self.run_sql(m.text)
            return
        try:
            self.lanes.answer(m.mode, m.text)
        except InputError as e:
            self.query_one(StatusBar).note = f"error: {e}"

    def on_jump_to(self, m: JumpTo) -> None:
        self.lanes.jump_to_time(m.t, m.agent)

    def on_area_selected(self, m: AreaSelected) -> None:
        from netsim.explore.pivot import pivot

        self.query_one(PivotPanel).show(pivot(m.run, m.t0, m.t1, m.agents))

    def on_pin_request(self, m: PinRequest) -> None:
        """p (the lanes' when nothing is pinned, the results panel's either way): pin the results' times as a
        lane, or unpin them. The focus stays where it was: the results panel, still open at its height, steps on
        (up, down, enter) with the pins beside the lanes."""
        if self.lanes.pinned is not None:
            self.lanes.pinned = None
            self.query_one(StatusBar).note = "unpinned"
            return
        t, agents = self.query_one(ResultsPanel).pins()
        if not len(t):
            self.query_one(StatusBar).note = "pin: run a query with a t column first (:)"
            return
        self.lanes.pinned = (t, agents)  # the status line's modes say "pinned N"
        self.query_one(StatusBar).note = "p again: unpin"

    # app keys ----------------------------------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_back(self) -> None:
        """Escape: close the innermost panel (key panel, prompt, results, pivot), else step back in the lanes."""
        prompt, results, pivot = self.query_one(PromptBar), self.query_one(ResultsPanel), self.query_one(PivotPanel)
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        elif prompt.is_open:
            prompt.close()
        elif results.is_open:
            results.close()
        elif pivot.has_class("open"):
            pivot.close()
        else:
            self.lanes.back()
            return
        self.lanes.focus()

    # SQL ---------------------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="sql")
    def run_sql(self, text: str) -> None:
        """The query bar: SQL over the active run (tables trace, metrics, agent_metrics, releases)."""
        from netsim.metrics.sql import query

        r = self.lanes.run_data
        try:  # a live run: the rows read so far, as the lanes show them (the file may be mid-batch)
            tab = query(r.path, text, trace=None if r.complete else r.arrow_table)
        except InputError as e:
            self.call_from_thread(self._sql_failed, f"error: {e}")
            return
        self.call_from_thread(self._sql_done, tab)

    def _sql_failed(self, text: str) -> None:
        self.query_one(StatusBar).note = text

    def _sql_done(self, tab) -> None:
        self.query_one(ResultsPanel).show(tab)
        self.query_one(StatusBar).note = (f"{tab.num_rows} rows" + (" (enter: go there, p: pin)"
                                                                    if "t" in tab.column_names else ""))

    # live mode ---------------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="follow")
    def follow_trace(self) -> None:
        """Live mode, in a thread: when the trace grew, read the whole batches written since (checked) and
        hand them to the UI thread, which appends them; until the end marker or the app ends."""
        from textual.worker import get_current_worker

        worker = get_current_worker()
        while self.follow and not worker.cancelled_event.wait(POLL_S):
            got = self._read_new()
            if got is not None:
                self.call_from_thread(self._apply, got)

    def _read_new(self):
        """The new batches when the trace grew (None when it did not), or the InputError that stopped them."""
        size = _file_size(self.trace_path)
        if size == self._trace_bytes:
            return None
        self._trace_bytes = size
        try:
            return self.first_run.read_new()
        except InputError as e:
            return e

    def _apply(self, got) -> bool:
        status = self.query_one(StatusBar)
        if isinstance(got, InputError):
            status.note = f"error: {got}"
            return False
        r = self.first_run
        old_max = r.t_max
        new = r.append(*got)
        if not new and not r.complete:
            return False
        self.lanes.grew(r, old_max)
        if r.complete:
            self.follow = False
            status.note, status.live = "run complete", ""
        else:
            status.note, status.live = f"live: {len(r.t):,} events", "LIVE"
        return bool(new)

    def poll(self) -> bool:
        """One look at the trace, on this thread (the worker's step; tests call it): whether events arrived."""
        got = self._read_new()
        return False if got is None else self._apply(got)


def _file_size(path: Path) -> int:
    from netsim.trace.io import resolve_trace_path

    try:
        return resolve_trace_path(path).stat().st_size
    except OSError:
        return -1
