"""The trace writer makes and writes a driver's column batches on a thread of its own (``trace.io._Writes``) and rows
(the events engine's) on the calling thread: the file is the bytes written on the calling thread, rows are on disk the
moment their batch is flushed, a driver's arrays reused after they were handed over do not reach the file, the
offset and hash a checkpoint reads cover every batch handed over, and a failed write stops the run."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from netsim.sim import rows as shapes
from netsim.trace import io
from netsim.trace.io import EOS, SCHEMA, TraceWriter, batch_message, record_batch, row_columns


def _rows(n: int, seed: int = 3) -> list[tuple]:
    rng = np.random.default_rng(seed)
    kinds = ["send", "deliver", "activate", "drop"]
    return [(0.01 * k, kinds[k % 4], int(rng.integers(0, 50)), int(rng.integers(-1, 50)), k, int(rng.integers(1, 900)),
             float(rng.random()), k // 7, "model" if k % 3 else "") for k in range(n)]


def _expected(rows: list[tuple], every: int) -> bytes:
    """The file as written on one thread: the schema, each batch's message, the end-of-stream marker."""
    meta = {"netsim.schema_version": str(io.SCHEMA_VERSION), io.CHECKSUM_KEY: io.CHECKSUM}
    out = SCHEMA.with_metadata(meta).serialize().to_pybytes()
    for lo in range(0, len(rows), every):
        out += batch_message(record_batch(rows[lo:lo + every]))
    return out + EOS


def test_rows_and_columns_written_on_the_thread_are_the_one_thread_bytes(tmp_path):
    """Rows (the events engine's) and columns (a driver's, its arrays overwritten right after each hand-over, as a
    driver reuses them) give the file written batch by batch on the calling thread."""
    rows = _rows(1000)
    a = TraceWriter(tmp_path / "rows.arrows", {}, flush_every=64)
    for r in rows:
        a.emit_row(r)
    a.close()
    assert (tmp_path / "rows.arrows").read_bytes() == _expected(rows, 64)
    words = shapes.words()
    b = TraceWriter(tmp_path / "cols.arrows", {}, flush_every=64)
    for lo in range(0, 1000, 128):  # two batches a call, each call's arrays then overwritten
        cols = row_columns(rows[lo:lo + 128], words)
        b.emit_columns(cols, words)
        for c in cols:
            c[...] = 0
    b.close()
    assert (tmp_path / "cols.arrows").read_bytes() == _expected(rows, 64)


def test_rows_are_on_disk_when_their_batch_is_flushed_after_the_columns_handed_before(tmp_path):
    """The events engine's guarantee (tests/test_memory.py): a run killed at any moment has lost at most its one
    unflushed batch, so a batch of rows is in the file when ``emit_row`` returns, and so is every column batch handed
    over before it."""
    rows, words = _rows(600), shapes.words()
    w = TraceWriter(tmp_path / "t.arrows", {}, flush_every=50)
    w.emit_columns(row_columns(rows[:200], words), words)  # four batches handed to the thread
    w._words = None  # (then rows, as the events engine emits them)
    for k, r in enumerate(rows[200:]):
        w.emit_row(r)
        if len(w.buffer) == 0:
            data = (tmp_path / "t.arrows").read_bytes()
            assert len(data) == len(_expected(rows[:200 + k + 1], 50)) - len(EOS)
    assert w._writes._pool is not None  # (the columns did go through the thread)
    w.close()
    assert (tmp_path / "t.arrows").read_bytes() == _expected(rows, 50)


def test_a_checkpoints_offset_and_hash_cover_every_batch_handed_over(tmp_path):
    rows = _rows(700)
    w = TraceWriter(tmp_path / "t.arrows", {}, flush_every=50)
    w.emit_rows(rows)
    offset, sha = w.bytes, w.sha.hexdigest()  # (what ``checkpoint.write`` reads)
    data = (tmp_path / "t.arrows").read_bytes()
    assert offset == len(data) == len(_expected(rows, 50)) - len(EOS)
    assert sha == hashlib.sha256(data).hexdigest()
    w.close()


def test_a_failed_batch_write_is_raised_where_the_run_waits_once(tmp_path, monkeypatch):
    """The first batch's write fails (a full disk): the run meets the error where it next hands a batch over or
    waits, once (a crash's own sync then goes on with the batches after it)."""
    real, calls = io.batch_message, []

    def full_once(batch: pa.RecordBatch) -> bytes:
        calls.append(batch.num_rows)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(batch)

    monkeypatch.setattr(io, "batch_message", full_once)
    w = TraceWriter(tmp_path / "t.arrows", {}, flush_every=10)
    with pytest.raises(OSError, match="No space left"):
        w.emit_rows(_rows(200))
        w.sync()
    w.sync()  # (the error is not raised again)
    w.emit_rows(_rows(30))
    w.close()
    assert len(calls) >= 4 and (tmp_path / "t.arrows").read_bytes().endswith(EOS)


def test_owned_columns_reach_the_thread_as_views_and_others_as_copies(tmp_path, monkeypatch):
    """A driver's fresh arrays handed over as the writer's own (``owned``: a round's rows at 10^6 agents are ~360 MB)
    are not copied; any other columns are, so a driver may write over them; the file is the one-thread bytes."""
    seen: list[tuple] = []
    real = TraceWriter._write_message

    def spy(self, made: tuple) -> None:
        seen.append(made[0])
        real(self, made)

    monkeypatch.setattr(TraceWriter, "_write_message", spy)
    rows, words = _rows(256), shapes.words()
    mine, theirs = row_columns(rows, words), row_columns(rows, words)
    w = TraceWriter(tmp_path / "t.arrows", {}, flush_every=64)
    w.emit_columns(mine, words, owned=True)
    w.emit_columns(theirs, words)
    w.close()
    assert len(seen) == 8
    assert all(np.shares_memory(c, o) for cols in seen[:4] for c, o in zip(cols, mine, strict=True))
    assert not any(np.shares_memory(c, o) for cols in seen[4:] for c, o in zip(cols, theirs, strict=True))
    assert (tmp_path / "t.arrows").read_bytes() == _expected(rows + rows, 64)


def test_copied_batches_stay_at_most_ahead_behind_among_owned_ones(tmp_path, monkeypatch):
    """Copies cost memory of their own, so at most ``AHEAD`` of them wait, however many owned batches are queued
    among them; the file keeps the order of the hand-overs."""
    monkeypatch.setattr(io._Writes, "AHEAD", 2)
    most = [0]
    real_put = io._Writes.put

    def put(self, write, arg, owned=False):
        real_put(self, write, arg, owned)
        most[0] = max(most[0], sum(not o for _, o in self._queued))
        assert self._copies == sum(not o for _, o in self._queued)

    monkeypatch.setattr(io._Writes, "put", put)
    slow = io.batch_message

    def late(batch: pa.RecordBatch) -> bytes:  # (the writer behind the run)
        import time

        time.sleep(0.002)
        return slow(batch)

    monkeypatch.setattr(io, "batch_message", late)
    rows, words = _rows(1280), shapes.words()
    w = TraceWriter(tmp_path / "t.arrows", {}, flush_every=64)
    for lo in range(0, 1280, 128):
        w.emit_columns(row_columns(rows[lo:lo + 128], words), words, owned=lo % 256 == 0)
    w.close()
    assert most[0] == 2
    assert (tmp_path / "t.arrows").read_bytes() == _expected(rows, 64)
