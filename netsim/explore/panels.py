"""The explorer's small panels: the selected event's details, the cursor agent's counts, the status line,
the prompt, an area's pivot and a query's results. Each draws from what it is given (a ``View``, a pivot,
an Arrow table) and says what the user chose with a message; none reads another widget."""

from __future__ import annotations

import math

import numpy as np
from rich.text import Text
from textual.binding import Binding
from textual.reactive import reactive
from textual.widgets import DataTable, Input, Static

from netsim.explore.follow import describe
from netsim.explore.messages import Answered, JumpTo, PinRequest, View
from netsim.explore.model import RunData, fmt_t
from netsim.explore.pivot import pivot_lines

RESULT_ROWS = 500  # rows of a query result the panel shows


class DetailsPanel(Static):
    """The selected event, its message followed or its timeout explained (``follow.describe``)."""

    def show(self, view: View) -> None:
        lines = describe(view.run, view.selected) if view.selected is not None else ["(no event under the cursor)"]
        self.update(Text("\n".join(lines)))


class AgentPanel(Static):
    """The cursor agent's counts up to the cursor (the selected event included), its epsilon and accuracy."""

    def show(self, view: View) -> None:
        self.update(Text(agent_text(view.run, view.agents, view.t_upto, view.selected is None), style="cyan"))


def agent_text(r: RunData, agents: list[int], t: float, cell_end: bool = False) -> str:
    """The agent pane's text: counts up to t (the selected event's time, else the cursor cell's end)."""
    if agents == [-1]:
        return "run lane: evaluations"
    if len(agents) != 1:
        return f"agents {agents[0]}-{agents[-1]} (enter: drill down)"
    a = agents[0]
    s = r.agent_stats(a, t)
    out = (f"agent {a} up to t = {fmt_t(t)}{' (cell end)' if cell_end else ''}\n"
           f"activations {s['activations']}  timeouts {s['timeouts']}\n"
           f"sent {s['sent']}  received {s['received']}  stale {s['stale']}\n"
           f"dropped: of its sends {s['dropped_out']}, to it {s['dropped_in']}\n"
           f"offline {s['offline_s']:.4g} s  releases {s['releases']}")
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


class StatusBar(Static):
    """One line: the cursor's time, lane and event, the window, filters, modes and the last note."""

    view: reactive[View | None] = reactive(None, always_update=True)
    note = reactive("")
    live = reactive("")  # "LIVE" / "PARTIAL" / ""

    def render(self) -> Text:
        v = self.view
        if v is None:
            return Text(self.note)
        r = v.run
        who = "run" if v.agents == [-1] else (f"agent {v.agents[0]}" if len(v.agents) == 1 else
                                             f"agents {v.agents[0]}-{v.agents[-1]}")
        under = "-"
        if v.selected is not None:
            e = r.row(v.selected)
            under = f"{e['kind']} @ {fmt_t(e['t'])}" + (f" {e['agent']}->{e['peer']}" if e["peer"] >= 0 else "")
        parts = [f"t={fmt_t(v.t)}s", who, f"under: {under}", f"[{fmt_t(v.window[0])}, {fmt_t(v.window[1])}]"]
        if v.group > 1:
            parts.append(f"{v.group}/lane")
        if v.filter_text:
            parts.append(f"filter: {v.filter_text}")
        if v.search_text:
            parts.append(f"search: {v.search_text}")
        parts += v.modes
        if self.note:
            parts.append(self.note)
        if v.pane:
            parts.insert(0, f"[{v.pane}]")
        if self.live:
            parts.append(self.live)
        return Text("  ".join(parts), no_wrap=True, overflow="ellipsis")


PLACEHOLDER = {"time": "go to time (s)", "agent": "go to agent id",
               "search": "search: kind=drop src=3 ... (n/N: next/previous)",
               "filter": "filter: kind=send,deliver agent=0-3 t>=10 t<=20 (empty: none)",
               "sql": "SQL over tables trace, metrics, agent_metrics, releases (a t column: rows jump there)"}


class PromptBar(Input):
    """The one-line prompt; ``mode`` says what the answer is for (see ``PLACEHOLDER``)."""

    DEFAULT_CSS = "PromptBar { display: none; } PromptBar.open { display: block; }"
    mode = reactive("")

    def open(self, mode: str, value: str = "") -> None:
        self.mode = mode
        self.placeholder = PLACEHOLDER[mode]
        self.value = value
        self.disabled = False
        self.add_class("open")
        self.focus()

    def close(self) -> None:
        self.remove_class("open")
        self.disabled = True

    @property
    def is_open(self) -> bool:
        return self.has_class("open")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        mode = self.mode
        self.close()
        self.post_message(Answered(mode, event.value.strip()))


class PivotPanel(Static):
    """An area's summary (``pivot.pivot``); escape closes it."""

    DEFAULT_CSS = "PivotPanel { display: none; height: auto; } PivotPanel.open { display: block; }"

    def show(self, p: dict) -> None:
        self.figures = p
        self.update(Text("\n".join(pivot_lines(p)), style="yellow"))
        self.add_class("open")

    def close(self) -> None:
        self.remove_class("open")


class ResultsPanel(DataTable):
    """A query's result rows; enter on a row with a ``t`` column goes there (and to its ``agent``), ``p``
    pins the rows' times as a lane."""

    DEFAULT_CSS = "ResultsPanel { display: none; height: 10; } ResultsPanel.open { display: block; }"
    BINDINGS = [Binding("p", "pin", "pin the results' times as a lane")]

    def __init__(self, **kw):
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self.result = None  # the pyarrow Table shown

    def show(self, table) -> None:
        self.result = table
        self.clear(columns=True)
        self.add_columns(*table.column_names)
        for row in table.slice(0, RESULT_ROWS).to_pylist():
            self.add_row(*[_cell(v) for v in row.values()])
        self.add_class("open")
        self.focus()

    def close(self) -> None:
        self.remove_class("open")

    @property
    def is_open(self) -> bool:
        return self.has_class("open")

    def pins(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(times, agents or None) of the result's rows: its ``t`` column (and ``agent`` column)."""
        tab = self.result
        if tab is None or "t" not in tab.column_names:
            return np.zeros(0), None
        t = np.asarray(tab.column("t").to_numpy(zero_copy_only=False), dtype=np.float64)
        ag = None
        if "agent" in tab.column_names:
            ag = np.asarray(tab.column("agent").to_numpy(zero_copy_only=False), dtype=np.float64)
            ag = np.where(np.isfinite(ag), ag, -1).astype(np.int64)
        ok = np.isfinite(t)
        return t[ok], None if ag is None else ag[ok]

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        tab = self.result
        if tab is None or "t" not in tab.column_names:
            return
        row = tab.slice(event.cursor_row, 1).to_pylist()[0]
        t = row["t"]
        if t is None or not math.isfinite(float(t)):
            return
        agent = row.get("agent")
        self.post_message(JumpTo(float(t), None if agent is None else int(agent)))

    def action_pin(self) -> None:
        self.post_message(PinRequest())


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else str(v)
