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
