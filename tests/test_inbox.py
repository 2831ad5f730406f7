"""The barrier and receive semantics every pattern's windowed driver is held to (``Agent.gather``, ``Agent.recv``,
the ``Inbox``): a complete barrier returns at its last delivery; a timed-out one returns what arrived, with a
``timeout`` row whose value is the missing count; messages of earlier rounds are discarded as ``stale``, whether
they arrive while the agent waits or were queued before it asked; a message that came early is taken from the
queue; ``recv`` with a round discards older rounds and returns None on its timeout."""

from __future__ import annotations

import pytest

from netsim.scenario import scenario_from_dict
from netsim.sim.kernel import Simulation
from netsim.trace.events import records
from netsim.trace.io import TraceWriter
from tests.conftest import BASE, merge

LAT = 0.01


def run(programs: dict[int, callable]) -> tuple[list, dict]:
    """Three agents (complete graph, links of LAT s) running ``programs[i](agent, seen)``; returns the trace
    records and what the programs recorded."""
    sc = scenario_from_dict(merge(BASE, {"agents": {"count": 3}, "topology": {"kind": "complete"},
                                         "network": {"latency": {"kind": "constant", "value": LAT}},
                                         "run": {"until": 5.0}, "evaluation": {"every": 100.0}}))
    rows: list = []
    seen: dict = {}

    def program(agent, _p):
        return programs.get(agent.id, idle)(agent, seen)

    sim = Simulation(sc, program, None, writer=TraceWriter(None, {}, on_batch=lambda c: rows.extend(records(c))))
    sim.run()
    return rows, seen


def idle(agent, seen):
    yield agent.timeout(100.0)


def kinds(rows: list, kind: str, agent: int | None = None) -> list:
    return [r for r in rows if r.kind == kind and (agent is None or r.agent == agent)]


def test_a_complete_barrier_returns_every_payload_at_the_last_delivery():
    def waiter(agent, seen):
        seen["got"] = yield agent.gather(tag="m", round=3, timeout=1.0)
        seen["t"] = agent.env.now

    def sender(delay):
        def prog(agent, seen):
            yield agent.timeout(delay)
            agent.send(0, agent.id * 10, tag="m", round=3)
            yield agent.timeout(100.0)
        return prog

    rows, seen = run({0: waiter, 1: sender(0.05), 2: sender(0.2)})
    assert seen["got"] == {1: 10, 2: 20}
    assert seen["t"] == pytest.approx(0.2 + LAT)
    assert list(seen["got"]) == [1, 2]  # in arrival order: the order a mix adds them
    assert not kinds(rows, "timeout", 0)


def test_a_timed_out_barrier_returns_what_arrived_and_counts_the_missing():
    def waiter(agent, seen):
        seen["got"] = yield agent.gather(tag="m", round=1, timeout=0.1)
        seen["t"] = agent.env.now
        seen["late"] = yield agent.gather(tag="m", round=2, timeout=0.5)  # the late round-1 message: stale

    def early(agent, seen):
        agent.send(0, "old", tag="m", round=0)  # an earlier round, arriving while 0 waits for round 1: stale
        agent.send(0, "x1", tag="m", round=1)
        agent.send(0, "y1", tag="m", round=2)
        yield agent.timeout(100.0)

    def late(agent, seen):
        yield agent.timeout(0.3)
        agent.send(0, "x2", tag="m", round=1)  # after the barrier timed out: queued until 0 asks for round 2
        yield agent.timeout(0.05)
        agent.send(0, "y2", tag="m", round=2)
        yield agent.timeout(100.0)

    rows, seen = run({0: waiter, 1: early, 2: late})
    assert seen["got"] == {1: "x1"} and seen["t"] == pytest.approx(0.1)
    (t,) = kinds(rows, "timeout", 0)
    assert t.round == 1 and t.value == 1.0
    stale = kinds(rows, "stale")
    assert [(s.peer, s.round) for s in stale] == [(1, 0), (2, 1)]
    assert stale[0].t == pytest.approx(LAT) and stale[1].t == pytest.approx(0.3 + LAT)
    assert seen["late"] == {1: "y1", 2: "y2"}  # y1 came early: taken from the queue when 0 asked


def test_recv_discards_older_rounds_and_times_out_with_none():
    def waiter(agent, seen):
        m = yield agent.recv(tag="r", round=5, timeout=0.5)
        seen["first"] = (m.src, m.payload, agent.env.now)
        seen["none"] = yield agent.recv(tag="r", round=6, timeout=0.2)
        seen["t"] = agent.env.now

    def sender(agent, seen):
        agent.send(0, "old", tag="r", round=4)
        yield agent.timeout(0.1)
        agent.send(0, "new", tag="r", round=5)
        yield agent.timeout(100.0)

    rows, seen = run({0: waiter, 1: sender})
    assert seen["first"][:2] == (1, "new") and seen["first"][2] == pytest.approx(0.1 + LAT)
    assert seen["none"] is None and seen["t"] == pytest.approx(0.1 + LAT + 0.2)
    assert [(s.peer, s.round) for s in kinds(rows, "stale")] == [(1, 4)]
