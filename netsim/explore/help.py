"""Every key of the explorer, grouped, in one table: the widgets' ``BINDINGS`` are built from it, and the
help screen (``?``) and the command palette's key panel show it, so what the keys do is said once.

A row is ``(keys, action, description, footer)``: ``keys`` as Textual names them (comma-separated for
several keys doing one thing); the description is "short|more" (the footer shows the short part, the key
panel and the help screen both); ``footer`` whether the footer shows it (the few keys a newcomer needs).
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

# bindings of the lanes widget (the focused widget: they act on the active run's view)
LANES_KEYS: list[tuple[str, list[tuple[str, str, str, bool]]]] = [
    ("Move", [
        ("left", "cursor(-1)", "cursor left|one column; pans at the edge", False),
        ("right", "cursor(1)", "cursor right|one column; pans at the edge", False),
        ("up", "lane(-1)", "lane cursor up", False),
        ("down", "lane(1)", "lane cursor down", False),
        ("pageup", "page(-1)", "a screen of lanes up", False),
        ("pagedown", "page(1)", "a screen of lanes down", False),
        ("a,shift+left", "pan(-0.25)", "pan left|a quarter of the window", False),
        ("d,shift+right", "pan(0.25)", "pan right|a quarter of the window", False),
        ("w,plus,equals_sign", "zoom(0.5)", "zoom in|around the selected event, else the cursor", True),
        ("s,minus", "zoom(2)", "zoom out", False),
        ("f", "fit", "fit all|or the filter's time window", False),
        ("g", "ask('time')", "go to a time (s)", False),
        ("A", "ask('agent')", "go to an agent", False),
    ]),
    ("Jump", [
        ("x", "jump('drop', 1)", "next drop", True),
        ("X", "jump('drop', -1)", "previous drop", False),
        ("t", "jump('timeout', 1)", "next round timeout", True),
        ("T", "jump('timeout', -1)", "previous round timeout", False),
        ("o", "jump('stale', 1)", "next stale message", False),
        ("O", "jump('stale', -1)", "previous stale message", False),
        ("r", "jump('release', 1)", "next DP release", False),
        ("R", "jump('release', -1)", "previous DP release", False),
        ("right_square_bracket", "jump('', 1)", "next event of the selected kind", False),
        ("left_square_bracket", "jump('', -1)", "previous event of the selected kind", False),
        ("enter", "follow", "follow|a send to its delivery or drop and back; drill into an aggregated lane", True),
    ]),
    ("Find", [
        ("slash", "ask('search')", "search|kind=drop src=3 ...; n/N step through the matches", True),
        ("n", "match(1)", "next search match", False),
        ("N", "match(-1)", "previous search match", False),
        ("k", "ask('filter')", "filter|same syntax; enter on an empty prompt clears it", True),
        ("colon", "ask('sql')", "SQL|over the run's tables (trace, messages, metrics, ...): a results panel", True),
        ("p", "pin", "pin|the query results' times as a lane; again: unpin", False),
        ("v", "mark", "area|mark a corner; at the other corner again: its summary (pivot)", True),
    ]),
    ("Views", [
        ("c", "causal", "causal past|who could have influenced the cursor agent by the cursor time", False),
        ("m", "aggregate", "aggregate|lanes of several agents on/off (off: one scrolling lane per agent)", False),
        ("e", "export", "export|the view as Perfetto JSON (explore-view.json in the run folder)", False),
        ("b", "swap", "other pane|two runs: the keys act on the other pane", False),
        ("D", "difference", "first difference|two runs: the first event where they differ, in both panes", False),
        ("u", "diff_only", "differences only|two runs: hide the cells equal in both", False),
        ("i", "own_accuracy", "own accuracy|the acc strip: the cursor agent's own model (agent_metrics.csv)", False),
    ]),
]

# bindings of the app (they work whatever has the focus)
APP_KEYS: list[tuple[str, list[tuple[str, str, str, bool]]]] = [
    ("App", [
        ("question_mark", "help", "help|every key, grouped, and the glyph legend", True),
        ("escape", "back", "close|a panel or the prompt; else leave a drill-down, drop the area mark, "
                                  "clear the causal highlight", False),
        ("q", "quit", "quit", True),
    ]),
]

DISPLAY = {"left": "←", "right": "→", "up": "↑", "down": "↓", "pageup": "PgUp", "pagedown": "PgDn",
           "shift+left": "shift+←", "shift+right": "shift+→", "plus": "+", "minus": "-", "equals_sign": "=",
           "right_square_bracket": "]", "left_square_bracket": "[", "slash": "/", "colon": ":",
           "question_mark": "?", "escape": "esc", "enter": "enter"}


def bindings(groups) -> list[Binding]:
    """Textual bindings of a key table: one per key, each with its description and how it is shown."""
    out = []
    for _, rows in groups:
        for keys, action, text, footer in rows:
            short, _, more = text.partition("|")
            for i, key in enumerate(keys.split(",")):
                out.append(Binding(key, action, short, show=footer and i == 0, key_display=DISPLAY.get(key),
                                   tooltip=more))
    return out


def legend() -> list[tuple[str, str, str]]:
    """(glyph, style, meaning) of every event kind the lanes draw, most important first."""
    from netsim.trace.timeline import glyphs

    return [(g, style, f"{meaning} ({kind})") for kind, (g, style, meaning) in glyphs().items()]


def keys_table() -> Table:
    """The help screen's keys, by group."""
    t = Table.grid(padding=(0, 2))
    t.add_column(justify="right", style="bold")
    t.add_column()
    for group, rows in [*LANES_KEYS, *APP_KEYS]:
        t.add_row(Text(group, style="underline bold"), "")
        for keys, _, text, _ in rows:
            short, _, more = text.partition("|")
            t.add_row(" ".join(DISPLAY.get(k, k) for k in keys.split(",")), f"{short}: {more}" if more else short)
    return t


def legend_table() -> Table:
    """The glyph legend and what the strips and marks mean."""
    t = Table.grid(padding=(0, 1))
    t.add_column(justify="right")
    t.add_column()
    t.add_row("", Text("Glyphs (a cell: its most important)", style="underline bold"))
    for g, style, meaning in legend():
        t.add_row(Text(g, style=style), meaning)
    t.add_row(Text("◆", style="bold yellow"), "a pinned query result")
    t.add_row(Text("▇", style="green"), "acc: accuracy of the average model (two runs: one y-range); "
                                        "acc 3: agent 3's own model (i)")
    t.add_row(Text("▇", style="magenta"), "eps: epsilon the cursor's agent spent (private runs)")
    t.add_row(Text(" ", style="on grey30"), "the cursor column")
    t.add_row(Text("x", style="reverse bold"), "the selected event; a reversed label: the cursor lane")
    t.add_row(Text("3", style="bold magenta"), "in the causal past (c); dim: too late to matter")
    return t


HELP_TITLE = "netsim explore keys (details: docs/explore.md) · ↑ ↓ PgUp PgDn End, wheel: scroll · escape closes"


class HelpScreen(ModalScreen):
    """``?``: every key grouped, and what the glyphs mean, in a body that scrolls (the keys, the arrows, the
    wheel) under a title that stays and says so; escape, ``?`` or ``q`` closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    #help-box { width: 95%; max-width: 150; height: 90%; border: round $accent; background: $surface;
                padding: 0 1; }
    #help-title { height: auto; }
    #help-body { height: 1fr; scrollbar-gutter: stable; }
    HelpScreen Horizontal { height: auto; }
    #help-keys { width: 1fr; }
    #help-legend { width: 44; margin-left: 2; }
    """
    BINDINGS = [Binding("escape,question_mark,q", "close", "close the help")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(Text(HELP_TITLE, style="bold"), id="help-title")
            with VerticalScroll(id="help-body"):
                with Horizontal():
                    yield Static(keys_table(), id="help-keys")
                    yield Static(legend_table(), id="help-legend")

    def on_mount(self) -> None:
        self.query_one("#help-body").focus()  # the scroll keys act at once

    def action_close(self) -> None:
        self.dismiss()
