"""Barrier rounds (rounds/sync.py: D-PSGD, DP-D-PSGD, CHOCO-SGD, a plugin's ``SyncKernel``) as conservative lookahead
windows: the fast path for agents on their own clocks (offsets, drift, jitter; Bernoulli or Poisson activation),
per-agent compute times and stragglers, lossy links whose barriers time out, any latency distribution (lognormal and
exponential too), transmission times (bandwidth, node uplinks, per-link bandwidth, link traces), churn and link
models of the scenario. Byte for byte the events engine's trace, metrics and models.

The windows are push gossip's (rounds/lookahead.py, whose admitted region, refusals and window statistics this driver
shares), but no lookahead is needed: a barrier completes on a delivery, or times out with what was delivered, and its
``combine`` reads only delivered payloads, each made by its sender's ``local`` before it was sent. The control never
reads a tensor; so the tensor work of ``gathers`` windows is done together in dependency order, a ``combine`` waiting
in lock step for the ``local`` that makes a payload it reads (``op_waits``: that ``local`` wakes it), and a message may
be sent and delivered inside one window. A window's length (``window``: the smallest latency where it is positive, else
a typical one) only sizes the control's buckets and the lock steps.

The control plays each agent's program (``SyncRounds.program``) as events in simpy's order (time, insertion): the
activation (its ``activate`` and ``compute_start`` rows, the gradient request), the gradient's completion (the engine's
batches; ``compute_end``, the agent's releases, a ``send`` and maybe a ``drop`` per out-neighbour, then the barrier, or
first the end of the broadcast's transmission where it takes time (``Agent.broadcast``'s Timeout of the longest
``tx_end - now`` of its links, set after their arrivals: an event of its own, then the barrier): the messages already
queued offered in arrival order, older rounds' discarded as ``stale``, its timer set unless it completed), each
delivery (offered to the barrier or queued, as ``Inbox.put``), the barrier's timer (a ``timeout`` row with the missing
count) and the barrier's completion (an event of its own, as ``succeed`` schedules it: ``combine``, then the next wake
or the finish). Every stream is drawn by the engine's calls in the engine's order (``Agent.plan_wake``,
``Agent.compute_time``, ``sample_rows``, the links' ``outcome``).

The tensor work then plays each agent's operations of the window in its program's order, one per agent and lock step
(``WindowDriver.in_order``): the gradient's point (the agent's parameters at its activation), ``local`` once its
gradient is evaluated (the engine's gradient batches, or per step for a batch-invariant model), and ``combine`` with
the payloads in arrival order; each kind's agents of one round index in one kernel call (its hooks are row-wise:
``netsim check``). ``local`` runs where the engine's ``LocalAhead`` runs it: with the agents whose gradients complete
at the same instant, at the first one's completion. Two things the control writes before the tensor work has them: a
message's bytes (``b.sizes`` or the payload's; where the kernel declares them before the payload is made,
``SyncKernel.payload_bytes``, those, checked after its ``local``, and nothing to patch), patched into the window's
``send`` and ``drop`` and ``deliver`` rows after the work (the rows of its windows are held until then:
``holds_rows``), and an agent's releases (``Batch.privatize`` through its ledger, placed at the agent's completion
time, round and tick), spliced in after its ``compute_end``.

Refused (``refusal``): what push gossip's windows refuse (a link model of its own, checkpoints; not a latency with no
positive minimum), transmission times of payloads whose size the kernel does not declare (the send's wait depends on
the bytes: compression), a time-varying topology, several exchanges a round, a kernel's own routes or local steps with
their own gradients, agents that take no gradient or ask for different ones, and the kernel's own reason.
"""

from __future__ import annotations

import heapq
import itertools
import struct
from collections import deque

import numpy as np
import torch

from netsim.rounds.kernel import LOOKAHEAD, Arrivals, Batch
from netsim.rounds.lookahead import _INF, _NEVER, ACT, ARR, DONE, WindowDriver, pack
from netsim.sim.network import payload_size
from netsim.sim.rows import CODES
from netsim.trace.events import Stale
from netsim.trace.events import row as event_row
from netsim.trace.io import RECORD, PackedRows

TIMER, BARRIER, SENT = 7, 8, 9  # a barrier's timeout timer, its completion, the end of a broadcast's transmission
# (the other kinds: rounds/lookahead.py's)
COMBINE, ASK, LOCAL = 0, 1, 2  # an agent's tensor operations (a lock step calls them in this order)
_SIZE_AT = struct.calcsize("<d3iq")  # the byte offset of a packed row's size (``RECORD``: t, kind, agent, peer, msg)
_pack_size = struct.Struct("<q").pack_into


def refusal(sim) -> str | None:
    """Why this run's barrier rounds cannot be played as lookahead windows with the engine's exact trace (None: they
    can; the module docstring)."""
    from netsim.rounds import lookahead
    from netsim.rounds.sync import SyncKernel, _combine_steps, _local_steps

    kernel, p, agents = sim.program, sim.params, sim.loop.agents
    name = sim.world.scenario.algorithm.name
    why = lookahead.refusal(sim, kernel, bound=False)  # (any latency: the tensor work is in dependency order)
    if why is not None:
        return why
    if lookahead.transmits(sim) and kernel.payload_bytes(p, kernel.state_of(agents[0], p),
                                                         sim.world.bank.W[0]) is None:
        return (f"bandwidth or uplinks with {name}: a payload's size depends on its values (compression) or is not "
                "declared (SyncKernel.payload_bytes), and a barrier round's send waits for its transmission — remove "
                "network.bandwidth, network.uplink and the links' bandwidth")
    if sim.world.network.dynamic is not None:
        return ("the topology changes over time: a barrier waits for the in-neighbours of its round (not played by "
                "these windows) — remove topology.dynamic")
    why = kernel.refusal(sim, LOOKAHEAD)
    if why is not None:
        return why
    sync = ("; synchronous rounds play it: periodic activation on identical clocks, one compute time and a "
            "constant latency")
    state = kernel.state_of(agents[0], p)
    steps = kernel.exchanges(p, state)
    if steps > 1:
        return (f"{name} exchanges {steps} times a round: the lookahead windows play one barrier a round — "
                f"run it with one exchange a round{sync}")
    if _combine_steps(kernel) or kernel.horizon(p, state) is not None:
        return (f"{name} takes gradients after the exchange or ends at its own round count (not played by the "
                f"lookahead windows) — {sync[2:]}")
    if type(kernel).routes is not SyncKernel.routes:
        return f"{name} chooses its own routes each exchange (not played by the lookahead windows) — {sync[2:]}"
    if _local_steps(kernel):
        return (f"{name} takes local steps with gradients of their own (not played by the lookahead windows) — "
                f"{sync[2:]}")
    reqs = {kernel.gradient(p, state, a.id) for a in agents}
    if None in reqs:
        return (f"{name} takes no gradients with these parameters (its rounds have no compute phase) — give it a "
                "learning rate (algorithm.lr > 0)")
    if len(reqs) > 1:
        return (f"{name}'s agents ask for different gradients (batch sizes or clipping): the windows evaluate one "
                f"kind of request — {sync[2:]}")
    return None


def window(sim) -> float:
    """A window's length: the smallest latency where there is a positive one (the lookahead), else the smallest
    typical one (a distribution's mean, a uniform's midpoint) of the scenario's and the per-link overrides', else
    ``FALLBACK``. Any length is exact (the tensor work is in dependency order); it only sizes the control's buckets
    and, with ``gathers``, the tensor work's lock steps."""
    from netsim.rounds.lookahead import lookahead

    L = lookahead(sim)[0]
    if L is not None:
        return L
    net = sim.world.scenario.network
    lats = [net.latency, *(o.latency for o in net.links or () if o.latency is not None)]
    typical = [t for lat in lats if (t := _typical(lat)) > 0]
    return min(typical) if typical else FALLBACK


SMALL = 4096  # parameters: a model up to this size has its payloads handed to ``combine`` as one tensor (``Arrivals``)
FALLBACK = 0.01  # seconds: a window where no latency is positive on average


def _typical(lat) -> float:
    return {"constant": lat.value, "uniform": None if lat.low is None else (lat.low + lat.high) / 2}.get(
        lat.kind, lat.mean) or 0.0


def play(pattern, sim, kernel) -> bool:
    """Play a started run to its end window by window (see the module docstring); False (checkpoints are refused,
    so no interrupt is taken between windows)."""
    return _Driver(pattern, sim, kernel).run()


class _Gather:
    """An agent's open barrier (``Agent.gather``): its round, the senders it waits for, what arrived ({sender:
    the payload's round record}, in arrival order) and its number (its timer's)."""

    __slots__ = ("round", "expect", "got", "gid")

    def __init__(self, rnd: int, expect: frozenset, gid: int):
        self.round, self.expect, self.got, self.gid = rnd, expect, {}, gid


class _Driver(WindowDriver):
    """The barrier rounds' control and tensor work (the module docstring); the rest is ``WindowDriver``'s."""

    gathers = 64  # (a window is one latency, often a small part of a round: 64 of them fill the lock steps)
    holds_rows = True  # (``decide`` patches the sizes of the gather's sends and deliveries)

    def window(self, sim) -> float:
        """The lookahead where the latencies have a positive minimum, else a typical latency (``window``)."""
        return window(sim)

    def __init__(self, pattern, sim, kernel):
        super().__init__(pattern, sim, kernel)
        p, agents = self.p, self.agents
        self.req = self.first = kernel.gradient(p, self.state, agents[0].id)
        if self.req.clip is not None:  # clipped per example (``clipping``): the engine's batches, whatever the model
            self.free = False
        self.timeout = p.round_timeout
        from netsim.rounds.sync import _local_steps

        self.ahead = kernel.batch_local and not _local_steps(kernel)  # the engine's ``LocalAhead``
        n = len(agents)
        self.k = [0] * n  # each program's round
        self.rid = [-1] * n  # its current round's record
        self.waiter: list[_Gather | None] = [None] * n
        self.queue: list[deque] = [deque() for _ in agents]  # arrived and not taken: (id, sender, record, round)
        self.gids = itertools.count()
        self.rids = itertools.count()
        # round records: rid -> [agent, round index k, completion time, activations, latest tick] (the releases')
        self.recs: dict[int, list] = {}
        self.pend: dict[float, dict[int, tuple]] = {}  # ``LocalAhead``: completion time -> {agent: (k, ticket, rid)}
        self.localed: set[int] = set()  # rounds whose ``local`` ran with an earlier agent's at their instant
        self.flushed = 0  # the tickets the engine's gradient batches have evaluated so far
        self.slots: list[tuple[int, int]] = []  # (row of this window, rid): the round's releases go there
        self.patches: list[tuple[int, int]] = []  # (row of this window, rid): a send or drop of the round's payload
        self.sizes: dict[int, int] = {}  # rid -> its payload's bytes (once its ``local`` ran)
        self.released: dict[int, list] = {}  # rid -> its release rows (once its ``local`` ran)
        self.refs: dict[int, int] = {}  # rid -> messages in flight or queued that carry its payload
        self.payload: dict[int, object] = {}  # rid -> the payload its agent sent
        self.parts: dict[int, Batch] = {}  # rid -> the agent's batch of one after ``local`` (for ``combine``)
        self.x_at: dict[int, torch.Tensor] = {}  # rid -> the agent's parameters at its activation
        # every payload's bytes, where the kernel knows them before ``local`` makes it (``payload_bytes``), else a
        # guess until its ``local`` ran (the rows patched where it was wrong: ``decide``)
        self.fixed = kernel.payload_bytes(p, self.state, self.bank.W[0])
        self.guess = payload_size(self.bank.W[0]) if self.fixed is None else self.fixed
        self.unmade: dict[int, list[int]] = {}  # rid -> agents whose ``combine`` waits for its ``local`` (this work's)
        self.op_waits = self.wait
        # a large model's payloads are copied once more by ``Arrivals`` and held longer by 64 windows' work: with
        # those, the dicts per agent and 8 windows are faster
        self.small = self.bank.W.shape[1] <= SMALL
        if not self.small:
            self.gathers = 8
        self._control()

    # the control flow -------------------------------------------------------------------------------------
    # ``events_until`` is a closure over the driver's state (made once, ``_control``), as push gossip's is: it runs
    # for every event, and reading locals (no attribute lookups, the rows packed in place) is what keeps the
    # per-event Python small.
    def _control(self) -> None:
        agents, enqueue, wake, ops_of, housekeeping = self.agents, self.enqueue, self.wake, self.ops, self.housekeeping
        rows, cur, soon = self.rows, self.cur, self.soon
        put, buf, R = rows.put, rows.buf, RECORD.size
        kernel, p, state, req0 = self.kernel, self.p, self.state, self.req
        batch, ahead, free, timeout = self.req.batch, self.ahead, self.free, self.timeout
        ks, rid_of, waiter, queue = self.k, self.rid, self.waiter, self.queue
        recs, pend, localed, slots, patches = self.recs, self.pend, self.localed, self.slots, self.patches
        sizes, released, refs, payload = self.sizes, self.released, self.refs, self.payload
        ticket_of, flushes, fixed, guess = self.ticket_of, self.flushes, self.fixed, self.guess
        gids, rids, words, tag = self.gids, self.rids, self.words, self.tag_code
        outcome, take_ids, unref, gradient = self.outcome, self.net.take_ids, self.unref, kernel.gradient
        adopt = None if self.dynamic is None else self.dynamic.adopt
        pop, take, push, seq, far, end_of, inv = heapq.heappop, cur.pop, heapq.heappush, self.seq, self.far, self.end, \
            self.inv  # (``enqueue``'s, inlined where an event is pushed per delivery and per activation)
        C = CODES
        expects: list[tuple] = [(None, None)] * len(agents)  # each agent's (in-neighbours, their set)
        c_act, c_start, c_end, c_send, c_drop, c_deliver, c_timeout, c_none = (
            C.activate, C.compute_start, C.compute_end, C.send, C.drop, C.deliver, C.timeout, C.none)

        def close(i: int, w: _Gather, t: float) -> None:
            """The barrier resolves (``succeed``): its completion is an event at ``t``, scheduled now."""
            waiter[i] = None
            enqueue(t, BARRIER, i, w.got)

        def offer(i: int, w: _Gather, m: tuple, t: float) -> bool:
            """``_Gather.offer``: a message of the barrier's round from an expected sender is taken (the last one
            completes it), one of an earlier round discarded as stale; False: left queued."""
            mid, src, rid, rnd = m
            if rnd == w.round and src in w.expect:
                got = w.got
                got[src] = rid
                if len(got) == len(w.expect):
                    close(i, w, t)
                return True
            if rnd < w.round:
                rows.append(event_row(Stale(t, i, src, mid, rnd)))
                unref(rid)
                return True
            return False

        def gather(i: int, t: float, k: int) -> None:
            """``Agent.gather`` of round k: the queued messages offered in arrival order, then the timer unless
            done."""
            expect = agents[i].in_neighbors
            made = expects[i]  # (the set made once per list of in-neighbours)
            if made[0] is not expect:
                made = expects[i] = (expect, frozenset(expect))
            w = _Gather(k, made[1], next(gids))
            if not expect:
                enqueue(t, BARRIER, i, w.got)
                return
            waiter[i] = w
            q = queue[i]
            if q:
                keep: deque = deque()
                while q and waiter[i] is w:
                    m = q.popleft()
                    if not offer(i, w, m, t):
                        keep.append(m)
                keep.extend(q)
                queue[i] = keep
            if waiter[i] is w:
                enqueue(t + timeout, TIMER, i, w.gid)

        def events_until(end: float) -> None:
            """Process every event due before ``end`` (or to the run's stop), as the engine's queue does."""
            t, pending_lo, flushed = self.now, self.pending_lo, self.flushed
            try:
                while True:  # ``due``, inlined
                    if soon and (not cur or soon[0] < cur[-1]):
                        t, _, kind, i, v = pop(soon)
                    elif cur and cur[-1][0] < end:
                        t, _, kind, i, v = take()
                    else:
                        break
                    if kind == ARR:  # a delivery: its row, then ``Inbox.put`` (offered to an open barrier, else queued)
                        mid, src, rid, sent, rnd = v
                        size = fixed if fixed is not None else sizes.get(rid)
                        if size is None:  # its ``local`` is in this gather's tensor work: the size patched after it
                            patches.append((len(buf) // R, rid))
                            size = guess
                        put(pack(t, c_deliver, i, src, mid, size, t - sent, rnd, tag))
                        m = (mid, src, rid, rnd)
                        w = waiter[i]
                        if w is None or not offer(i, w, m, t):
                            queue[i].append(m)
                    elif kind == DONE:
                        # the gradient is back: ``compute_end`` (a batch's first evaluates every pending request),
                        # ``local`` (with the agents done at this instant, ``LocalAhead``), the releases, the sends,
                        # the barrier
                        if v >= flushed:
                            flushed = len(ticket_of)
                        if v >= pending_lo and not free:
                            flushes.append(range(pending_lo, len(ticket_of)))
                            pending_lo = len(ticket_of)
                        put(pack(t, c_end, i, -1, -1, 0, 0.0, -1, c_none))
                        rid, k = rid_of[i], ks[i]
                        if not ahead:
                            recs[rid][2] = t
                            ops = ops_of.get(i)
                            if ops is None:
                                ops = ops_of[i] = []
                            ops.append((LOCAL, v, rid))
                        elif rid in localed:
                            localed.discard(rid)
                        else:  # the first of its instant: every agent of this round index done now runs ``local``
                            group = pend[t]
                            for j, (kj, tj, rj) in list(group.items()):
                                if kj == k and tj < flushed:
                                    del group[j]
                                    recs[rj][2] = t
                                    ops = ops_of.get(j)
                                    if ops is None:
                                        ops = ops_of[j] = []
                                    ops.append((LOCAL, tj, rj))
                                    if rj != rid:
                                        localed.add(rj)
                            if not group:
                                del pend[t]
                        made = released.pop(rid, None)
                        if made is None:
                            slots.append((len(buf) // R, rid))
                        else:  # its ``local`` ran in an earlier window's work (an agent done at this instant first)
                            rows.extend(made)
                        size = fixed if fixed is not None else sizes.get(rid)
                        s = guess if size is None else size
                        held, tx = 0, 0.0
                        for j in agents[i].neighbors:  # ``Agent.broadcast``: links transmit in parallel
                            # ``Network.send``: the link's outcome from its streams, the next id, the rows
                            tx_end, delay, reason = outcome(i, j, t, s)
                            mid = take_ids(1)
                            if size is None:
                                patches.append((len(buf) // R, rid))
                            put(pack(t, c_send, i, j, mid, s, delay, k, tag))
                            if tx_end - t > tx:
                                tx = tx_end - t
                            if reason:
                                if size is None:
                                    patches.append((len(buf) // R, rid))
                                put(pack(t, c_drop, i, j, mid, s, delay, k, words(reason)))
                            else:
                                held += 1
                                at = t + delay  # ``enqueue``
                                e = (at, next(seq), ARR, j, (mid, i, rid, t, k))
                                if at < end_of[0]:
                                    push(soon, e)
                                else:
                                    b = int(at * inv) if at < _INF else _NEVER
                                    q = far.get(b)
                                    if q is None:
                                        far[b] = [e]
                                    else:
                                        q.append(e)
                        if held or rid not in payload:  # (0 until its ``local`` runs: it keeps no payload then)
                            refs[rid] = held
                        else:
                            del payload[rid]
                        if tx <= 0:  # nothing to transmit: the barrier at once
                            gather(i, t, k)
                        else:  # the program waits for its longest transmission (a Timeout, set after the arrivals)
                            enqueue(t + tx, SENT, i, k)
                    elif kind == ACT:  # the activation: its row, the round's gradient request (the parameters now)
                        a = agents[i]
                        if adopt is not None:
                            adopt(a, t)
                        put(pack(t, c_act, i, -1, -1, 0, v, a.round, c_none))
                        req = gradient(p, state, i)
                        if req is not req0 and req != req0:
                            raise RuntimeError(f"barrier windows: agent {i} asks for another gradient ({req}) than "
                                               f"{req0}")
                        rid = next(rids)
                        rid_of[i] = rid
                        ct = a.compute_time(t)  # ``Agent.gradient``
                        put(pack(t, c_start, i, -1, -1, 0, ct, -1, c_none))
                        tk = len(ticket_of)
                        got = a.sample_rows(batch)
                        ticket_of.append((i, None if got is a.rows else got))
                        done = t + ct
                        e = (done, next(seq), DONE, i, tk)  # ``enqueue``
                        if done < end_of[0]:
                            push(soon, e)
                        else:
                            b = int(done * inv) if done < _INF else _NEVER
                            q = far.get(b)
                            if q is None:
                                far[b] = [e]
                            else:
                                q.append(e)
                        k = ks[i]
                        recs[rid] = [i, k, 0.0, a.round, a.schedule.tick]
                        ops = ops_of.get(i)
                        if ops is None:
                            ops = ops_of[i] = []
                        ops.append((ASK, tk, rid))
                        if ahead:
                            group = pend.get(done)
                            if group is None:
                                group = pend[done] = {}
                            group[i] = (k, tk, rid)
                    elif kind == BARRIER:  # its completion: ``combine``, then the next wake or the finish
                        ops = ops_of.get(i)
                        if ops is None:
                            ops = ops_of[i] = []
                        ops.append((COMBINE, rid_of[i], v))
                        ks[i] += 1
                        wake(i, t)
                    elif kind == TIMER:
                        w = waiter[i]
                        if w is not None and w.gid == v:  # (else the barrier completed: the timer does nothing)
                            put(pack(t, c_timeout, i, -1, -1, 0, float(len(w.expect) - len(w.got)), w.round, c_none))
                            close(i, w, t)
                    elif kind == SENT:  # the broadcast's transmission is over: the program goes on to its barrier
                        gather(i, t, v)
                    elif housekeeping(t, kind, i, v):
                        return
            finally:
                self.now, self.pending_lo, self.flushed = t, pending_lo, flushed

        self.events_until = events_until

    def unref(self, rid: int) -> None:
        n = self.refs[rid] - 1
        if n or rid not in self.sizes:  # (0 before its ``local`` ran: ``locals`` keeps no payload then)
            self.refs[rid] = n
        else:
            del self.refs[rid]
            self.payload.pop(rid, None)

    def decide(self) -> None:
        """After the window's tensor work: its payloads' bytes into the ``send`` and ``drop`` rows, its releases after
        their agents' ``compute_end``."""
        buf, R, sizes, guess = self.rows.buf, RECORD.size, self.sizes, self.guess
        for at, rid in self.patches:
            if sizes[rid] != guess:
                _pack_size(buf, at * R + _SIZE_AT, sizes[rid])
        self.patches.clear()
        if not self.slots:
            return
        out, last = bytearray(), 0
        made = PackedRows(self.words)
        for at, rid in self.slots:
            rows = self.released.pop(rid)
            if rows:
                made.clear()
                made.extend(rows)
                out += buf[last:at * R]
                out += made.buf
                last = at * R
        self.slots.clear()
        if last:
            out += buf[last:]
            self.rows.clear()
            self.rows.put(out)

    # the tensor work --------------------------------------------------------------------------------------
    def tensor_work(self, first_ticket: int) -> None:
        self.in_order(first_ticket, (self.combines, self.asks, self.locals), ASK, LOCAL)
        if self.unmade:  # a payload is made before it is delivered, so in this work at the latest
            raise RuntimeError("barrier windows: a combine waits for a payload that was not made")

    def wait(self, i: int, o: tuple) -> bool:
        """Whether agent i's operation ``o`` is a ``combine`` that reads a payload not made yet (its sender's ``local``
        is later in this work's lock steps): it waits, and that ``local`` wakes it."""
        if o[0] != COMBINE:
            return False
        payload = self.payload
        for r in o[2].values():
            if r not in payload:
                self.unmade.setdefault(r, []).append(i)
                return True
        return False

    def by_round(self, step: list, at: int) -> dict[int, list]:
        """A lock step's operations by their round index (a batch has one ``b.k``)."""
        groups: dict[int, list] = {}
        recs = self.recs
        for i, o in step:
            groups.setdefault(recs[o[at]][1], []).append((i, o))
        return groups

    def asks(self, step: list) -> None:
        """The gradients' points: each agent's parameters at its activation (``agent.params``)."""
        who = [i for i, _ in step]
        x = self.bank.W.index_select(0, torch.tensor(who, device=self.bank.W.device))
        for (_, o), row in zip(step, x.unbind(0), strict=True):
            self.x_at[o[2]] = row
        self.asked(who, [o[1] for _, o in step], x)

    def locals(self, step: list) -> None:
        """``local`` of the agents whose gradients are evaluated, one call per round index."""
        kernel, p, recs, per_row = self.kernel, self.p, self.recs, self.kernel.per_row
        for k, ops in self.by_round(step, 2).items():
            rids = [o[2] for _, o in ops]
            x = torch.stack([self.x_at.pop(r) for r in rids])
            g = self.grads.take([o[1] for _, o in ops])
            made: list[list] = [[] for _ in ops]

            def at(n: int, rids=rids, made=made) -> tuple:
                rec = recs[rids[n]]
                return rec[2], made[n], rec[3], rec[4]

            b = Batch([self.agents[i] for i, _ in ops], k, x, g, self.state, at)
            if kernel.local(b, p) is not None:
                raise RuntimeError("barrier windows: local returned a generator (local steps are refused)")
            if b.k != k:
                raise RuntimeError("barrier windows: local changed the round index b.k (not played by these windows)")
            plain = not b.kept()  # (nothing of its own: ``combine`` takes its rows, no batch of one per agent)
            for n, rid in enumerate(rids):
                payload = b.out[n]
                size = self.sizes[rid] = b.sizes[n] if b.sizes is not None else payload_size(payload)
                if self.fixed is not None and size != self.fixed:  # (its sends were timed with the declared bytes)
                    raise RuntimeError(f"barrier windows: {type(kernel).__name__}.payload_bytes says {self.fixed} "
                                       f"bytes, and agent {self.agents[ops[n][0]].id} sent a payload of {size}")
                held = self.refs.get(rid)  # (None: its sends come later, at its own completion)
                if held is None or held:
                    self.payload[rid] = payload
                    woken = self.unmade.pop(rid, None)
                    if woken is not None:
                        self.woken.extend(woken)
                else:  # sent nowhere, every message lost, or discarded as stale before this work
                    del self.refs[rid]
                self.parts[rid] = (b, n) if plain else b.row(n, per_row)
                self.released[rid] = made[n]

    def combines(self, step: list) -> None:
        """``combine`` with what each barrier took, in arrival order, one call per round index."""
        kernel, p = self.kernel, self.p
        for _, ops in self.by_round(step, 1).items():
            parts = [self.parts.pop(o[1]) for _, o in ops]
            b = self.rows_of(parts) if all(type(q) is tuple for q in parts) else self.joined(
                [q if type(q) is not tuple else q[0].row(q[1], self.kernel.per_row) for q in parts])
            if self.small:
                got = self.arrivals([i for i, _ in ops], [o[2] for _, o in ops])
            else:
                got = [{src: self.payload[r] for src, r in o[2].items()} for _, o in ops]
            kernel.combine(b, p, got)
            for _, o in ops:
                for r in o[2].values():
                    self.unref(r)
                del self.recs[o[1]]

    def arrivals(self, who: list[int], took: list[dict]) -> Arrivals:
        """What each barrier took ({sender: round record}, in arrival order) as ``combine``'s ``got``: the payloads
        delivered (each once) as one tensor's rows where they are tensors, and each delivery's receiver, payload and
        weight as arrays (``Arrivals``: no dict per agent)."""
        payload, agents, chain = self.payload, self.agents, itertools.chain.from_iterable
        rids = np.fromiter(chain(g.values() for g in took), np.int64)
        if not len(rids):
            return Arrivals([], [], None, rids, rids, np.zeros(0), receivers=len(who))
        srcs = np.fromiter(chain(took), np.int64)  # (a dict's keys, in arrival order)
        # each delivery's weight (None, NaN in the array: the receiver has none for that sender)
        w = np.array(list(chain(map(agents[i].weights.get, g) for i, g in zip(who, took, strict=True))), np.float64)
        made, first, send = np.unique(rids, return_index=True, return_inverse=True)  # each payload once
        out = [payload[r] for r in made.tolist()]
        sent = torch.stack(out) if all(type(x) is torch.Tensor for x in out) else None
        recv = np.repeat(np.arange(len(who)), [len(g) for g in took])
        return Arrivals(srcs[first].tolist(), out, sent, recv, send.reshape(-1), w, receivers=len(who))

    def rows_of(self, parts: list[tuple[Batch, int]]) -> Batch:
        """``joined`` of (batch, row) parts whose batches keep nothing of their own: their rows, payloads and sizes."""
        first = parts[0][0]
        if len(parts) == 1:
            return first.row(parts[0][1])
        b = Batch([q.agents[n] for q, n in parts], first.k, torch.stack([q.x[n] for q, n in parts]),
                  None if first.g is None else torch.stack([q.g[n] for q, n in parts]), self.state)
        b.s = first.s
        b.out = [q.out[n] for q, n in parts]
        if any(q.sizes is not None for q, _ in parts):
            b.sizes = [payload_size(q.out[n]) if q.sizes is None else q.sizes[n] for q, n in parts]
        return b

    def joined(self, parts: list[Batch]) -> Batch:
        """Batches of one (``Batch.row``) as one batch: their rows, payloads and the kernel's kept values (those it
        declares ``per_row`` joined row by row, the others shared)."""
        first = parts[0]
        b = Batch([q.agents[0] for q in parts], first.k, torch.cat([q.x for q in parts]),
                  None if first.g is None else torch.cat([q.g for q in parts]), self.state)
        b.out = [q.out[0] for q in parts]
        if any(q.sizes is not None for q in parts):
            b.sizes = [payload_size(q.out[0]) if q.sizes is None else q.sizes[0] for q in parts]
        per_row = self.kernel.per_row
        for name, v in first.kept().items():
            if name in per_row:
                vs = [getattr(q, name) for q in parts]
                if all(isinstance(u, torch.Tensor) for u in vs):
                    v = torch.cat(vs)
                else:
                    v = [None if u is None else u[0] for u in vs]
            setattr(b, name, v)
        return b
