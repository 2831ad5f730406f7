"""A damaged trace never reads as a valid one: every record batch carries a CRC-32 of its values and every
reader verifies it, refusing a damaged batch in one line that names the file and the batch (exit 2); a trace
cut at a batch boundary (a killed run) still reads as a partial run; a trace written without checksums (an
older netsim) reads as before, with a warning; the writer compresses every batch body (zstd), and the CRC holds
over it; plain traces (written before), compressed and mixed ones read alike."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

import netsim
from netsim.api import RunResult
from netsim.cli import app
from netsim.errors import InputError
from netsim.scenario import scenario_from_dict
from netsim.trace.folder import END_FILES, SUMMARY_FILE
from netsim.trace.io import EOS, TRACE_FILE, read_trace
from tests.conftest import BASE, merge

# A small DP run (releases for `netsim privacy`) flushed every 64 events: a trace of several batches.
DP = merge(BASE, {"run": {"seed": 2, "until": 6.0, "trace_flush_every": 64},
                  "agents": {"count": 6},
                  "algorithm": {"name": "dp_dpsgd", "lr": 0.5, "batch": 16, "round_timeout": 0.2, "clip": 1.0,
                                "noise_multiplier": 4.0},
                  "privacy": {"delta": 1.0e-5}})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return netsim.run(scenario_from_dict(DP), out=tmp_path_factory.mktemp("ck") / "run").out


def batches(data: bytes) -> list[tuple[int, int]]:
    """(start, end) byte offsets of each record batch message of a trace file."""
    src = pa.BufferReader(pa.py_buffer(data))
    pa.ipc.read_message(src)  # the schema
    out = []
    while True:
        at = src.tell()
        try:
            pa.ipc.read_message(src)
        except EOFError:
            return out
        out.append((at, src.tell()))


def inverted(data: bytes, at: int, n: int = 64) -> bytes:
    b = bytearray(data)
    b[at:at + n] = bytes(255 - x for x in b[at:at + n])
    return bytes(b)


def damages(data: bytes) -> dict[str, tuple[bytes, int | None]]:
    """Trace bytes damaged in several places: (the bytes, the number of the batch damaged, None: the header)."""
    spans = batches(data)
    mid = len(spans) // 2
    header = spans[0][0]
    return {
        "header": (inverted(data, header // 2, 16), None),  # inside the scenario text
        "first batch": (inverted(data, (spans[0][0] + spans[0][1]) // 2), 1),
        "middle batch": (inverted(data, (spans[mid][0] + spans[mid][1]) // 2), mid + 1),  # the 64 bytes
        "a batch's message header": (inverted(data, spans[mid][0], 12), mid + 1),  # its length and flatbuffer
        "end": (inverted(data, len(data) - len(EOS) - 64), len(spans)),  # the last batch, its end marker kept
    }


READERS = {  # every command that reads a trace; {out}: a path it would write
    "replay": ["replay", "{run}", "--out", "{out}", "-q"],
    "query": ["query", "{run}", "SELECT count(*) AS n, min(msg) AS lo FROM trace"],
    "privacy": ["privacy", "{run}", "--no-pld"],
    "timeline": ["timeline", "{run}", "--width", "80"],
    "explore --export": ["explore", "{run}", "--export", "{out}"],
    "compare --x bytes": ["compare", "{run}", "--x", "bytes", "--out", "{out}"],
}


@pytest.fixture(scope="module")
def damaged(run_dir, tmp_path_factory) -> dict[str, tuple[Path, int | None]]:
    root = tmp_path_factory.mktemp("damaged")
    out = {}
    for i, (name, (data, k)) in enumerate(damages((run_dir / TRACE_FILE).read_bytes()).items()):
        folder = root / f"d{i}"
        shutil.copytree(run_dir, folder)
        (folder / TRACE_FILE).write_bytes(data)
        out[name] = folder, k
    return out


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("where", ["header", "first batch", "middle batch", "a batch's message header", "end"])
def test_every_reader_refuses_a_damaged_trace_in_one_line(damaged, tmp_path, reader, where):
    folder, k = damaged[where]
    target = tmp_path / ("o.png" if reader.startswith("compare") else "o.json" if reader.startswith("explore")
                         else "o")
    args = [a.format(run=folder, out=target) for a in READERS[reader]]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, (r.exit_code, r.output)
    line = r.stderr
    assert line.count("\n") == 1 and "Traceback" not in line and line.startswith(f"error: {folder / TRACE_FILE}: ")
    if k is not None:
        assert f": batch {k} (at byte " in line and "is damaged" in line, line
    assert not target.exists()  # nothing written


@pytest.mark.parametrize("where", ["header", "first batch", "middle batch", "a batch's message header", "end"])
def test_the_python_readers_raise_on_a_damaged_trace(damaged, where):
    from netsim.explore.model import RunData
    from netsim.metrics.sql import query

    folder, k = damaged[where]
    for read in (lambda: read_trace(folder), lambda: read_trace(folder / TRACE_FILE), lambda: RunData(folder),
                 lambda: RunResult.load(folder).events, lambda: query(folder, "SELECT count(*) FROM trace")):
        with pytest.raises(InputError) as e:
            read()
        assert str(e.value).startswith(f"{folder / TRACE_FILE}: ") and "\n" not in str(e.value)
        if k is not None:
            assert f"batch {k} " in str(e.value)


def test_a_trace_cut_at_each_batch_boundary_reads_as_a_partial_run(run_dir, tmp_path):
    """What a killed run leaves: whole batches, no end marker, no summary.json nor metrics."""
    data = (run_dir / TRACE_FILE).read_bytes()
    full = read_trace(run_dir).table
    folder = tmp_path / "killed"
    shutil.copytree(run_dir, folder)
    for name in (SUMMARY_FILE, *END_FILES):
        (folder / name).unlink(missing_ok=True)
    rows = 0
    for start, end in batches(data):
        (folder / TRACE_FILE).write_bytes(data[:start])  # cut before this batch: the ones before it whole
        tr = read_trace(folder)
        assert not tr.complete and tr.table.equals(full.slice(0, rows))
        rows += full.slice(rows).num_rows if end == len(data) - len(EOS) else \
            pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(data[start:end])), full.schema).num_rows
    (folder / TRACE_FILE).write_bytes(data[:-len(EOS)])  # every batch, no end
    assert read_trace(folder).table.equals(full) and not read_trace(folder).complete
    for args in (["query", folder, "SELECT count(*) FROM trace"], ["timeline", folder, "--width", "80"],
                 ["privacy", folder, "--no-pld"], ["explore", folder, "--export", tmp_path / "x.json"]):
        r = CliRunner().invoke(app, [str(a) for a in args])
        assert r.exit_code == 0, r.output
        assert "partial run, up to t = " in r.output + r.stderr


def old_format(data: bytes) -> bytes:
    """The same trace as a netsim before checksums wrote it: no checksum key, plain batch messages."""
    from netsim.trace.io import CHECKSUM_KEY, SCHEMA

    reader = pa.ipc.open_stream(pa.py_buffer(data))
    meta = {k: v for k, v in reader.schema.metadata.items() if k.decode() != CHECKSUM_KEY}
    return (SCHEMA.with_metadata(meta).serialize().to_pybytes()
            + b"".join(b.serialize().to_pybytes() for b in reader) + EOS)


def test_a_trace_without_checksums_reads_with_a_warning(run_dir, tmp_path):
    from netsim.trace.io import unchecked_note

    old = tmp_path / "old.arrows"
    old.write_bytes(old_format((run_dir / TRACE_FILE).read_bytes()))
    tr = read_trace(old)
    assert tr.complete and not tr.checked and tr.table.equals(read_trace(run_dir).table)
    assert read_trace(run_dir).checked and unchecked_note(run_dir) == ""
    r = CliRunner().invoke(app, ["query", str(old), "SELECT count(*) AS n FROM trace"])
    assert r.exit_code == 0 and r.stderr == f"warning: {unchecked_note(old)}\n"
    assert "written without batch checksums" in r.stderr


def test_a_header_that_lost_its_checksum_key_is_refused(run_dir, tmp_path):
    """A damaged header must not turn a checked trace into an unchecked one: its batches still carry CRCs."""
    from netsim.trace.io import CHECKSUM_KEY, SCHEMA

    data = (run_dir / TRACE_FILE).read_bytes()
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    meta = {k: v for k, v in reader.schema.metadata.items() if k.decode() != CHECKSUM_KEY}
    head = len(reader.schema.serialize())
    bad = tmp_path / "bad.arrows"
    bad.write_bytes(SCHEMA.with_metadata(meta).serialize().to_pybytes() + data[head:])
    with pytest.raises(InputError, match=r"batch 1 \(at byte .*the header does not say so"):
        read_trace(bad)


def messages(data: bytes, compression=None) -> tuple[bytes, list[bytes]]:
    """A trace's schema message and its batches as IPC messages with their checksums, written by pyarrow's own
    stream writer with ``compression`` (None: bodies as netsim wrote them before it compressed its traces)."""
    from netsim.trace.io import CRC_KEY, SCHEMA, batch_crc

    reader = pa.ipc.open_stream(pa.py_buffer(data))
    out = []
    for b in reader:
        sink = pa.BufferOutputStream()
        w = pa.ipc.new_stream(sink, SCHEMA, options=pa.ipc.IpcWriteOptions(compression=compression))
        w.write_batch(b, custom_metadata={CRC_KEY: f"{batch_crc(b):08x}"})
        out.append(sink.getvalue().slice(len(SCHEMA.serialize())).to_pybytes())
    return reader.schema.serialize().to_pybytes(), out


def compressed(data: bytes) -> list[bool]:
    """For each batch of a trace, whether its body is compressed (smaller than the same batch's plain body)."""
    src, out = pa.BufferReader(pa.py_buffer(data)), []
    schema = pa.ipc.read_schema(pa.ipc.read_message(src))
    for _ in batches(data):
        msg = pa.ipc.read_message(src)
        plain = pa.ipc.read_message(pa.ipc.read_record_batch(msg, schema).serialize()).body.size
        out.append(msg.body.size < plain)
    return out


@pytest.mark.skipif(not pa.Codec.is_available("zstd"), reason="pyarrow without zstd")
def test_the_writer_compresses_every_batch_body_with_zstd(run_dir):
    """Byte for byte what pyarrow's stream writer writes with zstd at level 3 and each batch's checksum; under
    half the plain trace's size (64-row batches); the CRC, of the decoded values, verifies over the compressed
    bodies (damaged ones: the tests above, on this trace)."""
    data = (run_dir / TRACE_FILE).read_bytes()
    head, zstd = messages(data, pa.Codec("zstd", compression_level=3))
    assert data == head + b"".join(zstd) + EOS
    _, plain = messages(data)
    assert all(compressed(data)) and len(zstd) > 4 and len(data) < len(head) + sum(map(len, plain)) / 2
    tr = read_trace(run_dir)
    assert tr.complete and tr.checked


@pytest.mark.parametrize("length", [2**62, 2**40, 10**6, 0, -5])
def test_a_damaged_decompressed_length_is_refused_in_one_line(run_dir, tmp_path, length):
    """A compressed buffer starts with its decompressed length (int64): damaged (huge, short, negative), the batch
    is refused like any damaged one, not allocated."""
    import struct

    data = bytearray((run_dir / TRACE_FILE).read_bytes())
    start, end = batches(bytes(data))[1]
    body = pa.ipc.read_message(pa.py_buffer(bytes(data[start:end]))).body.size
    at = end - body  # the body's first buffer: the t column's values (a column without nulls has no bitmap)
    assert struct.unpack_from("<q", data, at)[0] == 8 * DP["run"]["trace_flush_every"]  # float64s of a whole batch
    struct.pack_into("<q", data, at, length)
    bad = tmp_path / "bad.arrows"
    bad.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"batch 2 \(at byte {start:,}\) is damaged: it does not decode"):
        read_trace(bad)


def test_the_committed_plain_traces_still_read():
    """The traces under tests/data were written before netsim compressed its traces: they read whole, as before."""
    traces = sorted((Path(__file__).parent / "data").glob(f"*/{TRACE_FILE}"))
    assert len(traces) >= 3
    for path in traces:
        data = path.read_bytes()
        tr = read_trace(path)
        assert not any(compressed(data)) and tr.complete and tr.table.num_rows > 500
        assert tr.table.equals(pa.ipc.open_stream(pa.py_buffer(data)).read_all())


@pytest.mark.skipif(not pa.Codec.is_available("zstd"), reason="pyarrow without zstd")
def test_plain_compressed_and_mixed_traces_read_alike_by_every_reader(run_dir, tmp_path):
    """A trace netsim wrote before it compressed its bodies (plain), and one whose first batches are plain and the
    rest compressed (a run started before, resumed after), read as the compressed one does: the same rows through
    every Python reader and the same output from every command; replayed, each gives the recording's own bytes
    (compressed); cut inside a batch, each reads as a partial run up to the batch before."""
    from netsim.explore.model import RunData
    from netsim.metrics.sql import query

    data = (run_dir / TRACE_FILE).read_bytes()
    head, plain = messages(data)
    half = len(plain) // 2
    _, zstd = messages(data, pa.Codec("zstd", compression_level=3))
    variants = {"plain": plain, "mixed": plain[:half] + zstd[half:]}
    assert not any(compressed(head + b"".join(plain) + EOS))
    assert compressed(head + b"".join(variants["mixed"]) + EOS) == [False] * half + [True] * (len(plain) - half)
    rows = sum(b.num_rows for b in list(pa.ipc.open_stream(pa.py_buffer(data)))[:half])  # in the first half
    full = read_trace(run_dir)
    model = RunData(run_dir)
    sql = "SELECT kind, count(*) AS n, sum(size) AS bytes, max(t) AS t FROM trace GROUP BY kind ORDER BY kind"
    commands = {"query": ["query", "{run}", sql], "privacy": ["privacy", "{run}", "--no-pld"],
                "timeline": ["timeline", "{run}", "--width", "80"], "export": ["explore", "{run}", "--export", "{out}"]}

    def outputs(folder: Path, tag: str) -> dict[str, str]:
        out = {}
        for name, args in commands.items():
            target = tmp_path / "out" / f"{tag}-{name}.json"
            r = CliRunner().invoke(app, [a.format(run=folder, out=target) for a in args])
            assert r.exit_code == 0, (name, r.output)
            text = r.stdout + (target.read_text() if target.exists() else "")
            out[name] = text.replace(str(target), "OUT").replace(str(folder), "RUN")
        return out

    (tmp_path / "out").mkdir()
    expected = outputs(run_dir, "zstd")
    for name, msgs in variants.items():
        folder = tmp_path / name
        shutil.copytree(run_dir, folder)
        (folder / TRACE_FILE).write_bytes(head + b"".join(msgs) + EOS)
        tr = read_trace(folder)
        assert tr.complete and tr.checked and tr.table.equals(full.table) and tr.metadata == full.metadata
        assert RunResult.load(folder).events.equals(full.table)
        assert query(folder, sql).equals(query(run_dir, sql))
        other = RunData(folder)
        assert all(np.array_equal(getattr(other, k), getattr(model, k)) for k in ("t", "agent", "peer", "msg", "value"))
        assert other.complete and outputs(folder, name) == expected
        r = CliRunner().invoke(app, ["replay", str(folder), "--out", str(tmp_path / f"{name}-replay"), "-q"])
        assert r.exit_code == 0, r.output
        assert (tmp_path / f"{name}-replay" / TRACE_FILE).read_bytes() == data
        for gone in (SUMMARY_FILE, *END_FILES):  # what a killed run leaves: its trace cut inside a batch
            (folder / gone).unlink(missing_ok=True)
        (folder / TRACE_FILE).write_bytes(head + b"".join(msgs[:half]) + msgs[half][:len(msgs[half]) // 2])
        part = read_trace(folder)
        assert not part.complete and part.table.equals(full.table.slice(0, rows)) and rows > 0


def test_batch_crc_is_of_the_values_not_of_their_buffers():
    """The same values in a sliced array (offset buffers not from 0) and in a fresh one have one CRC."""
    from netsim.trace.io import SCHEMA, batch_crc, record_batch

    rows = [(0.5 * i, "send" if i % 2 else "deliver", i % 3, (i + 1) % 3, i, 10 * i, 0.1, i, "x" * (i % 4))
            for i in range(40)]
    whole = record_batch(rows)
    sliced = whole.slice(7, 20)
    fresh = pa.RecordBatch.from_pylist(sliced.to_pylist(), schema=SCHEMA)
    assert sliced.column(1).offset == 7 and batch_crc(sliced) == batch_crc(fresh) != batch_crc(whole)
    changed = rows[7:27]
    changed[3] = (*changed[3][:4], changed[3][4] + 1, *changed[3][5:])  # one message id
    assert batch_crc(record_batch(changed)) != batch_crc(fresh)
