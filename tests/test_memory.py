"""Bounded memory: a long run keeps what it must (parameters, links, per-evaluation
metric rows) and streams or aggregates the rest; nothing it keeps grows by a record per event.

Measured with tracemalloc around ``Simulation.run`` only (setup excluded), after a warm-up run that pays
the lazy imports and caches once. Figures on the dev machine (16 agents, DP-D-PSGD, Bernoulli activation):
T = 60 s: 43k events, 1.4k releases, 0.20 MB kept at the end, 0.55 MB peak; 4T = 240 s: 170k events,
5.6k releases, 0.29 MB kept, 0.64 MB peak. Before the compact release log the same runs kept 0.69 MB and
2.2 MB (about 360 bytes per release); now about 20 bytes per release (time, round, skipped ticks)."""

from __future__ import annotations

import gc
import random
import tracemalloc
from pathlib import Path

import pytest
import torch

from netsim.api import prepare
from netsim.privacy.accountants import epsilon, grouped_events, release_events
from netsim.privacy.ledger import ledgers, release_logs, releases_from_table
from netsim.privacy.log import ReleaseLog
from netsim.scenario import scenario_from_dict
from netsim.trace.events import Release
from netsim.trace.io import TraceWriter, read_trace
from tests.conftest import BASE, merge

FLUSH = 1024


def dp_run(until: float, n: int = 16, **extra) -> dict:
    return merge(BASE, merge({
        "run": {"until": until, "trace_flush_every": FLUSH},
        "agents": {"count": n, "activation": {"kind": "bernoulli", "period": 0.5, "p": 0.7}},
        "algorithm": {"name": "dp_dpsgd", "lr": 0.3, "batch": 8, "round_timeout": 0.2, "clip": 1.0,
                      "noise_multiplier": 2.0},
        "privacy": {"accounting": "amplified"},
        "evaluation": {"every": 1.0e6},
    }, extra))


def traced_run(sc_dict: dict, folder: Path, during=None):
    """(memory kept at the end, peak, sim): tracemalloc over ``sim.run`` alone."""
    sc = scenario_from_dict(sc_dict)
    writer = TraceWriter(folder / "trace.arrows", {}, sc.run.trace_flush_every, lazy=True)
    sim = prepare(sc, writer)
    if during is not None:
        sim.env.process(during(sim))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        sim.run()
        peak = tracemalloc.get_traced_memory()[1]
        gc.collect()  # the run collects rarely (kernel._lean_gc): count what is still reachable
        cur = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return cur - base, peak - base, sim


def test_a_four_times_longer_run_keeps_about_the_same_memory(tmp_path):
    (tmp_path / "warm").mkdir()
    traced_run(dp_run(5.0), tmp_path / "warm")  # lazy imports, caches: paid once, not measured
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    kept1, peak1, s1 = traced_run(dp_run(40.0), tmp_path / "a")
    kept4, peak4, s4 = traced_run(dp_run(160.0), tmp_path / "b")
    ev1, ev4 = s1.events_emitted, s4.events_emitted
    rel1 = sum(len(r) for r in release_logs(s1).values())
    rel4 = sum(len(r) for r in release_logs(s4).values())
    assert ev4 > 3.5 * ev1 and rel4 > 3.5 * rel1 > 1000  # the long run really did ~4x the work
    # what is kept grows by the compact release log only: < 40 bytes per release, < 2 bytes per event
    assert kept4 - kept1 < 40 * (rel4 - rel1), (kept1, kept4, rel1, rel4)
    assert kept4 - kept1 < 4 * (ev4 - ev1), (kept1, kept4, ev1, ev4)
    print(f"T: {ev1} events, {rel1} releases, kept {kept1}, peak {peak1}; "
          f"4T: {ev4} events, {rel4} releases, kept {kept4}, peak {peak4}")
    assert kept4 < 2 * kept1 and peak4 < 1.5 * peak1, (kept1, kept4, peak1, peak4)
    # and the compact log is the ledger the trace holds, record for record
    table = read_trace(tmp_path / "b").table
    assert ledgers(s4) == {i: releases_from_table(table).get(i, []) for i in range(16)}


def test_events_stream_to_disk_while_the_run_goes_on(tmp_path):
    """A run killed at any moment has lost at most one unflushed batch: in memory there are never more
    than ``trace_flush_every`` events, and everything else is already readable on disk."""
    seen = []

    def watch(sim):
        while True:
            yield sim.env.timeout(7.3)
            w = sim.writer
            seen.append(len(w.buffer))
            assert len(w.buffer) < w.flush_every
            on_disk = read_trace(tmp_path / "trace.arrows").table.num_rows if w.count else 0
            assert on_disk == w.count and w.count + len(w.buffer) == sim.events_emitted

    sc = dp_run(80.0, n=8)
    sc["algorithm"] = {"name": "adpsgd"}  # asynchronous gossip: requests, replies, refusals
    sc["privacy"] = {}
    sc["run"]["trace_flush_every"] = 256
    _, _, sim = traced_run(sc, tmp_path, during=watch)
    assert len(seen) >= 10 and sim.writer.count == sim.events_emitted > 20 * 256


def _live_tensors() -> int:
    gc.collect()
    return sum(type(o) is torch.Tensor for o in gc.get_objects())


def test_a_barrier_without_timeout_keeps_no_payloads_of_past_rounds():
    """A very long round timeout (a 'wait forever' barrier) leaves one timer per round in simpy's queue
    until it fires; the resolved wait it points to must not keep that round's received models alive
    (before: every payload of the run stayed in memory, 334 -> 1294 tensors from T to 4T here)."""
    counts = []
    for until in (20.0, 80.0):
        sc = merge(BASE, {"run": {"until": until}, "evaluation": {"every": 1.0e6},
                          "algorithm": {"name": "dpsgd", "lr": 0.5, "batch": 16, "round_timeout": 1.0e5}})
        sim = prepare(scenario_from_dict(sc))
        sim.run()
        assert sim.env.queued() > 15 * until  # the timers are there (simpy cannot cancel them) ...
        del sim
        counts.append(_live_tensors())
    assert counts[1] <= counts[0] + 5, counts  # ... but not the tensors of the rounds they belong to


def _random_releases(rng: random.Random, k: int, trial: int) -> list[Release]:
    out, t = [], 0.0
    for i in range(k):
        t += rng.random()
        mech = rng.choice(["gaussian", "laplace"]) if trial % 3 == 0 else "gaussian"
        out.append(Release(t, 3, rng.choice([-1, -1, 1, 2]) if trial % 2 else 4, i, 6, mech,
                           rng.choice(["gradient", "model"]), rng.choice([1.0, 2.0]), 0.5,
                           rng.choice([1.0, 0.1]), 0.5 if trial % 4 == 0 else 1.0,
                           rng.choice([0, 0, 3]) if trial % 4 == 0 else 0))
    return out


@pytest.mark.parametrize("trial", range(8))
def test_release_log_reads_back_as_the_records_it_was_given(trial):
    rng = random.Random(trial)
    ref = _random_releases(rng, rng.randint(0, 80), trial)
    log = ReleaseLog(3)
    for r in ref:
        log.append(r)
    assert len(log) == len(ref) and list(log) == ref and log[2:7] == ref[2:7]
    assert [log[i] for i in range(-len(ref), len(ref))] == ref + ref
    with pytest.raises(IndexError):
        log[len(ref)]
    for mode in ("observed", "amplified"):
        slow: list = []
        for r in ref:  # the per-record grouping the accountants did before
            ev, n = release_events(r, mode)
            if slow and slow[-1][0] == ev:
                slow[-1] = (ev, slow[-1][1] + n)
            else:
                slow.append((ev, n))
        assert grouped_events(log, mode) == slow
        if all(r.mechanism == "gaussian" for r in ref):
            assert epsilon(log, 1e-5, "rdp", mode) == epsilon(ref, 1e-5, "rdp", mode)


def test_release_log_costs_a_few_bytes_per_release():
    r = Release(0.0, 0, -1, 0, 1000, "gaussian", "gradient", 2.0, 1.0, 0.01, 1.0, 0)
    log = ReleaseLog(0)
    log.append(r)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(1, 20_001):
            log.append(Release(0.5 * i, 0, -1, i, 1000, "gaussian", "gradient", 2.0, 1.0, 0.01, 1.0, 0))
        per = (tracemalloc.get_traced_memory()[0] - base) / 20_000
    finally:
        tracemalloc.stop()
    assert per < 16, per  # time (8) + round (4), amortised array growth; a record was ~400
    assert log.nbytes() <= 12 * len(log) + 64 and len(log.specs) == 1


def test_cached_release_tags_keep_each_numbers_own_repr():
    """The tag cache must not hand back 1's tag for 1.0 (equal keys, different reprs in the trace)."""
    from netsim.trace.events import release_tag

    for q in (1, 1.0, 0.5, True):
        r = Release(0.0, 0, -1, 0, 3, "gaussian", "gradient", 2.0, 1.0, q, 1.0, 0)
        assert r.tag == f"gaussian gradient s=1.0 q={q!r} p=1.0 k=0" == release_tag("gaussian", "gradient", 1.0, q,
                                                                                      1.0, 0)
