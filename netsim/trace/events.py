"""Event records: every thing that happens in a run is one frozen attrs record.

All kinds share one flat, versioned row schema (``COLUMNS``) so a trace is a single table that
pandas/polars/duckdb read directly; a kind leaves the columns it does not use at their defaults.
Bump ``SCHEMA_VERSION`` when a column or a kind's meaning changes.

    column  meaning
    t       simulated time of the event (s, global clock)
    kind    one of event_kinds(): the core's KINDS and those registered with register_event_kind
    agent   the acting agent (sender for send/drop, receiver for deliver), -1 for the run itself
    peer    the other end of a message, -1 otherwise
    msg     message id (unique per run), -1 otherwise
    size    payload bytes (messages), 0 otherwise
    value   kind-specific number: send/deliver/drop = total delay (s); compute_start = compute time;
            activate = local clock time; timeout = messages missing; eval = test accuracy of the
            average model; release = noise scale added; budget_exhausted = epsilon spent
    round   the agent's activation count (activate) or the algorithm's round tag (messages)
    tag     message tag (e.g. "model"), drop reason ("loss", "outage", "offline"), or a short note
    (offline: value = duration of the agent's offline interval starting at t)

Event kinds are open: a module (an algorithm, a plugin) defines a frozen attrs subclass of ``EventRow``
with a class attribute ``kind`` and registers it with ``@register_event_kind``. Its record fills the
same columns, so traces keep one schema; fields beyond the columns must be packed into them (usually
``tag``, as ``Release`` does) and the class may give ``from_row`` to read them back (``decode``).
"""

from __future__ import annotations

import functools
import operator

import attrs

SCHEMA_VERSION = 1
COLUMNS = ("t", "kind", "agent", "peer", "msg", "size", "value", "round", "tag")
DEFAULTS = {"agent": -1, "peer": -1, "msg": -1, "size": 0, "value": 0.0, "round": -1, "tag": ""}


class EventRow:
    """Base of every event record: the columns a kind does not use read as their defaults, so one
    ``operator.attrgetter(*COLUMNS)`` turns any event into its row (fast, in C)."""

    __slots__ = ()
    agent, peer, msg, size, value, round, tag = (DEFAULTS[c] for c in COLUMNS[2:])
    glyph: tuple[str, str, str] | None = None  # (char, rich style, legend) for ``netsim timeline``; None: not drawn


@attrs.frozen(slots=True)
class Activate(EventRow):
    kind = "activate"
    t: float
    agent: int
    round: int
    value: float  # local clock time


@attrs.frozen(slots=True)
class ComputeStart(EventRow):
    kind = "compute_start"
    t: float
    agent: int
    value: float  # compute time


@attrs.frozen(slots=True)
class ComputeEnd(EventRow):
    kind = "compute_end"
    t: float
    agent: int


@attrs.frozen(slots=True)
class Send(EventRow):
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
class Deliver(EventRow):
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
class Drop(EventRow):
    kind = "drop"
    t: float
    agent: int
    peer: int
    msg: int
    size: int
    value: float
    round: int
    tag: str  # reason: "loss", "outage" or "offline"


@attrs.frozen(slots=True)
class Timeout(EventRow):
    kind = "timeout"
    t: float
    agent: int
    round: int
    value: float  # how many expected messages were missing


@attrs.frozen(slots=True)
class Stale(EventRow):
    """A message that arrived after its round was over (discarded by a barrier)."""

    kind = "stale"
    t: float
    agent: int
    peer: int
    msg: int
    round: int


@attrs.frozen(slots=True)
class Evaluation(EventRow):
    kind = "eval"
    t: float
    value: float  # test accuracy of the average model


@attrs.frozen(slots=True)
class Finish(EventRow):
    kind = "finish"
    t: float
    agent: int
    round: int


@functools.lru_cache(maxsize=4096, typed=True)  # typed: 1 and 1.0 print differently
def release_tag(mechanism: str, what: str, sensitivity: float, q: float, p: float, skipped: int) -> str:
    """A ``Release`` row's tag (its fields that are not columns; cached: a run's releases repeat a few)."""
    return f"{mechanism} {what} s={sensitivity!r} q={q!r} p={p!r} k={skipped}"


def _release_tag(e) -> str:
    return release_tag(e.mechanism, e.what, e.sensitivity, e.q, e.p, e.skipped)


@attrs.frozen(slots=True)
class Release(EventRow):
    """One privatized release by one agent: the ledger entry the privacy accountants compose.

    ``value`` is the noise scale actually added (Gaussian std, or Laplace b); ``tag`` packs the rest
    as ``"<mechanism> <what> s=<sensitivity> q=<sampling prob> p=<activation prob> k=<skipped ticks>"``
    (floats as repr, so a trace row gives back the exact numbers; see ``Release.from_row``). ``peer``
    is the recipient (-1: every out-neighbour / public), ``size`` the number of released coordinates.
    """

    kind = "release"
    t: float
    agent: int
    peer: int
    round: int
    size: int
    mechanism: str  # "gaussian" | "laplace"
    what: str  # "gradient" | "message" | "model" | ...
    scale: float
    sensitivity: float
    q: float = 1.0  # probability that a given record enters this release (data sampling)
    p: float = 1.0  # activation probability of the agent (Bernoulli activation), 1 otherwise
    skipped: int = 0  # activation ticks the agent skipped (inactive) since its previous release
    value: float = attrs.field(default=attrs.Factory(lambda e: e.scale, takes_self=True))
    tag: str = attrs.field(default=attrs.Factory(_release_tag, takes_self=True))

    @classmethod
    def from_row(cls, t: float, agent: int, peer: int, round: int, size: int, value: float, tag: str) -> Release:
        mech, what, *kv = tag.split(" ")
        f = dict(x.split("=", 1) for x in kv)
        return cls(float(t), int(agent), int(peer), int(round), int(size), mech, what, float(value),
                   float(f["s"]), float(f["q"]), float(f["p"]), int(f["k"]))


@attrs.frozen(slots=True)
class BudgetExhausted(EventRow):
    """An agent's next release would have exceeded its privacy budget cap: it releases no more."""

    kind = "budget_exhausted"
    t: float
    agent: int
    round: int
    value: float  # epsilon spent so far (at the run's delta)
    tag: str  # "cap=<epsilon cap> <accountant>"


@attrs.frozen(slots=True)
class Offline(EventRow):
    """An agent's offline (churn) interval begins: it neither computes, sends nor receives."""

    kind = "offline"
    t: float
    agent: int
    value: float  # duration of the interval (s)


_CORE = (Activate, ComputeStart, ComputeEnd, Send, Deliver, Drop, Timeout, Stale, Evaluation, Finish, Release,
         BudgetExhausted, Offline)
KINDS = tuple(c.kind for c in _CORE)  # the core's kinds; event_kinds() adds the registered ones
_REGISTRY: dict[str, type] = {c.kind: c for c in _CORE}


def register_event_kind(cls: type) -> type:
    """Register an event record class (usable as a decorator): a frozen attrs subclass of ``EventRow``
    with a string class attribute ``kind`` (lower-case identifier) and a field ``t``. Registering the
    same class again is a no-op; another class with a registered kind raises ``ValueError``."""
    name = getattr(cls, "__name__", repr(cls))
    if not (isinstance(cls, type) and issubclass(cls, EventRow) and attrs.has(cls)):
        raise ValueError(f"event kind {name}: must be an attrs class derived from netsim.trace.events.EventRow")
    kind = cls.__dict__.get("kind")
    if not (isinstance(kind, str) and kind.isidentifier() and kind == kind.lower()):
        raise ValueError(f"event kind {name}: needs a class attribute kind = '<lower_case_name>', got {kind!r}")
    fields = attrs.fields_dict(cls)
    if "t" not in fields or "kind" in fields:
        raise ValueError(f"event kind {name}: needs a field t (simulated time) and no field 'kind'")
    if getattr(cls.__setattr__, "__name__", "") != "_frozen_setattrs":  # what attrs installs when frozen
        raise ValueError(f"event kind {name}: must be frozen (@attrs.frozen)")
    have = _REGISTRY.get(kind)
    if have is not None and have is not cls and (have.__module__, have.__qualname__) != (cls.__module__,
                                                                                        cls.__qualname__):
        raise ValueError(f"event kind {kind!r} is already registered by {have.__module__}.{have.__qualname__}")
    _REGISTRY[kind] = cls
    return cls


def event_kinds() -> dict[str, type]:
    """Every registered event kind and its record class (the core's first, then in registration order)."""
    return dict(_REGISTRY)


def decode(t: float, kind: str, **columns) -> EventRow:
    """A trace row back as its record: the class's ``from_row`` if it has one, else the class built from
    the columns it has as fields. ``KeyError`` for a kind not registered in this process."""
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise KeyError(f"event kind {kind!r} is not registered (registered: {', '.join(_REGISTRY)})")
    if hasattr(cls, "from_row"):
        cols = ("agent", "peer", "round", "size", "value", "tag")
        return cls.from_row(t, **{c: columns.get(c, DEFAULTS[c]) for c in cols})
    names = attrs.fields_dict(cls)
    return cls(t=t, **{c: v for c, v in columns.items() if c in names and names[c].init})


row = operator.attrgetter(*COLUMNS)
"""``row(event)``: an event record as its trace row, a tuple in COLUMNS order (one C-level call; every
record has every column, EventRow gives the defaults)."""


def record(r: tuple) -> EventRow:
    """A trace row (COLUMNS order) back as its event record (``decode``)."""
    return decode(r[0], r[1], **dict(zip(COLUMNS[2:], r[2:])))


def records(batch) -> list[EventRow]:
    """A flushed ``pa.RecordBatch`` (``TraceWriter``'s ``on_batch``) back as event records."""
    return [record(r) for r in zip(*(c.to_pylist() for c in batch.columns))]
