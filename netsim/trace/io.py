"""Trace files: Arrow IPC *stream* format, written in batches.

Each batch's body is compressed (IPC buffer compression, zstd: ``WRITE_OPTIONS``), which Arrow readers undo
themselves; a trace written uncompressed (before netsim compressed them) reads the same. The stream format needs
no footer, so a run killed mid-way leaves a file readable up to its last flushed batch (the readers stop at a
batch cut off at the file's end). Only the end of a run writes the stream's end-of-stream marker, so a trace
without it (killed, interrupted or crashed run) is partial. The schema metadata holds the schema version, the
resolved scenario text and its sha256.

Every record batch carries a CRC-32 of its decoded column values in its IPC custom metadata
(``netsim.crc32``; the schema's ``netsim.batch_checksum = "crc32"`` says the trace has them), and every
reader verifies it: a damaged batch is an InputError naming the file and the batch, never rows read as
valid. The checksum covers the values as decoded (``batch_crc``), not the bytes of the message, so it holds
whatever the IPC body's encoding (buffer compression included) and also catches a damaged message header
(lengths, offsets) that would decode to other values. A trace without ``netsim.batch_checksum`` (written
before netsim checked its traces) is read as before, its batches unverified (``TraceTail.checked`` False).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import math
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def file_sha_ahead(path: Path, size: int) -> Callable[[], Any]:
    """``_file_sha`` of ``path`` computed in a thread (hashlib lets go of the GIL over large chunks); the returned
    function waits for it and returns it (or raises its error): a resume hashes the trace up to its checkpoint
    (~70 ms at 70 MB) while it builds the run."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(_file_sha, path, size).result
    finally:
        pool.shutdown(wait=False)


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
            self.made = (len(self.words), string_array(self.words))
        return self.made[1]


def string_array(words: list) -> pa.Array:
    """``pa.array(words, pa.string())``, made from its buffers where every word is a str: ``pa.array`` imports pandas
    (~0.3 s of CPU, a tenth of a 1,000-agent windowed run) to look for its types, and a run's column path need not."""
    if not all(type(w) is str for w in words):
        return pa.array(words, pa.string())
    data = [w.encode() for w in words]
    offsets = np.zeros(len(data) + 1, np.int32)
    np.cumsum([len(d) for d in data], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])


def _numbers(c: np.ndarray, type_: pa.DataType) -> pa.Array:
    """``pa.array(c, type_)`` of a numpy column already of ``type_``'s dtype, made from its buffer (no pandas import:
    ``string_array``); another dtype is converted by ``pa.array`` as before."""
    np_type = _NUMPY[type_]
    if not isinstance(c, np.ndarray) or c.dtype != np_type or c.ndim != 1:
        return pa.array(c, type_)
    return pa.Array.from_buffers(type_, len(c), [None, pa.py_buffer(np.ascontiguousarray(c))])


_TEXT = (1, 8)  # the string columns: kind, tag


def columns_batch(cols: tuple, words: Words) -> pa.RecordBatch:
    """Rows given as columns (COLUMNS order: numpy arrays of the schema's types, the strings as ``words``' codes)
    as one record batch: the bytes ``record_batch`` makes of the same rows."""
    import pyarrow.compute as pc

    return pa.record_batch([pc.take(words.array(), _numbers(c, pa.int32())) if n in _TEXT else _numbers(c, f.type)
                            for n, (c, f) in enumerate(zip(cols, SCHEMA))], schema=SCHEMA)


def column_rows(cols: tuple, lo: int, hi: int, words: Words) -> list[tuple]:
    """Rows lo..hi of columns (``columns_batch``'s) as row tuples of Python values."""
    text = np.array(words.words, object)
    return list(zip(*((text[c[lo:hi]] if n in _TEXT else c[lo:hi]).tolist() for n, c in enumerate(cols))))


def row_columns(rows: list[tuple], words: Words) -> tuple:
    """Row tuples as columns (``columns_batch``'s). A string column's distinct words are coded first, in order, and
    its rows looked up in C (``dict.__getitem__``): a Python call per row cost most of a windowed round's leftover
    rows."""
    cols = list(zip(*rows))
    for n in _TEXT:
        for w in dict.fromkeys(cols[n]) if cols else ():
            words(w)
    code = words.codes.__getitem__
    return tuple(np.fromiter(map(code, c), np.int32, len(rows)) if n in _TEXT else np.array(c, dtype=_NUMPY[f.type])
                 for n, (c, f) in enumerate(zip(cols, SCHEMA)))


RECORD = struct.Struct("<d3i2qd2i")  # a row as packed bytes (COLUMNS order, the strings as ``Words`` codes)
RECORD_DTYPE = np.dtype([(f.name, "<i4" if f.name in ("kind", "tag") else _NUMPY[f.type]().dtype.newbyteorder("<"))
                         for f in SCHEMA])  # (no padding: RECORD's layout)


class PackedRows:
    """Trace rows as fixed-size records in one bytearray (``RECORD``), for a driver that makes millions of them in
    Python: a record is packed as the row is made (one C call, its values still in cache), and a batch of them
    becomes columns with no per-row work (``write_to``). ``put(RECORD.pack(
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
            writer.emit_columns(packed_columns(bytes(buf[:cut])), self.words, owned=True)  # (arrays of their own)
            del buf[:cut]


def packed_columns(data) -> tuple:
    """Packed records (``PackedRows``) as columns of their own arrays."""
    recs = np.frombuffer(data, RECORD_DTYPE)
    cols = tuple(np.ascontiguousarray(recs[f.name]).astype(np.int32 if f.name in ("kind", "tag") else
                                                            _NUMPY[f.type], copy=False) for f in SCHEMA)
    del recs  # (a view holds the buffer: a bytearray under a view cannot be emptied)
    return cols


EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the stream format's end-of-stream marker
CHECKSUM_KEY, CHECKSUM = "netsim.batch_checksum", "crc32"  # schema metadata: every batch carries its CRC
CRC_KEY = "netsim.crc32"  # a batch's custom metadata: ``batch_crc`` of its values, 8 hex digits


def batch_crc(batch: pa.RecordBatch) -> int:
    """CRC-32 (zlib) of a batch's decoded values: its row count, then column by column the values of a
    fixed-width column (its data buffer over the batch's rows), or a string column's offsets (from 0) and
    characters. Validity bitmaps are left out (a trace holds no nulls; the readers refuse one), as are padding
    and any encoding of the message body, so a compressed body gives the same CRC. The batch must be
    validated first (its offsets index its buffers)."""
    crc = zlib.crc32(struct.pack("<q", batch.num_rows))
    for col in batch.columns:
        bufs, n, at = col.buffers(), len(col), col.offset
        if len(bufs) == 3:  # string: offsets, characters
            offsets = np.frombuffer(bufs[1], np.int32, n + 1, at * 4) if n else np.zeros(1, np.int32)
            lo, hi = int(offsets[0]), int(offsets[-1])
            crc = zlib.crc32(offsets - lo if lo else offsets, crc)
            if hi > lo:
                crc = zlib.crc32(memoryview(bufs[2])[lo:hi], crc)
        elif n:
            w = col.type.bit_width // 8
            crc = zlib.crc32(memoryview(bufs[1])[at * w:(at + n) * w], crc)
    return crc


_SCHEMA_BYTES = len(SCHEMA.serialize())  # what a stream writer writes before its first batch

COMPRESSION = ("zstd", 3)  # IPC buffer compression of every batch body written (codec, level)
# zstd at its own default level 3: on the 10,000-agent D-PSGD trace 40 bytes an agent-round instead of 439
# (lz4: 95), for ~70 ns of CPU a row (lz4: ~25); level 1 costs as much and is 12% larger, levels 5 and up
# cost more for < 4%. Each buffer is compressed on the calling thread: a batch's buffers are too small for
# the pool's hand-offs to pay. A pyarrow built without zstd
# writes the bodies uncompressed (readers read both).
WRITE_OPTIONS = pa.ipc.IpcWriteOptions(
    compression=pa.Codec(*COMPRESSION) if pa.Codec.is_available(COMPRESSION[0]) else None, use_threads=False)


def batch_message(batch: pa.RecordBatch) -> bytes:
    """The IPC message of a batch with its CRC in the custom metadata, its body compressed (``WRITE_OPTIONS``):
    what the trace writer writes (a stream writer's message for the batch, its schema message cut off: the only
    way pyarrow writes a batch's custom metadata)."""
    sink = pa.BufferOutputStream()
    writer = pa.ipc.new_stream(sink, SCHEMA, options=WRITE_OPTIONS)
    writer.write_batch(batch, custom_metadata={CRC_KEY: f"{batch_crc(batch):08x}"})
    return sink.getvalue().slice(_SCHEMA_BYTES).to_pybytes()  # (not closed: no end-of-stream marker)


def write_trace(table: pa.Table, path: str | Path, flush_every: int = 8192) -> Path:
    """A trace table (an edited recording, say) written as netsim writes a trace: its schema's metadata (the
    recorded scenario), each batch of ``flush_every`` rows with its checksum, the end-of-stream marker."""
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    meta[CHECKSUM_KEY] = CHECKSUM
    path = Path(path)
    with open(path, "wb") as f:
        f.write(SCHEMA.with_metadata(meta).serialize().to_pybytes())
        for batch in table.cast(SCHEMA.with_metadata(meta)).to_batches(max_chunksize=flush_every):
            f.write(batch_message(batch))
        f.write(EOS)
    return path


def _custom_metadata(meta: pa.Buffer) -> dict[str, str] | None:
    """The custom metadata of an IPC message from its flatbuffer (Arrow's Message.fbs: ``Message`` field 4,
    ``custom_metadata: [KeyValue]``), which pyarrow reads only through a stream reader; None when it cannot be
    read (pyarrow has verified the flatbuffer by then, so only a damaged one)."""
    b = memoryview(meta)

    def u32(at: int) -> int:
        if at < 0:
            raise ValueError(at)
        return struct.unpack_from("<I", b, at)[0]

    def field(table: int, i: int) -> int | None:  # where field i of a table is, None when absent
        vt = table - struct.unpack_from("<i", b, table)[0]
        if vt < 0 or 4 + 2 * i >= struct.unpack_from("<H", b, vt)[0]:
            return None
        off = struct.unpack_from("<H", b, vt + 4 + 2 * i)[0]
        return table + off if off else None

    def text(at: int) -> str:
        at += u32(at)
        n = u32(at)
        if at + 4 + n > len(b):
            raise ValueError(at)
        return bytes(b[at + 4:at + 4 + n]).decode()

    try:
        vec = field(u32(0), 4)
        if vec is None:
            return {}
        vec += u32(vec)
        count = u32(vec)
        if count > 64:
            return None
        out = {}
        for j in range(count):
            elem = vec + 4 + 4 * j
            kv = elem + u32(elem)
            k, v = field(kv, 0), field(kv, 1)
            if k is not None and v is not None:
                out[text(k)] = text(v)
        return out
    except (struct.error, ValueError):  # (UnicodeDecodeError is a ValueError)
        return None


class TraceWriter:
    """Buffers events as rows and writes them as Arrow record batches; ``None`` path = count only.
    ``on_batch(batch)`` sees each ``pa.RecordBatch`` as it is flushed.

    The stream is written as raw IPC messages (schema, then one message per batch with its checksum, its body
    compressed, then EOS on close: byte for byte what ``pa.ipc.new_stream`` writes given ``WRITE_OPTIONS`` and
    each batch's ``custom_metadata``), so the writer knows its byte offset and a running sha256 of what it
    wrote: a checkpoint records both, and a resumed run truncates the file there and appends (``reopen``)."""

    def __init__(self, path: Path | None, metadata: dict[str, str], flush_every: int = 8192,
                 on_batch=None, lazy: bool = False):
        self.path = path
        self.flush_every = flush_every
        self.buffer: list = []
        self.count = 0  # events flushed so far
        self._bytes = 0  # bytes written to the file so far
        self._sha = hashlib.sha256()  # of the bytes written
        self.on_batch = on_batch
        self._sink = None
        self._writes = _Writes()  # the batches' messages, made and written on a thread of their own
        self._words: Words | None = None  # the codes of the columns a driver hands (``emit_columns``): rows then
        # flushed as columns too (``flush``)
        self._meta = {"netsim.schema_version": str(SCHEMA_VERSION), CHECKSUM_KEY: CHECKSUM, **metadata}
        if not lazy:
            self._open()

    def _write(self, data: bytes) -> None:
        self._sink.write(data)
        self._sha.update(data)
        self._bytes += len(data)

    @property
    def bytes(self) -> int:
        """The bytes written to the file so far (every batch handed over: a checkpoint points here)."""
        self._writes.wait()
        return self._bytes

    @property
    def sha(self):
        """sha256 of the file's bytes so far (a ``hashlib`` object a checkpoint reads the digest of)."""
        self._writes.wait()
        return self._sha

    def _open(self) -> None:
        """Create the file (lazily: on the first flush, so a run that fails validation writes nothing)."""
        if self.path is not None and self._sink is None:
            self._sink = open(self.path, "wb")  # noqa: SIM115 - closed in close()
            self._write(SCHEMA.with_metadata(self._meta).serialize().to_pybytes())

    def reopen(self, path: Path, offset: int, count: int, sha256: str,
               hashed: Callable[[], Any] | None = None) -> None:
        """Continue the file at ``path`` after its first ``offset`` bytes (``count`` events), which must
        hash to ``sha256``: the tail after a checkpoint is cut and will be written again, identically
        (the events in the buffer are the ones that follow ``offset``). ``offset`` 0: nothing was written by the
        checkpoint (a windowed run's first batch came after it): the file is made again at the first flush.
        ``hashed``: those bytes' hash already under way (``file_sha_ahead``)."""
        self._writes.wait()
        if offset == 0:
            path.unlink(missing_ok=True)
            self.path, self.count, self._bytes, self._sha = path, count, 0, hashlib.sha256()
            return
        sha = _file_sha(path, offset) if hashed is None else hashed()
        if sha.hexdigest() != sha256:
            raise ValueError(f"its first {offset} bytes changed since the checkpoint (sha256 differs)")
        with open(path, "r+b") as f:
            f.truncate(offset)
        self.path, self.count, self._bytes, self._sha = path, count, offset, sha
        self._sink = open(path, "ab")  # noqa: SIM115 - closed in close()

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

    def emit_columns(self, cols: tuple, words: Words, owned: bool = False) -> None:
        """``emit_rows`` for rows given as columns (``columns_batch``'s, strings as codes of ``words``): each full
        batch goes to Arrow column by column, with no tuple per row; its bytes are those of the same rows emitted
        one by one (batches are cut at the same rows). The rows left over, fewer than a batch, wait in the buffer
        as row tuples. ``owned``: the arrays are the writer's from now on (never changed again, as a driver's fresh
        arrays of a round): its batches are handed to the writer's thread as views, not copies (``_Writes``)."""
        n, i = len(cols[0]), 0
        if not n:
            return
        self._words = words
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
            self._write_columns(tuple(np.concatenate([h, c[:i]]) for h, c in zip(head, cols)), owned=True)
        while n - i >= every:
            self._write_columns(tuple(c[i:i + every] for c in cols), owned)
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
        words = self._words  # (a run whose driver hands columns: the rows left as columns, the same bytes)
        if words is None:
            self._write_batch(record_batch(rows))
        else:
            self._write_columns(row_columns(rows, words), owned=True)  # (arrays made here)

    def _write_columns(self, cols: tuple, owned: bool = False) -> None:
        """``_write_batch`` of columns (``columns_batch``'s, codes of ``_words``): a driver's whole windows of rows,
        made and written on the writer's thread (``_Writes``) from a copy of the columns (a driver may reuse its
        arrays) or, ``owned``, from the columns themselves, where no listener reads the batch itself (an
        ``on_batch`` that counts columns, ``EventCounts.columns``, is handed them: no string per row to read
        back)."""
        counted = None if self.on_batch is None else getattr(self.on_batch, "columns", None)
        if self.on_batch is not None and counted is None:
            self._write_batch(columns_batch(cols, self._words))
            return
        self.count += len(cols[0])
        if counted is not None:
            counted(cols, self._words)
        self._open()
        if self._sink is not None:
            self._writes.put(self._write_message, (cols if owned else tuple(map(np.array, cols)), self._words),
                             owned)

    def _write_batch(self, batch: pa.RecordBatch) -> None:
        """A batch written on the calling thread, after every batch handed over before it: a run that emits rows
        (the events engine) has at most its one unflushed batch in memory, whenever it is killed."""
        self.count += batch.num_rows
        if self.on_batch is not None:
            self.on_batch(batch)
        self._open()
        if self._sink is not None:
            self._writes.wait()
            self._append(batch_message(batch))

    def _write_message(self, made: tuple) -> None:
        """On the writer's thread: a batch's message (``batch_message``: compressing is most of a batch's cost, and
        Arrow does it without the GIL) made from columns and their words (only ever added to: the codes of these
        columns are there), written after the ones before it."""
        self._append(batch_message(columns_batch(*made)))

    def _append(self, message: bytes) -> None:
        """A batch's message written and flushed to the file."""
        self._write(message)
        self._sink.flush()

    def sync(self, buffered: bool = True) -> None:
        """Flush (the rows not yet in a batch too, unless ``buffered`` is False), and make what was written
        durable (a checkpoint points into the file)."""
        if buffered:
            self.flush()
        self._writes.wait()
        if self._sink is not None:
            os.fsync(self._sink.fileno())

    def close(self) -> None:
        self.flush()
        self._writes.close()
        self._open()
        if self._sink is not None:
            self._sink.write(EOS)
            self._sink.close()
            self._sink = None
        self.path = None  # closed for good


class _Writes:
    """A trace writer's batches, written in order on one thread of its own (made at the first), at most ``AHEAD``
    behind the run: the run goes on while Arrow compresses (most of a batch's cost; its C++ leaves the GIL). The
    bytes are those written on the calling thread. ``wait`` is where the file holds every batch handed over (a
    checkpoint's offset, a sync, the end); a failed write is raised there or at the next ``put``."""

    AHEAD = 32  # copied batches (~0.4 MB each at 8,192 rows: a round of 10,000 agents' ~9 batches handed over at
    # once, and written while the next round is played)
    AHEAD_OWNED = 1024  # batches of arrays the writer owns (``emit_columns``'s ``owned``): views that add no memory,
    # but keep the arrays of the round that made them until written. A round of 10^6 agents hands ~850 at once:
    # the round after it is played while they are written (with 32, the run waited for ~800 of them each round)

    def __init__(self):
        self._pool = None
        self._queued: collections.deque = collections.deque()
        self._copies = 0  # copied batches queued (``AHEAD``)

    def put(self, write: Callable[[Any], None], arg: Any, owned: bool = False) -> None:
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="netsim-trace")
        queued = self._queued
        queued.append((self._pool.submit(write, arg), owned))
        self._copies += not owned
        while self._copies > self.AHEAD or len(queued) > self.AHEAD_OWNED or (queued and queued[0][0].done()):
            self._next()

    def wait(self) -> None:
        while self._queued:
            self._next()

    def _next(self) -> None:
        """The oldest write waited for (an interrupt meanwhile leaves it queued), then dropped; its failure raised,
        once."""
        head, owned = self._queued[0]
        head.exception()
        self._queued.popleft()
        self._copies -= not owned
        head.result()

    def close(self) -> None:
        self.wait()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


@attrs.frozen
class Trace:
    table: pa.Table
    metadata: dict[str, str]
    complete: bool  # the run's end is recorded (end-of-stream marker) and every batch is sound
    checked: bool = True  # every batch's checksum verified (False: a trace written without them)

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


def unchecked_note(path: str | Path) -> str:
    """One line for a trace written without batch checksums (by a netsim before them), whose batches are read
    unverified; "" for one with them, or one whose header cannot be read (its reader says why)."""
    p = resolve_trace_path(path)
    try:
        with pa.OSFile(str(p)) as f:
            meta = pa.ipc.read_schema(pa.ipc.read_message(f)).metadata or {}
    except (pa.ArrowException, OSError, EOFError, ValueError):
        return ""
    if b"netsim.schema_version" not in meta or CHECKSUM_KEY.encode() in meta:
        return ""
    return (f"{p}: written without batch checksums (by an older netsim): a damaged batch cannot be told from a "
            "sound one; run the scenario again for a checked trace")


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
    if meta.get(CHECKSUM_KEY, CHECKSUM) != CHECKSUM:
        raise InputError("", f"batch checksums of kind {meta[CHECKSUM_KEY][:20]!r}: this netsim knows {CHECKSUM} "
                             "(a newer netsim's trace, or a damaged header)", str(p))
    if not schema.remove_metadata().equals(SCHEMA):
        raise InputError("", "not a netsim trace: columns must be " + ", ".join(
            f"{f.name}: {f.type}" for f in SCHEMA), str(p))
    return _agent_count(meta, p)


def read_trace(path: str | Path) -> Trace:
    """Read a trace file (or a run folder's trace) up to its last complete batch.

    Every batch is checked before it is used (``TraceTail``: its checksum, full Arrow validation, no nulls,
    times finite and >= 0, agent and peer ids in range), so a damaged file is never handed to pandas or numpy:
    a damaged batch is an InputError naming it; a batch cut off at the end of the file (a killed run) ends the
    readable part. ``complete`` is True only when the file ends with the end-of-stream marker the writer writes
    when the run ends; a killed, interrupted or crashed run's trace (whole batches, no marker) is partial. A
    file whose header or schema is not a netsim trace (or whose scenario text does not match its sha256) is an
    InputError; so is a run folder whose files are not all one run's (``netsim.trace.folder``)."""
    tail = TraceTail(path)
    batches = tail.read()
    return Trace(pa.Table.from_batches(batches, schema=tail.schema), tail.metadata, tail.complete, tail.checked)


class _Damaged(Exception):
    """A batch that is not what the writer wrote: (its number from 1, its byte offset, why)."""


class TraceTail:
    """A trace read incrementally, message by message: each ``read()`` returns the whole record batches
    appended since the previous one and keeps the byte offset after the last one, so following a run
    being written costs the new bytes, not the file. A message cut off at the end of the file (being
    written) is left for the next ``read()``; a damaged batch is an InputError naming the file and the
    batch (in a trace written without checksums it ends the readable part for good, ``sound`` False).

    A damaged batch is told from one cut off by a killed writer: the writer writes each message whole and the
    end-of-stream marker last, so a message that cannot be read is a cut only when the file does not end with
    the marker and no whole batch with a sound checksum follows it.

    ``memory_map`` maps the file instead of reading it (several times faster on a large trace); only for
    files nobody truncates while they are read (a complete run's trace: a resumed run cuts a partial one).
    A run folder (or its ``trace.arrows``) is checked first: all its files one run's (``netsim.trace.folder``)."""

    def __init__(self, path: str | Path, memory_map: bool = False):
        from netsim.trace.folder import check_run_folder

        self.path = resolve_trace_path(path)
        if self.path.name == TRACE_FILE:
            check_run_folder(self.path.parent)
        if not self.path.exists():
            raise InputError("", "trace not found (give a run folder or its trace.arrows)", str(self.path))
        self.memory_map = memory_map
        self.offset = 0  # bytes consumed: the header and every whole batch read so far
        self.schema: pa.Schema | None = None
        self.metadata: dict[str, str] = {}
        self.n: int | None = None
        self.checked = False  # the header says every batch carries its checksum (verified as it is read)
        self.batches = 0  # whole batches read so far
        self.ended = False  # the end-of-stream marker follows the last batch
        self.sound = True  # no batch failed its checks (a trace without checksums: it ends the readable part)
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
        start = 0
        if self.schema is None:
            src = pa.BufferReader(buf)
            try:
                schema = pa.ipc.read_schema(pa.ipc.read_message(src))
                meta = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
            except (pa.ArrowException, OSError, EOFError, UnicodeDecodeError) as e:
                msg = " ".join(str(e).split())[:200]
                raise InputError("", f"not a netsim trace (Arrow IPC stream): {msg}", str(self.path)) from None
            self.n = _check_header(schema, meta, self.path)
            self.schema, self.metadata = SCHEMA.with_metadata(schema.metadata), meta  # (the file's flags aside)
            self.checked = meta.get(CHECKSUM_KEY) == CHECKSUM
            start = src.tell()
        batches, ends, self.ended, damage = self._messages(buf, start)
        good, self.columns = good_batches(batches, self.n)
        if good < len(batches):
            damage = (self.batches + good + 1, self.offset + ends[good], "it holds rows no run writes (a time "
                      "that is negative or not finite, or an agent id out of range)")
        if damage is not None:
            k, at, why = damage
            if self.checked:
                raise InputError("", f"batch {k} (at byte {at:,}) is damaged: {why}; its events cannot be "
                                     "trusted", str(self.path))
            self.sound, self.ended = False, False  # without checksums: the readable part ends there, as always
        self.offset += ends[good]
        self.batches += good
        return batches[:good]

    def _messages(self, buf: pa.Buffer, pos: int) -> tuple[list[pa.RecordBatch], list[int], bool, tuple | None]:
        """The whole batches in ``buf`` from ``pos``, the offset after each (``ends[0]``: ``pos``), whether the
        end-of-stream marker follows the last, and the first batch that is not what the writer wrote (its
        number, its offset in the file, why; None when none), its checksum verified when the trace has them."""
        src = pa.BufferReader(buf)
        src.seek(pos)
        batches, ends, size = [], [pos], buf.size
        while pos < size:
            k, at = self.batches + len(batches) + 1, self.offset + pos
            try:
                msg = pa.ipc.read_message(src)
            except EOFError:  # an end-of-stream marker: the file's last bytes, or a damaged message
                rest = buf.slice(pos, min(len(EOS) + 1, size - pos)).to_pybytes()
                if rest == EOS:
                    return batches, ends, True, None
                if len(rest) < len(EOS) or self._cut(buf, ends[-2] if len(ends) > 1 else pos):
                    break
                return batches, ends, False, (k, at, "an end-of-stream marker before the end of the file")
            except (pa.ArrowException, OSError):  # cut off by a killed writer (or being written), or damaged
                if self._cut(buf, ends[-2] if len(ends) > 1 else pos):
                    break
                return batches, ends, False, (k, at, "its message cannot be read")
            why = self._unsound(msg)
            if isinstance(why, str):
                return batches, ends, False, (k, at, why)
            batches.append(why)
            pos = src.tell()
            ends.append(pos)
        return batches, ends, False, None

    def _unsound(self, msg) -> pa.RecordBatch | str:
        """The batch a whole message holds, or why it is not one the writer wrote: it does not decode to the
        trace's columns, holds nulls, or (a trace with checksums) its checksum is missing or differs."""
        try:
            if msg.type != "record batch":
                return f"a {msg.type} message where a record batch belongs"
            batch = pa.ipc.read_record_batch(msg, self.schema)
            batch.validate(full=True)
        except (pa.ArrowException, OSError, ValueError):
            return "it does not decode to the trace's columns"
        if any(c.null_count for c in batch.columns):
            return "it holds nulls"
        custom = _custom_metadata(msg.metadata)
        if not self.checked:
            if custom is None or CRC_KEY not in custom:
                return batch  # a trace written without checksums
            self.checked = True  # its batches carry them: it is the header's netsim.batch_checksum that is damaged
            return f"the header does not say so ({CHECKSUM_KEY}), though its batches carry checksums"
        crc = (custom or {}).get(CRC_KEY)
        if crc is None:
            return ("its checksum is missing (a trace rewritten by another writer, e.g. an edited recording: write it "
                    "with netsim.trace.io.write_trace)")
        if crc != f"{batch_crc(batch):08x}":
            return "its checksum differs from its contents"
        return batch

    def _cut(self, buf: pa.Buffer, pos: int) -> bool:
        """Whether an unreadable message is one a killed (or still running) writer cut off at the end of the
        file: the file does not end with the end-of-stream marker, and no whole batch with a sound checksum lies
        after ``pos`` (the start of the last batch read, which a damaged length may have made swallow the next;
        messages start 8-byte aligned in the file). Without checksums, every unreadable message is. (So a damaged
        message header in the last batch of a trace without its end reads as a cut.)"""
        if not self.checked:
            return True
        size = buf.size
        if size >= len(EOS) and buf.slice(size - len(EOS)).to_pybytes() == EOS:
            return False
        first = pos + 1 + (-(self.offset + pos + 1)) % 8  # the next 8-byte aligned offset of the file after pos
        if first >= size:
            return True
        words = np.frombuffer(buf, "<u4", (size - first) // 8 * 2, first).reshape(-1, 2)
        lengths = words[:, 1].astype(np.int64)
        starts = first + 8 * np.flatnonzero((words[:, 0] == 0xFFFFFFFF) & (lengths >= 8) & (lengths % 8 == 0))
        for q in starts.tolist():
            try:
                msg = pa.ipc.read_message(pa.BufferReader(buf.slice(q)))
            except (pa.ArrowException, OSError, EOFError):
                continue
            if not isinstance(self._unsound(msg), str):
                return False
        return True


def good_batches(batches: list[pa.RecordBatch], n: int | None) -> tuple[int, dict[str, np.ndarray]]:
    """How many leading batches hold rows a run writes (times finite and >= 0, agent and peer ids in [-1, n);
    the batches are read, validated and checked for nulls already: ``TraceTail``), the checks done once over
    all rows in numpy rather than per batch through pyarrow.compute; and the checked columns (t, agent, peer)
    of those batches as numpy arrays, which a reader needs anyway."""
    good = len(batches)
    starts = np.cumsum([0] + [b.num_rows for b in batches])
    cols = {name: concat_numbers([b.column(name) for b in batches], dtype)
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
