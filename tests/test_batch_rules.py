"""The engine's rules over a batch (netsim/sim/), as a planned run takes them: a round of broadcasts
(``network.Broadcasts``), compute times taken ahead (``ComputeTimes(ahead=...)``) and periodic or Bernoulli wakes
(``agent.Wakes``) give the bits of the rules they batch (``lean_outcomes``, ``Agent.compute_time``,
``Agent.plan_wake``) on a twin simulation, round after round, past the blocks taken ahead."""

from __future__ import annotations

import numpy as np
import pytest

from netsim.api import prepare
from netsim.sim.agent import ComputeTimes, Wakes
from netsim.sim.network import Broadcasts, lean_outcomes


def twins(scenario, activation=None, **net):
    sc = scenario(run={"until": 10.0},
                  agents={"count": 9, "clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.3},
                          "clock_drift": {"kind": "normal", "mean": 0.0, "sigma": 0.01},
                          "compute_time": {"kind": "lognormal", "mean": 0.05, "sigma": 0.5},
                          "activation": activation or {"kind": "periodic", "period": 0.25}},
                  topology={"kind": "ring"},
                  network={"latency": {"kind": "lognormal", "mean": 0.02, "sigma": 0.5}, **net})
    return prepare(sc), prepare(sc)


@pytest.mark.parametrize("net", [{"bandwidth": 3000.0, "loss": 0.3}, {"loss": 0.0}])
def test_a_round_of_broadcasts_has_each_links_own_draws(scenario, net):
    """Each round some senders broadcast at their own times: their delays, losses and longest transmissions are
    ``lean_outcomes``' on the twin, for more rounds than one block of draws (``cols``) holds."""
    a, b = twins(scenario, **net)
    nb = [x.neighbors for x in a.agents]
    batch = Broadcasts(a.world.network, nb, cols=4)
    rng = np.random.default_rng(0)
    t = np.zeros(len(nb))
    for _ in range(11):
        ids = np.flatnonzero(rng.random(len(nb)) < 0.7)
        t[ids] += rng.uniform(0.0, 0.5, len(ids))
        delay, lost, hold = batch(ids, t[ids], 200)
        want = [lean_outcomes(b.world.network, i, nb[i], float(t[i]), 200) for i in ids.tolist()]
        assert delay.tolist() == [d for w in want for d in w[0]]
        assert lost.tolist() == [r == "loss" for w in want for r in w[1]]
        assert hold.tolist() == [w[2] for w in want]
    batch.close()
    assert [lk.busy_until for lk in batch.links] == [b.world.network.link(i, j).busy_until
                                                     for i, d in enumerate(nb) for j in d]


def test_compute_times_taken_ahead_are_each_agents_own(scenario):
    a, b = twins(scenario)
    ahead = ComputeTimes(a.agents, ahead=3)
    assert ahead.block is not None
    rng = np.random.default_rng(1)
    for _ in range(8):
        ids = np.flatnonzero(rng.random(len(a.agents)) < 0.6)
        now = rng.uniform(0.0, 5.0, len(ids))
        got = ahead([a.agents[i] for i in ids.tolist()], ids, now)
        assert got.tolist() == [b.agents[i].compute_time(t) for i, t in zip(ids.tolist(), now.tolist())]


@pytest.mark.parametrize("activation", [None, {"kind": "bernoulli", "period": 0.25, "p": 0.4}])
def test_wakes_over_arrays_are_plan_wakes(scenario, activation):
    """Drifting, offset clocks, ticks skipped while busy, Bernoulli gaps drawn ahead (past a block's end): the ticks
    and delays of ``Agent.plan_wake``, and the ticks left in the run's array."""
    a, b = twins(scenario, activation)
    wakes = Wakes(a.agents, ahead=3)
    assert wakes.arrays
    rng = np.random.default_rng(2)
    now = np.zeros(len(a.agents))
    for _ in range(12):
        ids = np.flatnonzero(rng.random(len(a.agents)) < 0.8)
        now[ids] += rng.uniform(0.0, 0.7, len(ids))
        at, delay = wakes(ids, now[ids])
        want = [b.agents[i].plan_wake(t) for i, t in zip(ids.tolist(), now[ids].tolist())]
        assert at.tolist() == [w[0] for w in want] and delay.tolist() == [w[1] for w in want]
        assert [x.schedule.tick for x in a.agents] == [x.schedule.tick for x in b.agents]
