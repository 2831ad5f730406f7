"""Communication patterns any algorithm can use: the exchange, not the optimiser.

Each pattern is a small object (or generator) bound to one agent; an algorithm yields from it inside
its own program. State that must outlive one activation (locks, copies, running sums) lives in the
pattern object, randomness comes from the agent's streams, messages go through the network.

- ``sync_round``: synchronous round, neighbour barrier with timeout (``Agent.gather``).
- ``PairwiseGossip``: AD-PSGD's atomic pairwise averaging with one random neighbour.
- ``AsyncPush``: send and go on; merge whatever arrived, optionally down-weighting stale values.
- ``PushSum``: push-sum on directed graphs with running sums (robust to message loss).
- ``NeighborCopies``: the last value received from each in-neighbour (event-triggered, CHOCO).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import attrs

from netsim.sim.network import Message, payload_size

if TYPE_CHECKING:  # torch is imported where it is used: an algorithm's module (its Params) loads without it
    import torch


def sync_round(agent, payload: Any, k: int, *, timeout: float | None, tag: str = "model") -> Generator:
    """One synchronous round: send ``payload`` to every out-neighbour, then wait (barrier) for round
    ``k`` from every in-neighbour or until ``timeout``. Returns {src: payload} of what arrived; late
    messages of earlier rounds are discarded as stale.
    Lian et al. 2017 (D-PSGD), Algorithm 1, the exchange step."""
    yield agent.broadcast(payload, tag=tag, round=k)
    got = yield agent.gather(tag=tag, round=k, timeout=timeout)
    return got


def drain(agent, tag: str) -> list[Message]:
    """Every message with ``tag`` that arrived and nobody took yet, in arrival order (never blocks)."""
    q = agent.inbox.queues.get(tag)
    if not q:
        return []
    msgs = list(q)
    q.clear()
    return msgs


# --------------------------------------------------------------------------------------------------
class PairwiseGossip:
    """Asynchronous pairwise averaging, AD-PSGD style (Lian et al., ICML 2018, Algorithm 1, the
    averaging step: ``x_i, x_j <- (x_i + x_j)/2`` atomically, with j a random neighbour).

    Over the network: i sends x_i (request); j replies with its x_j and sets x_j = (x_i + x_j)/2; i sets
    x_i = (x_i + x_j)/2 on the reply. Atomicity (``atomic=True``): each agent holds a lock from its
    request until the reply (or ``timeout``); a request reaching a locked agent is answered with a
    refusal (a 1-byte NACK) instead of being served, so no agent is in two averagings at once and,
    without loss, the sum of models is conserved exactly. Refusing rather than queueing cannot deadlock
    (the paper avoids it with a bipartite active/passive split: ``adpsgd``'s ``roles = "bipartite"``).
    A lost reply leaves j averaged and i not: that is what loss does to pairwise gossip.

    ``version`` counts writes to this agent's model by exchanges; ``served`` those started by others.
    An algorithm measures gradient staleness as writes between reading x and applying its gradient.
    ``tags`` = (request, reply) message tags (default ``tag.req``, ``tag.rep``). Exchange k carries
    round k (the agent's k-th exchange).

    ``merge`` makes the exchange one-sided, a pull (Demers et al., "Epidemic algorithms for replicated database
    maintenance", PODC 1987, the pull variant): the request is a 1-byte message without a model, j replies with its
    x_j and keeps it, and i sets x_i = merge(x_i, x_j) on the reply. Nothing writes x_i during its own exchange, so
    the reply is merged into the model as requested.
    """

    def __init__(self, agent, *, timeout: float, tag: str = "gossip", atomic: bool = True,
                 tags: tuple[str, str] | None = None, merge: Callable[[Any, Any], Any] | None = None):
        self.agent = agent
        self.merge = merge
        self.timeout = timeout
        self.req, self.rep = tags if tags is not None else (tag + ".req", tag + ".rep")
        self.atomic = atomic
        self.busy = False
        self.version = 0
        self.served = 0
        self._seq = 0
        self.stats = agent.stats
        agent.spawn(self._serve())

    def _serve(self) -> Generator:
        a = self.agent
        while True:
            msg = yield a.recv(tag=self.req)
            if self.atomic and self.busy:
                self.stats.add("gossip_refused")
                a.send(msg.src, None, tag=self.rep, round=msg.round, size=1)
                continue
            mine = a.params
            a.send(msg.src, mine, tag=self.rep, round=msg.round)
            if self.merge is not None:  # a pull: j's model is only read
                continue
            a.params = (mine + msg.payload) / 2
            self.version += 1
            self.served += 1

    def exchange(self, j: int) -> Generator:
        """Average with neighbour ``j``; returns True if this agent averaged."""
        a = self.agent
        self.busy = True
        try:
            self._seq += 1
            pull = self.merge is not None
            mine = None if pull else a.params
            yield a.send(j, mine, tag=self.req, round=self._seq, size=1 if pull else None)
            reply = yield a.recv(tag=self.rep, round=self._seq, timeout=self.timeout)
            if reply is None:
                self.stats.add("gossip_timeouts")
                return False
            if reply.payload is None:
                return False
            if pull:
                a.params = self.merge(a.params, reply.payload)
            # delta form: equals (x_i + x_j)/2 under the lock, and still conserves the sum without it
            else:
                a.params = a.params + (reply.payload - mine) / 2
            self.version += 1
            self.stats.add("gossip_exchanges")
            return True
        finally:
            self.busy = False

    def random_neighbor(self, rng) -> int:
        nb = self.agent.neighbors
        return nb[int(rng.integers(len(nb)))]


# --------------------------------------------------------------------------------------------------
class AsyncPush:
    """Send and go on; merge whatever has arrived (asynchronous gossip without barriers).

    ``merge(x)`` = (1 - sum_j w'_ij) x + sum_j w'_ij x_j over the latest value that arrived from each
    in-neighbour j since the last merge, with W the scenario's mixing matrix (a neighbour that sent
    nothing leaves its weight on x, as ``Agent.mix``). Staleness s = my round - 1 - the sender's round
    when it sent, clipped at 0 (a value pushed at the end of the sender's last round is fresh). With
    ``staleness_power`` a > 0 the weights are w'_ij = W_ij (1 + s)^-a, the polynomial staleness
    function s(t - tau) of FedAsync (Xie, Koyejo, Gupta 2019, "Asynchronous Federated Optimization").
    """

    def __init__(self, agent, *, tag: str = "push", staleness_power: float = 0.0):
        self.agent = agent
        self.tag = tag
        self.power = staleness_power
        self.stats = agent.stats

    def push(self, payload: Any, to=None):
        """Broadcast (non-blocking for the protocol; the event ends when transmission does)."""
        return self.agent.broadcast(payload, tag=self.tag, round=self.agent.round, to=to)

    def merge(self, own: torch.Tensor) -> torch.Tensor:
        a = self.agent
        out = own.clone()
        for m, w in staleness_weights(a, latest_by_sender(drain(a, self.tag)), self.power):
            out.add_(m.payload - own, alpha=w)
        return out


def latest_by_sender(msgs) -> dict[int, Any]:
    """The latest of each sender's messages (by round; of equal rounds, the last to arrive), by sender."""
    latest: dict[int, Any] = {}
    for m in msgs:
        if m.src not in latest or m.round >= latest[m.src].round:
            latest[m.src] = m
    return latest


def staleness_weights(agent, latest: dict[int, Any], power: float) -> list[tuple[Any, float]]:
    """(message, w'_ij) in sender order, w'_ij = W_ij (1 + s)^-power with s = the agent's round - 1 - the
    message's round, clipped at 0 (``AsyncPush``); each s is observed as ``push_staleness``."""
    out = []
    stats = agent.stats
    for j in sorted(latest):
        m = latest[j]
        s = max(0, agent.round - m.round - 1)  # pushed at the end of its last round: fresh
        stats.observe("push_staleness", float(s))
        out.append((m, agent.weights.get(j, 0.0) * (1.0 + s) ** (-power)))
    return out


# --------------------------------------------------------------------------------------------------
@attrs.frozen(slots=True)
class RunningSumPayload:
    """Push-sum message: the sender's running sums of value and weight (sent together)."""

    x: torch.Tensor
    y: float

    @property
    def size_bytes(self) -> int:
        return payload_size(self.x) + 8


class PushSum:
    """Push-sum ratio consensus on a directed graph with running sums.

    Kempe, Dobra, Gehrke (FOCS 2003), Algorithm 1 (Push-Sum): each agent keeps a value x_i and a weight
    y_i (y_i^0 = 1), keeps the share 1/(d_i + 1) and sends one share of (x_i, y_i) to each of its d_i
    out-neighbours; x_i / y_i converges to the average of the x_i^0 (column-stochastic mixing, the
    scenario's ``column_stochastic`` W). With gradient steps this is subgradient-push (Nedic &
    Olshevsky, IEEE TAC 2015, Section II, the subgradient-push updates of w, y, z, x).

    Loss: instead of the share, an agent sends the running sum sigma_i of every share it ever sent
    (value and weight); the receiver keeps rho_ij, the last running sum it got from j, and adds
    sigma_j - rho_ij (Hadjicostis, Vaidya, Dominguez-Garcia, IEEE TAC 2016, "Robust distributed average
    consensus via exchange of running sums", the running-sum push-sum iteration). A dropped
    message's mass arrives with the next one that gets through, so sum_i x_i plus the mass in flight
    is conserved exactly. Messages overtaken by a later one from the same sender are ignored.
    ``running_sums=False`` sends the plain share instead (Kempe et al.'s original), whose lost mass is
    gone for good (biased under loss).
    """

    def __init__(self, agent, x0: torch.Tensor, *, tag: str = "pushsum", running_sums: bool = True):
        import torch

        self.agent = agent
        self.tag = tag
        self.running = running_sums
        self.x = x0.clone()
        self.y = 1.0
        self.share = 1.0 / (len(agent.neighbors) + 1)
        self.sigma_x = torch.zeros_like(x0)
        self.sigma_y = 0.0
        self.rho: dict[int, tuple[int, torch.Tensor, float]] = {}
        self._seq = 0

    def absorb(self) -> None:
        """Add everything that arrived (sigma_j - rho_ij per in-neighbour j)."""
        for m in drain(self.agent, self.tag):
            if not self.running:
                self.x.add_(m.payload.x)
                self.y += m.payload.y
                continue
            last = newer_sum(self.rho, m.src, m.round, m.payload.x, m.payload.y)
            if last is None:
                continue  # overtaken: a later running sum already counted this mass
            px, py = last
            self.x.add_(m.payload.x - (0.0 if px is None else px))
            self.y += m.payload.y - py

    @property
    def estimate(self) -> torch.Tensor:
        return self.x / self.y

    @property
    def seq(self) -> int:
        """Pushes so far: the round tag of the latest push (a synchronous reader gathers that round)."""
        return self._seq

    def push(self):
        """Keep one share, add one share per out-neighbour to the running sums and send them."""
        s = self.share
        self.sigma_x.add_(self.x, alpha=s)
        self.sigma_y += self.y * s
        self.x.mul_(s)
        self.y *= s
        self._seq += 1
        if self.running:
            payload = RunningSumPayload(self.sigma_x.clone(), self.sigma_y)
        else:
            payload = RunningSumPayload(self.x.clone(), self.y)
        return self.agent.broadcast(payload, tag=self.tag, round=self._seq)


def newer_sum(rho: dict, src: int, rnd: int, x: Any, y: float) -> tuple[Any, float] | None:
    """Push-sum's running-sum rule for a message of round ``rnd`` from ``src`` carrying the sums (x, y): None if a
    later sum from ``src`` was already absorbed (overtaken); else the last absorbed (x or None, y, 0.0 at first),
    whose difference to (x, y) is the mass to add, and (x, y) become the last absorbed (``rho``)."""
    last = rho.get(src)
    if last is not None and rnd <= last[0]:
        return None
    rho[src] = (rnd, x, y)
    return (None, 0.0) if last is None else (last[1], last[2])


# --------------------------------------------------------------------------------------------------
class NeighborCopies:
    """The last value received from each in-neighbour, and gossip mixing with those copies:
    x_i <- W_ii x_i + sum_j W_ij xhat_j (the receiver side of event-triggered communication).

    Copies start at the neighbours' initial models (read from the bank at construction, i.e. a
    common, known initialisation), so a neighbour that never sends is mixed at its initial value; one first
    met later (a time-varying topology) at the common initial model, this agent's own. ``mix`` mixes the
    current in-neighbours (``agent.weights``), with the copies of those that are one no longer kept."""

    def __init__(self, agent, *, tag: str = "model"):
        self.agent = agent
        self.tag = tag
        self.copies: dict[int, torch.Tensor] = {j: agent.params_of(j) for j in agent.weights}
        self.initial = agent.params
        self._round: dict[int, int] = {}

    def absorb(self) -> int:
        """Take every arrived message (latest per sender wins); returns how many arrived."""
        msgs = drain(self.agent, self.tag)
        for m in msgs:
            if m.round >= self._round.get(m.src, -1):
                self._round[m.src] = m.round
                self.copies[m.src] = m.payload
        return len(msgs)

    def mix(self, own: torch.Tensor) -> torch.Tensor:
        a = self.agent
        out = own * a.self_weight
        copies, initial = self.copies, self.initial
        for j, w in sorted(a.weights.items()):
            out.add_(copies.get(j, initial), alpha=w)
        return out
