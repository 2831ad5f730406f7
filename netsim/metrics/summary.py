"""Interpreters over the event stream: counts for the summary (fed one flushed batch at a time)."""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np

from netsim.trace.events import COLUMNS

_KIND, _SIZE = COLUMNS.index("kind"), COLUMNS.index("size")


@functools.cache
def _send():
    """The kind "send" as an Arrow scalar, made without ``pa.scalar`` (which imports pandas: ``string_array``)."""
    from netsim.trace.io import string_array

    return string_array(["send"])[0]


class EventCounts:
    """Events per kind and bytes sent; counts each flushed batch's columns, so it costs nothing per event."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.bytes_sent = 0

    def __call__(self, batch) -> None:
        """Count one flushed ``pa.RecordBatch`` (in Arrow's compute functions: no per-row Python)."""
        import pyarrow.compute as pc

        kinds = batch.column(_KIND)
        counts = kinds.value_counts()  # in the order of first appearance, as counting the rows would
        self.kinds.update(dict(zip(counts.field(0).to_pylist(), counts.field(1).to_pylist(), strict=True)))
        sent = pc.sum(pc.filter(batch.column(_SIZE), pc.equal(kinds, _send()))).as_py()
        self.bytes_sent += sent or 0

    def columns(self, cols: tuple, words) -> None:
        """``__call__`` for a batch given as columns, its kinds as codes of ``words`` (``TraceWriter`` hands them):
        the same counts, by code (one ``bincount``: ~15 µs a batch of 8,192 rows; its strings, ~250)."""
        kinds = np.asarray(cols[_KIND])
        counts = np.bincount(kinds)
        codes = np.flatnonzero(counts).tolist()
        names = list(map(words.words.__getitem__, codes))
        new = [c for c, k in zip(codes, names) if k not in self.kinds]
        if new:  # kinds not counted before go in the order of their first appearance, as ``__call__`` adds them
            new.sort(key=lambda c: int(np.argmax(kinds == c)))
            self.kinds.update({words.words[c]: 0 for c in new})
        self.kinds.update(dict(zip(names, counts[codes].tolist())))
        send = words.codes.get("send")
        if send is not None:
            self.bytes_sent += int(np.asarray(cols[_SIZE])[kinds == send].sum())

    @property
    def total(self) -> int:
        return sum(self.kinds.values())
