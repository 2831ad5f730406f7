"""The explorer's data: one trace as numpy columns with the indexes a viewer needs, and no UI.

A view draws only what is on screen, so everything here answers "what lies in this window of time for
these lanes" with binary searches on time-sorted columns (the trace is written in simulated-time order)
and per-agent row indexes, then bins the few rows found into cells in one vectorized pass. The raw
columns are read once through ``netsim.trace.io.read_trace`` (every batch validated); strings (kind,
tag) stay dictionary-coded, and a tag is decoded only for the event a details pane shows.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pyarrow as pa

from netsim.trace.io import read_trace
from netsim.trace.timeline import KIND_OF, glyphs

SPANS = ("compute", "offline")  # kinds drawn over [t, t + value]
RECV = ("deliver", "stale")  # rows whose agent is the receiver: src = peer


class RunData:
    """A trace ready to explore: time-sorted numpy columns, per-agent and per-message indexes."""

    def __init__(self, path: str | Path):
        tr = read_trace(path)
        self.path = str(path)
        self.complete = tr.complete
        self.partial = tr.partial_note()
        self.scenario = _scenario(tr.scenario_text)
        tab = tr.table
        self.t = _np(tab, "t", np.float64)
        self.agent = _np(tab, "agent", np.int32)
        self.peer = _np(tab, "peer", np.int32)
        self.msg = _np(tab, "msg", np.int64)
        self.size = _np(tab, "size", np.int64)
        self.value = _np(tab, "value", np.float64)
        self.round = _np(tab, "round", np.int32)
        self._tag = tab.column("tag")
        # kind codes: index into self.kind_names (glyph order first, so a lower code is more important)
        names = list(glyphs())
        seen = [KIND_OF.get(k, k) for k in _unique(tab.column("kind"))]
        self.kind_names = names + [k for k in dict.fromkeys(seen) if k not in names]
        self.code = {k: i for i, k in enumerate(self.kind_names)}
        enc = tab.column("kind").dictionary_encode().combine_chunks() if tab.num_rows else None
        if enc is not None:
            lut = np.array([self.code[KIND_OF.get(k, k)] for k in enc.dictionary.to_pylist()], dtype=np.int16)
            self.kind = lut[enc.indices.to_numpy(zero_copy_only=False)]
        else:
            self.kind = np.zeros(0, dtype=np.int16)
        if len(self.t) > 1 and not (np.diff(self.t) >= 0).all():  # written in time order; be safe anyway
            order = np.argsort(self.t, kind="stable")
            for name in ("t", "agent", "peer", "msg", "size", "value", "round", "kind"):
                setattr(self, name, getattr(self, name)[order])
            self._tag = self._tag.take(pa.array(order))
        n = int(self.scenario.get("agents", {}).get("count", 0) or 0)
        if len(self.t):
            n = max(n, int(self.agent.max()) + 1, int(self.peer.max()) + 1)
        self.n = n
        self.t_end = float(self.t[-1]) if len(self.t) else 0.0
        self.t_max = max(self.t_end, self._span_end())
        algo = self.scenario.get("algorithm", {}).get("name", "?")
        self.name = f"{self.scenario.get('name', Path(self.path).name)} · {algo}"
        self.max_span = float(self.value[np.isin(self.kind, self.codes(SPANS))].max(initial=0.0))

    # indexes, built on first use (the first screen needs neither) -------------------------------
    @functools.cached_property
    def by_agent(self) -> np.ndarray:
        """Row indexes grouped by agent, each group in time order (see ``agent_rows``)."""
        return np.argsort(self.agent, kind="stable")

    @functools.cached_property
    def starts(self) -> np.ndarray:
        return np.searchsorted(self.agent[self.by_agent], np.arange(-1, self.n + 1))

    @functools.cached_property
    def by_msg(self) -> np.ndarray:
        """Rows that carry a message id (send, deliver, drop, stale), sorted by id."""
        has = np.flatnonzero(self.msg >= 0)
        return has[np.argsort(self.msg[has], kind="stable")]

    @functools.cached_property
    def _msg_sorted(self) -> np.ndarray:
        return self.msg[self.by_msg]

    # small helpers --------------------------------------------------------------------------------
    def codes(self, kinds) -> list[int]:
        return [self.code[k] for k in kinds if k in self.code]

    def kind_of(self, row: int) -> str:
        return self.kind_names[int(self.kind[row])]

    def tag(self, row: int) -> str:
        return str(self._tag[int(row)].as_py())

    def _span_end(self) -> float:
        if not len(self.t):
            return 1.0
        span = np.isin(self.kind, self.codes(SPANS))
        return float((self.t[span] + self.value[span]).max(initial=0.0))

    def row(self, i: int) -> dict:
        """One event as a dict of its columns (kind and tag decoded)."""
        i = int(i)
        return {"row": i, "t": float(self.t[i]), "kind": self.kind_of(i), "agent": int(self.agent[i]),
                "peer": int(self.peer[i]), "msg": int(self.msg[i]), "size": int(self.size[i]),
                "value": float(self.value[i]), "round": int(self.round[i]), "tag": self.tag(i)}

    def agent_rows(self, a: int) -> np.ndarray:
        """Row indexes of agent a (-1: the run's own rows, evaluations), in time order."""
        return self.by_agent[self.starts[a + 1]:self.starts[a + 2]]

    def message(self, msg_id: int) -> list[int]:
        """The rows of one message (send, then deliver/drop/stale), in time order."""
        lo, hi = np.searchsorted(self._msg_sorted, [msg_id, msg_id + 1])
        return sorted(int(r) for r in self.by_msg[lo:hi])

    def window(self, t0: float, t1: float, spans: bool = True) -> np.ndarray:
        """Rows that show in [t0, t1]: instants inside it, and spans that overlap it."""
        lo = np.searchsorted(self.t, t0 - (self.max_span if spans else 0.0), side="left")
        hi = np.searchsorted(self.t, t1, side="right")
        rows = np.arange(lo, hi)
        if spans and lo < hi:
            inside = self.t[rows] >= t0
            sp = np.isin(self.kind[rows], self.codes(SPANS))
            keep = inside | (sp & (self.t[rows] + self.value[rows] >= t0))
            rows = rows[keep]
        return rows

    # drawing --------------------------------------------------------------------------------------
    def cells(self, lane_of: np.ndarray, n_lanes: int, t0: float, t1: float, width: int,
              mask: np.ndarray | None = None) -> np.ndarray:
        """(n_lanes, width) grid of kind codes (-1: empty): per cell the most important kind that
        happens there; spans fill the cells they cover. ``lane_of[a + 1]`` is agent a's lane (-1: not
        shown; index 0 is the run's own rows); ``mask`` (per row) hides filtered-out events."""
        big = np.int16(32767)
        grid = np.full((n_lanes, width), big, dtype=np.int16)
        rows = self.window(t0, t1)
        if mask is not None:
            rows = rows[mask[rows]]
        lane = lane_of[self.agent[rows] + 1]
        rows, lane = rows[lane >= 0], lane[lane >= 0]
        if not len(rows):
            return np.full((n_lanes, width), -1, dtype=np.int16)
        scale = width / (t1 - t0)
        k = self.kind[rows]
        col = np.clip(((self.t[rows] - t0) * scale).astype(np.int64), 0, width - 1)
        sp = np.isin(k, self.codes(SPANS))
        inst = ~sp
        np.minimum.at(grid, (lane[inst], col[inst]), k[inst])
        for name in SPANS:  # coverage by difference arrays: one pass whatever the span lengths
            if name not in self.code:
                continue
            m = k == self.code[name]
            if not m.any():
                continue
            end = self.t[rows[m]] + self.value[rows[m]]
            lo = np.clip(((np.maximum(self.t[rows[m]], t0) - t0) * scale).astype(np.int64), 0, width - 1)
            hi = np.clip(((np.minimum(end, t1) - t0) * scale).astype(np.int64), 0, width - 1)
            diff = np.zeros((n_lanes, width + 1), dtype=np.int32)
            np.add.at(diff, (lane[m], lo), 1)
            np.add.at(diff, (lane[m], hi + 1), -1)
            cover = np.cumsum(diff, axis=1)[:, :width] > 0
            grid = np.where(cover, np.minimum(grid, self.code[name]), grid)
        grid[grid == big] = -1
        return grid

    def nearest(self, agents: list[int], t: float, t_tol: float, mask: np.ndarray | None = None) -> int | None:
        """The event of these agents closest to time t within t_tol (half a cell), the most important
        kind first: what the cursor is on. Reads only the rows of that slice of time."""
        lo, hi = np.searchsorted(self.t, [t - t_tol, t + t_tol], side="left")
        rows = np.arange(lo, hi)
        if mask is not None:
            rows = rows[mask[rows]]
        ag = self.agent[rows]
        if len(agents) == 1:
            rows = rows[ag == agents[0]]
        else:
            rows = rows[(ag >= min(agents)) & (ag <= max(agents))]
            rows = rows[np.isin(self.agent[rows], agents)]
        if not len(rows):
            return None
        key = np.lexsort((np.abs(self.t[rows] - t), self.kind[rows]))
        return int(rows[key[0]])

    def agent_stats(self, a: int, t: float) -> dict:
        """What agent a did up to time t: activations, messages in/out, drops, offline time, epsilon spent
        (the last budget note, when the run traces one) and stale messages."""
        rows = self.agent_rows(a)
        rows = rows[self.t[rows] <= t]
        k = self.kind[rows]

        def count(name: str) -> int:
            return int((k == self.code[name]).sum()) if name in self.code else 0

        off = 0.0
        if "offline" in self.code:
            m = rows[k == self.code["offline"]]
            off = float(np.clip(np.minimum(self.t[m] + self.value[m], t) - self.t[m], 0, None).sum())
        drops_in = 0
        if "drop" in self.code:
            d = np.flatnonzero((self.kind == self.code["drop"]) & (self.peer == a) & (self.t <= t))
            drops_in = len(d)
        return {"agent": a, "activations": count("activate"), "sent": count("send"), "received": count("deliver"),
                "dropped_out": count("drop"), "dropped_in": drops_in, "timeouts": count("timeout"),
                "stale": count("stale"), "releases": count("release"), "offline_s": off}

    def evals(self) -> tuple[np.ndarray, np.ndarray]:
        """(times, accuracy of the average model) of the run's evaluation rows."""
        if "eval" not in self.code:
            return np.zeros(0), np.zeros(0)
        m = self.kind == self.code["eval"]
        return self.t[m], self.value[m]


def _np(tab: pa.Table, name: str, dtype) -> np.ndarray:
    col = tab.column(name)
    if not tab.num_rows:
        return np.zeros(0, dtype=dtype)
    return col.combine_chunks().to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _unique(col: pa.ChunkedArray) -> list[str]:
    import pyarrow.compute as pc

    return [str(x) for x in pc.unique(col).to_pylist()] if len(col) else []


def _scenario(text: str) -> dict:
    import tomllib

    if not text:
        return {}
    try:
        sc = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError):
        return {}
    return sc if isinstance(sc, dict) else {}


def fmt_t(t: float) -> str:
    """Seconds with enough digits to tell neighbouring events apart."""
    if t == 0 or not math.isfinite(t):
        return f"{t:g}"
    return f"{t:.6g}"
