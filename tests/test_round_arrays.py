"""The windowed synchronous driver's array steps against what they replace, one agent or one row at a time:
trace rows given as columns, every agent's mini-batch in one gather, a round's activations planned at once."""

from __future__ import annotations

import numpy as np
import pytest

from netsim import api
from netsim.rounds import windowed
from netsim.scenario import scenario_from_dict
from netsim.sim.agent import RowsAhead
from netsim.trace.io import RECORD, PackedRows, TraceWriter, Words, read_trace, row_columns


def rows(n: int, seed: int = 0) -> list[tuple]:
    """Trace rows of every column type, a release's long tag and repeated kinds among them."""
    rng = np.random.default_rng(seed)
    kinds = ["activate", "send", "deliver", "release", "timeout"]
    tags = ["", "model", "gaussian gradient s=1.0 q=0.25 p=1.0 k=0"]
    return [(float(rng.random()), kinds[int(rng.integers(5))], int(rng.integers(100)), int(rng.integers(-1, 100)),
             int(rng.integers(-1, 10**6)), int(rng.integers(0, 10**4)), float(rng.normal()),
             int(rng.integers(-1, 9)), tags[int(rng.integers(3))]) for _ in range(n)]


@pytest.mark.parametrize("every", [1, 3, 8, 1000])
def test_columns_write_the_bytes_of_the_same_rows(tmp_path, every):
    """Rows emitted as columns, between rows emitted one by one, give the file, the batches and the rows waiting
    of the same rows emitted as tuples (batches cut at the same rows)."""
    given = rows(200)
    cuts = [0, 5, 6, 50, 51, 130, 200]  # row runs, emitted alternately as tuples and as columns
    made = {}
    for how in ("rows", "columns"):
        path = tmp_path / f"{how}.arrows"
        w = TraceWriter(path, {"a": "b"}, flush_every=every)
        words = Words()
        for n, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
            part = given[lo:hi]
            if how == "columns" and n % 2:
                w.emit_columns(row_columns(part, words), words)
            else:
                w.emit_rows(part)
        pending, count = list(w.buffer), w.count
        w.close()
        made[how] = (path.read_bytes(), pending, count)
    assert made["columns"] == made["rows"]
    table = read_trace(tmp_path / "columns.arrows").table
    assert table.num_rows == 200 and table.column("tag").to_pylist() == [r[8] for r in given]


def test_packed_rows_write_the_bytes_of_the_same_rows(tmp_path):
    """Rows packed as they are made (``PackedRows``: the hot paths' ``put(RECORD.pack(...))`` and ``append`` of any
    row, None in a float column and a float in an int column among them), written a batch at a time between rows
    emitted as tuples, give the file and the rows waiting of the same rows emitted as tuples (``record_batch``'s
    values: None as NaN, the float truncated)."""
    given = rows(300, seed=3)
    given[7] = (given[7][0], "finish", 3, -1, -1, 0, None, 5, "")
    given[8] = (given[8][0], "offline", 4, -1, -1, 0, 2.5, -1, "")
    given[9] = (given[9][0], "send", 4, 2, 17, 452.0, 0.1, 3, "model")
    cuts = [0, 4, 120, 121, 300]
    made = {}
    for how in ("rows", "packed"):
        path = tmp_path / f"{how}.arrows"
        w = TraceWriter(path, {"a": "b"}, flush_every=50)
        for n, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
            part = given[lo:hi]
            if how == "packed" and n % 2:
                words = Words()
                words("send")  # codes the control gave first (a driver's fixed words)
                packed = PackedRows(words)
                for k, r in enumerate(part):
                    if k % 3 or r[1] != "send" or r[6] is None:
                        packed.append(r)
                    else:  # the hot path's packing, its codes from the same words
                        packed.put(RECORD.pack(r[0], words(r[1]), *r[2:8], words(r[8])))
                assert len(packed) == len(part)
                # whole batches (the rows that would not fill one wait, packed), then the rest
                packed.write_to(w)
                assert (len(w.buffer) + len(packed)) % 50 == 0 or not w.buffer
                assert len(packed) < 50 and w.count + len(w.buffer) + len(packed) == hi
                packed.write_to(w, final=True)
                assert not len(packed)
            else:
                w.emit_rows(part)
        pending, count = list(w.buffer), w.count
        w.close()
        made[how] = (path.read_bytes(), pending, count)
    assert made["packed"] == made["rows"]
    table = read_trace(tmp_path / "packed.arrows").table
    assert np.isnan(table.column("value")[7].as_py()) and table.column("size")[9].as_py() == 452


def sims(n: int = 6, **data) -> tuple:
    sc = {"name": "arrays", "run": {"seed": 5, "rounds": 40, "until": 1.0e6},
          "agents": {"count": n, "compute_time": {"kind": "constant", "value": 0.01},
                     "activation": {"kind": "periodic", "period": 0.1}},
          "topology": {"kind": "ring"}, "network": {"latency": {"kind": "constant", "value": 0.005}},
          "data": {"kind": "synthetic", "samples": 30 * n, "features": 4, "partition": "dirichlet_classes",
                   "alpha": 0.5, **data},
          "model": {"kind": "logistic"}, "algorithm": {"name": "dpsgd", "batch": 5, "round_timeout": 0.05},
          "evaluation": {"every": 1.0e6}}
    return tuple(api.prepare(scenario_from_dict(sc)) for _ in range(2))


def same_streams(one, many) -> None:
    """Each agent's batch stream where single draws would have left it (a block drawn ahead rewound to the rows
    handed out: ``RowsAhead`` draws longer blocks than ``sample_rows``, the same values), in both simulations."""
    for a, b in zip(one.loop.agents, many.loop.agents, strict=True):
        assert (a.batches_ahead is None) == (b.batches_ahead is None)
        for h in (a.batches_ahead, b.batches_ahead):
            if h is not None:
                h.rewind()
        assert a._draws.batch().bit_generator.state == b._draws.batch().bit_generator.state


def test_rows_ahead_draws_what_each_agent_draws():
    """Every agent's mini-batches through ``RowsAhead`` (agents in a new order each round, blocks refilled, the
    batch size changed midway, then a program taking the stream) are those of ``sample_rows``, with the streams
    left in the same state."""
    one, many = sims()
    assert len({len(a.rows) for a in one.loop.agents}) > 1  # parts of different sizes, laid end to end
    rng = np.random.default_rng(1)
    ahead = RowsAhead(many.loop.agents)
    for k in range(160):
        batch = 16 if k < 140 else 7  # RowsAhead's blocks of 64 mini-batches (sample_rows' of 16): refilled twice
        order = rng.permutation(len(one.loop.agents))
        if k == 150:
            one.loop.agents[int(order[0])].rng("batch")
            many.loop.agents[int(order[0])].rng("batch")
        want = [one.loop.agents[i].sample_rows(batch) for i in order]
        got = ahead.take([many.loop.agents[i] for i in order], order, batch)
        assert np.array_equal(np.stack(want), np.stack(list(got)))
    same_streams(one, many)


def test_rows_ahead_of_a_few_agents_at_a_time_draws_what_each_agent_draws():
    """``RowsAhead`` over a different few of the agents each call (a lock step of the barrier windows: agents on
    their own clocks), some drawing a mini-batch themselves in between: each call is those agents'
    ``sample_rows``, the streams and blocks end where theirs do, and the blocks stay laid in one array."""
    one, many = sims()
    rng = np.random.default_rng(2)
    n = len(one.loop.agents)
    ahead = RowsAhead(many.loop.agents)
    for k in range(80):
        who = rng.permutation(n)[:int(rng.integers(1, n + 1))]
        if k % 9 == 4:  # one agent draws itself (its block is then not the laid one)
            for sim in (one, many):
                sim.loop.agents[int(who[0])].sample_rows(16)
        want = [one.loop.agents[i].sample_rows(16) for i in who]
        got = ahead.take([many.loop.agents[i] for i in who], who, 16)
        assert isinstance(got, np.ndarray) and np.array_equal(np.stack(want), got), k
    assert all(b.batches_ahead.block.base is ahead.blocks for b in many.loop.agents if b.batches_ahead is not None)
    same_streams(one, many)


@pytest.mark.parametrize("then", ["stream", "rows", "another"])
def test_rows_ahead_follows_what_others_do_between_its_rounds(then):
    """Between two rounds of blocks laid by ``RowsAhead`` (taken over arrays, no agent visited), an agent draws a
    mini-batch itself, another draws its block to the end, then a third's program takes its stream, or its part is
    replaced, or another ``RowsAhead`` lays the blocks and takes from them every other round: each round is still
    every agent's ``sample_rows``, and the streams end in the same states."""
    one, many = sims()
    ahead = RowsAhead(many.loop.agents)
    if then == "another":
        ahead = _Alternating(ahead, RowsAhead(many.loop.agents))
    order = np.arange(len(one.loop.agents))
    for k in range(40):
        order = np.roll(order, 1)
        for sim in (one, many):
            agents = sim.loop.agents
            if k == 3:
                agents[2].sample_rows(16)
            if k == 7:
                for _ in range(70):  # past its block's end (64 laid by RowsAhead): a fresh block of its own
                    agents[4].sample_rows(16)
            if k == 20 and then == "stream":  # no more drawing ahead (then every agent draws its own)
                agents[5].rng("batch")
            if k == 20 and then == "rows":
                agents[1].rows = agents[1].rows[::-1].copy()
        want = [one.loop.agents[i].sample_rows(16) for i in order]
        got = ahead.take([many.loop.agents[i] for i in order], order, 16)
        assert np.array_equal(np.stack(want), np.stack(list(got))), k
    same_streams(one, many)


class _Alternating:
    """Two ``RowsAhead`` of the same agents, taking in turn (each lays the blocks the other laid before)."""

    def __init__(self, *both: RowsAhead):
        self.both, self.k = both, 0

    def take(self, agents, ids, batch):
        self.k += 1
        return self.both[self.k % 2].take(agents, ids, batch)


def test_rows_ahead_of_distinct_rows_is_each_agents_own():
    one, many = sims(sampling="without_replacement")
    order = np.arange(len(one.loop.agents))[::-1].copy()
    for _ in range(3):
        want = [one.loop.agents[i].sample_rows(5) for i in order]
        got = RowsAhead(many.loop.agents).take([many.loop.agents[i] for i in order], order, 5)
        assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))


def wake(sim, order: list[tuple[int, float]]) -> list[tuple[float, int, int, float]]:
    """The rule ``windowed.wake_all`` plays over arrays, agent by agent: each agent of ``order`` ((agent, when it
    called wake), in call order) woken as ``Agent.wake`` does (its round counted): (activation time, call order,
    agent, local tick time), sorted as simpy fires them: by time, then by the order the activations were set."""
    acts, woken = [], []
    for seq, (i, w) in enumerate(order):
        a = sim.loop.agents[i]
        at, delay = a.plan_wake(w)
        acts.append((w + delay, seq, i, at))
        woken.append(a)
    sim.count_wakes(woken)
    acts.sort()
    return acts


@pytest.mark.parametrize("kept", ["shared", "own"])
def test_a_round_wakes_as_each_agent_wakes(kept):
    """``wake_all`` plans what ``wake`` plans agent by agent: times, order (ties in call order), ticks, rounds; with
    every agent's tick in the run's array (``Counts.ticks``), or one agent's schedule replaced by one that keeps its
    own (then each agent's schedule is read and set)."""
    from netsim.sim.activation import Periodic

    one, many = sims(n=8)
    if kept == "own":
        for sim in (one, many):
            a = sim.loop.agents[5]
            a.use_schedule(Periodic(a.schedule.period, a.local_time(0.0)))
    assert many.loop.counts.ticks_shared is (kept == "shared")
    order = [(3, 0.0), (0, 0.0), (5, 0.055), (1, 0.0), (2, 0.055), (7, 0.105), (4, 0.0), (6, 0.105)]
    for _ in range(3):
        want = wake(one, order)
        t, ids, at, woken = windowed.wake_all(many, np.array([i for i, _ in order]),
                                              np.array([w for _, w in order]))
        assert [(a, i, b) for a, _, i, b in want] == list(zip(t.tolist(), ids.tolist(), at.tolist(), strict=True))
        assert [a.id for a in woken] == ids.tolist()
        order = [(i, a + 0.01 * (i % 2)) for a, _, i, _ in want]
    for a, b in zip(one.loop.agents, many.loop.agents, strict=True):
        assert (a.schedule.tick, a.round) == (b.schedule.tick, b.round)


def test_a_round_of_agents_woken_at_once_wakes_as_each_agent_wakes():
    """Every agent calling wake at the same time on the same tick (a synchronous round: planned once, no sort) gives
    what ``wake`` gives agent by agent; then the same agents apart again (the general path) go on alike."""
    one, many = sims(n=8)
    order = [(i, 0.25) for i in (3, 0, 5, 1, 2, 7, 4, 6)]
    for r in range(4):
        want = wake(one, order)
        t, ids, at, woken = windowed.wake_all(many, np.array([i for i, _ in order]),
                                              np.array([w for _, w in order]))
        assert [(a, i, b) for a, _, i, b in want] == list(zip(t.tolist(), ids.tolist(), at.tolist(), strict=True))
        assert [a.id for a in woken] == ids.tolist()
        assert len(set(t.tolist())) == 1 or r == 3  # (the synchronous rounds fire at one time)
        order = [(i, a + (0.01 * (i % 2) if r == 2 else 0.5)) for a, _, i, _ in want]
    for a, b in zip(one.loop.agents, many.loop.agents, strict=True):
        assert (a.schedule.tick, a.round) == (b.schedule.tick, b.round)


def test_as_index_is_torch_tensor_of_the_list():
    """The drivers' index tensors (made through numpy) are ``torch.tensor``'s of the same ints: values and dtype."""
    import torch

    from netsim.rounds.kernel import as_index

    for values in ([7], [3, 0, 2**40, 5], list(range(999, 0, -3))):
        got, want = as_index(values, torch.device("cpu")), torch.tensor(values)
        assert got.dtype == want.dtype == torch.int64 and torch.equal(got, want)
