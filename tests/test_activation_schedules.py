"""Activation schedules as objects (sim/activation.py): their times against hand computations, churn's
deferral, the tick count, and activation listeners."""

from __future__ import annotations

import math

import numpy as np
import pytest

from netsim.sim.activation import Bernoulli, Periodic, Poisson, Schedule, schedule_for


def test_periodic_ticks_skip_missed_ones_and_defer_to_the_first_tick_back():
    s = Periodic(0.5, start_local=0.2)
    assert s.tick == 0
    assert s.next(0.2) == 0.5 and s.tick == 1
    assert s.next(0.6) == 1.0                       # the next multiple after now
    assert s.next(2.3) == 2.5 and s.tick == 5       # ticks while busy are missed
    assert s.defer(2.5, back_local=3.7) == 4.0 and s.tick == 8   # offline until 3.7: first tick back
    assert s.defer(4.0, back_local=1.0) == 4.5      # never earlier than the next tick


def test_bernoulli_gaps_are_geometric_draws_of_its_own_stream():
    rng, ref = np.random.default_rng(5), np.random.default_rng(5)
    s = Bernoulli(1.0, 0.3, rng, start_local=0.0)
    tick = 0
    for _ in range(50):
        tick = tick + 1 + int(ref.geometric(0.3)) - 1
        assert s.next(float(s.tick)) == tick
    assert 50 / tick == pytest.approx(0.3, abs=0.12)
    assert Bernoulli(1.0, 1.0, np.random.default_rng(0), 0.0).next(0.0) == 1.0   # p = 1 draws nothing


def test_poisson_arrivals_are_exponential_gaps_from_the_offset_and_busy_ones_are_missed():
    rng, ref = np.random.default_rng(2), np.random.default_rng(2)
    s = Poisson(4.0, rng, start_local=10.0)
    first = 10.0 + ref.exponential(0.25)
    assert s.upcoming == first
    assert s.next(0.0) == first
    second = first + ref.exponential(0.25)
    at = s.next(second + 5.0)                        # busy for 5 s: the arrivals in between are missed
    expect = second
    while expect < second + 5.0:
        expect += ref.exponential(0.25)
    assert at == expect and s.upcoming == expect + ref.exponential(0.25)
    assert s.tick == 0


def test_schedule_for_reads_the_scenario(scenario):
    sc = scenario(agents={"activation": {"kind": "bernoulli", "period": 2.0, "p": 0.5}})
    s = schedule_for(sc.agents.activation, np.random.default_rng(0), 0.0, 3.0)
    assert isinstance(s, Bernoulli) and s.period == 2.0 and s.p == 0.5 and s.tick == 1


def test_listeners_run_at_each_activation_before_it_is_traced(scenario):
    from netsim.api import prepare

    sim = prepare(scenario(run={"until": 3.0}))
    seen = []
    a = sim.agents[1]
    a.on_activation(lambda agent: seen.append((agent.id, agent.round)))
    sim.run()
    assert len(seen) == a.round or len(seen) == a.round - 1   # the last wake may still be pending at the end
    assert seen == [(1, r) for r in range(1, len(seen) + 1)]
    assert a.last_tick == a.schedule.tick and a.schedule.tick >= math.floor(3.0 / 0.5)


class EveryOtherSecond(Schedule):
    """A user's schedule: activations at local times 1, 3, 5, ... (the protocol of sim/activation.py)."""

    kind = "every_other_second"

    def __init__(self):
        self.tick = 0

    def next(self, now_local):
        self.tick = max(self.tick, int(now_local // 2) * 2 + 1)
        at = float(self.tick)
        self.tick += 2
        return at

    def defer(self, at, back_local):
        while at < back_local:
            at += 2.0
        return at

    def advance_tick(self, tick):
        self.tick = max(self.tick, tick)


def test_a_schedule_object_installed_through_setup_drives_the_activations(tmp_path, scenario):
    import netsim
    from netsim.trace.io import read_trace

    sc = scenario(run={"until": 9.5}, agents={"count": 4, "compute_time": {"kind": "constant", "value": 0.01}})

    def setup(sim):
        for a in sim.agents:
            a.use_schedule(EveryOtherSecond())

    netsim.run(sc, out=tmp_path / "run", setup=setup)
    t = read_trace(tmp_path / "run").table.to_pandas()
    act = t[t["kind"] == "activate"]
    for _, rows in act.groupby("agent"):
        assert list(rows["value"]) == [1.0, 3.0, 5.0, 7.0, 9.0]   # the local times it planned
        assert list(rows["round"]) == [1, 2, 3, 4, 5]


def _sparse_ticks(spec, rng, offset):
    """A plugin's schedule with its own period and probability (0.5 s ticks, each taken with p = 0.6),
    whatever the scenario's table says."""
    return Bernoulli(0.5, 0.6, rng, offset)


def test_a_plugin_schedule_is_accounted_by_the_ledger_as_it_behaves(scenario):
    """The privacy ledger reads p, the tick count and its origin from the agent's schedule: a plugin schedule
    that is a Bernoulli(0.5 s, 0.6) under a periodic 1 s table gets the built-in Bernoulli's entries."""
    from netsim.api import prepare
    from netsim.sim.activation import register_schedule

    register_schedule("test_sparse_ticks", _sparse_ticks)
    common = {"run": {"until": 12.0},
              "agents": {"clock_offset": {"kind": "uniform", "low": 0.0, "high": 3.0}},
              "algorithm": {"name": "dp_dpsgd", "lr": 0.5, "batch": 16, "round_timeout": 0.2, "clip": 1.0,
                            "noise_multiplier": 4.0}}
    built_in = scenario(**{**common, "agents": {**common["agents"],
                                                "activation": {"kind": "bernoulli", "period": 0.5, "p": 0.6}}})
    plugin = scenario(**{**common, "agents": {**common["agents"],
                                              "activation": {"kind": "periodic", "period": 1.0,
                                                             "schedule": "test_sparse_ticks"}}})
    entries = []
    for sc in (built_in, plugin):
        sim = prepare(sc)
        sim.run()
        assert all(a.activation_probability == 0.6 and a.activation_period == 0.5 for a in sim.agents)
        entries.append({a.id: [(r.t, r.round, r.skipped, r.p, r.scale) for r in a.ledger.releases]
                        for a in sim.agents})
    assert entries[0] == entries[1]
    rows = [e for per_agent in entries[1].values() for e in per_agent]
    assert len(rows) > 8 * 10 and {p for *_, p, _ in rows} == {0.6}
    assert sum(skipped for _, _, skipped, _, _ in rows) > 0   # ticks the agents skipped, counted from the origin


def test_a_schedule_must_be_a_schedule_object(scenario):
    from netsim.api import prepare

    sim = prepare(scenario())
    with pytest.raises(TypeError, match="subclass netsim.sim.activation.Schedule"):
        sim.agents[0].use_schedule(object())
