"""Kernel benchmark: raw simpy Store message passing vs netsim's message path, same pattern, one process.

Pattern: N agents on a ring; every agent wakes each `period` seconds and sends one message to its
successor; latency ~ Exp(mean 10 ms); the receiver takes messages from its inbox. Raw simpy uses the
idiom of simpy's own "event latency" example (a process per message that waits, then puts into the
receiver's Store). netsim runs the same through its whole path: agent clocks and activation, named
per-link RNG streams, the link model, message records, inboxes and tracing to an Arrow file.
Goal: netsim delivers >= 0.5x the messages/s of raw simpy.

    python benchmarks/kernel.py [--agents 64] [--until 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import attrs
import numpy as np
import simpy


def raw_simpy(n: int, until: float, period: float, seed: int) -> int:
    env = simpy.Environment()
    rng = np.random.default_rng(seed)
    stores = [simpy.Store(env) for _ in range(n)]
    received = [0]

    def latency(store, msg, delay):
        yield env.timeout(delay)
        store.put(msg)

    def sender(i):
        k = 0
        while True:
            yield env.timeout(period)
            env.process(latency(stores[(i + 1) % n], (i, k), rng.exponential(0.01)))
            k += 1

    def receiver(i):
        while True:
            yield stores[i].get()
            received[0] += 1

    for i in range(n):
        env.process(sender(i))
        env.process(receiver(i))
    env.run(until=until)
    return received[0]


@attrs.frozen
class _Params:
    pass


def _ping(agent, p):
    received = agent.service("bench_received", lambda: [0])  # the run's one counter of deliveries

    def receive():
        while True:
            yield agent.recv("m")
            received[0] += 1

    agent.spawn(receive())
    succ = (agent.id + 1) % agent.agent_count
    while True:
        yield agent.wake()
        agent.send(succ, None, tag="m", size=64)


def netsim_path(n: int, until: float, period: float, seed: int, out: Path) -> tuple[int, int]:
    from netsim.api import TRACE_FILE
    from netsim.scenario import scenario_from_dict, scenario_hash, to_toml
    from netsim.sim.kernel import Simulation
    from netsim.trace.io import TraceWriter

    sc = scenario_from_dict({
        "name": "kernel-bench",
        "run": {"seed": seed, "until": until},
        "agents": {"count": n, "activation": {"kind": "periodic", "period": period}},
        "topology": {"kind": "ring", "directed": True, "mixing": "column_stochastic"},
        "network": {"latency": {"kind": "exponential", "mean": 0.01}},
        "data": {"samples": 4 * n, "features": 2},
        "algorithm": {"name": "bench"},
        "evaluation": {"every": until},
    })
    text = to_toml(sc)
    writer = TraceWriter(out / TRACE_FILE, {"netsim.scenario": text, "netsim.scenario_sha256": scenario_hash(text)})
    sim = Simulation(sc, _ping, _Params(), writer=writer)
    sim.run()
    return sim.services.find("bench_received")[0], writer.count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--until", type=float, default=200.0)
    ap.add_argument("--period", type=float, default=0.1)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        raw_simpy(a.agents, 1.0, a.period, 0)  # warm-up: imports, pyarrow's one-time init
        netsim_path(a.agents, 1.0, a.period, 0, Path(tmp))
        for r in range(a.repeat):  # interleaved, so machine noise hits both alike
            t0 = time.perf_counter()
            m_raw = raw_simpy(a.agents, a.until, a.period, r)
            t_raw = time.perf_counter() - t0
            t0 = time.perf_counter()
            m_net, events = netsim_path(a.agents, a.until, a.period, r, Path(tmp))
            t_net = time.perf_counter() - t0
            rows.append((m_raw / t_raw, m_net / t_net, events / t_net))
    raw, net, ev = (np.median([r[i] for r in rows]) for i in range(3))
    print(f"agents={a.agents} simulated={a.until}s messages/run~{m_raw:,} (raw) {m_net:,} (netsim)")
    print(f"raw simpy Store      : {raw:12,.0f} messages/s")
    print(f"netsim message path  : {net:12,.0f} messages/s   ({ev:,.0f} traced events/s)")
    print(f"ratio netsim / raw   : {net / raw:.2f}x   (goal >= 0.5x; median of {a.repeat} interleaved runs)")


if __name__ == "__main__":
    main()
