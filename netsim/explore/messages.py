"""Typed messages between the explorer's widgets: the lanes say what the cursor is on, panels ask the lanes
to go somewhere, anyone may leave a note in the status line. The app routes them; no widget reaches into
another's state."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from textual.message import Message


@dataclass
class View:
    """What the lanes show and what the cursor is on (the status line and side panels draw from it)."""

    run: object  # RunData of the active pane
    selected: int | None  # the event under the cursor (row of ``run``)
    agents: list[int]  # the cursor lane's agents ([-1]: the run's own lane)
    t: float  # the cursor's time: the selected event's, else the cursor column's middle
    t_upto: float  # counts run up to this time: the selected event's, else the cursor cell's end
    window: tuple[float, float]
    group: int = 1  # agents per lane
    filter_text: str = ""
    search_text: str = ""
    pane: str = ""  # "A" or "B" with two runs
    modes: list[str] = field(default_factory=list)  # e.g. "differences only", "pinned 12"


class ViewChanged(Message):
    """The lanes' view or cursor changed."""

    def __init__(self, view: View):
        super().__init__()
        self.view = view


class Note(Message):
    """A line for the status bar ("no next drop", "wrote explore-view.json", an error)."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text


class Ask(Message):
    """Open the prompt in a mode (time, agent, search, filter, sql), pre-filled with ``value``."""

    def __init__(self, mode: str, value: str = ""):
        super().__init__()
        self.mode, self.value = mode, value


class Answered(Message):
    """The prompt was submitted."""

    def __init__(self, mode: str, text: str):
        super().__init__()
        self.mode, self.text = mode, text


class JumpTo(Message):
    """Go to the event nearest time ``t`` (on agent ``agent`` when given): a results row was chosen."""

    def __init__(self, t: float, agent: int | None = None):
        super().__init__()
        self.t, self.agent = t, agent


class AreaSelected(Message):
    """An area of the lanes (a time range x agents) was marked: summarise it."""

    def __init__(self, run, t0: float, t1: float, agents: np.ndarray):
        super().__init__()
        self.run, self.t0, self.t1, self.agents = run, t0, t1, agents


class PinRequest(Message):
    """Pin (or unpin) the results of the last query as a lane."""
