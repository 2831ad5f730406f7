"""The explorer's data: one trace as numpy columns with the indexes a viewer needs, and no UI.

A view draws only what is on screen, so everything here answers "what lies in this window of time for
these lanes" with binary searches on time-sorted columns (the trace is written in simulated-time order)
and per-agent row indexes, then bins the few rows found into cells in one vectorized pass. The raw
columns are read through ``netsim.trace.io.TraceTail`` (every batch checked as ``read_trace`` checks
it); kinds become small integer codes, and a tag is decoded only for the event a details pane shows.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pyarrow as pa

from netsim.explore.binning import Binner
from netsim.trace.io import TraceTail, concat_numbers, has_end_marker, partial_note
from netsim.trace.timeline import KIND_OF, glyphs

SPANS = ("compute", "offline")  # kinds drawn over [t, t + value]
RECV = ("deliver", "stale")  # rows whose agent is the receiver: src = peer


class RunData:
    """A trace ready to explore: time-sorted numpy columns, per-agent and per-message indexes.

    Read through ``netsim.trace.io.TraceTail``: memory-mapped when the trace is complete (nothing
    truncates a finished run's trace; a partial one may be cut by a resume), and ``refresh`` appends the
    batches a running simulation wrote since, reading only the new bytes."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._reader = TraceTail(path, memory_map=has_end_marker(path))
        batches = self._reader.read()
        cols = self._reader.columns
        self.scenario = _scenario(self._reader.metadata.get("netsim.scenario", ""))
        tab = pa.Table.from_batches(batches, schema=self._reader.schema)
        t = cols["t"]
        if len(t) > 1 and not (t[1:] >= t[:-1]).all():  # written in time order; be safe anyway
            order = np.argsort(t, kind="stable")
            tab = tab.take(pa.array(order))
            cols = {name: c[order] for name, c in cols.items()}
        self._tab: pa.Table | None = tab
        self.t = cols["t"]
        self.agent = cols["agent"]
        self.__dict__["peer"] = cols["peer"]  # read to check the batches: no need to read it again
        self.value = _np(tab, "value", np.float64)
        self._tag = tab.column("tag")
        # kind codes: index into self.kind_names (glyph order first, so a lower code is more important)
        self.kind_names = list(glyphs())
        self.code = {k: i for i, k in enumerate(self.kind_names)}
        self.kind = self._codes(tab.column("kind"))
        self._settle()
        algo = self.scenario.get("algorithm", {}).get("name", "?")
        self.name = f"{self.scenario.get('name', Path(self.path).name)} · {algo}"
        self._eps: dict[tuple[int, int], float | None] = {}

    def _codes(self, col: pa.ChunkedArray) -> np.ndarray:
        """Kind codes of a kind column: its few distinct strings looked up once (a hash per row through
        ``index_in`` costs a quarter of ``dictionary_encode``'s), new kinds appended to ``kind_names``."""
        import pyarrow.compute as pc

        if not len(col):
            return np.zeros(0, dtype=np.int16)
        uniq = pc.unique(col)
        for k in uniq.to_pylist():
            k = KIND_OF.get(k, k)
            if k not in self.code:
                self.code[k] = len(self.kind_names)
                self.kind_names.append(k)
        lut = np.array([self.code[KIND_OF.get(k, k)] for k in uniq.to_pylist()], dtype=np.int16)
        return lut[_np_chunked(pc.index_in(col, value_set=uniq), np.int32)]

    def _settle(self) -> None:
        """What follows from the rows: agent count, end times, the longest span."""
        self.complete = self._reader.complete
        self.partial = "" if self.complete else partial_note(float(self.t[-1]) if len(self.t) else 0.0)
        n = int(self.scenario.get("agents", {}).get("count", 0) or 0)
        if len(self.t):
            n = max(n, int(self.agent.max()) + 1)
            if not n:  # no agent count in the trace's scenario: the ids seen
                n = int(self.peer.max()) + 1
        self.n = n
        self.t_end = float(self.t[-1]) if len(self.t) else 0.0
        is_span = np.zeros(len(self.kind_names), dtype=bool)
        is_span[self.codes(SPANS)] = True
        span = np.flatnonzero(is_span[self.kind])
        self.max_span = float(self.value[span].max(initial=0.0))
        end = float((self.t[span] + self.value[span]).max(initial=0.0)) if len(self.t) else 1.0
        self.t_max = max(self.t_end, end)

    def refresh(self) -> int:
        """Append the whole batches written since the last read (live mode); the number of new rows.
        Rows only append in time order, so row numbers stay; the indexes are rebuilt on next use."""
        return self.append(*self.read_new())

    def read_new(self) -> tuple[list, dict]:
        """The whole batches written since the last read and their checked numeric columns: the file's
        part of ``refresh``, which a live view runs in a thread (it touches the reader only)."""
        batches = self._reader.read()
        return batches, self._reader.columns

    def append(self, batches: list, cols: dict) -> int:
        """Append batches from ``read_new`` (on the thread that draws: it replaces the arrays); the new rows' count."""
        new = sum(b.num_rows for b in batches)
        if not new:
            self._settle()  # the end marker may have arrived alone
            return 0
        t = np.concatenate([self.t[-1:], cols["t"]])
        if not (t[1:] >= t[:-1]).all():  # out of time order (never written so): read afresh, sorted
            self.__init__(self.path)
            return new
        tab = pa.Table.from_batches(batches, schema=self._reader.schema)
        self.t = np.concatenate([self.t, cols["t"]])
        self.agent = np.concatenate([self.agent, cols["agent"]])
        self.value = np.concatenate([self.value, _np(tab, "value", np.float64)])
        self.kind = np.concatenate([self.kind, self._codes(tab.column("kind"))])
        self._tag = pa.chunked_array(self._tag.chunks + tab.column("tag").chunks, type=self._tag.type)
        lazy = {"peer": cols["peer"]} | {name: tab.column(name) for name in ("msg", "size", "round")}
        for name, col in lazy.items():
            if name in self.__dict__:
                arr = col if isinstance(col, np.ndarray) else _np(tab, name, self.__dict__[name].dtype)
                self.__dict__[name] = np.concatenate([self.__dict__[name], arr])
        self._tab = pa.concat_tables([self._tab, tab]) if self._tab is not None else None
        for name in ("drops_by_peer", "by_agent", "starts", "by_msg", "_msg_sorted"):
            self.__dict__.pop(name, None)
        self._eps.clear()
        self._settle()
        return new

    # columns and indexes that drawing does not need, read on first use --------------------------
    @functools.cached_property
    def peer(self) -> np.ndarray:
        return _np(self._tab, "peer", np.int32)

    @functools.cached_property
    def msg(self) -> np.ndarray:
        return _np(self._tab, "msg", np.int64)

    @functools.cached_property
    def size(self) -> np.ndarray:
        return _np(self._tab, "size", np.int64)

    @functools.cached_property
    def round(self) -> np.ndarray:
        return _np(self._tab, "round", np.int32)

    @property
    def arrow_table(self) -> pa.Table | None:
        """The rows read as an Arrow table, while it is held (a complete trace lets it go once warm)."""
        return self._tab

    def has(self, kind: str) -> bool:
        """Whether an event of this kind occurs: one scan of the codes per kind and read (no sort)."""
        got = self.__dict__.get("_has")
        if got is None or got[0] != len(self.t):
            got = self.__dict__["_has"] = (len(self.t), {})
        if kind not in got[1]:
            got[1][kind] = kind in self.code and bool((self.kind == self.code[kind]).any())
        return got[1][kind]

    @functools.cached_property
    def drops_by_peer(self) -> tuple[np.ndarray, np.ndarray]:
        """(drop rows sorted by receiver, their receivers): drops of messages to an agent."""
        rows = np.flatnonzero(self.kind == self.code["drop"]) if "drop" in self.code else np.zeros(0, np.int64)
        rows = rows[np.argsort(self.peer[rows], kind="stable")]
        return rows, self.peer[rows]

    @functools.cached_property
    def by_agent(self) -> np.ndarray:
        """Row indexes grouped by agent, each group in time order (see ``agent_rows``): a stable sort,
        on 16-bit keys when the ids fit (numpy radix-sorts those, several times faster)."""
        key = self.agent.astype(np.int16) if self.n < 2**15 - 1 else self.agent
        return np.argsort(key, kind="stable")

    @functools.cached_property
    def starts(self) -> np.ndarray:
        """Where each agent's rows (-1 first) start in ``by_agent``: counts, summed."""
        counts = np.bincount(self.agent + 1, minlength=self.n + 1)
        return np.concatenate([[0], np.cumsum(counts)])

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

    def row(self, i: int) -> dict:
        """One event as a dict of its columns (kind and tag decoded)."""
        i = int(i)
        return {"row": i, "t": float(self.t[i]), "kind": self.kind_of(i), "agent": int(self.agent[i]),
                "peer": self._at("peer", i), "msg": self._at("msg", i), "size": self._at("size", i),
                "value": float(self.value[i]), "round": self._at("round", i), "tag": self.tag(i)}

    def _at(self, name: str, i: int) -> int:
        """One cell of a lazily read column, without reading the column when it is not read yet."""
        col, tab = self.__dict__.get(name), self._tab
        return int(col[i]) if col is not None or tab is None else int(tab.column(name)[i].as_py())

    def warm(self) -> None:
        """Read the lazy columns and build the indexes (run in a thread after the first screen); then let
        go of the file: the tags are copied out of a memory-mapped trace, the Arrow table dropped."""
        for name in ("peer", "msg", "round", "size", "by_agent", "starts", "by_msg", "_msg_sorted",
                     "drops_by_peer"):
            getattr(self, name)
        if self._reader.memory_map:
            self._tag = pa.chunked_array([self._tag.combine_chunks()], type=self._tag.type)
            self._tab = None

    def agent_rows(self, a: int) -> np.ndarray:
        """Row indexes of agent a (-1: the run's own rows, evaluations), in time order."""
        return self.by_agent[self.starts[a + 1]:self.starts[a + 2]]

    def message(self, msg_id: int) -> list[int]:
        """The rows of one message (send, then deliver/drop/stale), in time order."""
        lo, hi = np.searchsorted(self._msg_sorted, [msg_id, msg_id + 1])
        return sorted(int(r) for r in self.by_msg[lo:hi])

    def window(self, t0: float, t1: float, spans: bool = True, agents: np.ndarray | None = None) -> np.ndarray:
        """Rows that show in [t0, t1]: instants inside it, and spans that overlap it; of ``agents``
        only (-1: the run's rows) when given, read through the per-agent index."""
        start = t0 - (self.max_span if spans else 0.0)
        if agents is None:
            lo = np.searchsorted(self.t, start, side="left")
            hi = np.searchsorted(self.t, t1, side="right")
            rows = np.arange(lo, hi)
        else:
            parts = []
            for a in agents:
                mine = self.agent_rows(int(a))
                ts = self.t[mine]
                parts.append(mine[np.searchsorted(ts, start, side="left"):np.searchsorted(ts, t1, side="right")])
            rows = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
        if spans and len(rows) and self.t[rows[0]] < t0:  # some rows start before t0: keep spans only
            inside = self.t[rows] >= t0
            sp = np.isin(self.kind[rows], self.codes(SPANS))
            keep = inside | (sp & (self.t[rows] + self.value[rows] >= t0))
            rows = rows[keep]
        return rows

    # drawing --------------------------------------------------------------------------------------
    def cells(self, lane_of: np.ndarray, n_lanes: int, t0: float, t1: float, width: int,
              mask: np.ndarray | None = None) -> np.ndarray:
        """(n_lanes, width) grid of kind codes (-1: empty): per cell the most important kind that
        happens there; spans fill the cells they cover (``binning.Binner``). ``lane_of[a + 1]`` is agent
        a's lane (-1: not shown; index 0 is the run's own rows); ``mask`` (per row) hides filtered-out events.
        A few lanes out of many agents read their rows through the per-agent index; otherwise the window's
        rows are binned in slices of ``CHUNK`` rows, so that the temporaries stay in cache."""
        shown = np.flatnonzero(lane_of >= 0) - 1
        lane_of = lane_of.astype(np.int32)
        binner = Binner(n_lanes, t0, t1, width, len(self.kind_names), self.codes(SPANS))
        if len(shown) * 8 < self.n or mask is not None:  # few lanes, or a filter: gather the rows
            rows = self.window(t0, t1, agents=shown if len(shown) * 8 < self.n else None)
            if mask is not None:
                rows = rows[mask[rows]]
            binner.add(self.t[rows], self.kind[rows], self.value[rows], lane_of[self.agent[rows] + 1])
        else:  # the window's rows are contiguous: work on views, no index arrays
            lo = int(np.searchsorted(self.t, t0 - self.max_span, side="left"))
            hi = int(np.searchsorted(self.t, t1, side="right"))
            for s in range(lo, hi, CHUNK):
                e = min(s + CHUNK, hi)
                binner.add(self.t[s:e], self.kind[s:e], self.value[s:e], lane_of[self.agent[s:e] + 1])
        return binner.grid()

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
        drows, dpeer = self.drops_by_peer
        lo, hi = np.searchsorted(dpeer, [a, a + 1])
        drops_in = int((self.t[drows[lo:hi]] <= t).sum())
        return {"agent": a, "activations": count("activate"), "sent": count("send"), "received": count("deliver"),
                "dropped_out": count("drop"), "dropped_in": drops_in, "timeouts": count("timeout"),
                "stale": count("stale"), "releases": count("release"), "offline_s": off}

    def epsilon(self, a: int, t: float) -> float | None:
        """epsilon(delta) agent a had spent by time t: its releases up to t composed by the run's
        accountant settings (privacy.delta, privacy.accounting; RDP). None without releases."""
        if not self.has("release"):
            return None
        rows = self.agent_rows(a)
        rows = rows[(self.kind[rows] == self.code["release"]) & (self.t[rows] <= t)]
        key = (a, len(rows))
        if key not in self._eps:
            from netsim.privacy.accountants import epsilon
            from netsim.trace.events import Release

            priv = self.scenario.get("privacy", {}) if isinstance(self.scenario.get("privacy"), dict) else {}
            delta = float(priv.get("delta", 1e-5))
            mode = "amplified" if priv.get("accounting") == "amplified" else "observed"
            rel = [Release.from_row(float(self.t[r]), a, self._at("peer", r), self._at("round", r),
                                    self._at("size", r), float(self.value[r]), self.tag(r)) for r in rows]
            self._eps[key] = epsilon(rel, delta, "rdp", mode)
        return self._eps[key]

    @functools.cached_property
    def agent_accuracy(self) -> np.ndarray | None:
        """(time, agent, loss, accuracy) rows of the run folder's agent_metrics.csv (the agent_accuracy
        metric), or None when there is none or it does not read as numbers."""
        p = Path(self.path)
        f = (p if p.is_dir() else p.parent) / "agent_metrics.csv"
        if not f.is_file():
            return None
        try:
            rows = np.loadtxt(f, delimiter=",", skiprows=1, ndmin=2)
        except (ValueError, OSError):
            return None
        return rows if rows.shape[1] == 4 and np.isfinite(rows[:, :2]).all() else None

    def accuracy_of(self, a: int, t: float) -> float | None:
        """Agent a's own test accuracy at its last evaluation by time t."""
        m = self.agent_accuracy
        if m is None:
            return None
        mine = m[(m[:, 1] == a) & (m[:, 0] <= t)]
        return float(mine[-1, 3]) if len(mine) else None

    def evals(self) -> tuple[np.ndarray, np.ndarray]:
        """(times, accuracy of the average model) of the run's evaluation rows (found once per read)."""
        got = self.__dict__.get("_evals")
        if got is None or got[0] != len(self.t):
            if "eval" not in self.code:
                got = (len(self.t), np.zeros(0), np.zeros(0))
            else:
                m = np.flatnonzero(self.kind == self.code["eval"])
                got = (len(self.t), self.t[m], self.value[m])
            self.__dict__["_evals"] = got
        return got[1], got[2]


CHUNK = 1 << 18  # rows binned at a time


def _np(tab: pa.Table, name: str, dtype) -> np.ndarray:
    return _np_chunked(tab.column(name), dtype)


def _np_chunked(col: pa.ChunkedArray, dtype) -> np.ndarray:
    """A numeric column without nulls (checked when read) as one numpy array."""
    return concat_numbers(col.chunks, dtype)


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
