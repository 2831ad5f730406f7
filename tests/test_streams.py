"""Streams seeded in bulk (``seed_states``, ``Streams.seed_ahead``) against numpy's own SeedSequence, key by key."""

from __future__ import annotations

import numpy as np
import pytest

from netsim.sim.streams import Streams, seed_states


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
    sim = prepare(scenario_from_dict(sc))
    assert len(sim.world.streams._ahead) == 20 * 4 * 2  # latency and loss, every directed link
    monkeypatch.setattr(network, "SEED_AHEAD_MAX", 159)
    assert not prepare(scenario_from_dict(sc)).world.streams._ahead


@pytest.mark.parametrize("kind", ["random", "uniform", "exponential", "normal"])
def test_draws_give_the_streams_values_in_order_whatever_their_blocks_and_resume_where_they_stood(kind):
    """A short first block, then full ones: the values are the stream's own, one after another (as one call for
    all of them gives); a position taken inside the first block, at its end, or in a later block, resumed in a
    stream made again, goes on with the very values that followed."""
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
            positions[k] = d.position()
        got.append(d())
    assert got == whole
    assert positions[FIRST_BLOCK][3] == FIRST_BLOCK  # the first block used up: it stands at its end
    for k, pos in positions.items():
        fresh = np.random.default_rng(7)  # the same stream (its key fixes its increment), standing elsewhere
        fresh.random(3)
        again = Draws(fill(fresh), fresh)
        again.resume(pos)
        assert [again() for _ in range(n - k)] == whole[k:]
