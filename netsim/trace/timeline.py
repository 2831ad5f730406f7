"""``netsim timeline``: a trace as one terminal lane per agent, plus a per-agent summary and a
Chrome/Perfetto export.

Each lane is the time window cut into one cell per column; a cell shows the most important thing
that happened to that agent in it (``GLYPHS``, most important first), compute and offline spans
fill the cells they cover. More agents than ``max_lanes`` are aggregated (``group`` agents per lane);
long runs are zoomed with ``--from/--to``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from netsim.errors import InputError
from netsim.trace.io import read_trace

# kind -> (glyph, style, legend), most important first (a cell shows the first that occurs)
GLYPHS = {
    "drop": ("x", "bold red", "drop"),
    "release": ("R", "bold magenta", "DP release"),
    "send": (">", "cyan", "send"),
    "deliver": ("<", "blue", "delivery"),
    "activate": ("^", "bold green", "activation"),
    "timeout": ("t", "yellow", "round timeout"),
    "stale": ("s", "yellow", "stale message"),
    "eval": ("*", "bold white", "evaluation"),
    "compute": ("=", "green", "compute"),
    "offline": ("~", "dim red", "offline"),
}
ORDER = list(GLYPHS)


def glyphs() -> dict[str, tuple[str, str, str]]:
    """GLYPHS, then the registered event kinds that give a ``glyph = (char, style, legend)`` class attribute
    (a plugin's kind: load it with ``netsim timeline --plugin``), least important."""
    from netsim.trace.events import event_kinds

    extra = {k: c.glyph for k, c in event_kinds().items() if k not in GLYPHS and getattr(c, "glyph", None)}
    return {**GLYPHS, **extra}
KIND_OF = {"compute_start": "compute"}  # trace kind -> timeline kind
MESSAGE_KINDS = {"send", "deliver", "drop", "stale"}
SPAN_KINDS = {"compute", "offline"}


def parse_agents(spec: str | None, n: int) -> list[int]:
    """'0-3,7' -> [0, 1, 2, 3, 7] (ids must exist)."""
    if not spec:
        return list(range(n))
    out: list[int] = []
    try:
        for part in spec.split(","):
            a, _, b = part.strip().partition("-")
            lo, hi = int(a), int(b) if b else int(a)
            out.extend(range(lo, hi + 1))
    except ValueError:
        raise InputError("--agents", f"expected ids and ranges like '0-3,7', got {spec!r}") from None
    bad = [i for i in out if not 0 <= i < n]
    if bad:
        raise InputError("--agents", f"agent ids must be in [0, {n - 1}], got {bad[:5]}")
    return sorted(set(out))


def parse_links(spec: str | None) -> set[tuple[int, int]] | None:
    """'0>1,2>3' (directed) or '0-1' (both directions) -> set of (src, dst)."""
    if not spec:
        return None
    out = set()
    for part in spec.split(","):
        part = part.strip()
        sep = ">" if ">" in part else "-"
        a, _, b = part.partition(sep)
        try:
            i, j = int(a), int(b)
        except ValueError:
            raise InputError("--links", f"expected links like '0>1,2-3', got {part!r}") from None
        out.add((i, j))
        if sep == "-":
            out.add((j, i))
    return out


def parse_kinds(spec: str | None) -> set[str]:
    known = glyphs()
    if not spec:
        return set(known)
    kinds = {k.strip() for k in spec.split(",") if k.strip()}
    bad = kinds - set(known)
    if bad:
        raise InputError("--kinds", f"unknown kind(s) {', '.join(sorted(bad))}; allowed: {', '.join(known)}")
    return kinds


class Timeline:
    """The filtered events of one trace, ready to draw, summarize or export."""

    def __init__(self, path: str | Path, agents: str | None = None, links: str | None = None,
                 kinds: str | None = None, t_from: float | None = None, t_to: float | None = None):
        tr = read_trace(path)
        self.path = str(path)
        self.complete = tr.complete
        self.partial = tr.partial_note()  # "" for a trace that records its run's end
        c = {k: np.asarray(v) for k, v in tr.table.to_pydict().items()}
        self.name = "trace"
        text = tr.scenario_text
        n = 0
        if text:
            import tomllib

            try:
                sc = tomllib.loads(text)
                n = int(sc.get("agents", {}).get("count", 0))
                self.name = f"{sc.get('name', 'trace')} · {sc.get('algorithm', {}).get('name', '?')}"
            except (tomllib.TOMLDecodeError, ValueError, TypeError):
                n = 0
        if len(c["agent"]):
            n = max(n, int(c["agent"].max()) + 1, int(c["peer"].max()) + 1)
        self.n = n
        kind = np.array([KIND_OF.get(k, k) for k in c["kind"]], dtype=object)
        c["kind"] = kind
        self.all = c
        self.t_min = 0.0
        self.t_max = float(c["t"].max()) if len(c["t"]) else 1.0
        self.t0 = self.t_min if t_from is None else float(t_from)
        self.t1 = self.t_max if t_to is None else float(t_to)
        if not self.t1 > self.t0:
            raise InputError("--to", f"the window must be non-empty: --from {self.t0:g} --to {self.t1:g}")
        self.agents = parse_agents(agents, n)
        self.kinds = parse_kinds(kinds)
        self.links = parse_links(links)
        # message direction: (src, dst) of each row (deliver/stale rows are the receiver's)
        recv = np.isin(kind, ["deliver", "stale"])
        src = np.where(recv, c["peer"], c["agent"])
        dst = np.where(recv, c["agent"], c["peer"])
        keep = np.isin(kind, list(self.kinds))
        if self.links is not None:
            on = np.array([(int(a), int(b)) in self.links for a, b in zip(src, dst, strict=True)], dtype=bool)
            keep &= ~np.isin(kind, list(MESSAGE_KINDS)) | on
        end = np.where(np.isin(kind, list(SPAN_KINDS)), c["t"] + c["value"], c["t"])
        keep &= (end >= self.t0) & (c["t"] <= self.t1)
        keep &= np.isin(c["agent"], self.agents) | (kind == "eval")
        self.rows = {k: v[keep] for k, v in c.items()}
        self.rows["end"] = end[keep]

    # lanes --------------------------------------------------------------------------------------
    def lanes(self, width: int, max_lanes: int = 40, group: int | None = None):
        """[(label, [kind or None per cell])]: a 'run' lane (evaluations), then one per agent or group."""
        g = group or max(1, math.ceil(len(self.agents) / max_lanes))
        groups = [self.agents[k:k + g] for k in range(0, len(self.agents), g)]
        scale = width / (self.t1 - self.t0)
        rank = {k: r for r, k in enumerate(glyphs())}
        r = self.rows
        cells: dict[int, list] = {}
        lane_of = {a: li for li, grp in enumerate(groups) for a in grp}
        run_lane: list = [None] * width

        def put(lane: list, col: int, k: str) -> None:
            if 0 <= col < width and (lane[col] is None or rank[k] < rank[lane[col]]):
                lane[col] = k

        for li in range(len(groups)):
            cells[li] = [None] * width
        for t, e, k, a in zip(r["t"], r["end"], r["kind"], r["agent"], strict=True):
            if k == "eval":
                put(run_lane, int((t - self.t0) * scale), k)
                continue
            lane = cells[lane_of[int(a)]]
            if k in SPAN_KINDS:
                lo = max(0, int((max(t, self.t0) - self.t0) * scale))
                hi = min(width - 1, int((min(e, self.t1) - self.t0) * scale))
                for col in range(lo, hi + 1):
                    put(lane, col, k)
            else:
                put(lane, int((t - self.t0) * scale), k)
        out = [("run", run_lane)] if "eval" in self.kinds else []
        for li, grp in enumerate(groups):
            label = f"{grp[0]}" if len(grp) == 1 else f"{grp[0]}-{grp[-1]}"
            out.append((label, cells[li]))
        return out, g

    # summary ------------------------------------------------------------------------------------
    def summary(self) -> list[dict]:
        """Per agent, within the window (all kinds, the link filter applied): messages, drops, bytes,
        idle fraction (time not computing and not offline), mean delay and staleness of receptions."""
        c = self.all
        t, k, a, p, v = c["t"], c["kind"], c["agent"], c["peer"], c["value"]
        win = (t >= self.t0) & (t <= self.t1)
        span = self.t1 - self.t0
        rows = []
        for i in self.agents:
            mine = win & (a == i)
            if self.links is not None:
                link_ok_out = np.array([(i, int(j)) in self.links for j in p], dtype=bool)
                link_ok_in = np.array([(int(j), i) in self.links for j in p], dtype=bool)
            else:
                link_ok_out = link_ok_in = np.ones(len(t), dtype=bool)
            sent = mine & (k == "send") & link_ok_out
            dele = mine & (k == "deliver") & link_ok_in
            busy = 0.0
            for kk in ("compute", "offline"):
                m = (a == i) & (k == kk)
                s, e = t[m], t[m] + v[m]
                busy += float(np.clip(np.minimum(e, self.t1) - np.maximum(s, self.t0), 0, None).sum())
            rows.append({
                "agent": i, "sent": int(sent.sum()), "delivered": int(dele.sum()),
                "dropped": int((mine & (k == "drop") & link_ok_out).sum()),
                "bytes": int(c["size"][sent].sum()),
                "idle": max(0.0, 1.0 - busy / span),
                "delay": float(v[dele].mean()) if dele.any() else float("nan"),
                "stale": int((mine & (k == "stale") & link_ok_in).sum()),
                "activations": int((mine & (k == "activate")).sum()),
            })
        return rows


def render(tl: Timeline, console, max_lanes: int = 40, group: int | None = None,
           summary: bool = True) -> None:
    from rich.table import Table
    from rich.text import Text

    known = glyphs()
    label_w = max(5, len(str(tl.n - 1)) * 2 + 2)
    width = max(10, console.width - label_w - 3)
    lanes, g = tl.lanes(width, max_lanes, group)
    per = f"{g} agents per lane, " if g > 1 else ""
    console.print(Text(f"{tl.name} · {len(tl.agents)} agents ({per}window {tl.t0:g}-{tl.t1:g} s)", style="bold"))
    if tl.partial:
        console.print(Text(tl.partial, style="bold yellow"))
    axis = [" "] * width
    for q in range(5):
        col = min(width - 1, round(q * (width - 1) / 4))
        lab = f"{tl.t0 + q * (tl.t1 - tl.t0) / 4:.4g}"
        start = max(0, min(width - len(lab), col - (len(lab) if q == 4 else 0)))
        axis[start:start + len(lab)] = list(lab)
    head = f"{'t (s)':>{label_w}}  " + "".join(axis)
    console.print(Text(head), soft_wrap=True, no_wrap=True, overflow="crop")
    for label, cells in lanes:
        line = Text(f"{label:>{label_w}} |", style="bold")
        for k in cells:
            if k is None:
                line.append(" ")
            else:
                glyph, style, _ = known[k]
                line.append(glyph, style=style)
        line.append("|")
        console.print(line, soft_wrap=True, no_wrap=True, overflow="crop")
    legend = Text("legend: ")
    for k in known:
        if k in tl.kinds:
            glyph, style, name = known[k]
            legend.append(glyph, style=style)
            legend.append(f" {name}  ")
    console.print(legend)
    if not summary:
        return
    t = Table(title="per agent (window)", show_lines=False)
    for col in ("agent", "sent", "delivered", "dropped", "bytes", "idle", "mean delay (s)", "stale",
                "activations"):
        t.add_column(col, justify="right")
    rows = tl.summary()
    if g > 1:  # aggregate like the lanes
        merged = []
        for k in range(0, len(rows), g):
            grp = rows[k:k + g]
            delays = [r["delay"] for r in grp if not math.isnan(r["delay"])]
            merged.append({"agent": f"{grp[0]['agent']}-{grp[-1]['agent']}",
                           **{f: sum(r[f] for r in grp) for f in ("sent", "delivered", "dropped", "bytes",
                                                                  "stale", "activations")},
                           "idle": sum(r["idle"] for r in grp) / len(grp),
                           "delay": sum(delays) / len(delays) if delays else float("nan")})
        rows = merged
    for r in rows:
        t.add_row(str(r["agent"]), str(r["sent"]), str(r["delivered"]), str(r["dropped"]), f"{r['bytes']:,}",
                  f"{r['idle']:.0%}", "-" if math.isnan(r["delay"]) else f"{r['delay']:.4g}", str(r["stale"]),
                  str(r["activations"]))
    console.print(t)


def chrome_trace(tl: Timeline) -> dict:
    """Chrome/Perfetto trace-event JSON (timestamps in microseconds of simulated time): compute and
    offline as complete ('X') slices, everything else as instants ('i'), messages as flow arrows."""
    r = tl.rows
    ev: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": tl.name}}]
    for i in tl.agents:
        ev.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": i, "args": {"name": f"agent {i}"}})
    for t, k, a, p, m, s, v, rnd, tag in zip(r["t"], r["kind"], r["agent"], r["peer"], r["msg"], r["size"],
                                             r["value"], r["round"], r["tag"], strict=True):
        ts = float(t) * 1e6
        tid = int(a) if a >= 0 else -1
        args = {"peer": int(p), "msg": int(m), "size": int(s), "value": float(v), "round": int(rnd),
                "tag": str(tag)}
        if k in SPAN_KINDS:
            ev.append({"ph": "X", "name": k, "cat": k, "ts": ts, "dur": float(v) * 1e6, "pid": 0, "tid": tid,
                       "args": args})
            continue
        ev.append({"ph": "i", "s": "t" if tid >= 0 else "g", "name": k, "cat": k, "ts": ts, "pid": 0,
                   "tid": tid, "args": args})
        if k == "send":
            ev.append({"ph": "s", "name": "message", "cat": "message", "id": int(m), "ts": ts, "pid": 0,
                       "tid": tid})
        elif k == "deliver":
            ev.append({"ph": "f", "bp": "e", "name": "message", "cat": "message", "id": int(m), "ts": ts,
                       "pid": 0, "tid": tid})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"source": tl.path, "time_unit": "simulated seconds x 1e6"}}


def write_chrome(tl: Timeline, out: str | Path) -> int:
    data = chrome_trace(tl)
    try:
        Path(out).write_text(json.dumps(data))
    except OSError as e:
        raise InputError("--chrome", f"cannot write {out}: {e.strerror or e}") from None
    return len(data["traceEvents"])
