"""The trace rows the engine's rules make, each kind's shape written once (COLUMNS order: t, kind, agent, peer, msg,
size, value, round, tag; netsim.trace.events documents each kind).

One definition serves every form a row is made in: the events engine calls a shape with one row's values and
``TEXT``, the strings, and traces the tuple (``emit_row``); a fast driver that packs rows calls it with ``CODES``, the
strings' codes in every driver's ``Words`` (``words()``), and packs the tuple (``PackedRows``); a driver that makes
rows as columns calls it with arrays over many rows (and ``CODES``) and assigns each column (``fill``). A shape
computes nothing but the delivery's delay (arrival - sent), so any form gives the same values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # pyarrow loads with the first run, not with a scenario's validation
    from netsim.trace.io import Words


class Vocabulary(NamedTuple):
    """The strings of the rows the engine's rules make: as text, or as codes (``words()``)."""

    none: str | int  # no tag
    activate: str | int
    compute_start: str | int
    compute_end: str | int
    send: str | int
    drop: str | int
    deliver: str | int
    timeout: str | int
    finish: str | int
    loss: str | int  # the lean path's drop reason


TEXT = Vocabulary("", "activate", "compute_start", "compute_end", "send", "drop", "deliver", "timeout", "finish",
                  "loss")
CODES = Vocabulary(*range(len(TEXT)))  # the code of each of TEXT in ``words()``


def words() -> Words:
    """A ``Words`` whose first codes are ``CODES``."""
    from netsim.trace.io import Words

    w = Words()
    for s in TEXT:
        w(s)
    return w


def activate(t, agent, local, rnd, k: Vocabulary = TEXT) -> tuple:
    """An activation (``Agent.wake``'s timer fired): ``local``, the agent's clock; ``rnd``, its activations."""
    return (t, k.activate, agent, -1, -1, 0, local, rnd, k.none)


def compute_start(t, agent, ct, k: Vocabulary = TEXT) -> tuple:
    """A gradient asked for (``Agent.compute_time``): ``ct``, its compute time."""
    return (t, k.compute_start, agent, -1, -1, 0, ct, -1, k.none)


def compute_end(t, agent, k: Vocabulary = TEXT) -> tuple:
    """A gradient's completion."""
    return (t, k.compute_end, agent, -1, -1, 0, 0.0, -1, k.none)


def send(t, src, dst, msg, size, delay, rnd, tag, k: Vocabulary = TEXT) -> tuple:
    """A message put on its link (``Network.take_ids``' id; ``delay``: ``network.delay``)."""
    return (t, k.send, src, dst, msg, size, delay, rnd, tag)


def drop(t, src, dst, msg, size, delay, rnd, reason, k: Vocabulary = TEXT) -> tuple:
    """A sent message that does not arrive (right after its ``send`` row): ``reason``, loss, outage or offline."""
    return (t, k.drop, src, dst, msg, size, delay, rnd, reason)


def deliver(t, dst, src, msg, size, sent, rnd, tag, k: Vocabulary = TEXT) -> tuple:
    """A message's arrival at ``t`` (sent at ``sent``): the receiver's row."""
    return (t, k.deliver, dst, src, msg, size, t - sent, rnd, tag)


def timeout(t, agent, rnd, missing, k: Vocabulary = TEXT) -> tuple:
    """A barrier (``Agent.gather``) timed out with ``missing`` (a float) of its messages not arrived."""
    return (t, k.timeout, agent, -1, -1, 0, missing, rnd, k.none)


def finish(t, agent, rnd, k: Vocabulary = TEXT) -> tuple:
    """An agent's program ended (``Agent.finish``) after ``rnd`` activations."""
    return (t, k.finish, agent, -1, -1, 0, 0.0, rnd, k.none)


def fill(columns, at, row: tuple) -> None:
    """A shape made over arrays (or scalars shared by all) into ``columns`` at positions ``at``."""
    for col, v in zip(columns, row, strict=True):
        col[at] = v
