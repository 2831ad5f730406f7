"""Filters and searches: ``kind=drop src=3``, as a row mask over a run.

Terms are ``key=value`` (or ``key<value``, ``key>value``, ``<=``, ``>=`` for numbers), all of which must
hold; a value may list alternatives (``kind=drop,timeout``) and agents ranges (``agent=0-3,7``).

    key     matches
    kind    the event kind (compute for compute_start)
    agent   the acting agent (sender of send/drop, receiver of deliver/stale)
    src     a message's sender; dst its receiver
    peer    the other end of a message
    round   the round or activation count
    tag     the tag (message tag, drop reason, note)
    msg     the message id
    t       time (use t>=10 t<20 for a window)
    value, size  the value and size columns
"""

from __future__ import annotations

import re

import numpy as np

from netsim.errors import InputError
from netsim.explore.model import RECV, RunData

KEYS = ("kind", "agent", "src", "dst", "peer", "round", "tag", "msg", "t", "value", "size")
_TERM = re.compile(r"^([a-z]+)\s*(<=|>=|=|<|>)\s*(.+)$")


def _ints(spec: str, where: str) -> np.ndarray:
    out: list[int] = []
    try:
        for part in spec.split(","):
            a, sep, b = part.strip().partition("-")
            if sep and a:
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise InputError(where, f"expected integers or ranges like 0-3,7, got {spec!r}") from None
    return np.array(out, dtype=np.int64)


def parse(text: str, where: str = "search") -> list[tuple[str, str, str]]:
    """'kind=drop src=3' -> [('kind', '=', 'drop'), ('src', '=', '3')]; InputError naming the term."""
    terms = []
    for word in text.split():
        m = _TERM.match(word)
        if not m:
            raise InputError(where, f"expected key=value terms like 'kind=drop src=3', got {word!r}")
        key, op, val = m.groups()
        if key not in KEYS:
            raise InputError(where, f"unknown key {key!r}; allowed: {', '.join(KEYS)}")
        if key in ("kind", "tag") and op != "=":
            raise InputError(where, f"only {key}=... is allowed, got {word!r}")
        terms.append((key, op, val))
    return terms


def mask(run: RunData, text: str, where: str = "search") -> np.ndarray | None:
    """Rows matching every term of ``text``; None for an empty query (everything). ``where`` names
    the input in error messages."""
    terms = parse(text, where)
    if not terms:
        return None
    m = np.ones(len(run.t), dtype=bool)
    recv = np.isin(run.kind, run.codes(RECV))
    for key, op, val in terms:
        if key == "kind":
            names = [v.strip() for v in val.split(",") if v.strip()]
            bad = [v for v in names if v not in run.kind_names]
            if bad:
                raise InputError(where, f"unknown kind(s) {', '.join(bad)}; allowed: {', '.join(run.kind_names)}")
            m &= np.isin(run.kind, run.codes(names))
            continue
        if key == "tag":
            import pyarrow as pa
            import pyarrow.compute as pc

            want = pa.array([v for v in val.split(",")], pa.string())
            m &= pc.is_in(run._tag, value_set=want).to_numpy(zero_copy_only=False)
            continue
        col = {"agent": run.agent, "peer": run.peer, "round": run.round, "msg": run.msg, "t": run.t,
               "value": run.value, "size": run.size,
               "src": np.where(recv, run.peer, run.agent), "dst": np.where(recv, run.agent, run.peer)}[key]
        if key in ("src", "dst"):
            m &= run.msg >= 0
        if op == "=" and key not in ("t", "value"):
            m &= np.isin(col, _ints(val, where))
            continue
        try:
            x = float(val)
        except ValueError:
            raise InputError(where, f"expected a number after {key}{op}, got {val!r}") from None
        m &= {"=": col == x, "<": col < x, ">": col > x, "<=": col <= x, ">=": col >= x}[op]
    return m


def window(text: str) -> tuple[float | None, float | None]:
    """The time window a query names with t terms (for fitting the view to it)."""
    lo = hi = None
    for key, op, val in parse(text):
        if key == "t":
            x = float(val)
            if op in (">", ">=", "="):
                lo = x
            if op in ("<", "<=", "="):
                hi = x
    return lo, hi
