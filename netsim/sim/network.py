"""Messages and links: latency + size/bandwidth transfer + Bernoulli loss, per directed link.

Each link draws its latency and loss from its own named streams ("latency", src, dst) and
("loss", src, dst), one draw of each per message, so the k-th message on a link sees the same
network whatever algorithm sent it. A link transmits one message at a time (FIFO uplink per link).

A link model is an object with one method, ``outcome(src, dst, now, size) -> (transmission end, delay,
drop reason or "")``: it decides what happens to a message sent at ``now`` (``LinkModel``). ``send`` runs
the lean default inline (latency distribution, per-link bandwidth, Bernoulli loss: ``LeanLinks`` is the
same as a model) unless a model is installed (``Network.use``): when the scenario configures any other
model (node uplinks, Gilbert-Elliott bursts, outages, per-link overrides, a measured link trace, churn)
``attach`` installs ``ComposedLinks``, which composes the models of sim/links.py and sim/churn.py; replay
installs the recorded outcomes. Unconfigured models therefore cost one comparison per message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import simpy

from netsim.errors import InputError, claim
from netsim.scenario.schema import NetworkSpec
from netsim.sim import rows as shapes
from netsim.sim.dists import draws
from netsim.sim.env import Timeout
from netsim.sim.streams import FIRST_BLOCK, Ahead, Draws, Streams


class Message(NamedTuple):
    """One message on its way or received (immutable; a named tuple: created once per send, so cheap)."""

    id: int
    src: int
    dst: int
    tag: str
    round: int
    payload: Any
    size: int
    sent: float


_new_message = tuple.__new__  # ``Message(...)`` without the named tuple's Python ``__new__``: one per send, hot


class Link:
    __slots__ = ("latency", "lost", "busy_until")

    def __init__(self, latency, lost):
        self.latency = latency
        self.lost = lost
        self.busy_until = 0.0


def payload_size(payload: Any) -> int:
    """Bytes on the wire: a tensor's/array's ``nbytes``, else the payload's own ``nbytes``/``size_bytes``."""
    for attr in ("size_bytes", "nbytes"):
        n = getattr(payload, attr, None)
        if n is not None:
            return int(n)
    numel = getattr(payload, "numel", None)
    if numel is not None:
        return int(numel() * payload.element_size())
    return 8


def hold_time(tx_end: float, now: float) -> float:
    """How long a send holds its sender's program (``Agent.send``, ``Agent.broadcast``: the longest over its links, a
    Timeout of it when positive): the rest of its transmission, ending at ``tx_end``. Every engine's one expression."""
    return tx_end - now


def delay(tx_end, now, latency):
    """A message's delay from its send at ``now`` to its arrival: the rest of its transmission (ending at ``tx_end``),
    then the link's ``latency`` (floats or arrays: the same expression, so the same bits, in every engine)."""
    return tx_end - now + latency


class LinkModel(Protocol):
    """What decides a message's fate: ``outcome(src, dst, now, size)`` returns (the time its transmission
    ends, so the sender is busy until then; its delay from ``now`` to arrival; a drop reason, "" if it
    arrives). Called once per message, in send order; a model draws from its own named streams."""

    def outcome(self, src: int, dst: int, now: float, size: int) -> tuple[float, float, str]: ...


class LeanLinks:
    """The default path as a model (what ``Network.send`` inlines): latency, per-link bandwidth, loss."""

    def __init__(self, net: Network):
        self.net = net

    def outcome(self, src: int, dst: int, now: float, size: int) -> tuple[float, float, str]:
        net = self.net
        link = net.link(src, dst)
        tx_end = now
        if net.bandwidth is not None:
            tx_end = max(now, link.busy_until) + size / net.bandwidth
            link.busy_until = tx_end
        d = delay(tx_end, now, link.latency())
        lost = link.lost is not None and link.lost() < net.p_loss
        return tx_end, d, shapes.TEXT.loss if lost else shapes.TEXT.none

    def outcomes(self, src: int, dsts: Sequence[int], now: float, size: int) -> tuple[list, list, float]:
        return lean_outcomes(self.net, src, dsts, now, size)


def lean_outcomes(net: Network, src: int, dsts: Sequence[int], now: float, size: int) -> tuple[list, list, float]:
    """``LeanLinks.outcome`` of one payload to each of ``dsts`` in send order, in one call (a broadcast: the engine's
    ``send_all`` and the windows take this): their delays, their drop reasons, the longest ``hold_time``. Each link's
    statements are ``outcome``'s, inlined: the same draws and the same bits."""
    links, bandwidth, p_loss, loss, none = net.links, net.bandwidth, net.p_loss, shapes.TEXT.loss, shapes.TEXT.none
    delays, reasons, longest = [], [], 0.0
    for dst in dsts:
        link = links.get((src, dst)) or net.link(src, dst)
        tx_end = now
        if bandwidth is not None:
            tx_end = max(now, link.busy_until) + size / bandwidth
            link.busy_until = tx_end
            h = hold_time(tx_end, now)
            if h > longest:
                longest = h
        delays.append(delay(tx_end, now, link.latency()))
        reasons.append(loss if link.lost is not None and link.lost() < p_loss else none)
    return delays, reasons, longest


class Broadcasts:
    """``LeanLinks.outcome`` of many senders' broadcasts at once, each sender to all its out-links (``dsts[i]``, in send
    order), for a driver that plans a run's broadcasts round by round. A link draws from its own streams, in its own
    order, whatever the order across links: so each link's next ``cols`` latency and loss draws are taken at once
    (``Draws.take``), and a round's outcomes are array work. The same statements as ``outcome``'s, over arrays (the
    same draws, the same bits); ``close`` leaves each link's ``busy_until`` where the last send put it."""

    def __init__(self, net: Network, dsts: Sequence[Sequence[int]], cols: int = 32):
        import numpy as np

        self.net = net
        self.deg = np.array([len(d) for d in dsts], np.int64)
        self.ptr = np.concatenate(([0], np.cumsum(self.deg)))
        self.links = [net.link(i, j) for i, d in enumerate(dsts) for j in d]
        self.lat = np.empty((len(self.links), cols))
        self.u = np.full((len(self.links), cols), np.inf)  # (no loss stream: never lost)
        self.busy = np.array([lk.busy_until for lk in self.links], np.float64)
        self.ahead = Ahead(len(dsts), cols)  # each sender's column: one a broadcast, for all its links

    def _take(self, i: int) -> None:
        cols = self.ahead.cols
        for r in range(int(self.ptr[i]), int(self.ptr[i + 1])):
            link = self.links[r]
            for out, f in ((self.lat, link.latency), (self.u, link.lost)):
                if f is not None:
                    take = getattr(f, "take", None)  # (a constant's callable has none)
                    out[r] = take(cols) if take is not None else [f() for _ in range(cols)]

    def __call__(self, ids, nows, size: int):
        """The broadcasts of senders ``ids`` (distinct) at times ``nows``: each message's delay and whether it is
        lost, the senders' links in order, and each sender's longest ``hold_time``."""
        import numpy as np

        from netsim.sim.graph_arrays import spans

        g = self.deg[ids]
        col = np.repeat(self.ahead.next(ids, self._take), g)
        starts = np.cumsum(g) - g
        at = spans(self.ptr[ids], g)
        now = np.repeat(np.asarray(nows, np.float64), g)
        tx_end, hold, bandwidth = now, np.zeros(len(ids)), self.net.bandwidth
        if bandwidth is not None:
            tx_end = np.maximum(now, self.busy[at]) + size / bandwidth
            self.busy[at] = tx_end
            has = g > 0
            if has.any():
                hold[has] = np.maximum(np.maximum.reduceat(hold_time(tx_end, now), starts[has]), 0.0)
        return delay(tx_end, now, self.lat[at, col]), self.u[at, col] < self.net.p_loss, hold

    def close(self) -> None:
        for link, t in zip(self.links, self.busy.tolist()):
            link.busy_until = t


def outcomes(model: LinkModel) -> Callable[[int, Sequence[int], float, int], tuple[list, list, float]]:
    """``model``'s outcomes of a broadcast in one call: its own ``outcomes`` where it has one (``LeanLinks``), else
    its ``outcome`` link by link in send order, as ``Network.send_all`` takes them (their delays, their drop reasons,
    the longest ``hold_time``)."""
    own = getattr(model, "outcomes", None)
    if own is not None:
        return own
    one = model.outcome

    def each(src: int, dsts: Sequence[int], now: float, size: int) -> tuple[list, list, float]:
        delays, reasons, longest = [], [], 0.0
        for dst in dsts:
            tx_end, d, reason = one(src, dst, now, size)
            delays.append(d)
            reasons.append(reason)
            h = hold_time(tx_end, now)
            if h > longest:
                longest = h
        return delays, reasons, longest

    return each


class LinksAhead:
    """The first block (``FIRST_BLOCK`` values) of each topology link's latency and loss draws, drawn for a chunk of
    links at once (``first_doubles``: the streams' own values, without making their generators); a link's
    generators are made, past that block, only if it draws more (``FirstDrawn``). For a run no checkpoint cuts
    (no positions kept), with a uniform or constant latency; ``of`` says None elsewhere, or where this numpy's
    draws are not ``first_doubles``' (checked on the run's first links)."""

    CHUNK = 4096  # links drawn together (4096 x 2 streams x 32 values: 2 MiB, freed once the chunk's links are made)

    def __init__(self, net: Network, edges):
        import numpy as np

        self.net = net
        self.edges = np.asarray(edges, dtype=np.int64)
        self.row = {e: k for k, e in enumerate(map(tuple, self.edges.tolist()))}
        self.chunks: dict[int, tuple] = {}
        self.left: dict[int, int] = {}  # chunk -> its links not made yet

    @classmethod
    def of(cls, net: Network, edges) -> LinksAhead | None:
        from netsim.sim.streams import first_doubles_exact, purpose_code, seed_states

        lat = net.spec.latency
        if edges is None or not len(edges) or net.restored or lat.kind not in ("uniform", "constant"):
            return None
        import numpy as np

        keys = np.column_stack([np.full(min(2, len(edges)), purpose_code("loss")), np.asarray(edges[:2])])
        low, high = (lat.low, lat.high) if lat.kind == "uniform" else (0.0, 1.0)
        return cls(net, edges) if first_doubles_exact(seed_states(net.streams.seed, keys), low, high) else None

    def _draw(self, c: int) -> tuple:
        got = self.chunks[c] = self._blocks(c)
        self.left[c] = min(self.CHUNK, len(self.edges) - c * self.CHUNK)
        return got

    def _blocks(self, c: int) -> tuple[bytes | None, bytes | None]:
        """Chunk ``c``'s first blocks, as float64 bytes: its links' latencies (None: a constant) and loss draws (None:
        no loss)."""
        import numpy as np

        from netsim.sim.streams import first_doubles, purpose_code, seed_states

        net, lat = self.net, self.net.spec.latency
        edges = self.edges[c * self.CHUNK:(c + 1) * self.CHUNK]
        seed = net.streams.seed

        def block(purpose: str):
            keys = np.column_stack([np.full(len(edges), purpose_code(purpose)), edges])
            return first_doubles(seed_states(seed, keys), FIRST_BLOCK)

        lats = None if lat.kind == "constant" else (lat.low + (lat.high - lat.low) * block("latency")).tobytes()
        losses = block("loss").tobytes() if net.p_loss > 0 else None  # (a link's block: a slice of the bytes)
        return lats, losses

    def link(self, src: int, dst: int) -> Link | None:
        """Link (src, dst) with its first draws taken from its chunk's blocks (None: not a topology link)."""
        from netsim.sim.streams import FirstDrawn

        k = self.row.pop((src, dst), None)
        if k is None:
            return None
        c, r = divmod(k, self.CHUNK)
        lats, losses = self.chunks.get(c) or self._draw(c)
        self.left[c] -= 1
        if not self.left[c]:
            del self.chunks[c], self.left[c]
        spec = self.net.spec.latency
        more_lat, more_lost = self._past(src, dst)
        at = slice(r * 8 * FIRST_BLOCK, (r + 1) * 8 * FIRST_BLOCK)
        lat = draws(spec, None, "network.latency") if lats is None else FirstDrawn(lats[at], more_lat)
        lost = None if losses is None else FirstDrawn(losses[at], more_lost)
        return Link(lat, lost)

    def _past(self, src: int, dst: int) -> tuple[Callable, Callable]:
        """Link (src, dst)'s samplers of its latency and its loss draws past their first blocks, each made when
        called (its stream then made and moved past the block)."""
        from netsim.sim.dists import sampler

        spec, streams = self.net.spec.latency, self.net.streams

        def past(purpose: str):  # the stream, moved past its first block
            rng = streams.rng(purpose, src, dst)
            rng.bit_generator.advance(FIRST_BLOCK)
            return rng

        return (lambda: sampler(spec, past("latency"), "network.latency")), (lambda: past("loss").random)

    # every link's first blocks at once, a link addressed by its row (a driver that pushes to fixed neighbours)
    def rows_of(self, src: int, dsts: list[int]) -> list[int]:
        """The rows of links (src, d) for each d of ``dsts`` (the addresses of ``flat``'s outcomes)."""
        row = self.row
        return [row[(src, d)] for d in dsts]

    def flat(self) -> Callable[[int, int, int, float], tuple[float, float, str]]:
        """Every link's first blocks drawn now into two flat arrays, and ``outcome(r, src, dst, now)``:
        ``LeanLinks.outcome`` of link ``r`` = (src, dst) (its row: ``rows_of``) with no bandwidth, its next latency and
        loss draw read there, the same values in the same order; past its first blocks, from its own streams
        (``Network.link``). ``link`` is not used after this."""
        from array import array

        lats, losses = array("d"), array("d")
        for c in range(-(-len(self.edges) // self.CHUNK)):  # (a chunk's bytes freed once they are copied)
            for into, got in zip((lats, losses), self._blocks(c), strict=True):
                if got is not None:
                    into.frombytes(got)
        lats = lats if len(lats) else None  # (None: a constant latency; no loss)
        losses = losses if len(losses) else None
        used = [0] * len(self.edges)  # each link's draws taken (of each of its streams)
        net, spec = self.net, self.net.spec.latency
        constant = float(spec.value) if lats is None else 0.0
        p_loss, lost, kept, past = net.p_loss, shapes.TEXT.loss, shapes.TEXT.none, self._past
        lean = LeanLinks(net).outcome  # (past a link's first blocks)

        def outcome(r: int, src: int, dst: int, now: float) -> tuple[float, float, str]:
            k = used[r]
            used[r] = k + 1
            if k < FIRST_BLOCK:
                x = r * FIRST_BLOCK + k
                return now, delay(now, now, constant if lats is None else lats[x]), \
                    lost if losses is not None and losses[x] < p_loss else kept
            if k == FIRST_BLOCK:  # the link's own draws from here on
                more_lat, more_lost = past(src, dst)
                net.links[(src, dst)] = Link(draws(spec, None, "network.latency") if lats is None else
                                             Draws(more_lat()), None if losses is None else Draws(more_lost()))
            return lean(src, dst, now, 0)

        return outcome


class ComposedLinks:
    """The configured models composed (sim/links.py's per-link models, uplinks, outages, churn)."""

    def __init__(self, net: Network):
        self.net = net

    def outcome(self, src: int, dst: int, now: float, size: int) -> tuple[float, float, str]:
        net = self.net
        link = net.full_link(src, dst)
        churn = net.churn
        lat, reason = link.draw(now)
        if churn is not None and churn.offline(src, now):
            return now, lat, "offline"
        tx_end = net.transfer(link, src, now, size)
        d = delay(tx_end, now, lat)
        if not reason and churn is not None and churn.offline(dst, now + d):
            reason = "offline"
        return tx_end, d, reason


LINK_MODELS: dict[str, Callable[[Network], LinkModel]] = {}


def register_link_model(name: str, factory: Callable[[Network], LinkModel]) -> None:
    """Make a link model selectable as ``network.model = "name"``: ``factory(network)`` returns the run's
    model (it may wrap ``network.lean()``, the built-in one). The same factory again is a no-op; another
    under a taken name raises."""
    claim(LINK_MODELS, "link model", name, factory)


def link_model(name: str) -> Callable[[Network], LinkModel]:
    got = LINK_MODELS.get(name)
    if got is None:
        raise InputError("network.model", f"unknown link model {name!r}; registered: "
                                          f"{', '.join(sorted(LINK_MODELS)) or 'none'} (a plugin's needs --plugin)")
    return got


# the most link streams seeded ahead (~250 bytes each until their link is first used: 0.5 GiB at most); a larger
# graph's links seed their streams one by one, as they are first used
SEED_AHEAD_MAX = 2_000_000


class Network:
    def __init__(self, env: simpy.Environment, spec: NetworkSpec, streams: Streams, emit, deliver,
                 emit_row=None):
        self.env = env
        self.spec = spec
        self.streams = streams
        self.emit = emit
        # the lean path traces rows (COLUMNS order, as TraceWriter.emit_row); without a row sink, records
        if emit_row is None:
            from netsim.trace.events import record  # the trace's records load with the first run, not validate

            emit_row = lambda r: emit(record(r))  # noqa: E731
        self.emit_row = emit_row
        self.deliver_to = deliver  # callable(message) that puts it in the receiver's inbox
        self._on_arrival = self._arrive  # one bound method, not one per message
        self.links: dict[tuple[int, int], Link] = {}
        self.next_id = 0
        self.bandwidth = spec.bandwidth
        self.p_loss = spec.loss
        self.churn = None  # the run's sim.churn.Churn once attached, when any agent can go offline (drops)
        # the composed models' links (sim/links.py's ``FullLink``), made when first used; a restored checkpoint's are
        # its rows until then (sim/restore.py's ``_full_rows``)
        self.full_links: dict = {}
        self.uplink_busy: dict[int, float] = {}
        self.model: LinkModel | None = None  # None: the lean default path, inline in send
        # whether the links' draws keep their streams' positions (``Draws``: what a checkpoint stores, a state read
        # per block of draws); off where no checkpoint can cut the run (the lookahead windows refuse them)
        self.positions = True
        self.dynamic = None  # the time-varying topology (sim/dynamic.py) once attached, if the scenario has one
        # links a restored checkpoint holds, made when next used (sim/restore.py): (src, dst) -> (its row there:
        # [src, dst, latency draws' position, loss draws' position], busy_until)
        self.restored: dict[tuple[int, int], tuple] = {}
        # the topology's links (``seed_ahead``), then their first draws drawn together (``without_checkpoints``: a
        # ``LinksAhead``, or None where they cannot be); read by ``link`` only once positions are off
        self.ahead: LinksAhead | Any = None

    def seed_ahead(self, edges) -> None:
        """Seed the streams every link of ``edges`` (rows u, v) will draw from, all at once (``Streams.seed_ahead``):
        the same generators as the ones each link's first message would make one by one, ~10x faster (a run at
        scale uses hundreds of thousands of links)."""
        import numpy as np

        from netsim.sim.links import needs_full_path

        self.ahead = edges  # (``without_checkpoints``: the links whose first draws can be drawn together)
        spec = self.spec
        full = needs_full_path(spec)
        purposes = tuple(p for p, used in (("latency", full or spec.latency.kind != "constant"),
                                           ("loss", full or spec.loss > 0), ("burst", spec.burst is not None))
                         if used)
        streams = len(edges) * len(purposes)
        if streams and streams <= SEED_AHEAD_MAX:
            self.streams.seed_ahead(purposes, np.asarray(edges, dtype=np.int64))

    def without_checkpoints(self) -> None:
        """No checkpoint can cut this run (a driver that refuses them): the links made from now on need not keep
        their streams' positions (``Draws``), which costs a state read per block of draws; the topology's links then
        take their first draws from blocks drawn for many links at once (``LinksAhead``)."""
        self.positions = False
        if not isinstance(self.ahead, LinksAhead):
            self.ahead = LinksAhead.of(self, self.ahead)

    def use(self, model: LinkModel | None) -> None:
        """Decide every message from now on with ``model`` (None: the lean default path)."""
        self.model = model

    def lean(self) -> LinkModel:
        """The model in use as an object (the lean default as ``LeanLinks``): what a wrapping model (replay)
        falls back to."""
        return self.model if self.model is not None else LeanLinks(self)

    def link(self, src: int, dst: int) -> Link:
        link = self.links.get((src, dst))
        if link is None:
            keep = self.positions
            if not keep and self.ahead is not None:
                link = self.ahead.link(src, dst)
                if link is not None:
                    self.links[(src, dst)] = link
                    return link
            lat = draws(self.spec.latency, lambda: self.streams.rng("latency", src, dst), "network.latency", keep)
            if self.p_loss > 0:
                rng = self.streams.rng("loss", src, dst)
                lost = Draws(rng.random, rng if keep else None)
            else:
                lost = None
            link = self.links[(src, dst)] = Link(lat, lost)
            if self.restored and (src, dst) in self.restored:  # where a restored run's link stood (its streams are)
                (_, _, lat_pos, lost_pos), link.busy_until = self.restored.pop((src, dst))
                for d, pos in ((lat, lat_pos), (lost, lost_pos)):
                    if pos is not None:
                        d.resume(pos, keep_stream=True)
        return link

    def send(self, src: int, dst: int, payload: Any, tag: str, rnd: int, size: int | None) -> float:
        """Put a message on the link; returns the time until its transmission ends (sender busy)."""
        return self.send_all(src, (dst,), payload, tag, rnd, size)

    def send_all(self, src: int, dsts: Iterable[int], payload: Any, tag: str, rnd: int, size: int | None) -> float:
        """``send`` of one payload to each of ``dsts``, in that order (a broadcast: links transmit in parallel);
        returns the longest time until a transmission ends (0.0 with none)."""
        if size is None:
            size = payload_size(payload)
        longest = 0.0
        if self.model is not None:
            for dst in dsts:
                tx = self._send_model(src, dst, payload, tag, rnd, size)
                if tx > longest:
                    longest = tx
            return longest
        env = self.env
        now = env.now
        dsts = dsts if type(dsts) is list or type(dsts) is tuple else list(dsts)
        delays, reasons, longest = lean_outcomes(self, src, dsts, now, size)
        emit_row, on_arrival = self.emit_row, self._on_arrival
        mid = self.take_ids(len(dsts))  # (their ids in send order: nothing else sends in between)
        for dst, d, reason in zip(dsts, delays, reasons):
            emit_row(shapes.send(now, src, dst, mid, size, d, rnd, tag))
            if reason:
                emit_row(shapes.drop(now, src, dst, mid, size, d, rnd, reason))
            else:
                msg = _new_message(Message, (mid, src, dst, tag, rnd, payload, size, now))
                Timeout(env, d, msg).callbacks.append(on_arrival)
            mid += 1
        return longest

    def take_ids(self, n: int) -> int:
        """Ids for ``n`` messages, in send order: the first of them (the next n are taken). The one place message ids
        are numbered, by every engine."""
        mid = self.next_id
        self.next_id = mid + n
        return mid

    def _arrive(self, ev) -> None:
        msg: Message = ev.value
        self.emit_row(shapes.deliver(self.env.now, msg.dst, msg.src, msg.id, msg.size, msg.sent, msg.round, msg.tag))
        self.deliver_to(msg)

    # the full path ----------------------------------------------------------------------------------
    def attach(self, sim) -> None:
        """Build the configured link models, with the run's churn (``sim.churn``) dropping what an offline
        agent sends or would receive (needs the agents: count, clocks, scenario); a
        plugin's model (``network.model``) is made last, so it can wrap the built-in one (``lean()``)."""
        self.n_agents = sim.scenario.agents.count
        self._attach_builtin(sim)
        if self.spec.model is not None:
            self.use(link_model(self.spec.model)(self))

    def _attach_builtin(self, sim) -> None:
        from netsim.compute.data import find_data_file
        from netsim.sim.links import needs_full_path, outages_by_link, read_link_trace

        sc = sim.scenario
        n = sc.agents.count
        if sc.topology.dynamic is not None:
            from netsim.sim.dynamic import DynamicTopology

            self.dynamic = DynamicTopology(sim)
            self.dynamic.install()
        self.churn = sim.churn
        if not (self.churn is not None or needs_full_path(self.spec)):
            return
        self.n_agents = n
        self.outages, self.all_outages = outages_by_link(self.spec, n)
        self.series = {}
        if self.spec.trace:
            path = find_data_file(self.spec.trace, "network.trace")
            try:
                self.series = read_link_trace(path, n)
            except InputError as e:
                raise InputError("network.trace", e.message, e.source) from None
        self.use(ComposedLinks(self))
        if self.churn is not None:
            for i in self.churn.sources:
                sim.start_housekeeping(self.churn.recorder(sim, i))

    def full_link(self, src: int, dst: int):
        from netsim.sim.links import FullLink

        link = self.full_links.get((src, dst))
        if link is None or type(link) is list:
            row = link  # (a restored checkpoint's row: where the link stood, its streams are)
            outs = self.outages.get((src, dst), []) + self.all_outages
            link = self.full_links[(src, dst)] = FullLink(self.spec, self.streams, src, dst,
                                                          self.series.get((src, dst)), outs, self.positions)
            if row is not None:
                _, _, lat_pos, loss_pos, burst, link.busy_until = row
                if burst is not None:
                    link.burst.bad = burst[0]
                for d, pos in ((link.latency, lat_pos), (link.u_loss, loss_pos),
                               (None if burst is None else link.burst.u, None if burst is None else burst[1])):
                    if pos is not None:
                        d.resume(pos, keep_stream=True)
        return link

    def transfer(self, link, src: int, now: float, size: int) -> float:
        """End of this message's transmission: FIFO on its link and (if set) on the node's uplink."""
        bw = link.bandwidth_at(now)
        up = self.spec.uplink
        if bw is None and up is None:
            return now
        start = max(now, link.busy_until) if bw is not None else now
        rate = bw if bw is not None else up
        if up is not None:
            start = max(start, self.uplink_busy.get(src, 0.0))
            rate = min(rate, up)
        end = start + size / rate
        link.busy_until = end
        if up is not None:
            self.uplink_busy[src] = end
        return end

    def _send_model(self, src: int, dst: int, payload: Any, tag: str, rnd: int, size: int | None) -> float:
        now = self.env.now
        if size is None:
            size = payload_size(payload)
        tx_end, delay, reason = self.model.outcome(src, dst, now, size)
        self.dispatch(src, dst, payload, tag, rnd, size, now, delay, reason)
        return hold_time(tx_end, now)

    def dispatch(self, src: int, dst: int, payload: Any, tag: str, rnd: int, size: int, now: float,
                 delay: float, reason: str) -> None:
        """A message whose outcome is decided: trace it, then drop it (``reason``) or schedule its arrival.
        Every model's path; the lean ``send`` inlines the same steps (hot path)."""
        mid = self.take_ids(1)
        self.emit_row(shapes.send(now, src, dst, mid, size, delay, rnd, tag))
        if reason:
            self.emit_row(shapes.drop(now, src, dst, mid, size, delay, rnd, reason))
        else:
            ev = Timeout(self.env, delay, Message(mid, src, dst, tag, rnd, payload, size, now))
            ev.callbacks.append(self._arrive)
