"""What keeps a 10^6-agent run's memory bounded without moving a bit: synthetic rows cast to float32 in their own
buffer, and a gradient flush over many agents evaluated in chunks of ``CHUNK`` requests."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from netsim.compute import gradients
from netsim.compute.data import float32_in_place
from netsim.compute.gradients import GradientService
from netsim.compute.models import MLP, LogisticRegression


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (3, 5), (1001, 20), (2**20 + 3, 3), (7,), (0, 20)])
def test_float32_in_place_is_astype(shape):
    X = np.random.default_rng(0).normal(size=shape) * 1e3
    want = X.astype(np.float32)
    got = float32_in_place(X)
    assert got.dtype == np.float32 and got.shape == want.shape and got.flags.c_contiguous
    assert got.tobytes() == want.tobytes()


def test_float32_in_place_copies_a_view_and_keeps_its_base():
    base = np.random.default_rng(1).normal(size=(10, 4))
    before = base.copy()
    got = float32_in_place(base[::2])  # not its own memory: copied as astype copies
    assert got.tobytes() == before[::2].astype(np.float32).tobytes()
    assert np.array_equal(base, before)


@pytest.mark.parametrize("model", [LogisticRegression(6), MLP(6, 3, (5,))])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_a_flush_in_chunks_gives_the_bits_of_one_call(monkeypatch, model, clip):
    """Requests of one block, evaluated in chunks of 64 (and a tail), against one call over all of them."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(500, 6, generator=g)
    y = torch.randint(0, 3 if isinstance(model, MLP) else 2, (500,), generator=g)
    R, m = 64 * 5 + 13, 8
    W = model.init(R, torch.float32, torch.device("cpu"), 0) + 0.1 * torch.randn(R, model.size, generator=g)
    rows = np.random.default_rng(4).integers(0, 500, (R, m))

    def flush():
        svc = GradientService(model, X, y)
        blk = svc.submit_block(list(range(R)), W, rows, clip)
        svc.flush()
        return blk.result, svc.calls

    whole, _ = flush()
    monkeypatch.setattr(gradients, "CHUNK", 64)
    chunked, calls = flush()
    assert calls == 1 and chunked.shape == whole.shape
    assert torch.equal(chunked, whole)


@pytest.mark.parametrize("kind", ["ring", "exponential", "torus", "grid", "complete", "star", "erdos_renyi"])
@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("mixing", [None, "uniform", "max_degree", "column_stochastic"])
def test_topology_arrays_are_the_graphs(kind, directed, mixing):
    """``Topology`` without networkx (a fixed kind's edges) gives the matrix of ``weighted_graph`` byte for byte and
    each agent's neighbours as sorted successors and predecessors; its lazily built graph is that graph."""
    from netsim.scenario.schema import TopologySpec
    from netsim.sim.graph_arrays import fixed_edges
    from netsim.sim.topology import Topology, weighted_graph

    if directed and kind in ("torus", "grid", "complete", "star"):
        pytest.skip("undirected kinds")
    for n in (4, 9, 12, 36) if kind in ("torus", "grid") else (3, 4, 12, 37):
        spec = TopologySpec(kind=kind, directed=directed, mixing=mixing, p=0.5)
        g, W = weighted_graph(spec, n, 7)
        t = Topology(spec, n, 7)
        fixed = fixed_edges(spec, n) is not None  # all but the random kind, and tori under 3 x 3
        assert fixed == (kind != "erdos_renyi") or n < 9
        assert (t._graph is None) == fixed  # from the arrays: no graph until asked for
        for a, b in ((t.W.indptr, W.indptr), (t.W.indices, W.indices), (t.W.data, W.data)):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        assert t.edges == g.number_of_edges()
        assert sorted(map(tuple, t.edge_array().tolist())) == sorted(g.edges)
        for i in range(n):
            assert t.neighbors(i) == sorted(g.successors(i))
            assert t.in_neighbors(i) == sorted(g.predecessors(i))
        lazy = t.graph
        assert list(lazy.edges(data=True)) == list(g.edges(data=True))


def test_a_windowed_ring_run_builds_no_networkx_graph_and_starts_no_program(tmp_path):
    """What a 10^6-agent synchronous run is spared: the networkx graph (its arrays suffice) and the agents' programs
    (the driver plays the rounds: not even made), a copy of the agents' parts; an events run of the same scenario
    starts one program an agent."""
    import netsim
    from netsim.scenario import scenario_from_dict

    sc = {"name": "lean", "run": {"seed": 3, "rounds": 4, "until": 100.0},
          "agents": {"count": 12, "compute_time": {"kind": "constant", "value": 0.01},
                     "activation": {"kind": "periodic", "period": 0.1}},
          "topology": {"kind": "ring"}, "network": {"latency": {"kind": "constant", "value": 0.005}},
          "data": {"kind": "synthetic", "samples": 600, "features": 5}, "model": {"kind": "logistic"},
          "algorithm": {"name": "dpsgd", "lr": 0.5, "batch": 4, "round_timeout": 0.05},
          "evaluation": {"every": 1.0e6}}
    sims = {}
    for engine in ("windowed", "events"):
        netsim.run(scenario_from_dict(sc), out=tmp_path / engine, engine=engine,
                   setup=lambda s, e=engine: sims.update({e: s}))
    w, e = sims["windowed"], sims["events"]
    assert w.loop.engine == "windowed" and w.world.topology._graph is None and w.loop.programs.running == []
    assert w.loop.programs.made == [] and w.loop.programs.make is None  # its generators never made
    assert len(e.loop.programs.running) == 12
    # the mini-batch gather indexes the dataset's own array of parts, not a copy of it
    from netsim.sim.agent import RowsAhead

    assert np.shares_memory(RowsAhead(w.loop.agents).flat, w.world.data.parts[0])
    assert (tmp_path / "windowed" / "trace.arrows").read_bytes() == (tmp_path / "events" / "trace.arrows").read_bytes()
    assert sorted(w.graph.edges) == sorted(e.graph.edges)  # built when read
    # an agent's attributes stay within CPython's shared-key limit (30 keys): one more turns every agent's instance
    # dict from ~300 B into a 1.6 KB table of its own, 1.3 GB more at 10^6 agents (per-agent state belongs in the
    # Inbox's or the schedule's slots, or in the bank)
    for sim in (w, e):
        for a in sim.loop.agents:
            assert len(vars(a)) < 30, sorted(vars(a))
            assert sys.getsizeof(vars(a)) < 600


def test_free_heap_memory_is_handed_back():
    """With the tuned allocator (large blocks from the heap), freed blocks below a live one stay in the process until
    ``release_free_memory`` trims them; below ``FREE_HELD_MAX`` free it does nothing. In a fresh process (the
    allocator's settings are process-wide)."""
    import subprocess

    code = """
import numpy as np, netsim.compute as C
if not C.tune_cpu_allocator() or not hasattr(C._libc(), "mallinfo2"):
    print("skip"); raise SystemExit
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
assert not C.release_free_memory(0.0)             # nothing much free yet
big = [np.ones(8 << 20) for _ in range(10)]       # 10 x 64 MiB from the heap
pin = np.ones(1 << 20)                            # a live block above them: the top cannot be trimmed
before = rss()
del big
held = rss()
assert C.release_free_memory(0.0)                 # 640 MiB free > FREE_HELD_MAX
print(before, held, rss())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    if out == ["skip"]:
        pytest.skip("not glibc 2.33+")
    before, held, after = map(int, out)
    assert held > before - 100  # freed, but still held by the process
    assert after < held - 500  # handed back
