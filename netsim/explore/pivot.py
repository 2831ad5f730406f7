"""The summary of an area of the lanes (a time range x a set of agents), as Perfetto summarises an area
selection: events by kind, bytes sent, drops, mean delivery latency, DP releases. An event belongs to the
area when its agent is one of the area's and its time (a span's start) lies in [t0, t1]."""

from __future__ import annotations

import math

import numpy as np

from netsim.explore.model import RunData, fmt_t
from netsim.trace.timeline import KIND_OF

TRACE_KIND = {lane: trace for trace, lane in KIND_OF.items()}  # the lanes' "compute" is the trace's compute_start


def pivot(run: RunData, t0: float, t1: float, agents) -> dict:
    """{events, by_kind {kind: count, by the trace's kind names, as SQL gives them}, bytes (sizes of the
    sends), drops, mean_latency_s (of the deliveries, NaN without any), releases, agents, t0, t1} of the
    area."""
    agents = np.asarray(sorted({int(a) for a in agents}), dtype=np.int64)
    rows = run.window(t0, t1, spans=False, agents=agents) if len(agents) else np.zeros(0, np.int64)
    k = run.kind[rows]
    counts = np.bincount(k, minlength=len(run.kind_names)) if len(k) else np.zeros(len(run.kind_names), int)
    by_kind = {TRACE_KIND.get(run.kind_names[c], run.kind_names[c]): int(n) for c, n in enumerate(counts) if n}

    def of(kind: str) -> np.ndarray:
        return rows[k == run.code[kind]] if kind in run.code else rows[:0]

    deliver = of("deliver")
    return {"t0": t0, "t1": t1, "agents": agents.tolist(), "events": int(len(rows)), "by_kind": by_kind,
            "bytes": int(run.size[of("send")].sum()), "drops": int(len(of("drop"))),
            "mean_latency_s": float(run.value[deliver].mean()) if len(deliver) else math.nan,
            "releases": int(len(of("release")))}


def pivot_lines(p: dict) -> list[str]:
    """The pivot panel's text."""
    a = p["agents"]
    who = f"agent {a[0]}" if len(a) == 1 else f"agents {a[0]}-{a[-1]} ({len(a)})" if a else "no agents"
    lat = "-" if math.isnan(p["mean_latency_s"]) else f"{p['mean_latency_s']:.4g} s"
    out = [f"area: {who}, t in [{fmt_t(p['t0'])}, {fmt_t(p['t1'])}]", f"events {p['events']:,}"]
    out += [f"  {kind:<10} {n:>8,}" for kind, n in sorted(p["by_kind"].items(), key=lambda x: -x[1])]
    out += [f"bytes sent {p['bytes']:,}", f"drops {p['drops']:,}", f"mean latency {lat}",
            f"DP releases {p['releases']:,}"]
    return out
