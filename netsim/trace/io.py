"""Trace files: Arrow IPC *stream* format, written in batches.

The stream format needs no footer, so a run killed mid-way leaves a file readable up to its last
flushed batch (``read_trace`` stops at the first incomplete batch). The schema metadata holds the
schema version, the resolved scenario text and its sha256.
"""

from __future__ import annotations

import operator
from pathlib import Path

import attrs
import pyarrow as pa

from netsim.errors import InputError
from netsim.trace.events import COLUMNS, SCHEMA_VERSION

SCHEMA = pa.schema([
    ("t", pa.float64()), ("kind", pa.string()), ("agent", pa.int32()), ("peer", pa.int32()),
    ("msg", pa.int64()), ("size", pa.int64()), ("value", pa.float64()), ("round", pa.int32()),
    ("tag", pa.string()),
])
TRACE_FILE = "trace.arrows"


_ROW = operator.attrgetter(*COLUMNS)


def _columns(events: list) -> list[tuple]:
    """Columns of a batch (COLUMNS order): one C-level attrgetter per event, then a transpose."""
    return list(zip(*map(_ROW, events)))


class TraceWriter:
    """Buffers events and writes them as Arrow record batches; ``None`` path = count only."""

    def __init__(self, path: Path | None, metadata: dict[str, str], flush_every: int = 8192,
                 on_batch=None, lazy: bool = False):
        self.path = path
        self.flush_every = flush_every
        self.buffer: list = []
        self.count = 0  # events flushed so far
        self.on_batch = on_batch
        self._sink = None
        self._writer = None
        self._meta = {"netsim.schema_version": str(SCHEMA_VERSION), **metadata}
        if not lazy:
            self._open()

    def _open(self) -> None:
        """Create the file (lazily: on the first flush, so a run that fails validation writes nothing)."""
        if self.path is not None and self._writer is None:
            self._sink = open(self.path, "wb")  # noqa: SIM115 - closed in close()
            self._writer = pa.ipc.new_stream(self._sink, SCHEMA.with_metadata(self._meta))

    def emit(self, event) -> None:
        self.buffer.append(event)
        if len(self.buffer) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        events, self.buffer = self.buffer, []
        self.count += len(events)
        if self.on_batch is not None:
            self.on_batch(events)
        self._open()
        if self._writer is not None:
            cols = _columns(events)
            self._writer.write_batch(pa.record_batch([pa.array(col, f.type) for col, f in zip(cols, SCHEMA)],
                                                     schema=SCHEMA))
            self._sink.flush()

    def close(self) -> None:
        self.flush()
        self._open()
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = None
        self.path = None  # closed for good


@attrs.frozen
class Trace:
    table: pa.Table
    metadata: dict[str, str]
    complete: bool  # False when the file ended inside a batch (killed run)

    @property
    def scenario_text(self) -> str:
        return self.metadata.get("netsim.scenario", "")

    def to_pandas(self):
        return self.table.to_pandas()


def resolve_trace_path(path: str | Path) -> Path:
    p = Path(path)
    return p / TRACE_FILE if p.is_dir() else p


def read_trace(path: str | Path) -> Trace:
    """Read a trace file (or a run folder's trace) up to its last complete batch."""
    p = resolve_trace_path(path)
    if not p.exists():
        raise InputError("", "trace not found (give a run folder or its trace.arrows)", str(p))
    batches = []
    complete = True
    try:
        reader = pa.ipc.open_stream(pa.OSFile(str(p)))
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError("", f"not a netsim trace (Arrow IPC stream): {e}", str(p)) from None
    meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
    if "netsim.schema_version" not in meta:
        raise InputError("", "not a netsim trace: schema has no netsim.schema_version", str(p))
    if int(meta["netsim.schema_version"]) > SCHEMA_VERSION:
        raise InputError("", f"trace schema v{meta['netsim.schema_version']} is newer than this netsim "
                             f"(v{SCHEMA_VERSION}); upgrade netsim", str(p))
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError):
            complete = False
            break
    table = pa.Table.from_batches(batches, schema=reader.schema)
    return Trace(table, meta, complete)

