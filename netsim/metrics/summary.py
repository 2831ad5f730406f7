"""Interpreters over the event stream: counts for the summary (fed one flushed batch at a time)."""

from __future__ import annotations

from collections import Counter
from itertools import compress

from netsim.trace.events import COLUMNS

_KIND, _SIZE = COLUMNS.index("kind"), COLUMNS.index("size")


class EventCounts:
    """Events per kind and bytes sent; counts each flushed batch's columns, so it costs nothing per event."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.bytes_sent = 0

    def __call__(self, columns: list[tuple]) -> None:
        kinds = columns[_KIND]
        self.kinds.update(kinds)
        self.bytes_sent += sum(compress(columns[_SIZE], map("send".__eq__, kinds)))

    @property
    def total(self) -> int:
        return sum(self.kinds.values())
