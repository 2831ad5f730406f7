"""Time-varying topologies: the neighbour lists an agent uses change from epoch to epoch.

An agent adopts the graph of the current epoch at each activation (so one round of a synchronous
algorithm sees one graph). The epoch is the agent's round (``every = "round"``, k = activations - 1:
all agents in round k use the same graph whatever their clocks) or ``floor(t / period)`` of the
global clock (``every = "period"``). Kinds:

- ``one_peer_exponential``: in epoch k agent i sends only to (i + 2^(k mod m)) mod n and mixes with
  weights 1/2 (own) and 1/2 (the one in-neighbour), m = floor(log2(n - 1)) + 1 (Assran et al.,
  "Stochastic Gradient Push", ICML 2019, Sec. 5 / App.; as in Zhu, Huang, Wang, Xu, "PrivSGP-VR",
  App. D: P^k = (I + Pi_k)/2). For n a power of two the product of m consecutive P^k is exactly the
  averaging matrix (Ying et al.,
  "Exponential Graph is Provably Efficient for Decentralized Deep Training", NeurIPS 2021, Thm 1).
- ``resample``: a fresh draw of the scenario's (random) topology every epoch, from the
  ``topology_schedule`` stream keyed by the epoch (the same graphs for every algorithm).
- ``schedule``: the listed topologies in turn (epoch k uses graphs[k mod len]).

``sim.graph``/``sim.W`` (and the summary's spectral gap) stay the initial, static topology.
"""

from __future__ import annotations

import math

import numpy as np

from netsim.errors import InputError
from netsim.sim.topology import weighted_graph

Lists = tuple[list[int], list[int], dict[int, float], float]  # out, in, weights by sender, self weight


def one_peer_exponential(n: int, k: int) -> list[Lists]:
    m = (n - 1).bit_length()  # floor(log2(n - 1)) + 1 hops: 1, 2, 4, ..., < n
    h = 2 ** (k % m)
    return [([(i + h) % n], [(i - h) % n], {(i - h) % n: 0.5}, 0.5) for i in range(n)]


def lists_of(g, W) -> list[Lists]:
    out = []
    for i in range(W.shape[0]):
        row = W.getrow(i)
        out.append((sorted(g.successors(i)), sorted(g.predecessors(i)),
                    {int(j): float(w) for j, w in zip(row.indices, row.data, strict=True) if j != i},
                    float(W[i, i])))
    return out


class DynamicTopology:
    """Epoch -> every agent's neighbour lists (the last few epochs cached)."""

    def __init__(self, sim):
        self.sim = sim
        sc = sim.scenario
        self.spec = sc.topology.dynamic
        self.base = sc.topology
        self.n = sc.agents.count
        self.cache: dict[int, list[Lists]] = {}
        self.adopted = [0] * self.n  # the epoch whose links each agent holds (a checkpoint's)
        if self.spec.kind == "schedule":
            for k, g in enumerate(self.spec.graphs):
                try:
                    weighted_graph(g, self.n, 0)
                except InputError as e:
                    sub = e.key.removeprefix("topology").lstrip(".")
                    key = f"topology.dynamic.graphs[{k}]" + (f".{sub}" if sub else "")
                    raise InputError(key, e.message) from None
        elif self.spec.kind == "resample":
            if self.base.kind not in ("erdos_renyi", "random_regular"):
                raise InputError("topology.dynamic.kind", "'resample' needs a random topology.kind "
                                 f"(erdos_renyi, random_regular), not {self.base.kind!r}")

    def seed(self, epoch: int) -> int:
        ss = self.sim.streams.seed_sequence("topology_schedule", epoch)
        return int(ss.generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))

    def at(self, epoch: int) -> list[Lists]:
        got = self.cache.get(epoch)
        if got is None:
            kind = self.spec.kind
            if kind == "one_peer_exponential":
                got = one_peer_exponential(self.n, epoch)
            elif kind == "resample":
                got = lists_of(*weighted_graph(self.base, self.n, self.seed(epoch)))
            else:
                graphs = self.spec.graphs
                got = lists_of(*weighted_graph(graphs[epoch % len(graphs)], self.n, self.seed(epoch)))
            if len(self.cache) > 16:
                self.cache.pop(next(iter(self.cache)))
            self.cache[epoch] = got
        return got

    def epoch(self, agent, now: float | None = None) -> int:
        if self.spec.every == "round":
            return max(0, agent.round - 1)
        return int(math.floor((agent.env.now if now is None else now) / self.spec.period))

    def adopt(self, agent, now: float | None = None) -> None:
        """The agent takes the graph of its current epoch (at ``now``: a windowed driver's time; default the
        environment's)."""
        k = self.adopted[agent.id] = self.epoch(agent, now)
        agent.adopt_links(*self.at(k)[agent.id])

    def readopt(self, epochs: list) -> None:
        """A restored run's agents take the links of the epochs they held at the checkpoint (``adopted``); ValueError
        unless ``epochs`` is an epoch for each agent."""
        if not (isinstance(epochs, list) and len(epochs) == self.n
                and all(type(k) is int and 0 <= k < 2**62 for k in epochs)):
            raise ValueError("dynamic: not an epoch for each agent")
        for a, k in zip(self.sim.agents, epochs, strict=True):
            self.adopted[a.id] = k
            a.adopt_links(*self.at(k)[a.id])

    def install(self) -> None:
        """Each agent adopts the current graph when an activation fires (before its program resumes)."""
        for a in self.sim.agents:
            self.adopt(a)  # epoch 0 before the first activation
            a.on_activation(self.adopt)
