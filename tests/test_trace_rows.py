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


class RowsWriter(TraceWriter):
    """Keeps the raw rows the engine emitted (as flushed), before they become Arrow."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.raw: list[tuple] = []

    def flush(self) -> None:
        self.raw += self.buffer
        super().flush()


def test_engine_rows_are_the_records_rows():
    sc = scenario_from_dict(merge(BASE, {"network": {"loss": 0.2}, "run": {"until": 3.0}}))
    writer = RowsWriter(None, {}, flush_every=97)
    sim = api.prepare(sc, writer)
    sim.run()
    writer.flush()
    rows = writer.raw
    kinds = {r[1] for r in rows}
    assert ENGINE <= kinds
    for r in rows:
        assert row(record(r)) == r, r
        if r[1] in ENGINE:
            assert all(isinstance(v, TYPES[c]) and type(v) is not bool for c, v in zip(COLUMNS, r)), r


def test_event_counts_from_columns_match_a_count_of_the_rows():
    from collections import Counter

    from netsim.metrics.summary import EventCounts

    counts = EventCounts()
    sc = scenario_from_dict(merge(BASE, {"network": {"loss": 0.2}, "run": {"until": 3.0}}))
    writer = RowsWriter(None, {}, flush_every=50, on_batch=counts)
    sim = api.prepare(sc, writer)
    sim.run()
    writer.flush()
    rows = writer.raw
    assert counts.kinds == Counter(r[1] for r in rows) and counts.total == len(rows)
    assert list(counts.kinds) == list(Counter(r[1] for r in rows))  # the same order (summary.json's)
    assert counts.bytes_sent == sum(r[5] for r in rows if r[1] == "send") > 0


def test_event_counts_of_columns_are_those_of_their_batches(tmp_path):
    """Rows handed to the writer as columns are counted by their codes (``EventCounts.columns``): the counts, in the
    same order, and the bytes sent that counting the written batches' strings gives."""
    import numpy as np
    import pyarrow as pa

    from netsim.metrics.summary import EventCounts
    from netsim.sim import rows as shapes
    from netsim.sim.rows import CODES
    from netsim.trace.io import row_columns

    words = shapes.words()
    rng = np.random.default_rng(5)
    names = ["deliver", "send", "custom", "activate", "timeout"]  # first appearance not in code order
    rows = [(0.1 * n, names[k if n >= 300 or k < 3 else 1], n % 7, -1, n, int(rng.integers(1, 100)), 0.0, 1, "model")
            for n, k in enumerate(rng.integers(0, len(names), 500).tolist())]  # (two kinds first seen in a later batch)
    counts = EventCounts()
    writer = TraceWriter(tmp_path / "t.arrows", {}, flush_every=64, on_batch=counts)
    for lo in range(0, 500, 90):  # full batches as columns, the rest left as rows (flushed as columns too)
        writer.emit_columns(row_columns(rows[lo:lo + 90], words), words)
    writer.close()
    read = EventCounts()
    for batch in pa.ipc.open_stream((tmp_path / "t.arrows").read_bytes()):
        read(batch)
    assert words.codes["send"] == CODES.send and counts.total == read.total == 500
    assert list(counts.kinds.items()) == list(read.kinds.items())
    assert counts.bytes_sent == read.bytes_sent == sum(r[5] for r in rows if r[1] == "send")


def test_mini_batches_drawn_ahead_are_the_single_draws():
    """sample_rows draws several mini-batches per numpy call (DrawsAhead): the rows handed out, and the
    batch stream's state whenever someone else reads it, must be those of one call per mini-batch."""
    import numpy as np

    from netsim.sim.streams import DrawsAhead

    assert DrawsAhead.exact()  # on this numpy, drawing ahead is exact (else sample_rows does not)
    sc = scenario_from_dict(merge(BASE, {"run": {"until": 1.0}}))
    agent = api.prepare(sc).agents[3]
    plain = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        agent.sim.streams.seed, spawn_key=agent.sim.streams.seed_sequence("batch", 3).spawn_key)))
    n = len(agent.rows)
    for batch in [5] * 40 + [7] * 3 + [5] * 2:  # blocks used up, a switch of batch size mid-block
        assert np.array_equal(agent.sample_rows(batch), agent.rows[plain.integers(0, n, batch)])
    own = agent.rng("batch")  # the program reads the stream itself: it is where single draws leave it
    assert own.bit_generator.state == plain.bit_generator.state
    assert own.integers(0, 1000, 4).tolist() == plain.integers(0, 1000, 4).tolist()
    for _ in range(3):  # and from then on, one draw per call
        assert np.array_equal(agent.sample_rows(5), agent.rows[plain.integers(0, n, 5)])
    assert own.bit_generator.state == plain.bit_generator.state


def test_record_batch_is_the_column_by_column_conversion():
    """The struct-array conversion of rows gives the bytes of the column-by-column one, and rows it cannot
    convert exactly (numpy scalars, a None) take the column-by-column path."""
    import numpy as np
    import pyarrow as pa

    from netsim.trace.io import SCHEMA, _array, record_batch

    def columns(rows):
        return pa.record_batch([_array(c, f.type) for c, f in zip(zip(*rows), SCHEMA)], schema=SCHEMA)

    rows = [(0.1 * i, "send", i, i + 1, i, 168, 0.005 * i, 3, "model") for i in range(50)]
    rows += [(1e300, "timeout", 2, -1, -1, 0, float("nan"), 7, ""), (2, "deliver", 1, 0, 9, 8, 3, 1, "x")]
    assert record_batch(rows).serialize().to_pybytes() == columns(rows).serialize().to_pybytes()
    odd = rows + [(np.float64(1.5), "drop", np.int64(3), 1, 2, 3, np.float32(0.25), 4, "loss"),
                  (2.0, "release", 1, -1, -1, 0, None, 0, "gradient")]
    got = record_batch(odd)
    assert got.serialize().to_pybytes() == columns(odd).serialize().to_pybytes()
    assert got.column("value").null_count == 0


_NO_PANDAS = r'''
import sys
import netsim
from netsim.trace.io import Words, columns_batch, record_batch, row_columns, string_array

rows = [(0.1 * i, "send", i, i + 1, i, 168, 0.005 * i, 3, "model") for i in range(50)]
rows += [(1e300, "timeout", 2, -1, -1, 0, float("nan"), 7, ""), (2.0, "deliver", 1, 0, 9, 8, 3.0, 1, "x\u00e9")]
words = Words()
got = columns_batch(row_columns(rows, words), words).serialize().to_pybytes()
words_made = string_array(words.words)
netsim.run(sys.argv[1], overrides={"agents": {"count": 8}, "run": {"until": 2.0}}, out=sys.argv[2],
           interruptible=False)
assert "pandas" not in sys.modules, "a windowed run imported pandas"
import pyarrow as pa
assert got == record_batch(rows).serialize().to_pybytes()
assert words_made.equals(pa.array(words.words, pa.string()))
print("ok")
'''


def test_the_column_path_writes_record_batch_bytes_without_importing_pandas(tmp_path):
    """Rows handed as columns (a windowed run's) become the bytes ``record_batch`` makes of them, through Arrow
    arrays made from their buffers: ``pa.array`` imports pandas (~0.3 s of CPU), which a fast-path run does not."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    from pathlib import Path

    quickstart = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.toml"
    out = subprocess.run([sys.executable, "-c", _NO_PANDAS, str(quickstart), str(tmp_path / "run")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
