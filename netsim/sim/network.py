"""Messages and links: latency + size/bandwidth transfer + Bernoulli loss, per directed link.

Each link draws its latency and loss from its own named streams ("latency", src, dst) and
("loss", src, dst), one draw of each per message, so the k-th message on a link sees the same
network whatever algorithm sent it. A link transmits one message at a time (FIFO uplink per link).
"""

from __future__ import annotations

from typing import Any

import attrs
import simpy

from netsim.scenario.schema import NetworkSpec
from netsim.sim.dists import draws
from netsim.sim.streams import Draws, Streams
from netsim.trace.events import Deliver, Drop, Send


@attrs.frozen(slots=True)
class Message:
    id: int
    src: int
    dst: int
    tag: str
    round: int
    payload: Any
    size: int
    sent: float


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


class Network:
    def __init__(self, env: simpy.Environment, spec: NetworkSpec, streams: Streams, emit, deliver):
        self.env = env
        self.spec = spec
        self.streams = streams
        self.emit = emit
        self.deliver_to = deliver  # callable(message) that puts it in the receiver's inbox
        self.links: dict[tuple[int, int], Link] = {}
        self.next_id = 0
        self.bandwidth = spec.bandwidth
        self.p_loss = spec.loss

    def link(self, src: int, dst: int) -> Link:
        link = self.links.get((src, dst))
        if link is None:
            lat = draws(self.spec.latency, self.streams.rng("latency", src, dst))
            if self.p_loss > 0:
                rng = self.streams.rng("loss", src, dst)
                lost = Draws(rng.random)
            else:
                lost = None
            link = self.links[(src, dst)] = Link(lat, lost)
        return link

    def send(self, src: int, dst: int, payload: Any, tag: str, rnd: int, size: int | None) -> float:
        """Put a message on the link; returns the time until its transmission ends (sender busy)."""
        env = self.env
        now = env.now
        link = self.link(src, dst)
        if size is None:
            size = payload_size(payload)
        mid = self.next_id
        self.next_id = mid + 1
        tx_end = now
        if self.bandwidth is not None:
            tx_end = max(now, link.busy_until) + size / self.bandwidth
            link.busy_until = tx_end
        delay = tx_end - now + link.latency()
        if link.lost is not None and link.lost() < self.p_loss:
            self.emit(Send(now, src, dst, mid, size, delay, rnd, tag))
            self.emit(Drop(now, src, dst, mid, size, delay, rnd, "loss"))
            return tx_end - now
        msg = Message(mid, src, dst, tag, rnd, payload, size, now)
        self.emit(Send(now, src, dst, mid, size, delay, rnd, tag))
        ev = simpy.events.Timeout(env, delay, msg)
        ev.callbacks.append(self._arrive)
        return tx_end - now

    def _arrive(self, ev) -> None:
        msg: Message = ev._value
        self.emit(Deliver(self.env.now, msg.dst, msg.src, msg.id, msg.size, self.env.now - msg.sent,
                          msg.round, msg.tag))
        self.deliver_to(msg)
