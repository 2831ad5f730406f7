"""The memory a scenario needs, estimated from its keys before anything is built, so a scenario that cannot fit
is refused in one line instead of exhausting the machine (a complete graph of 10^6 agents is 10^12 edges).

The figures are upper-side estimates per item, measured on CPython 3.11: a directed edge of the networkx graph
(successor and predecessor dicts and its attribute dict) with its CSR weight and the agents' weight tables; an
agent (its object, streams, inbox, mini-batch blocks and its share of a round's arrays and trace rows: 10^5 to
10^6 agents of ``bench_scale`` D-PSGD peaked at ~11 KB an agent, ~5.5 KB of it beyond its data and edges); a
parameter row of the bank (held twice while the windowed engine or a checkpoint copies it); a training value
(generated as float64, then float32 in the same buffer: ``compute.data.float32_in_place``).
"""

from __future__ import annotations

import math
import os

from netsim.errors import InputError

EDGE_BYTES = 600
AGENT_BYTES = 6_000
VALUE_BYTES = 8


def edges(spec, n: int) -> float | None:
    """Directed edges of the topology (both ways for an undirected one); None when only building tells."""
    k, both = spec.kind, 1 if getattr(spec, "directed", False) else 2
    if k == "ring":
        return both * n
    if k in ("torus", "grid"):
        return 4 * n
    if k == "complete":
        return n * (n - 1)
    if k == "star":
        return 2 * (n - 1)
    if k == "erdos_renyi":
        return spec.p * n * (n - 1)
    if k == "random_regular":
        return spec.degree * n
    if k == "exponential":
        return both * n * max(1, math.ceil(math.log2(max(n - 1, 1))))
    return None


def available() -> int | None:
    """Bytes of memory this machine can give (Linux MemAvailable; elsewhere the physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def estimate(sc) -> list[tuple[str, str, float]]:
    """(scenario key, what, bytes) of the scenario's large parts."""
    n = sc.agents.count
    out = [("agents.count", f"{n:,} agents", float(n) * AGENT_BYTES)]
    e = edges(sc.topology, n)
    if e is not None:
        out.append(("topology", f"a {sc.topology.kind} graph of {e:,.0f} directed edges", e * EDGE_BYTES))
    data = sc.data
    if data.kind == "synthetic":
        values = float(data.samples) * data.features
        out.append(("data.samples", f"{data.samples:,} x {data.features} training values", values * VALUE_BYTES))
        if sc.model.kind == "logistic":
            row = data.features + 1
            out.append(("agents.count", f"a bank of {n:,} x {row:,} parameters", 2.0 * n * row * 8))
    return out


def check(sc, memory: int | None = None) -> None:
    """Refuse (InputError naming the dominant key) a scenario whose estimate exceeds the machine's memory."""
    memory = available() if memory is None else memory
    if memory is None:
        return
    parts = estimate(sc)
    total = sum(b for *_, b in parts)
    if total <= memory:
        return
    key, what, size = max(parts, key=lambda p: p[2])
    raise InputError(key, f"this scenario needs about {gib(total)} of memory ({what}: {gib(size)}), more than the "
                          f"{gib(memory)} this machine has available; use fewer agents or a sparser topology")


def gib(b: float) -> str:
    return f"{b / 2**30:,.1f} GiB" if b < 2**40 else f"{b / 2**40:,.1f} TiB"
