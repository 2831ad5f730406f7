"""Composable link models for the network's full message path (sim/network.py).

Each is small and draws only from its link's own named streams, so the k-th message on a link sees
the same outcome whatever algorithm sent it:

- latency: the scenario's distribution, a per-link override (``[[network.links]]``, directed, so links
  can be asymmetric), or a measured CSV series (``network.trace``);
- loss: Bernoulli (``network.loss`` / override / CSV ``loss`` column) or Gilbert-Elliott bursts
  (``network.burst``), plus scheduled outages (``[[network.outages]]``);
- bandwidth: per link (FIFO per link, as the default path) and per node uplink (``network.uplink``,
  FIFO over all of the node's sends: a broadcast of k messages of s bytes ends at k*s/uplink).
"""

from __future__ import annotations

import bisect
import csv
import math
from pathlib import Path

import numpy as np

from netsim.errors import InputError
from netsim.scenario.schema import BurstSpec, NetworkSpec
from netsim.sim.dists import draws
from netsim.sim.streams import Draws, Streams

TRACE_COLUMNS = ("time", "src", "dst", "latency", "bandwidth", "loss")


class LinkSeries:
    """One link's measurements: piecewise constant, the row with the largest time <= t applies
    (before the first row, the first row). A missing cell = the scenario's own model."""

    __slots__ = ("times", "latency", "bandwidth", "loss")

    def __init__(self, rows: list[tuple[float, float | None, float | None, float | None]]):
        rows.sort(key=lambda r: r[0])
        self.times = [r[0] for r in rows]
        self.latency = [r[1] for r in rows]
        self.bandwidth = [r[2] for r in rows]
        self.loss = [r[3] for r in rows]

    def index(self, t: float) -> int:
        return max(0, bisect.bisect_right(self.times, t) - 1)


def read_link_trace(path: str | Path, agents: int | None = None) -> dict[tuple[int, int], LinkSeries]:
    """CSV ``time,src,dst,latency,bandwidth,loss`` (s, agent ids, s, bytes/s, probability) -> series
    per directed link. Any problem raises InputError naming the file and line."""
    p = Path(path)
    try:
        f = p.open(newline="", encoding="utf-8")
    except OSError as e:
        raise InputError("", f"cannot read link trace: {e.strerror or e}", str(p)) from None
    rows: dict[tuple[int, int], list] = {}
    with f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise InputError("", "empty link trace (expected header " + ",".join(TRACE_COLUMNS) + ")",
                             str(p)) from None
        except (csv.Error, UnicodeDecodeError) as e:
            raise InputError("", f"line 1: {e}", str(p)) from None
        if tuple(header) != TRACE_COLUMNS:
            raise InputError("", f"line 1: header must be {','.join(TRACE_COLUMNS)}, got {','.join(header)[:80]!r}",
                             str(p))
        line = 1
        try:
            for lineno, rec in enumerate(reader, start=2):
                line = lineno
                if not rec or all(not c.strip() for c in rec):
                    continue
                if len(rec) != len(TRACE_COLUMNS):
                    raise ValueError(f"expected {len(TRACE_COLUMNS)} fields, got {len(rec)}")
                t, src, dst = float(rec[0]), int(rec[1]), int(rec[2])
                opt = [float(c) if c.strip() else None for c in rec[3:]]
                lat, bw, loss = opt
                if not math.isfinite(t) or t < 0:
                    raise ValueError(f"time must be a finite number >= 0, got {rec[0]!r}")
                if src < 0 or dst < 0 or (agents is not None and (src >= agents or dst >= agents)):
                    top = "" if agents is None else f" in [0, {agents - 1}]"
                    raise ValueError(f"src/dst must be agent ids{top}, got {src},{dst}")
                if lat is not None and not (math.isfinite(lat) and lat >= 0):
                    raise ValueError(f"latency must be >= 0 s (finite), got {rec[3]!r}")
                if bw is not None and not bw > 0:
                    raise ValueError(f"bandwidth must be > 0 bytes/s, got {rec[4]!r}")
                if loss is not None and not 0 <= loss <= 1:
                    raise ValueError(f"loss must be in [0, 1], got {rec[5]!r}")
                rows.setdefault((src, dst), []).append((t, lat, bw, loss))
        except (ValueError, csv.Error, UnicodeDecodeError) as e:
            raise InputError("", f"line {line}: {e}", str(p)) from None
    if not rows:
        raise InputError("", "link trace has a header but no rows", str(p))
    return {k: LinkSeries(v) for k, v in rows.items()}


class GilbertElliott:
    """Two-state loss chain of one link, stepped once per message: the message is lost with the
    current state's loss probability, then the state moves (good -> bad w.p. p_enter, bad -> good
    w.p. p_exit). Two uniforms per message from the link's ``burst`` stream, always."""

    __slots__ = ("spec", "bad", "u")

    def __init__(self, spec: BurstSpec, rng: np.random.Generator, positions: bool = True):
        self.spec = spec
        self.bad = False
        self.u = Draws(rng.random, rng if positions else None)

    def lost(self) -> bool:
        s = self.spec
        lost = self.u() < (s.loss_bad if self.bad else s.loss_good)
        move = self.u()
        self.bad = (move >= s.p_exit) if self.bad else (move < s.p_enter)
        return lost

    @staticmethod
    def stationary_loss(spec: BurstSpec) -> float:
        pb = spec.p_enter / (spec.p_enter + spec.p_exit)
        return (1 - pb) * spec.loss_good + pb * spec.loss_bad


class FullLink:
    """A directed link with every configured model; built once per link on first use."""

    __slots__ = ("latency", "p_loss", "u_loss", "burst", "bandwidth", "busy_until", "series", "outages")

    def __init__(self, net: NetworkSpec, streams: Streams, src: int, dst: int, series: LinkSeries | None,
                 outages: list[tuple[float, float]], positions: bool = True):
        over = {}
        for o in net.links or ():
            if (o.src, o.dst) == (src, dst) or (o.both and (o.dst, o.src) == (src, dst)):
                over = {k: getattr(o, k) for k in ("latency", "loss", "bandwidth")
                        if getattr(o, k) is not None}
        self.latency = draws(over.get("latency", net.latency), streams.rng("latency", src, dst), positions=positions)
        self.p_loss = over.get("loss", net.loss)
        u = streams.rng("loss", src, dst)
        self.u_loss = Draws(u.random, u if positions else None)
        self.burst = GilbertElliott(net.burst, streams.rng("burst", src, dst), positions) if net.burst else None
        self.bandwidth = over.get("bandwidth", net.bandwidth)
        self.busy_until = 0.0
        self.series = series
        self.outages = outages

    def bandwidth_at(self, t: float) -> float | None:
        s = self.series
        if s is not None:
            bw = s.bandwidth[s.index(t)]
            if bw is not None:
                return bw
        return self.bandwidth

    def draw(self, t: float) -> tuple[float, str]:
        """(latency, drop reason or '') for a message sent at t; always the same draws per message."""
        lat = self.latency()
        u = self.u_loss()
        p = self.p_loss
        s = self.series
        if s is not None:
            i = s.index(t)
            if s.latency[i] is not None:
                lat = s.latency[i]
            if s.loss[i] is not None:
                p = s.loss[i]
        reason = ""
        for a, b in self.outages:
            if a <= t < b:
                reason = "outage"
        if self.burst is not None:
            if self.burst.lost() and not reason:
                reason = "loss"
        elif u < p and not reason:
            reason = "loss"
        return lat, reason


def outages_by_link(net: NetworkSpec, n: int) -> tuple[dict[tuple[int, int], list], list]:
    """Outage windows per directed link, plus those that apply to every link."""
    per: dict[tuple[int, int], list] = {}
    every: list = []
    for k, o in enumerate(net.outages or ()):
        for key, v in (("src", o.src), ("dst", o.dst)):
            if v is not None and v >= n:
                raise InputError(f"network.outages[{k}].{key}", f"agent id must be in [0, {n - 1}], got {v}")
        if o.src is None and o.dst is None:
            every.append((o.start, o.end))
        else:
            srcs = range(n) if o.src is None else (o.src,)
            dsts = range(n) if o.dst is None else (o.dst,)
            for i in srcs:
                for j in dsts:
                    per.setdefault((i, j), []).append((o.start, o.end))
    for k, o in enumerate(net.links or ()):
        for key, v in (("src", o.src), ("dst", o.dst)):
            if v >= n:
                raise InputError(f"network.links[{k}].{key}", f"agent id must be in [0, {n - 1}], got {v}")
    return per, every


def needs_full_path(net: NetworkSpec) -> bool:
    return bool(net.uplink or net.burst or net.outages or net.links or net.trace)
