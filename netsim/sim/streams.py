"""Named random streams: one independent generator per (purpose, key...) from the run's seed.

Streams are addressed, not spawned in order (``SeedSequence(seed, spawn_key=(purpose, *key))``), so
creating a stream never shifts another: a different algorithm, or a different number of messages on
one link, leaves every other stream's draws unchanged (principle 4).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

import numpy as np

PURPOSES = {
    "topology": 1, "clock": 2, "activation": 3, "compute": 4, "latency": 5, "loss": 6,
    "data": 7, "partition": 8, "batch": 9, "init": 10, "noise": 11, "algorithm": 12,
}
# link and agent models (issue 4): numbered apart so concurrent additions cannot collide
PURPOSES.update({"burst": 40, "churn": 41, "jitter": 42, "topology_schedule": 43})
# communication parts (issue 6): rand-k seeds and QSGD rounding
PURPOSES.update({"compress": 60})
# seed 000 (issue 8): the held-out validation rows, Monte-Carlo Shapley permutations
PURPOSES.update({"validation": 80, "shapley": 81})
# seed algorithms (issue 7): seed 001's per-agent data stream (online learning)
PURPOSES.update({"data_stream": 71})
# data options: per-agent subsampling (data.per_agent)
PURPOSES.update({"subsample": 90})
BLOCK = 256


class Streams:
    """The stream tree of one run."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._cache: dict[tuple[int, ...], np.random.Generator] = {}

    def rng(self, purpose: str, *key: int) -> np.random.Generator:
        k = (PURPOSES[purpose], *map(int, key))
        g = self._cache.get(k)
        if g is None:
            g = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=k)))
            self._cache[k] = g
        return g

    def seed_for(self, purpose: str, *key: int) -> int:
        """A 63-bit integer seed (for torch generators and networkx) from the named stream."""
        return int(self.rng(purpose, *key).integers(2**63 - 1))


class Draws:
    """Scalar draws from a stream, generated in blocks (one numpy call per BLOCK draws).

    Consumption order is the only thing that matters for determinism, and it is the event order.
    A block is held as ``array('d')`` (2 KiB), not a list of Python floats (8 KiB): a link keeps one
    block per stream it draws from, and a 10,000-agent run has tens of thousands of links. Iterating
    an array yields the same float64 values as ``tolist()``, as fast (measured).
    """

    __slots__ = ("_fill", "_it")

    def __init__(self, fill: Callable[[int], np.ndarray]):
        self._fill = fill
        self._it = iter(())

    def __call__(self) -> float:
        try:
            return next(self._it)
        except StopIteration:
            block = array("d")
            block.frombytes(np.ascontiguousarray(self._fill(BLOCK), dtype=np.float64).tobytes())
            self._it = iter(block)
            return next(self._it)
