"""An agent's releases, stored compactly (a long run makes millions of them).

A ``Release`` record costs about 350 bytes in memory (a slotted attrs object, its tag string and its
boxed floats); 10,000 agents x 1,000 releases would be 3.5 GB. ``ReleaseLog`` keeps what varies from
release to release in typed arrays (time: 8 bytes, round: 4 bytes; recipient and skipped ticks: 4 bytes
each, created only once they vary: most agents release to one recipient and skip no tick) and what
rarely varies (size, mechanism, what, scale, sensitivity, q, p) run-length encoded: a new run starts
when that tuple changes, and each distinct tuple is stored once. It is a ``Sequence[Release]``:
indexing and iteration give back records equal to the ones traced, so every accountant, report and
test reads it as the list it replaces, and ``grouped_events`` composes runs directly without building
one record per release.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Sequence
from typing import overload

from netsim.trace.events import Release

Spec = tuple[int, str, str, float, float, float, float]  # size, mechanism, what, scale, sensitivity, q, p


class ReleaseLog(Sequence[Release]):
    """One agent's releases in arrival order (append-only)."""

    __slots__ = ("agent", "t", "round", "to0", "to", "skipped", "specs", "_spec_ids", "run_start", "run_spec")

    def __init__(self, agent: int):
        self.agent = int(agent)
        self.t = array("d")
        self.round = array("i")
        self.to0 = -1  # the recipient of every release while ``to`` is None
        self.to: array | None = None  # created at the first release to another recipient
        self.skipped: array | None = None  # created at the first nonzero skip (zeros before it)
        self.specs: list[Spec] = []  # distinct (size, mechanism, what, scale, sensitivity, q, p)
        self._spec_ids: dict[Spec, int] = {}
        self.run_start = array("q")  # index of the first release of each run
        self.run_spec = array("i")  # the run's spec id

    def load_specs(self, specs: list[Spec]) -> None:
        """Put back a saved log's distinct specs, in their order (their ids), as ``append`` made them."""
        self.specs = list(specs)
        self._spec_ids = {s: n for n, s in enumerate(self.specs)}

    def append(self, r: Release) -> None:
        self.append_fields(r.t, r.round, r.peer, r.skipped, (r.size, r.mechanism, r.what, r.scale, r.sensitivity,
                                                             r.q, r.p))

    def append_fields(self, t: float, round: int, to: int, skipped: int, spec: Spec) -> None:
        """``append`` of the release these fields make (``spec``: size, mechanism, what, scale, sensitivity, q,
        p), without building its record."""
        sid = self._spec_ids.get(spec)
        if sid is None:
            sid = self._spec_ids[spec] = len(self.specs)
            self.specs.append(spec)
        n = len(self.t)
        if not self.run_spec or self.run_spec[-1] != sid:
            self.run_start.append(n)
            self.run_spec.append(sid)
        self.t.append(t)
        self.round.append(round)
        if self.to is not None:
            self.to.append(to)
        elif to != self.to0:
            if n == 0:
                self.to0 = to
            else:
                self.to = array("i", [self.to0]) * n
                self.to.append(to)
        if skipped:
            if self.skipped is None:
                self.skipped = array("i", [0]) * n
            self.skipped.append(skipped)
        elif self.skipped is not None:
            self.skipped.append(0)

    def __len__(self) -> int:
        return len(self.t)

    def _record(self, i: int, spec: Spec) -> Release:
        size, mech, what, scale, sens, q, p = spec
        k = self.skipped[i] if self.skipped is not None else 0
        to = self.to[i] if self.to is not None else self.to0
        return Release(self.t[i], self.agent, to, self.round[i], size, mech, what, scale, sens, q, p, k)

    @overload
    def __getitem__(self, i: int) -> Release: ...
    @overload
    def __getitem__(self, i: slice) -> list[Release]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("release index out of range")
        run = bisect.bisect_right(self.run_start, i) - 1
        return self._record(i, self.specs[self.run_spec[run]])

    def runs(self) -> Iterator[tuple[Spec, int, int]]:
        """(spec, first index, end index) of each run of releases sharing one spec."""
        starts, n = self.run_start, len(self)
        for k, sid in enumerate(self.run_spec):
            yield self.specs[sid], starts[k], starts[k + 1] if k + 1 < len(starts) else n

    def __iter__(self) -> Iterator[Release]:
        for spec, a, b in self.runs():
            for i in range(a, b):
                yield self._record(i, spec)

    def ticks(self, a: int = 0, b: int | None = None) -> int:
        """Activation ticks releases a..b-1 stand for (each release plus the ticks skipped before it)."""
        b = len(self) if b is None else b
        return (b - a) + (sum(self.skipped[a:b]) if self.skipped is not None else 0)

    def grouped_events(self, mode: str = "observed") -> list:
        """``accountants.grouped_events`` of these releases, one accountant event per run (equal result)."""
        from netsim.privacy.accountants import release_events

        out: list = []
        for spec, a, b in self.runs():
            ev, _ = release_events(self._record(a, spec), mode)  # validates mode, as per release
            n = (b - a) if mode == "observed" else self.ticks(a, b)
            if out and out[-1][0] == ev:
                out[-1] = (ev, out[-1][1] + n)
            else:
                out.append((ev, n))
        return out

    def nbytes(self) -> int:
        """Bytes held by the arrays (the specs list aside)."""
        arrays = (self.t, self.round, self.to, self.run_start, self.run_spec, self.skipped)
        return sum(x.itemsize * len(x) for x in arrays if x is not None)
