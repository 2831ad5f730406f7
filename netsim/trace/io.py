"""Trace files: Arrow IPC *stream* format, written in batches.

The stream format needs no footer, so a run killed mid-way leaves a file readable up to its last
flushed batch (``read_trace`` stops at the first incomplete batch). Only the end of a run writes the
stream's end-of-stream marker, so a trace without it (killed, interrupted or crashed run) is partial.
The schema metadata holds the schema version, the resolved scenario text and its sha256.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import struct
from pathlib import Path

import attrs
import numpy as np
import pyarrow as pa

from netsim.errors import InputError
from netsim.trace.events import SCHEMA_VERSION, row

SCHEMA = pa.schema([
    ("t", pa.float64()), ("kind", pa.string()), ("agent", pa.int32()), ("peer", pa.int32()),
    ("msg", pa.int64()), ("size", pa.int64()), ("value", pa.float64()), ("round", pa.int32()),
    ("tag", pa.string()),
])
TRACE_FILE = "trace.arrows"


_NUMPY = {pa.float64(): np.float64, pa.int64(): np.int64, pa.int32(): np.int32}  # Arrow type: numpy


def _array(col: tuple, type_: pa.DataType) -> pa.Array:
    """One column as Arrow: numbers through numpy (pyarrow converts a tuple of Python floats ~30x slower),
    strings directly. The same values, so the same bytes."""
    np_type = _NUMPY.get(type_)
    return pa.array(col, type_) if np_type is None else pa.array(np.array(col, np_type))


_ROW = pa.struct(list(SCHEMA))


def record_batch(rows: list[tuple]) -> pa.RecordBatch:
    """Rows (COLUMNS order) as one Arrow record batch: converted as a struct array, row by row in pyarrow's own
    code (half the cost of transposing them in Python); where a row holds what that conversion refuses or would
    make a null of (numpy scalars, None), column by column through numpy, as always. The values are the
    same either way, so the bytes are."""
    try:
        batch = pa.RecordBatch.from_struct_array(pa.array(rows, _ROW))
        if not any(c.null_count for c in batch.columns):
            return batch
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    cols = list(zip(*rows))
    return pa.record_batch([_array(col, f.type) for col, f in zip(cols, SCHEMA)], schema=SCHEMA)


def _file_sha(path: Path, size: int):
    """sha256 of the first ``size`` bytes of ``path`` (ValueError if it is shorter)."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        left = size
        while left:
            chunk = f.read(min(left, 1 << 22))
            if not chunk:
                raise ValueError(f"shorter than {size} bytes")
            sha.update(chunk)
            left -= len(chunk)
    return sha


class Words:
    """The strings of the ``kind`` and ``tag`` columns as small codes, for rows given as columns: converting a
    string per row to Arrow costs ~50 ns, a code ~1 ns (``columns_batch`` takes each string column as codes)."""

    def __init__(self):
        self.words: list[str] = []
        self.codes: dict[str, int] = {}
        self.made: tuple[int, pa.Array] | None = None

    def __call__(self, word: str) -> int:
        code = self.codes.get(word)
        if code is None:
            code = self.codes[word] = len(self.words)
            self.words.append(word)
        return code

    def array(self) -> pa.Array:
        if self.made is None or self.made[0] != len(self.words):
            self.made = (len(self.words), pa.array(self.words, pa.string()))
        return self.made[1]


_TEXT = (1, 8)  # the string columns: kind, tag


def columns_batch(cols: tuple, words: Words) -> pa.RecordBatch:
    """Rows given as columns (COLUMNS order: numpy arrays of the schema's types, the strings as ``words``' codes)
    as one record batch: the bytes ``record_batch`` makes of the same rows."""
    import pyarrow.compute as pc

    return pa.record_batch([pc.take(words.array(), pa.array(c)) if n in _TEXT else pa.array(c, f.type)
                            for n, (c, f) in enumerate(zip(cols, SCHEMA))], schema=SCHEMA)


def column_rows(cols: tuple, lo: int, hi: int, words: Words) -> list[tuple]:
    """Rows lo..hi of columns (``columns_batch``'s) as row tuples of Python values."""
    text = np.array(words.words, object)
    return list(zip(*((text[c[lo:hi]] if n in _TEXT else c[lo:hi]).tolist() for n, c in enumerate(cols))))


def row_columns(rows: list[tuple], words: Words) -> tuple:
    """Row tuples as columns (``columns_batch``'s)."""
    return tuple(np.fromiter(map(words, c), np.int32, len(rows)) if n in _TEXT else np.array(c, dtype=_NUMPY[f.type])
                 for n, (c, f) in enumerate(zip(zip(*rows), SCHEMA)))


RECORD = struct.Struct("<d3i2qd2i")  # a row as packed bytes (COLUMNS order, the strings as ``Words`` codes)
_RECORD_DTYPE = np.dtype([(f.name, "<i4" if f.name in ("kind", "tag") else _NUMPY[f.type]().dtype.newbyteorder("<"))
                          for f in SCHEMA])  # (no padding: RECORD's layout)


class PackedRows:
    """Trace rows as fixed-size records in one bytearray (``RECORD``), for a driver that makes millions of them in
    Python and hands them on: a record is packed as the row is made (one C call, its values still in cache), and a
    batch of them crosses a pipe as bytes and becomes columns with no per-row work (``write_to``). A list of row
    tuples cost ~0.5 us a row more to pickle, most of it fetching the rows back into the cache. ``put(RECORD.pack(
    ...))`` on the hot paths (codes from ``words``); ``append(row)`` takes any row tuple, as ``TraceWriter.emit_row``
    does (None in a float column is NaN, a float in an int column is truncated: ``record_batch``'s values)."""

    __slots__ = ("buf", "words", "put")

    def __init__(self, words: Words):
        self.buf = bytearray()
        self.words = words
        self.put = self.buf.extend  # (the bytearray is never replaced: ``clear`` empties it)

    def __len__(self) -> int:
        return len(self.buf) // RECORD.size

    def append(self, row: tuple) -> None:
        words = self.words
        t, kind, agent, peer, msg, size, value, rnd, tag = row
        try:
            self.buf += RECORD.pack(t, words(kind), agent, peer, msg, size, value, rnd, words(tag))
        except (struct.error, TypeError):
            f = lambda x: math.nan if x is None else float(x)  # noqa: E731
            self.buf += RECORD.pack(f(t), words(kind), int(agent), int(peer), int(msg), int(size), f(value),
                                    int(rnd), words(tag))

    def extend(self, rows) -> None:
        """Rows in order: row tuples, or another ``PackedRows`` (its bytes, with the same ``words``)."""
        if isinstance(rows, PackedRows):
            self.buf += rows.buf
            return
        for r in rows:
            self.append(r)

    def clear(self) -> None:
        del self.buf[:]

    def write_to(self, writer: TraceWriter, final: bool = False) -> None:
        """These rows into ``writer`` as whole batches, the rows that would not fill one kept here (``final``: all of
        them). ``emit_columns`` keeps a partial batch as row tuples, to convert them back when the next rows come:
        ~2 us a row."""
        buf = self.buf
        n = len(buf) // RECORD.size
        every = writer.flush_every
        k = n if final or every == math.inf else n - (len(writer.buffer) + n) % every
        if k > 0:
            cut = k * RECORD.size
            writer.emit_columns(packed_columns(bytes(buf[:cut])), self.words)
            del buf[:cut]

    def ship(self) -> tuple[bytes, list[str]]:
        """The rows as bytes and the words their codes refer to, in code order (``packed_columns`` at the other end);
        emptied."""
        data = bytes(self.buf)
        self.clear()
        return data, self.words.words.copy()


def packed_columns(data) -> tuple:
    """Packed records (``PackedRows``) as columns of their own arrays."""
    recs = np.frombuffer(data, _RECORD_DTYPE)
    cols = tuple(np.ascontiguousarray(recs[f.name]).astype(np.int32 if f.name in ("kind", "tag") else
                                                            _NUMPY[f.type], copy=False) for f in SCHEMA)
    del recs  # (a view holds the buffer: a bytearray under a view cannot be emptied)
    return cols


EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the stream format's end-of-stream marker


class TraceWriter:
    """Buffers events as rows and writes them as Arrow record batches; ``None`` path = count only.
    ``on_batch(batch)`` sees each ``pa.RecordBatch`` as it is flushed.

    The stream is written as raw IPC messages (schema, then one message per batch, then EOS on close:
    byte for byte what ``pa.ipc.new_stream`` writes), so the writer knows its byte offset and a running
    sha256 of what it wrote: a checkpoint records both, and a resumed run truncates the file there and
    appends (``reopen``)."""

    def __init__(self, path: Path | None, metadata: dict[str, str], flush_every: int = 8192,
                 on_batch=None, lazy: bool = False):
        self.path = path
        self.flush_every = flush_every
        self.buffer: list = []
        self.count = 0  # events flushed so far
        self.bytes = 0  # bytes written to the file so far
        self._sha = hashlib.sha256()  # of the bytes written (None after ``adopt``: hashed from the file when asked)
        self._adopted: Path | None = None  # the file ``adopt`` took over (where ``sha`` is hashed from)
        self.on_batch = on_batch
        self._sink = None
        self._meta = {"netsim.schema_version": str(SCHEMA_VERSION), **metadata}
        if not lazy:
            self._open()

    def _write(self, data: bytes) -> None:
        self._sink.write(data)
        if self._sha is not None:
            self._sha.update(data)
        self.bytes += len(data)

    @property
    def sha(self):
        """sha256 of the file's bytes so far (a ``hashlib`` object a checkpoint reads the digest of)."""
        if self._sha is None:
            self._sha = _file_sha(self._adopted, self.bytes)
        return self._sha

    def _open(self) -> None:
        """Create the file (lazily: on the first flush, so a run that fails validation writes nothing)."""
        if self.path is not None and self._sink is None:
            self._sink = open(self.path, "wb")  # noqa: SIM115 - closed in close()
            self._write(SCHEMA.with_metadata(self._meta).serialize().to_pybytes())

    def reopen(self, path: Path, offset: int, count: int, sha256: str) -> None:
        """Continue the file at ``path`` after its first ``offset`` bytes (``count`` events), which must
        hash to ``sha256``: the tail after a checkpoint is cut and will be written again, identically
        (the events in the buffer are the ones that follow ``offset``)."""
        sha = _file_sha(path, offset)
        if sha.hexdigest() != sha256:
            raise ValueError(f"its first {offset} bytes changed since the checkpoint (sha256 differs)")
        with open(path, "r+b") as f:
            f.truncate(offset)
        self.path, self.count, self.bytes, self._sha = path, count, offset, sha
        self._sink = open(path, "ab")  # noqa: SIM115 - closed in close()

    def handoff(self) -> tuple:
        """What a fork of this process that wrote on in this writer hands back (``adopt``): the rows waiting, the
        events and bytes written, whether the file is open, and the counts of ``on_batch``."""
        return (self.buffer, self.count, self.bytes, self._sink is not None,
                getattr(self.on_batch, "__dict__", None))

    def adopt(self, state: tuple) -> None:
        """Write on after a fork of this process wrote to the same file, from its ``handoff``: its rows waiting, its
        counts; the file opened for appending if the fork opened it (an open one shares the fork's offset)."""
        self.buffer, self.count, self.bytes, opened, counts = state
        if opened and self._sink is None and self.path is not None:
            self._sink = open(self.path, "ab")  # noqa: SIM115 - closed in close()
        if counts is not None:
            self.on_batch.__dict__.update(counts)
        self._sha, self._adopted = None, self.path

    def emit(self, event) -> None:
        """Trace one event record (``netsim.trace.events``)."""
        buf = self.buffer
        buf.append(row(event))
        if len(buf) >= self.flush_every:
            self.flush()

    def emit_row(self, row: tuple) -> None:
        """Trace one row in COLUMNS order, exactly the row ``emit`` would make of the record: the engine's
        per-message events (activate, compute, send, deliver) skip the record object this way."""
        buf = self.buffer
        buf.append(row)
        if len(buf) >= self.flush_every:
            self.flush()

    def emit_rows(self, rows: list[tuple]) -> None:
        """``emit_row`` for each of ``rows``, in order (batches are cut at the same rows)."""
        buf, i, n = self.buffer, 0, len(rows)
        while i < n:
            take = self.flush_every - len(buf)
            buf.extend(rows[i:i + take])
            i += take
            if len(buf) >= self.flush_every:
                self.flush()
                buf = self.buffer

    def emit_columns(self, cols: tuple, words: Words) -> None:
        """``emit_rows`` for rows given as columns (``columns_batch``'s, strings as codes of ``words``): each full
        batch goes to Arrow column by column, with no tuple per row; its bytes are those of the same rows emitted
        one by one (batches are cut at the same rows). The rows left over, fewer than a batch, wait in the buffer
        as row tuples."""
        n, i = len(cols[0]), 0
        if not n:
            return
        every = self.flush_every
        if every == math.inf:  # capturing: the rows go to the capturing list
            self.buffer.extend(column_rows(cols, 0, n, words))
            return
        if self.buffer:  # the rows waiting come first: completed into a batch if the columns fill it
            i = min(n, every - len(self.buffer))
            if len(self.buffer) + i < every:
                self.buffer.extend(column_rows(cols, 0, i, words))
                return
            head = row_columns(self.buffer, words)
            self.buffer = []
            self._write_batch(columns_batch(tuple(np.concatenate([h, c[:i]]) for h, c in zip(head, cols)), words))
        while n - i >= every:
            self._write_batch(columns_batch(tuple(c[i:i + every] for c in cols), words))
            i += every
        if i < n:
            self.buffer.extend(column_rows(cols, i, n, words))

    @contextlib.contextmanager
    def capturing(self, into: list):
        """Rows emitted inside the block go to ``into`` instead of the trace, for a driver that places them
        itself (the windowed engine puts an agent's releases between its rows); nothing is flushed meanwhile."""
        saved = self.buffer, self.flush_every
        self.buffer, self.flush_every = into, math.inf
        try:
            yield into
        finally:
            self.buffer, self.flush_every = saved

    def flush(self) -> None:
        if not self.buffer:
            return
        rows, self.buffer = self.buffer, []
        self._write_batch(record_batch(rows))

    def _write_batch(self, batch: pa.RecordBatch) -> None:
        self.count += batch.num_rows
        if self.on_batch is not None:
            self.on_batch(batch)
        self._open()
        if self._sink is not None:
            self._write(batch.serialize().to_pybytes())
            self._sink.flush()

    def sync(self, buffered: bool = True) -> None:
        """Flush (the rows not yet in a batch too, unless ``buffered`` is False), and make what was written
        durable (a checkpoint points into the file)."""
        if buffered:
            self.flush()
        if self._sink is not None:
            os.fsync(self._sink.fileno())

    def close(self) -> None:
        self.flush()
        self._open()
        if self._sink is not None:
            self._sink.write(EOS)
            self._sink.close()
            self._sink = None
        self.path = None  # closed for good


@attrs.frozen
class Trace:
    table: pa.Table
    metadata: dict[str, str]
    complete: bool  # the run's end is recorded (end-of-stream marker) and every batch is sound

    @property
    def t_end(self) -> float:
        """Time of the last event read (0.0 for an empty trace): where a partial run's record stops."""
        n = self.table.num_rows
        return float(self.table.column("t")[n - 1].as_py()) if n else 0.0

    def partial_note(self) -> str:
        """One line for a trace that does not record its run's end ("" for a complete one)."""
        return "" if self.complete else partial_note(self.t_end)

    @property
    def scenario_text(self) -> str:
        return self.metadata.get("netsim.scenario", "")

    def to_pandas(self):
        return self.table.to_pandas()


def partial_note(t_end: float) -> str:
    """The line for a partial run's trace whose last event is at t_end."""
    return (f"partial run, up to t = {t_end:.6g} s (the trace does not record the run's end: "
            "it was killed, interrupted or crashed, or the file is cut or corrupted)")


def resolve_trace_path(path: str | Path) -> Path:
    p = Path(path)
    return p / TRACE_FILE if p.is_dir() else p


def has_end_marker(path: str | Path) -> bool:
    """Whether a trace file ends with the end-of-stream marker, read from its last bytes only: False means
    a partial run for sure (``read_trace`` also checks every batch before it calls a trace complete)."""
    try:
        with open(resolve_trace_path(path), "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size < len(EOS):
                return False
            f.seek(size - len(EOS))
            return f.read() == EOS
    except OSError:
        return False


def _agent_count(meta: dict[str, str], p: Path) -> int | None:
    """agents.count of the scenario in the metadata, after checking the text against its sha256 (a
    corrupted header is an InputError); None when the trace carries no scenario."""
    import tomllib

    from netsim.scenario.load import scenario_hash

    text, sha = meta.get("netsim.scenario"), meta.get("netsim.scenario_sha256")
    if text is None and sha is None:
        return None
    if text is None or sha is None or scenario_hash(text) != sha:
        raise InputError("", "corrupted trace header: the scenario text does not match its sha256", str(p))
    try:
        n = tomllib.loads(text).get("agents", {}).get("count")
    except (tomllib.TOMLDecodeError, AttributeError, RecursionError):
        return None
    return n if isinstance(n, int) and n > 0 else None


def _batch_ok(batch: pa.RecordBatch, n: int | None) -> bool:
    """A batch the writer could have written: full Arrow validation (offsets, lengths, UTF-8), no nulls,
    times finite and >= 0, agent and peer ids in [-1, n)."""
    import pyarrow.compute as pc

    try:
        batch.validate(full=True)
    except pa.ArrowException:
        return False
    if batch.num_rows == 0:
        return True
    if any(c.null_count for c in batch.columns):
        return False
    t = batch.column(0)
    if not pc.all(pc.is_finite(t)).as_py() or pc.min(t).as_py() < 0:
        return False
    for name in ("agent", "peer"):
        lo, hi = pc.min_max(batch.column(name)).values()
        if lo.as_py() < -1 or (n is not None and hi.as_py() >= n):
            return False
    return True


def _check_header(schema: pa.Schema, meta: dict[str, str], p: Path) -> int | None:
    """The schema of a netsim trace this netsim can read (else an InputError); agents.count, if known."""
    if "netsim.schema_version" not in meta:
        raise InputError("", "not a netsim trace: schema has no netsim.schema_version", str(p))
    version = meta["netsim.schema_version"]
    if not (version.isascii() and version.isdigit()):
        raise InputError("", f"not a netsim trace: schema version {version[:20]!r} is not a number", str(p))
    if int(version) > SCHEMA_VERSION:
        raise InputError("", f"trace schema v{version} is newer than this netsim "
                             f"(v{SCHEMA_VERSION}); upgrade netsim", str(p))
    if not schema.remove_metadata().equals(SCHEMA):
        raise InputError("", "not a netsim trace: columns must be " + ", ".join(
            f"{f.name}: {f.type}" for f in SCHEMA), str(p))
    return _agent_count(meta, p)


def read_trace(path: str | Path) -> Trace:
    """Read a trace file (or a run folder's trace) up to its last complete batch.

    Every batch is checked before it is used (full Arrow validation, then ``_batch_ok``), so a
    corrupted file is never handed to pandas or numpy: the first batch that is cut off or fails a check
    ends the readable part. ``complete`` is True only when every batch is sound and the file ends with
    the end-of-stream marker the writer writes when the run ends; a killed, interrupted or crashed run's
    trace (whole batches, no marker) is partial. A file whose header or schema is not a netsim trace
    (or whose scenario text does not match its sha256) is an InputError."""
    p = resolve_trace_path(path)
    if not p.exists():
        raise InputError("", "trace not found (give a run folder or its trace.arrows)", str(p))
    batches = []
    complete = True
    with pa.OSFile(str(p)) as f:
        try:
            reader = pa.ipc.open_stream(f)
            meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
        except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
            msg = " ".join(str(e).split())[:200]
            raise InputError("", f"not a netsim trace (Arrow IPC stream): {msg}", str(p)) from None
        n = _check_header(reader.schema, meta, p)
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except (pa.ArrowException, OSError):
                complete = False
                break
            if not _batch_ok(batch, n):
                complete = False
                break
            batches.append(batch)
        if complete:  # the stream ended: at the writer's end-of-stream marker, or just at the file's end
            size = f.size()
            f.seek(max(0, size - len(EOS)))
            complete = size >= len(EOS) and f.read(len(EOS)) == EOS
    table = pa.Table.from_batches(batches, schema=reader.schema)
    return Trace(table, meta, complete)


class TraceTail:
    """A trace read incrementally, message by message: each ``read()`` returns the whole record batches
    appended since the previous one and keeps the byte offset after the last one, so following a run
    being written costs the new bytes, not the file. A message cut off at the end of the file (being
    written) is left for the next ``read()``; a batch that fails the checks of ``read_trace`` ends the
    readable part for good (``sound`` False), as it does there.

    ``memory_map`` maps the file instead of reading it (several times faster on a large trace); only for
    files nobody truncates while they are read (a complete run's trace: a resumed run cuts a partial one)."""

    def __init__(self, path: str | Path, memory_map: bool = False):
        self.path = resolve_trace_path(path)
        if not self.path.exists():
            raise InputError("", "trace not found (give a run folder or its trace.arrows)", str(self.path))
        self.memory_map = memory_map
        self.offset = 0  # bytes consumed: the header and every whole batch read so far
        self.schema: pa.Schema | None = None
        self.metadata: dict[str, str] = {}
        self.n: int | None = None
        self.ended = False  # the end-of-stream marker follows the last batch
        self.sound = True  # no batch failed its checks
        self.size = 0  # the file's size at the last read
        self.columns: dict[str, np.ndarray] = {}  # t, agent, peer of the last read's batches, as numpy

    @property
    def complete(self) -> bool:
        """As ``Trace.complete``: every batch sound and the file ends with the end-of-stream marker."""
        return self.sound and self.ended

    def _bytes(self) -> pa.Buffer:
        if self.memory_map and self.offset == 0:
            buf = pa.memory_map(str(self.path)).read_buffer()  # the buffer keeps the mapping alive
        else:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                buf = pa.py_buffer(f.read())
        return buf

    def read(self) -> list[pa.RecordBatch]:
        """The whole, checked batches written since the last call (the header on the first call: an
        InputError when the file is not a netsim trace, or its header is still being written)."""
        if self.ended or not self.sound:
            return []
        buf = self._bytes()
        self.size = self.offset + buf.size
        src = pa.BufferReader(buf)
        if self.schema is None:
            try:
                schema = pa.ipc.read_schema(pa.ipc.read_message(src))
                meta = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
            except (pa.ArrowException, OSError, EOFError, UnicodeDecodeError) as e:
                msg = " ".join(str(e).split())[:200]
                raise InputError("", f"not a netsim trace (Arrow IPC stream): {msg}", str(self.path)) from None
            self.n = _check_header(schema, meta, self.path)
            self.schema, self.metadata = schema, meta
            self.offset += src.tell()
            buf = buf.slice(src.tell())
            src = pa.BufferReader(buf)
        batches, ends = [], [0]
        while True:
            pos = src.tell()
            try:
                msg = pa.ipc.read_message(src)
                batches.append(pa.ipc.read_record_batch(msg, self.schema))
            except EOFError:  # the end-of-stream marker, or nothing more yet
                self.ended = buf.size - pos >= len(EOS) and buf.slice(buf.size - len(EOS)).to_pybytes() == EOS
                break
            except (pa.ArrowException, OSError):  # a message cut off (or not yet whole): the next read
                break
            ends.append(src.tell())
        good, self.columns = good_batches(batches, self.n)
        if good < len(batches):
            self.sound, self.ended = False, False
        self.offset += ends[good]
        return batches[:good]


def good_batches(batches: list[pa.RecordBatch], n: int | None) -> tuple[int, dict[str, np.ndarray]]:
    """How many leading batches pass ``_batch_ok``'s checks (full Arrow validation, no nulls, times
    finite and >= 0, agent and peer ids in [-1, n)), with the numeric checks done once over all rows in
    numpy rather than per batch through pyarrow.compute; and the checked columns (t, agent, peer) of
    those batches as numpy arrays, which a reader needs anyway."""
    good = len(batches)
    for i, b in enumerate(batches):
        try:
            b.validate(full=True)
        except pa.ArrowException:
            good = i
            break
        if any(c.null_count for c in b.columns):
            good = i
            break
    kept = batches[:good]
    starts = np.cumsum([0] + [b.num_rows for b in kept])
    cols = {name: concat_numbers([b.column(name) for b in kept], dtype)
            for name, dtype in (("t", np.float64), ("agent", np.int32), ("peer", np.int32))}
    t = cols["t"]
    bad = ~np.isfinite(t) | (t < 0)
    for name in ("agent", "peer"):
        bad |= cols[name] < -1
        if n is not None:
            bad |= cols[name] >= n
    hit = np.flatnonzero(bad)
    if len(hit):
        good = int(np.searchsorted(starts, hit[0], side="right")) - 1  # the batch holding the first bad row
        cols = {name: c[:starts[good]] for name, c in cols.items()}
    return good, cols


def concat_numbers(arrays: list[pa.Array], dtype) -> np.ndarray:
    """Validated numeric Arrow arrays without nulls into one numpy array: one copy, straight from their
    data buffers (``Array.to_numpy`` would import pandas, a tenth of a second)."""
    out = np.empty(sum(len(a) for a in arrays), dtype=dtype)
    at = 0
    for a in arrays:
        if len(a):
            own = np.dtype(_NUMPY[a.type])
            out[at:at + len(a)] = np.frombuffer(a.buffers()[1], own, len(a), a.offset * own.itemsize)
        at += len(a)
    return out
