"""Event records: every thing that happens in a run is one frozen attrs record (principle 3).

All kinds share one flat, versioned row schema (``COLUMNS``) so a trace is a single table that
pandas/polars/duckdb read directly; a kind leaves the columns it does not use at their defaults.
Bump ``SCHEMA_VERSION`` when a column or a kind's meaning changes.

    column  meaning
    t       simulated time of the event (s, global clock)
    kind    one of KINDS
    agent   the acting agent (sender for send/drop, receiver for deliver), -1 for the run itself
    peer    the other end of a message, -1 otherwise
    msg     message id (unique per run), -1 otherwise
    size    payload bytes (messages), 0 otherwise
    value   kind-specific number: send/deliver/drop = total delay (s); compute_start = compute time;
            activate = local clock time; timeout = messages missing; eval = test accuracy of the
            average model
    round   the agent's activation count (activate) or the algorithm's round tag (messages)
    tag     message tag (e.g. "model"), or a short note
"""

from __future__ import annotations

import attrs

SCHEMA_VERSION = 1
COLUMNS = ("t", "kind", "agent", "peer", "msg", "size", "value", "round", "tag")
DEFAULTS = {"agent": -1, "peer": -1, "msg": -1, "size": 0, "value": 0.0, "round": -1, "tag": ""}


@attrs.frozen(slots=True)
class Activate:
    kind = "activate"
    t: float
    agent: int
    round: int
    value: float  # local clock time


@attrs.frozen(slots=True)
class ComputeStart:
    kind = "compute_start"
    t: float
    agent: int
    value: float  # compute time


@attrs.frozen(slots=True)
class ComputeEnd:
    kind = "compute_end"
    t: float
    agent: int


@attrs.frozen(slots=True)
class Send:
    kind = "send"
    t: float
    agent: int
    peer: int
    msg: int
    size: int
    value: float  # delay it will see (transfer + latency)
    round: int
    tag: str


@attrs.frozen(slots=True)
class Deliver:
    kind = "deliver"
    t: float
    agent: int
    peer: int
    msg: int
    size: int
    value: float
    round: int
    tag: str


@attrs.frozen(slots=True)
class Drop:
    kind = "drop"
    t: float
    agent: int
    peer: int
    msg: int
    size: int
    value: float
    round: int
    tag: str  # reason: "loss"


@attrs.frozen(slots=True)
class Timeout:
    kind = "timeout"
    t: float
    agent: int
    round: int
    value: float  # how many expected messages were missing


@attrs.frozen(slots=True)
class Stale:
    """A message that arrived after its round was over (discarded by a barrier)."""

    kind = "stale"
    t: float
    agent: int
    peer: int
    msg: int
    round: int


@attrs.frozen(slots=True)
class Evaluation:
    kind = "eval"
    t: float
    value: float  # test accuracy of the average model


@attrs.frozen(slots=True)
class Finish:
    kind = "finish"
    t: float
    agent: int
    round: int


KINDS = tuple(c.kind for c in (Activate, ComputeStart, ComputeEnd, Send, Deliver, Drop, Timeout, Stale,
                               Evaluation, Finish))


def row(event) -> tuple:
    """An event as a tuple in COLUMNS order."""
    return tuple(
        event.kind if c == "kind" else getattr(event, c, DEFAULTS.get(c)) for c in COLUMNS
    )
