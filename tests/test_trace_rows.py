"""The engine's per-message events go to the trace as rows, not records: they must be exactly the rows the
records would make (same columns, same types), or traces would change silently."""

from __future__ import annotations

from netsim import api
from netsim.scenario import scenario_from_dict
from netsim.trace.events import COLUMNS, record, row
from netsim.trace.io import TraceWriter
from tests.conftest import BASE, merge

TYPES = {"t": (float, int), "kind": str, "agent": int, "peer": int, "msg": int, "size": int, "value": float,
         "round": int, "tag": str}
ENGINE = {"activate", "compute_start", "compute_end", "send", "deliver", "drop"}  # rows written as tuples


def test_engine_rows_are_the_records_rows():
    batches: list = []
    sc = scenario_from_dict(merge(BASE, {"network": {"loss": 0.2}, "run": {"until": 3.0}}))
    sim = api.prepare(sc, TraceWriter(None, {}, flush_every=97, on_batch=batches.append))
    sim.run()
    rows = [r for cols in batches for r in zip(*cols)]
    kinds = {r[1] for r in rows}
    assert ENGINE <= kinds
    for r in rows:
        assert row(record(r)) == r, r
        if r[1] in ENGINE:
            assert all(isinstance(v, TYPES[c]) and type(v) is not bool for c, v in zip(COLUMNS, r)), r


def test_event_counts_from_columns_match_a_count_of_the_rows():
    from collections import Counter

    from netsim.metrics.summary import EventCounts

    batches: list = []
    counts = EventCounts()
    sc = scenario_from_dict(merge(BASE, {"network": {"loss": 0.2}, "run": {"until": 3.0}}))
    sim = api.prepare(sc, TraceWriter(None, {}, flush_every=50,
                                      on_batch=lambda cols: (batches.append(cols), counts(cols))))
    sim.run()
    rows = [r for cols in batches for r in zip(*cols)]
    assert counts.kinds == Counter(r[1] for r in rows) and counts.total == len(rows)
    assert counts.bytes_sent == sum(r[5] for r in rows if r[1] == "send") > 0
