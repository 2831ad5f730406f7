"""Streams seeded in bulk (``seed_states``, ``Streams.seed_ahead``) against numpy's own SeedSequence, key by key."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from netsim.sim.streams import Streams, purpose_code, seed_states


@pytest.mark.parametrize("seed", [0, 1, 7, 2**31, 2**32 - 1, 2**32, 2**40 + 3, 2**63 - 1])
def test_seed_states_are_numpys_seed_sequence_words_for_every_key(seed):
    rng = np.random.default_rng(seed % 1000)
    for width in (1, 2, 3, 5):
        keys = rng.integers(0, 2**32, (200, width))
        keys[0], keys[1] = 0, 2**32 - 1  # the ends of the range
        got = seed_states(seed, keys)
        want = np.stack([np.random.SeedSequence(seed, spawn_key=tuple(k)).generate_state(4, np.uint64)
                         for k in keys.tolist()])
        assert got.dtype == np.uint64 and np.array_equal(got, want)


def test_streams_seeded_ahead_draw_what_streams_seeded_one_by_one_draw():
    """The same generators either way: states, draws, and the streams not seeded ahead untouched."""
    edges = np.array([[0, 1], [1, 0], [3, 2], [2**32 - 1, 5]])
    ahead, plain = Streams(11), Streams(11)
    ahead.seed_ahead(("latency", "loss"), edges)
    for purpose in ("latency", "loss", "burst"):
        for src, dst in edges.tolist():
            a, b = ahead.rng(purpose, src, dst), plain.rng(purpose, src, dst)
            assert a.bit_generator.state == b.bit_generator.state
            assert np.array_equal(a.random(5), b.random(5))
    assert not ahead._ahead  # each seeded state used once, then dropped
    ahead.seed_ahead(("loss",), np.array([[-1, 2]]))  # out of range: left to numpy, one by one
    assert not ahead._ahead


def test_the_network_seeds_its_links_ahead_up_to_a_bound(monkeypatch):
    """A built run's links find their streams seeded (the same generators, as the test above shows); past
    ``SEED_AHEAD_MAX`` streams none are, so a huge graph does not hold their states in memory."""
    from netsim.api import prepare
    from netsim.scenario import scenario_from_dict
    from netsim.sim import network

    sc = {"run": {"seed": 3, "until": 1.0}, "agents": {"count": 20},
          "network": {"latency": {"kind": "uniform", "low": 0.01, "high": 0.1}, "loss": 0.1},
          "topology": {"kind": "random_regular", "degree": 4}, "algorithm": {"name": "push_gossip"}}
    links = {purpose_code("latency"), purpose_code("loss")}
    seeded = lambda sim: [k for k in sim.world.streams._ahead if k[0] in links]  # noqa: E731  (not the agents')
    assert len(seeded(prepare(scenario_from_dict(sc)))) == 20 * 4 * 2  # latency and loss, every directed link
    monkeypatch.setattr(network, "SEED_AHEAD_MAX", 159)
    assert not seeded(prepare(scenario_from_dict(sc)))


@pytest.mark.parametrize("kind", ["random", "uniform", "exponential", "normal"])
def test_draws_give_the_streams_values_in_order_whatever_their_blocks_and_resume_where_they_stood(kind):
    """A short first block, then full ones: the values are the stream's own, one after another (as one call for
    all of them gives); a position taken inside the first block, at its end, or in a later block, resumed in a
    stream made again, goes on with the very values that followed: at once, in a stream already restored (past the
    block, however long: a first block is drawn again as long as it was, or the values past it would come twice),
    or with the stream made (``make``) and the block drawn again only at the first draw."""
    from netsim.sim.streams import BLOCK, FIRST_BLOCK, Draws

    def fill(rng):
        return {"random": rng.random, "uniform": lambda n: rng.uniform(0.05, 0.5, n),
                "exponential": lambda n: rng.exponential(2.0, n), "normal": lambda n: rng.normal(1.0, 3.0, n)}[kind]

    n = FIRST_BLOCK + 2 * BLOCK + 5
    whole = fill(np.random.default_rng(7))(n).tolist()
    rng = np.random.default_rng(7)
    d = Draws(fill(rng), rng)
    got, positions = [], {}
    for k in range(n):
        if k in (5, FIRST_BLOCK, FIRST_BLOCK + 3, FIRST_BLOCK + BLOCK + 1):
            positions[k] = d.position(), rng.bit_generator.state  # (the stream past the block, as a restore puts it)
        got.append(d())
    assert got == whole
    assert positions[FIRST_BLOCK][0][3] == FIRST_BLOCK  # the first block used up: it stands at its end
    for k, (pos, past) in positions.items():
        fresh = np.random.default_rng(7)  # the same stream (its key fixes its increment), standing elsewhere
        fresh.random(3)
        again = Draws(fill(fresh), fresh)
        again.resume(pos)
        assert [again() for _ in range(n - k)] == whole[k:]
        kept = np.random.default_rng(7)  # the stream restored first (past the block), the draws then
        kept.bit_generator.state = past
        again = Draws(fill(kept), kept)
        again.resume(pos, keep_stream=True)
        assert kept.bit_generator.state == past and [again() for _ in range(n - k)] == whole[k:]
        restored, made = np.random.default_rng(7), []
        restored.bit_generator.state = past
        later = Draws(None, make=lambda: made.append(1) or (fill(restored), restored))  # noqa: B023
        later.resume(pos, later=True)
        assert made == [] and later.position() == pos  # (nothing drawn yet: where it was restored)
        assert [later() for _ in range(n - k)] == whole[k:] and made == [1]


@settings(max_examples=60, deadline=None)
@given(ops=hs.lists(hs.one_of(hs.just(0), hs.integers(1, 300)), min_size=1, max_size=12),
       resumed=hs.booleans())
def test_take_gives_the_values_and_positions_of_as_many_calls(ops, resumed):
    """``take(n)`` (runs of a block's buffer) against n calls, mixed with single calls (0) across a short first block
    and full ones, from the start or from a resumed position: the same values and, after each, the same
    ``position`` (what a checkpoint keeps)."""
    from netsim.sim.streams import FIRST_BLOCK, Draws

    def draws():
        rng = np.random.default_rng(11)
        d = Draws(lambda m: rng.lognormal(-4.6, 0.5, m), rng)
        if resumed:
            ref = np.random.default_rng(11)
            r = Draws(lambda m: ref.lognormal(-4.6, 0.5, m), ref)
            for _ in range(FIRST_BLOCK + 7):
                r()
            d.resume(r.position())
        return d

    took, called = draws(), draws()
    for n in ops:
        if n == 0:
            assert took() == called()
        else:
            got = took.take(n)
            assert got.dtype == np.float64 and got.tolist() == [called() for _ in range(n)]
        assert took.position() == called.position()


@pytest.mark.parametrize("seed", [0, 5, 2**32 + 1, 2**63 - 1])
def test_first_doubles_are_each_streams_own_first_values(seed):
    """PCG64 over many streams at once: each row is what the stream's own generator draws (``random``), and
    low + (high - low) u what its ``uniform`` draws; the key range's ends and a 3-word key included."""
    from netsim.sim.streams import _SeedState, first_doubles, first_doubles_exact

    rng = np.random.default_rng(seed % 97)
    for width in (2, 3):
        keys = rng.integers(0, 2**32, (300, width))
        keys[0], keys[1] = 0, 2**32 - 1
        states = seed_states(seed, keys)
        got = first_doubles(states, 40)
        for st, row in zip(states, got, strict=True):
            assert np.array_equal(np.random.Generator(np.random.PCG64(_SeedState(st))).random(40), row)
        for low, high in ((0.05, 0.5), (1e-9, 3.7), (-2.0, 2.0)):
            assert first_doubles_exact(states[5:], low, high)


def test_first_drawn_go_on_with_the_streams_values_past_their_first_block():
    """A link's draws from a block drawn for many streams, then from its stream made later and moved past that block:
    the values ``Draws`` of the stream gives, across the first block's end and the next blocks'."""
    from netsim.sim.streams import BLOCK, FIRST_BLOCK, Draws, FirstDrawn, first_doubles

    streams = Streams(4)
    keys = np.array([[5, 1, 2], [6, 1, 2], [5, 2**32 - 1, 0]])
    firsts = first_doubles(seed_states(4, keys), FIRST_BLOCK)
    made = []

    def past(key):
        rng = streams.rng("latency" if key[0] == 5 else "loss", *key[1:])
        rng.bit_generator.advance(FIRST_BLOCK)
        made.append(key)
        return rng

    n = FIRST_BLOCK + 2 * BLOCK + 3
    for key, first in zip(keys.tolist(), firsts, strict=True):
        plain = Streams(4).rng("latency" if key[0] == 5 else "loss", *key[1:])
        want = Draws(lambda m, g=plain: g.uniform(0.1, 0.9, m))
        lazy = FirstDrawn((0.1 + (0.9 - 0.1) * first).tobytes(),
                          lambda k=key: (lambda m, g=past(k): g.uniform(0.1, 0.9, m)))
        got = [lazy() for _ in range(FIRST_BLOCK)]
        assert not made  # the first block needs no generator
        got += [lazy() for _ in range(n - FIRST_BLOCK)]
        assert made == [key] and got == [want() for _ in range(n)]
        made.clear()


def test_lookahead_windows_take_their_links_first_draws_from_blocks_drawn_together():
    """A run with no checkpoint: every topology link's first draws come from blocks drawn for its chunk (the
    generators made only for links that draw past them); with checkpoints, links keep their streams' positions
    and are made one by one."""
    from netsim.api import prepare
    from netsim.scenario import scenario_from_dict
    from netsim.sim.network import LinksAhead
    from netsim.sim.streams import FirstDrawn, purpose_code

    sc = {"run": {"seed": 3, "until": 1.0}, "agents": {"count": 20},
          "network": {"latency": {"kind": "uniform", "low": 0.01, "high": 0.1}, "loss": 0.1},
          "topology": {"kind": "random_regular", "degree": 4}, "algorithm": {"name": "push_gossip"}}
    net = prepare(scenario_from_dict(sc)).world.network
    edges = net.ahead  # the topology's links, held until positions go off
    assert isinstance(edges, np.ndarray) and type(net.link(0, edges[0][1]).latency) is not FirstDrawn
    net.without_checkpoints()
    assert isinstance(net.ahead, LinksAhead)
    u, v = edges[-1].tolist()
    link = net.link(u, v)
    assert type(link.latency) is FirstDrawn and type(link.lost) is FirstDrawn
    key = (purpose_code("latency"), u, v)
    assert key not in net.streams._cache and net.link(u, v) is link
    plain = Streams(3)
    lat, loss = plain.rng("latency", u, v), plain.rng("loss", u, v)
    assert [link.latency() for _ in range(20)] == lat.uniform(0.01, 0.1, 20).tolist()
    assert key not in net.streams._cache  # within the first block: no generator
    assert [link.latency() for _ in range(40)] == lat.uniform(0.01, 0.1, 40).tolist()
    assert key in net.streams._cache  # past it: the stream made
    assert [link.lost() for _ in range(40)] == loss.random(40).tolist()


def test_streams_rows_restore_into_a_fresh_tree_and_read_back_the_same():
    """``rows`` names every stream by its spawn key and gives numpy's own state (128-bit halves, the buffered 32-bit
    draw); ``restore`` puts them back: a stream made already at once, any other when first asked for, and a tree
    restored but not yet used gives the very rows and names back. Names not as ``rows`` writes them are refused."""
    a = Streams(5)
    for key in ((1,), (2, 10), (2, 9), (3, 0, 7)):
        g = a.rng("latency", *key)
        g.random(3 + key[0])
        g.integers(0, 10, 3)  # (leaves a 32-bit half buffered)
    a.rng("latency")
    names, rows = a.rows()
    code = purpose_code("latency")
    assert names == [f"{code}", f"{code},1", f"{code},2,9", f"{code},2,10", f"{code},3,0,7"]  # by key, not by text
    st = a.rng("latency", 2, 9).bit_generator.state
    mask = (1 << 64) - 1
    assert rows[2].tolist() == [st["state"]["state"] >> 64, st["state"]["state"] & mask, st["state"]["inc"] >> 64,
                                st["state"]["inc"] & mask, st["has_uint32"], st["uinteger"]]
    b = Streams(5)
    made = b.rng("latency", 1)  # made before the restore: put in place
    b.restore(names, rows)
    assert made.bit_generator.state == a.rng("latency", 1).bit_generator.state
    for restored in (True, False):  # (right after the restore: its names and rows as given; read back: the same)
        again, back = b.rows(restored)
        assert again == names and np.array_equal(back, rows)
    for key in ((2, 10), (3, 0, 7)):  # the others made when asked for, standing where they stood
        assert np.array_equal(b.rng("latency", *key).random(4), a.rng("latency", *key).random(4))
    for bad in ([*names[:-1], names[-1] + ","], [*names[:-1], "0" + names[-1]], names[:-1], [*names[:-1], "-1"],
                [*names[:-2], names[-2] + "\n1", names[-1]]):
        with pytest.raises(ValueError):
            Streams(5).restore(bad, rows)
