"""Chrome/Perfetto trace-event JSON of what the explorer shows: a time window, the shown agents and
the active filter. Compute and offline are complete ('X') slices, other events instants ('i'), and a
delivered message is a flow arrow from its send to its delivery; an arrow is written only when both ends
are in the selection, so every flow start has its finish. Timestamps are microseconds of simulated
time, written in time order (so monotone on every lane)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from netsim.errors import InputError
from netsim.explore.model import SPANS, RunData


def trace_events(run: RunData, t0: float, t1: float, agents: np.ndarray | None = None,
                 mask: np.ndarray | None = None) -> dict:
    rows = run.window(t0, t1)
    if mask is not None:
        rows = rows[mask[rows]]
    if agents is not None:
        shown = np.zeros(run.n + 1, dtype=bool)
        shown[np.asarray(agents, dtype=np.int64) + 1] = True
        shown[0] = True  # the run's own rows (evaluations)
        rows = rows[shown[run.agent[rows] + 1]]
    ids = sorted({int(a) for a in run.agent[rows]})
    ev: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": run.name}}]
    for a in ids:
        ev.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": a,
                   "args": {"name": "run" if a < 0 else f"agent {a}"}})
    code = run.code
    send, deliver = code.get("send", -1), code.get("deliver", -1)
    # flows: messages whose send and delivery are both selected
    sel_send = {int(run.msg[r]) for r in rows if run.kind[r] == send}
    sel_deliver = {int(run.msg[r]) for r in rows if run.kind[r] == deliver}
    paired = sel_send & sel_deliver
    spans = set(run.codes(SPANS))
    body = []
    for r in rows:
        r = int(r)
        k = int(run.kind[r])
        name = run.kind_names[k]
        ts = float(run.t[r]) * 1e6
        tid = int(run.agent[r])
        args = {"peer": int(run.peer[r]), "msg": int(run.msg[r]), "size": int(run.size[r]),
                "value": float(run.value[r]), "round": int(run.round[r]), "tag": run.tag(r)}
        if k in spans:
            body.append({"ph": "X", "name": name, "cat": name, "ts": ts, "dur": float(run.value[r]) * 1e6,
                         "pid": 0, "tid": tid, "args": args})
            continue
        body.append({"ph": "i", "s": "t", "name": name, "cat": name, "ts": ts, "pid": 0, "tid": tid,
                     "args": args})
        m = int(run.msg[r])
        if k == send and m in paired:
            body.append({"ph": "s", "name": "message", "cat": "message", "id": m, "ts": ts, "pid": 0,
                         "tid": tid})
        elif k == deliver and m in paired:
            body.append({"ph": "f", "bp": "e", "name": "message", "cat": "message", "id": m, "ts": ts,
                         "pid": 0, "tid": tid})
    body.sort(key=lambda e: e["ts"])  # stable: rows are already in time order
    return {"traceEvents": ev + body, "displayTimeUnit": "ms",
            "otherData": {"source": run.path, "window_s": [t0, t1], "time_unit": "simulated seconds x 1e6"}}


def export_view(run: RunData, out: str | Path, t0: float, t1: float, agents: np.ndarray | None = None,
                mask: np.ndarray | None = None) -> int:
    """Write the selection as Chrome/Perfetto JSON; returns the number of trace events."""
    data = trace_events(run, t0, t1, agents, mask)
    try:
        Path(out).write_text(json.dumps(data))
    except OSError as e:
        raise InputError("--export", f"cannot write {out}: {e.strerror or e}") from None
    return len(data["traceEvents"])


def check_trace_events(data: dict) -> list[str]:
    """Problems with a trace-event document (empty when it is valid): phases, required fields, flow
    starts and finishes paired by id with the finish not before the start, timestamps monotone per
    (pid, tid)."""
    problems = []
    starts: dict[int, float] = {}
    finishes: dict[int, float] = {}
    last: dict[tuple, float] = {}
    for i, e in enumerate(data.get("traceEvents", [])):
        ph = e.get("ph")
        if ph not in ("M", "X", "i", "s", "f"):
            problems.append(f"event {i}: unknown phase {ph!r}")
            continue
        if ph == "M":
            continue
        for key in ("name", "ts", "pid", "tid"):
            if key not in e:
                problems.append(f"event {i}: no {key}")
        ts = float(e.get("ts", 0))
        lane = (e.get("pid"), e.get("tid"))
        if ts < last.get(lane, -np.inf):
            problems.append(f"event {i}: ts {ts} before {last[lane]} on lane {lane}")
        last[lane] = ts
        if ph == "X" and not e.get("dur", -1) >= 0:
            problems.append(f"event {i}: a complete event needs dur >= 0")
        if ph in ("s", "f"):
            book = starts if ph == "s" else finishes
            if e.get("id") in book:
                problems.append(f"event {i}: flow id {e.get('id')} has two {ph!r} events")
            book[e.get("id")] = ts
    for fid in starts.keys() ^ finishes.keys():
        problems.append(f"flow {fid}: start without finish or finish without start")
    for fid in starts.keys() & finishes.keys():
        if finishes[fid] < starts[fid]:
            problems.append(f"flow {fid}: finishes before it starts")
    return problems
