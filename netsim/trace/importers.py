"""Converters from published measurement formats to netsim's trace inputs (docs/traces.md).

    python -m netsim.trace.importers stunner IN.csv.gz OUT.json --agents 16 [--skip 0] [--scale 1.0]
    python -m netsim.trace.importers aws-ping IN.csv.gz OUT.csv --agents 16 [--interval 1.0] [--edges E.txt]

``stunner``: the smartphone availability intervals (Berta et al., P2P 2014, as converted in
$NETSIM_DATA/network/stunner_smartphone_availability/: ``segment,user,segment_start_epoch_ms,tz_offset_h,
online,start_offset_ms,end_offset_ms``) -> FedScale-style availability JSON. Client k is segment
``skip + k``; times are seconds from the segment start times ``scale`` (e.g. 1/60 to play a minute of
phone time per simulated second); the pattern repeats every segment length (``finish_time``).

``aws-ping``: the AWS 52-node cluster ping log (``source,dest,size,time,...``, RTT in ms) ->
link-measurement CSV: node-k is agent k (k < agents); the m-th 64-byte ping of a directed edge becomes
the row at time m * interval with one-way latency RTT / 2. ``--edges`` also writes the measured edges
among those agents as a topology edges file (``topology.kind = "edges_file"``).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import sys
import zlib
from pathlib import Path

from netsim.errors import InputError


def _open(path: Path):
    try:
        f = gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="")
        f.readable()
        return f
    except OSError as e:
        raise InputError("", f"cannot read: {e.strerror or e}", str(path)) from None


def _rows(path: Path, header: tuple[str, ...]):
    """(line number, dict row) over a CSV whose header must start with ``header``."""
    with _open(path) as f:
        r = csv.reader(f)
        try:
            head = next(r, None)
            if head is None:
                raise InputError("", f"empty file (expected a header starting with {','.join(header)})", str(path))
            if tuple(head[: len(header)]) != header:
                want, got = ",".join(header), ",".join(head)[:80]
                raise InputError("", f"line 1: header must start with {want}, got {got!r}", str(path))
            for line, rec in enumerate(r, start=2):
                if len(rec) != len(head):
                    msg = f"line {line}: expected {len(head)} fields, got {len(rec)}"
                    raise InputError("", msg, str(path))
                yield line, dict(zip(head, rec, strict=True))
        except (csv.Error, OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
            raise InputError("", f"unreadable (truncated or not CSV): {e}", str(path)) from None


def stunner_to_availability(src: Path, out: Path, agents: int, skip: int = 0, scale: float = 1.0) -> dict:
    keep = range(skip, skip + agents)
    clients: dict[str, dict] = {}
    for line, row in _rows(src, ("segment", "user", "segment_start_epoch_ms", "tz_offset_h", "online",
                                 "start_offset_ms", "end_offset_ms")):
        try:
            seg, online = int(row["segment"]), row["online"] == "1"
            a, b = float(row["start_offset_ms"]) / 1000 * scale, float(row["end_offset_ms"]) / 1000 * scale
            if not (math.isfinite(a) and math.isfinite(b) and 0 <= a <= b):
                raise ValueError("start_offset_ms and end_offset_ms must be finite with 0 <= start <= end")
        except ValueError as e:
            raise InputError("", f"line {line}: {e}", str(src)) from None
        if seg < keep.start:
            continue
        if seg >= keep.stop:
            break
        c = clients.setdefault(str(seg - skip), {"active": [], "inactive": [], "finish_time": 0.0})
        c["finish_time"] = max(c["finish_time"], b)
        if online:
            c["active"].append(a)
            c["inactive"].append(b)
    if len(clients) < agents:
        msg = f"only {len(clients)} segments from segment {skip} on; {agents} needed"
        raise InputError("", msg, str(src))
    out.write_text(json.dumps(clients) + "\n")
    return clients


def aws_ping_to_links(src: Path, out: Path, agents: int, interval: float = 1.0,
                      edges: Path | None = None) -> int:
    pings: dict[tuple[int, int], list[float]] = {}
    for line, row in _rows(src, ("source", "dest", "size", "time")):
        try:
            i, j = int(row["source"].removeprefix("node-")), int(row["dest"].removeprefix("node-"))
            size, rtt = int(row["size"]), float(row["time"])
            if i < 0 or j < 0 or not (math.isfinite(rtt) and rtt >= 0):
                raise ValueError("node ids must be >= 0 and the RTT a finite number >= 0")
        except ValueError as e:
            raise InputError("", f"line {line}: {e}", str(src)) from None
        if size == 64 and i < agents and j < agents:
            pings.setdefault((i, j), []).append(rtt)
    if not pings:
        raise InputError("", f"no 64-byte pings between node-0 .. node-{agents - 1}", str(src))
    n = 0
    with out.open("w") as f:
        f.write("time,src,dst,latency,bandwidth,loss\n")
        for (i, j), rtts in sorted(pings.items()):
            for m, rtt in enumerate(rtts):
                f.write(f"{m * interval:g},{i},{j},{rtt / 2000:.9g},,\n")
                n += 1
    if edges is not None:
        und = sorted({(min(i, j), max(i, j)) for i, j in pings})
        edges.write_text("".join(f"{i} {j}\n" for i, j in und))
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netsim.trace.importers", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="format", required=True)
    s = sub.add_parser("stunner", help="smartphone availability intervals -> availability JSON")
    s.add_argument("src", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--agents", type=int, required=True)
    s.add_argument("--skip", type=int, default=0, help="first segment to use")
    s.add_argument("--scale", type=float, default=1.0, help="simulated seconds per measured second")
    a = sub.add_parser("aws-ping", help="AWS cluster ping log -> link-measurement CSV")
    a.add_argument("src", type=Path)
    a.add_argument("out", type=Path)
    a.add_argument("--agents", type=int, required=True)
    a.add_argument("--interval", type=float, default=1.0, help="seconds between successive pings of an edge")
    a.add_argument("--edges", type=Path, default=None, help="also write the measured edges (topology file)")
    args = p.parse_args(argv)
    try:
        if args.agents < 1:
            raise InputError("--agents", "must be >= 1")
        if args.format == "stunner":
            c = stunner_to_availability(args.src, args.out, args.agents, args.skip, args.scale)
            print(f"wrote {args.out}: {len(c)} clients")
        else:
            n = aws_ping_to_links(args.src, args.out, args.agents, args.interval, args.edges)
            print(f"wrote {args.out}: {n} rows")
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
