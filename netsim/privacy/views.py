"""The mixing record: the weights each agent actually applied to which messages, written when a scenario asks
for it (``privacy.record = "mixing"``) as ``RUN/mixing.csv``.

Pairwise accounting (``netsim privacy RUN --pairwise``, netsim/privacy/pairwise.py) needs what the trace
does not hold: the weights of the mixing steps as applied (a missing or late neighbour's weight stays on
the receiver's own value; a time-varying graph changes them). ``Agent.mix`` and ``Agent.mix_into_params``
report each step here (a windowed batch after its ``combine``, each agent at its own time and in the engine's order:
``Batch.record_mixes``, ``MixingLog.mix_batches``); nothing is recorded, and no file written, unless the scenario
asks.

One row per (mixing step, weight): ``agent, step, t, released, src, weight, lr``. ``step`` counts the
agent's mixing steps from 0; ``released`` is how many releases (``Agent.privatize``) the agent had made
before this step; ``src`` is the sender whose message of this step the weight multiplies (``src == agent``:
the weight kept on the agent's own value); ``lr`` is the step size of the gradient step taken in the same
call (``mix_into_params``), 0 for a mix without a step (``Agent.mix``, or no step given). Floats are
written as Python's ``repr``, so they read back exactly.
"""

from __future__ import annotations

import csv
from array import array
from pathlib import Path

import attrs
import numpy as np

from netsim.errors import InputError
from netsim.sim.graph_arrays import spans

MIXING_FILE = "mixing.csv"
HEADER = ("agent", "step", "t", "released", "src", "weight", "lr")


class MixingLog:
    """The run's mixing steps as applied (one per ``Agent.mix`` / ``mix_into_params`` call)."""

    def __init__(self) -> None:
        self.steps: dict[int, int] = {}  # agent -> mixing steps so far
        self.agent, self.step, self.released, self.src = array("i"), array("i"), array("q"), array("i")
        self.t, self.weight, self.lr = array("d"), array("d"), array("d")
        self.views = None  # the delivered payloads and release values (privacy.record = "payloads": payloads.py)

    def mix(self, agent: int, t: float, released: int, self_weight: float, srcs, weights, lr: float = 0.0) -> None:
        """One mixing step of ``agent`` at time ``t``: ``self_weight`` on its own value, ``weights`` on the
        messages of ``srcs`` (same order)."""
        k = self.steps.get(agent, 0)
        self.steps[agent] = k + 1
        for src, w in ((agent, self_weight), *zip(srcs, weights, strict=True)):
            self.agent.append(agent)
            self.step.append(k)
            self.t.append(t)
            self.released.append(released)
            self.src.append(int(src))
            self.weight.append(float(w))
            self.lr.append(float(lr))

    def mix_rows(self, agent: np.ndarray, t: np.ndarray, released: np.ndarray, self_weight: np.ndarray,
                 counts: np.ndarray, srcs: np.ndarray, weights: np.ndarray, lr: np.ndarray) -> None:
        """``mix`` of M steps at once, in order: step m of ``agent[m]`` with ``counts[m]`` senders, whose ids and
        weights are the next ``counts[m]`` of ``srcs`` and ``weights`` (a windowed batch's, as arrays)."""
        m = len(agent)
        if not m:
            return
        o = np.argsort(agent, kind="stable")  # each agent's steps so far, then its rank among these
        a = agent[o]
        first = np.concatenate(([True], a[1:] != a[:-1]))
        at = np.flatnonzero(first)
        rank = np.empty(m, np.int64)
        rank[o] = np.arange(m) - np.repeat(at, np.diff(np.append(at, m)))
        uniq = a[at].tolist()
        base = np.array([self.steps.get(i, 0) for i in uniq], np.int64)
        self.steps.update(zip(uniq, (base + np.diff(np.append(at, m))).tolist()))
        step = base[np.searchsorted(a[at], agent)] + rank
        n = 1 + counts  # a row for the agent's own weight, then one per sender
        own = np.cumsum(n) - n
        src = np.repeat(agent, n)
        w = np.repeat(self_weight, n)
        rest = np.ones(len(src), bool)
        rest[own] = False
        src[rest], w[rest] = srcs, weights
        for col, v, dt in ((self.agent, np.repeat(agent, n), np.intc), (self.step, np.repeat(step, n), np.intc),
                           (self.t, np.repeat(t, n), np.float64), (self.released, np.repeat(released, n), np.longlong),
                           (self.src, src, np.intc), (self.weight, w, np.float64),
                           (self.lr, np.repeat(lr, n), np.float64)):
            col.frombytes(np.ascontiguousarray(v, dt).tobytes())

    def mix_batches(self, batches: list[tuple]) -> None:
        """Batches' mixing steps (``Batch.take_mix_rows``' tuples: each step's order and call, agent, time, releases,
        own weight and senders' count, then the senders and their weights, and the step size) through ``mix_rows``, in
        the order of (order, call); a step whose order is negative is not written."""
        if not batches:
            return
        order, call, agent, t, released, keep, counts, srcs, ws, lr = (np.concatenate(c) for c in zip(*batches))
        o = np.lexsort((call, order))
        o = o[order[o] >= 0]
        at = spans((np.cumsum(counts) - counts)[o], counts[o])  # (each step's senders and weights moved with it)
        self.mix_rows(agent[o], t[o], released[o], keep[o], counts[o], srcs[at], ws[at], lr[o])

    COLUMNS = ("agent", "step", "t", "released", "src", "weight", "lr")  # (the arrays' order in ``held``)

    def held(self) -> tuple[list, dict[str, np.ndarray]]:
        """The record so far as a windowed checkpoint keeps it: each agent's count of steps (plain) and the columns
        (arrays)."""
        return [[a, k] for a, k in sorted(self.steps.items())], \
            {c: np.frombuffer(getattr(self, c), dtype=getattr(self, c).typecode).copy() for c in self.COLUMNS}

    def take(self, steps: list, columns: dict[str, np.ndarray]) -> None:
        """``held``'s record back into a fresh run's log; ValueError where it is not one."""
        n = len(columns.get("agent", ()))
        if not (isinstance(steps, list) and all(isinstance(e, list) and len(e) == 2 and type(e[0]) is int
                                                and type(e[1]) is int and e[1] > 0 for e in steps)
                and set(columns) == set(self.COLUMNS) and all(len(v) == n for v in columns.values())):
            raise ValueError("mixing: not a mixing record")
        for c in self.COLUMNS:
            col = getattr(self, c)
            want = np.dtype(col.typecode)
            got = np.asarray(columns[c])
            if got.dtype != want:
                raise ValueError(f"mixing.{c}: not {want}")
            setattr(self, c, array(col.typecode, np.ascontiguousarray(got).tobytes()))
        self.steps = {a: k for a, k in steps}

    def write(self, path: Path) -> Path:
        """Write the record as CSV (atomically: a temporary file renamed)."""
        tmp = path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(HEADER)
            for row in zip(self.agent, self.step, self.t, self.released, self.src, self.weight, self.lr,
                           strict=True):
                a, k, t, r, s, wt, lr = row
                w.writerow((a, k, repr(t), r, s, repr(wt), repr(lr)))
        tmp.replace(path)
        return path


@attrs.frozen
class MixingRecord:
    """A mixing record read back: numpy columns in file order (``HEADER``)."""

    agent: np.ndarray
    step: np.ndarray
    t: np.ndarray
    released: np.ndarray
    src: np.ndarray
    weight: np.ndarray
    lr: np.ndarray

    def __len__(self) -> int:
        return len(self.agent)


def read_mixing(path: Path) -> MixingRecord:
    """Read ``mixing.csv``; a file that does not parse is one InputError naming it."""
    cols: list[list] = [[] for _ in HEADER]
    try:
        with Path(path).open(newline="") as f:
            r = csv.reader(f)
            head = next(r, None)
            if tuple(head or ()) != HEADER:
                raise ValueError(f"header must be {','.join(HEADER)}, got {','.join(head or [])!r}")
            for n, row in enumerate(r, start=2):
                if len(row) != len(HEADER):
                    raise ValueError(f"line {n}: {len(row)} fields, expected {len(HEADER)}")
                a, k, t, rel, s, w, lr = row
                for c, v in zip(cols, (int(a), int(k), float(t), int(rel), int(s), float(w), float(lr)),
                                strict=True):
                    c.append(v)
    except (OSError, ValueError) as e:
        raise InputError(MIXING_FILE, f"cannot read the mixing record: {e}", str(path)) from None
    ints = {"agent", "step", "released", "src"}
    return MixingRecord(*(np.asarray(c, dtype=np.int64 if h in ints else np.float64)
                          for h, c in zip(HEADER, cols, strict=True)))


def mixing_log_for(sim) -> MixingLog | None:
    """The run's mixing log when its scenario asks for one (``privacy.record = "mixing"``, or ``"payloads"``,
    which also keeps the payloads: netsim/privacy/payloads.py), else None."""
    spec = getattr(sim.scenario, "privacy", None)
    if spec is None or spec.record is None:
        return None
    log = sim.services.get(MixingLog)
    if spec.record == "payloads" and log.views is None:
        from netsim.privacy.payloads import view_log_for

        log.views = view_log_for(sim)
    return log


def write_mixing(sim, folder: Path) -> Path | None:
    """Write ``mixing.csv`` (and ``payloads.npz`` when asked) into the run folder if the run recorded its mixing
    steps."""
    log = sim.services.find(MixingLog)
    if log is None:
        return None
    if log.views is not None:
        from netsim.privacy.payloads import PAYLOADS_FILE

        log.views.write(Path(folder) / PAYLOADS_FILE)
    return log.write(Path(folder) / MIXING_FILE)
