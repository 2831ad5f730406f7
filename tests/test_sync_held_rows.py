"""The synchronous windows' rows held across rounds (``HeldRows``) and the LDP learners' kept sender order: the same
trace bytes and the same slots as made afresh."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from netsim.algorithms.ldp_online import _sender_order, by_sender
from netsim.rounds.kernel import Arrivals
from netsim.rounds.sync import HeldRows, RoundRows, columns
from netsim.sim import rows as shapes
from netsim.sim.rows import CODES, fill
from netsim.trace.io import TraceWriter


def _block(n: int, at: float) -> tuple:
    c = columns(n)
    ids = np.arange(n, dtype=np.int64)
    fill(c, slice(None), shapes.compute_start(at + ids / 8, ids, np.full(n, 0.5), CODES))
    return tuple(c)


def _tuples(n: int, at: float) -> list[tuple]:
    return [shapes.activate(at, i, at, 3) if i % 2 else shapes.timeout(at, i, 3, 1.0) for i in range(n)]


@settings(max_examples=25, deadline=None)
@given(rounds=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 4), st.booleans()), min_size=1, max_size=12),
       every=st.integers(1, 9))
def test_held_rows_write_the_bytes_of_the_rows_emitted_one_by_one(tmp_path_factory, rounds, every):
    """Rounds of column blocks and row tuples, held and written a whole batch at a time (with rows written to the
    trace directly between rounds, after a final write), give the trace of every row emitted one by one."""
    d = tmp_path_factory.mktemp("held")
    held_writer = TraceWriter(d / "held.arrows", {}, every)
    one_writer = TraceWriter(d / "one.arrows", {}, every)
    words = shapes.words()
    held = HeldRows(words)
    for k, (n_cols, n_rows, direct) in enumerate(rounds):
        rr = RoundRows(words)
        rr.add(_block(n_cols, float(k)))
        rr.parts.append(_tuples(n_rows, k + 0.5))
        rr.add(_block(n_cols, k + 0.75))
        rr.hold(held, held_writer)
        for r in [*_rows(_block(n_cols, float(k)), words), *_tuples(n_rows, k + 0.5),
                  *_rows(_block(n_cols, k + 0.75), words)]:
            one_writer.emit_row(r)
        if direct:  # something else writes: everything held goes first
            held.write_to(held_writer, final=True)
            assert held.n == 0
            extra = _tuples(2, k + 0.9)
            held_writer.emit_rows(extra)
            for r in extra:
                one_writer.emit_row(r)
        assert (len(held_writer.buffer) + held.n) // every == 0 or held.n == 0  # no whole batch held
    held.write_to(held_writer, final=True)
    held_writer.close()
    one_writer.close()
    assert (d / "held.arrows").read_bytes() == (d / "one.arrows").read_bytes()


def _rows(cols: tuple, words) -> list[tuple]:
    from netsim.trace.io import column_rows

    return column_rows(cols, 0, len(cols[0]), words)


def _arrivals(ids, recv, send, sent) -> Arrivals:
    return Arrivals(list(ids), list(sent.unbind(0)), sent, recv, send, np.full(len(recv), 0.3))


def test_the_sender_order_is_kept_only_for_the_same_read_only_arrays():
    """A ring's deliveries: the slots equal the dicts' order; arrays never written are kept and reused round after
    round (the same slots, the new round's payloads); new arrays, or other ids, are ordered afresh."""
    recv = np.array([1, 4, 2, 0, 3, 1, 0, 4, 3, 2], np.int64)  # ring of 5: each receives from i-1 and i+1
    send = np.array([0, 0, 1, 1, 2, 2, 4, 3, 4, 3], np.int64)
    for a in (recv, send):
        a.setflags(write=False)
    ids = [0, 1, 2, 3, 4]
    x = torch.arange(10.0, dtype=torch.float64).view(5, 2)
    first = by_sender(_arrivals(ids, recv, send, x))
    again = by_sender(_arrivals(ids, recv, send, x + 100))
    assert _sender_order(_arrivals(ids, recv, send, x)) is _sender_order(_arrivals(ids, recv, send, x + 1))
    for (r1, y1), (r2, y2) in zip(first, again, strict=True):
        assert r1.tolist() == r2.tolist()
        assert torch.equal(y1 + 100, y2)
    got = _arrivals(ids, recv, send, x)
    for s, (rs, ys) in enumerate(first):  # slot s: each receiver's s-th sender by increasing id, as the dicts give
        for r, y in zip(rs.tolist(), ys.unbind(0), strict=True):
            assert torch.equal(y, got[r][sorted(got[r])[s]])
    fresh = _sender_order(_arrivals(ids, recv.copy(), send.copy(), x))
    assert fresh is not _sender_order(_arrivals(ids, recv, send, x))
    other = [0, 1, 2, 3, 9]  # agent 4 is now agent 9: sorted after the rest, the same order here
    assert _sender_order(_arrivals(other, recv, send, x)) is not _sender_order(_arrivals(ids, recv, send, x))
