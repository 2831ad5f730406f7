"""Interpreters over the event stream: counts for the summary (fed one flushed batch at a time)."""

from __future__ import annotations

from collections import Counter


class EventCounts:
    """Events per kind and bytes sent; consumes trace batches, so it costs nothing per event."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.bytes_sent = 0

    def __call__(self, events: list) -> None:
        self.kinds.update(e.kind for e in events)
        self.bytes_sent += sum(e.size for e in events if e.kind == "send")

    @property
    def total(self) -> int:
        return sum(self.kinds.values())
