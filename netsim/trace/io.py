"""Trace files: Arrow IPC *stream* format, written in batches.

The stream format needs no footer, so a run killed mid-way leaves a file readable up to its last
flushed batch (``read_trace`` stops at the first incomplete batch). Only the end of a run writes the
stream's end-of-stream marker, so a trace without it (killed, interrupted or crashed run) is partial.
The schema metadata holds the schema version, the resolved scenario text and its sha256.
"""

from __future__ import annotations

import hashlib
import os
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


_NUMPY = {pa.float64(): np.float64, pa.int64(): np.int64, pa.int32(): np.int32}


def _array(col: tuple, type_: pa.DataType) -> pa.Array:
    """One column as Arrow: numbers through numpy (pyarrow converts a tuple of Python floats ~30x slower),
    strings directly. The same values, so the same bytes."""
    np_type = _NUMPY.get(type_)
    return pa.array(col, type_) if np_type is None else pa.array(np.array(col, np_type))


EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # the stream format's end-of-stream marker


class TraceWriter:
    """Buffers events as rows and writes them as Arrow record batches; ``None`` path = count only.
    ``on_batch(columns)`` sees each batch's columns (COLUMNS order) as it is flushed.

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
        self.sha = hashlib.sha256()
        self.on_batch = on_batch
        self._sink = None
        self._meta = {"netsim.schema_version": str(SCHEMA_VERSION), **metadata}
        if not lazy:
            self._open()

    def _write(self, data: bytes) -> None:
        self._sink.write(data)
        self.sha.update(data)
        self.bytes += len(data)

    def _open(self) -> None:
        """Create the file (lazily: on the first flush, so a run that fails validation writes nothing)."""
        if self.path is not None and self._sink is None:
            self._sink = open(self.path, "wb")  # noqa: SIM115 - closed in close()
            self._write(SCHEMA.with_metadata(self._meta).serialize().to_pybytes())

    def reopen(self, path: Path, offset: int, count: int, sha256: str) -> None:
        """Continue the file at ``path`` after its first ``offset`` bytes (``count`` events), which must
        hash to ``sha256``: the tail after a checkpoint is cut and will be written again, identically
        (the events in the buffer are the ones that follow ``offset``)."""
        sha = hashlib.sha256()
        with open(path, "r+b") as f:
            left = offset
            while left:
                chunk = f.read(min(left, 1 << 22))
                if not chunk:
                    raise ValueError(f"shorter than the checkpoint's {offset} bytes")
                sha.update(chunk)
                left -= len(chunk)
            if sha.hexdigest() != sha256:
                raise ValueError(f"its first {offset} bytes changed since the checkpoint (sha256 differs)")
            f.truncate(offset)
        self.path, self.count, self.bytes, self.sha = path, count, offset, sha
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

    def flush(self) -> None:
        if not self.buffer:
            return
        rows, self.buffer = self.buffer, []
        self.count += len(rows)
        cols = list(zip(*rows))  # the batch's columns
        if self.on_batch is not None:
            self.on_batch(cols)
        self._open()
        if self._sink is not None:
            batch = pa.record_batch([_array(col, f.type) for col, f in zip(cols, SCHEMA)], schema=SCHEMA)
            self._write(batch.serialize().to_pybytes())
            self._sink.flush()

    def sync(self) -> None:
        """Flush, and make what was written durable (a checkpoint points into the file)."""
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
        if self.complete:
            return ""
        return (f"partial run, up to t = {self.t_end:.6g} s (the trace does not record the run's end: "
                "it was killed, interrupted or crashed, or the file is cut or corrupted)")

    @property
    def scenario_text(self) -> str:
        return self.metadata.get("netsim.scenario", "")

    def to_pandas(self):
        return self.table.to_pandas()


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
        if "netsim.schema_version" not in meta:
            raise InputError("", "not a netsim trace: schema has no netsim.schema_version", str(p))
        version = meta["netsim.schema_version"]
        if not (version.isascii() and version.isdigit()):
            raise InputError("", f"not a netsim trace: schema version {version[:20]!r} is not a number",
                             str(p))
        if int(version) > SCHEMA_VERSION:
            raise InputError("", f"trace schema v{version} is newer than this netsim "
                                 f"(v{SCHEMA_VERSION}); upgrade netsim", str(p))
        if not reader.schema.remove_metadata().equals(SCHEMA):
            raise InputError("", "not a netsim trace: columns must be " + ", ".join(
                f"{f.name}: {f.type}" for f in SCHEMA), str(p))
        n = _agent_count(meta, p)
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
