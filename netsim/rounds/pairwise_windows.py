"""Pairwise exchanges with a lock (rounds/pairwise.py: AD-PSGD) as conservative lookahead windows: ``--engine
windowed``, byte for byte the events engine's trace, metrics and models.

The lookahead is push gossip's (rounds/lookahead.py): a request sent at t lands at t + L at the earliest, and the
reply the server sends then lands L later still; so whatever an operation of the window [T, T + L) reads of
another agent (a request's model, a reply's) was sent before T, by an earlier window's tensor work. Without a
lookahead (a latency with no positive minimum) a serve or a reply may read a payload made in its own window: it
waits for the lock step after the one that makes it (``reads``). The lock protocol never reads a tensor: who is
locked, served, refused or timed out follows from times alone.

The control plays the engine's two programs per agent in simpy's order: the main program (activated,
the gradient asked for, on its completion the staleness observed and, for an initiating agent, the exchange: lock,
peer from the program's stream, request, the stale replies still queued, the reply's timer) and the server (a
request served, or refused while locked, then the next queued one). A program waiting on ``recv`` resumes in an
event of its own, scheduled when the message (or the timer) resolves its wait, as simpy's ``succeed`` does; a
message that finds no waiter is queued, as the inbox queues it. Each agent's tensor operations, in the order its
programs make them (the gradient's point, the request's model, a serve: the reply's model and (x + x_req) / 2, a
reply: x + (x_rep - x_mine) / 2, the step), are then done in lock step, one per agent and step, each kind in one
batched call, on the bank's rows (``PairwiseGossip``'s float operations, row-wise: the same bits in any batch).
A payload row (a request's model, a reply's) is kept while a message or the requester's exchange holds it, and
dropped after the tensor work of the window whose control let go of it.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import torch

from netsim.rounds.kernel import Batch
from netsim.rounds.lookahead import (
    ACT,
    ARR,
    DONE,
    EVAL,
    OFF,
    STOP,
    UNTIL,
    WindowDriver,
    holds_of,
    pack,
    per_agent,
    queued,
)
from netsim.sim.network import hold_time, payload_size
from netsim.sim.rows import CODES, deliver
from netsim.trace.events import Stale
from netsim.trace.events import row as event_row

RESUME, SERVE_NEXT, TIMER, SENT = 7, 8, 9, 10  # events of their own (after lookahead's): a program's wait resolved,
# a timer, the end of a request's transmission
ASK, SEND, SERVE, REPLY, STEP = range(5)  # an agent's tensor operations


class Arrived(NamedTuple):
    """A message on its way and in an inbox: id, sender, bytes, when sent, round, tag, payload handle (None: a
    refusal, a pull's request). A tuple: a checkpoint keeps it as a list."""

    mid: int
    src: int
    size: int
    sent: float
    round: int
    tag: str
    pid: int | None


def play(pattern, sim, kernel) -> bool:
    """Play a started run to its end window by window (see the module docstring); True when an interrupt stopped it
    between two windows."""
    return _Driver(pattern, sim, kernel).run()


class _Programs:
    """The control state of each agent's two programs (``PairwiseGossip``'s main program and server), by agent."""

    __slots__ = ("initiates", "rngs", "locked", "xround", "served", "seen", "ticket", "mine", "waits", "replies",
                 "requests", "serving")

    def __init__(self, kernel, state, agents: list):
        n = len(agents)
        self.initiates = [kernel.initiates(state, i) for i in range(n)]
        self.rngs = [a.rng() for a in agents]  # the program's own stream: its peers
        self.locked = [False] * n  # in its own exchange (``PairwiseGossip.busy``)
        self.xround = [0] * n  # exchanges so far (a request's round)
        self.served = [0] * n  # requests served (not refused)
        self.seen = [0] * n  # ``served`` when the activation asked for its gradient
        self.ticket: list = [None] * n  # the activation's gradient ticket
        self.mine: list = [None] * n  # the exchange's own model (its request's payload)
        self.waits = [0] * n  # the round of the reply the main program waits for (0: not waiting)
        self.replies: list[list[Arrived]] = [[] for _ in range(n)]  # replies nobody waited for (stale later)
        self.requests: list[deque] = [deque() for _ in range(n)]  # requests that came while the server resumes
        self.serving = [False] * n  # the server's resume is scheduled (its wait is over)

    PLAIN = ("locked", "xround", "served", "seen", "ticket", "mine", "waits", "serving")  # a value per agent

    def held(self) -> dict:
        """The programs' state as a checkpoint keeps it (``WindowDriver.held``)."""
        return {**{k: getattr(self, k) for k in self.PLAIN}, "replies": self.replies,
                "requests": [list(q) for q in self.requests]}

    def load(self, own: dict) -> None:
        per_agent(own, (*self.PLAIN, "replies", "requests"), len(self.locked))
        for k in self.PLAIN:
            getattr(self, k)[:] = own[k]
        self.replies[:] = [[Arrived(*m) for m in box] for box in own["replies"]]
        self.requests[:] = [deque(Arrived(*m) for m in q) for q in own["requests"]]


class _Driver(WindowDriver):
    """The pairwise pattern's control and tensor work; the rest is ``WindowDriver``'s."""

    reads = {SERVE: 1, REPLY: 1}  # a request's model, a reply's: made by another agent's SEND, SERVE
    gathers = 32  # windows whose tensor work is done together (a serve or reply waits for its payload: ``reads``)
    gathers_checkpointed = 1  # (where checkpoints are kept: each cut at the window it falls in)

    def __init__(self, pattern, sim, kernel):
        super().__init__(pattern, sim, kernel)
        p = self.ctx.p
        self.grad.first = kernel.gradient(p, self.ctx.state, 0)  # the same for every activation
        self.timeout, self.atomic = kernel.exchange(p)
        self.tags, self.pull = pattern.names, pattern.pull
        self.stat = self.ctx.agents[0].stats
        self.X = self.ctx.bank.W  # every program's model (``agent.params``)
        self.size = payload_size(self.X[0])
        self.programs = _Programs(kernel, self.ctx.state, self.ctx.agents)

    # the control flow -------------------------------------------------------------------------------------
    def events_until(self, end: float) -> None:
        """Process every event due before ``end`` (or to the run's stop), as the engine's queue does."""
        put, words, t = self.rows.put, self.rows.words, self.events.now
        try:
            for t, _, kind, i, v in self.events.due(end):
                if kind == ACT:
                    self.activate(i, t, v)
                    self.activated(i, t)
                elif kind == ARR:
                    put(pack(*deliver(t, i, v.src, v.mid, v.size, v.sent, v.round, words(v.tag), CODES)))
                    self.arrived(i, t, v)
                elif kind == DONE:
                    self.completion(i, t, v)
                    if self.ctx.kernel.staleness is not None:
                        prog = self.programs
                        self.stat.observe(self.ctx.kernel.staleness, float(prog.served[i] - prog.seen[i]))
                    if self.ctx.kernel.step_first:
                        self.op(i, STEP, v)
                    else:
                        self.programs.ticket[i] = v
                    self.exchange_or_step(i, t)
                elif kind == RESUME:
                    self.resumed(i, t, v)
                elif kind == SERVE_NEXT:
                    self.serve(i, t, v)
                elif kind == TIMER:
                    if self.programs.waits[i] == v:  # the wait it was set for is still open: it ends with nothing
                        self.programs.waits[i] = 0
                        self.events.push(t, RESUME, i, None)
                elif kind == SENT:
                    self.receive(i, t, v)
                elif self.housekeeping(t, kind, i, v):
                    return
        finally:
            self.events.now = t

    def activated(self, i: int, now: float) -> None:
        if self.grad.first is None:
            self.exchange_or_step(i, now)
            return
        self.programs.seen[i] = self.programs.served[i]
        self.op(i, ASK, self.request(i, now, self.grad.first.batch))

    def exchange_or_step(self, i: int, now: float) -> None:
        if self.programs.initiates[i]:
            self.exchange(i, now)
        else:
            self.step(i, now)

    def exchange(self, i: int, now: float) -> None:
        """``PairwiseGossip.exchange`` up to its wait: the lock, the request (and the end of its transmission, where it
        takes time: the program waits for it), then ``receive``."""
        self.programs.locked[i] = True
        r = self.programs.xround[i] = self.programs.xround[i] + 1
        nb = self.ctx.agents[i].neighbors
        j = nb[int(self.programs.rngs[i].integers(len(nb)))]
        if self.pull:  # a 1-byte request, no model
            self.programs.mine[i] = None
            tx_end = self.send(i, j, now, None, 1, self.tags[0], r)
        else:
            pid = self.programs.mine[i] = self.payloads.new()
            self.op(i, SEND, pid)
            self.payloads.hold(pid)  # the exchange's own copy (``mine``), until it resumes
            tx_end = self.send(i, j, now, pid, self.size, self.tags[0], r)
        tx = hold_time(tx_end, now)  # ``Agent.send``'s Timeout, set after the arrival
        if tx > 0:
            self.events.push(now + tx, SENT, i, r)
        else:
            self.receive(i, now, r)

    def receive(self, i: int, now: float, r: int) -> None:
        """The exchange's ``recv``: the queued stale replies, then the wait for round ``r``'s reply and its timer."""
        for m in self.programs.replies[i]:  # an earlier exchange's reply (round < r): stale
            self.rows.append(event_row(Stale(now, i, m.src, m.mid, m.round)))
            if m.pid is not None:
                self.payloads.release(m.pid, later=True)
        self.programs.replies[i].clear()
        self.programs.waits[i] = r
        self.events.push(now + self.timeout, TIMER, i, r)

    def send(self, i: int, j: int, now: float, pid, size: int, tag: str, rnd: int) -> float:
        """A message (and a hold of its payload ``pid``) on its way; returns the end of its transmission."""
        mid, at, tx_end = self.message(i, j, now, size, rnd, tag, self.rows)
        if at is not None:
            if pid is not None:
                self.payloads.hold(pid)
            self.events.push(at, ARR, j, Arrived(mid, i, size, now, rnd, tag, pid))
        return tx_end

    def arrived(self, i: int, now: float, m: Arrived) -> None:
        """``Inbox.put``: a waiting program's wait resolved (it resumes in an event of its own), else queued."""
        if m.tag == self.tags[0]:
            if self.programs.serving[i]:
                self.programs.requests[i].append(m)
            else:
                self.programs.serving[i] = True
                self.events.push(now, SERVE_NEXT, i, m)
            return
        w = self.programs.waits[i]
        if not w:
            self.programs.replies[i].append(m)
        elif m.round != w:  # an older exchange's reply (never a later one's): stale, taken and dropped
            self.rows.append(event_row(Stale(now, i, m.src, m.mid, m.round)))
            if m.pid is not None:
                self.payloads.release(m.pid, later=True)
        else:
            self.programs.waits[i] = 0
            self.events.push(now, RESUME, i, m)

    def resumed(self, i: int, now: float, m: Arrived | None) -> None:
        """The exchange after its wait: nothing (timed out), a refusal, or the reply averaged in; then the step."""
        if m is None:
            self.stat.add("gossip_timeouts")
        elif m.pid is not None:
            self.op(i, REPLY, m.pid, self.programs.mine[i])
            self.payloads.release(m.pid, later=True)
            self.stat.add("gossip_exchanges")
        if self.programs.mine[i] is not None:
            self.payloads.release(self.programs.mine[i], later=True)
        self.programs.locked[i] = False
        self.step(i, now)

    def step(self, i: int, now: float) -> None:
        tk = self.programs.ticket[i]
        if tk is not None:
            self.op(i, STEP, tk)
            self.programs.ticket[i] = None
        self.wake(i, now)

    def serve(self, j: int, now: float, m: Arrived) -> None:
        """``PairwiseGossip._serve`` for one request, then its next wait (a queued request resumes it at once)."""
        if self.atomic and self.programs.locked[j]:
            self.stat.add("gossip_refused")
            self.send(j, m.src, now, None, 1, self.tags[1], m.round)
        else:
            pid = self.payloads.new()
            self.send(j, m.src, now, pid, self.size, self.tags[1], m.round)
            self.op(j, SERVE, m.pid, pid, pid in self.payloads.holds)
            self.programs.served[j] += not self.pull  # a pull's server keeps its model
        if m.pid is not None:
            self.payloads.release(m.pid, later=True)
        q = self.programs.requests[j]
        if q:
            self.events.push(now, SERVE_NEXT, j, q.popleft())
        else:
            self.programs.serving[j] = False

    # checkpoints (``WindowDriver.held``) ------------------------------------------------------------------------
    MESSAGES = (ARR, RESUME, SERVE_NEXT)  # the events whose value is a message (``Arrived``; RESUME's or None)

    def hold(self) -> tuple[object, dict[str, torch.Tensor]]:
        return self.programs.held(), {}

    KINDS = frozenset((ACT, DONE, ARR, STOP, UNTIL, EVAL, OFF, RESUME, SERVE_NEXT, TIMER, SENT))

    @classmethod
    def check_own(cls, sim, plain: dict, tensors: dict[str, torch.Tensor]) -> str | None:
        """``hold``'s state as this driver goes on from it: each agent's programs (its lock, exchanges and serves so
        far, the gradient it steps with, its exchange's own model while locked, the round it waits for), the replies
        and requests queued; the messages in flight, resolving a wait or served next (each from a neighbour, of the
        pattern's tags), the timers and transmissions of exchanges made, the completions; every payload kept and held
        once by each message and locked exchange that names it."""
        from netsim.sim.restore import int_in, number, peers

        bad = super().check_own(sim, plain, tensors)
        if bad is not None:
            return bad
        own, agents, pattern, sent_by = plain["own"], sim.loop.agents, sim.program.pattern, peers(sim, out=True)
        n, kept, grads = len(agents), set(plain["payloads"]), set(plain["grads"])
        if set(own) != {*_Programs.PLAIN, "replies", "requests"} or tensors:
            return "own"
        each = lambda k, ok: isinstance(own[k], list) and len(own[k]) == n and all(map(ok, own[k]))  # noqa: E731
        xround = own["xround"]
        for k, ok in (("locked", lambda v: type(v) is bool), ("serving", lambda v: type(v) is bool),
                      ("xround", lambda v: int_in(v, 0, 2**31)), ("served", lambda v: int_in(v, 0, 2**62)),
                      ("ticket", lambda v: v is None or v in grads), ("mine", lambda v: v is None or int_in(v))):
            if not each(k, ok):
                return f"own.{k}"
        if not (each("seen", lambda v: int_in(v)) and all(map(int.__le__, own["seen"], own["served"]))):
            return "own.seen"
        if not (each("waits", lambda v: int_in(v)) and all(w in (0, r) for w, r in zip(own["waits"], xround))):
            return "own.waits"
        if not (pattern.pull or all(m in kept for m, locked in zip(own["mine"], own["locked"]) if locked)):
            return "own.mine"
        refs = [m for m, locked in zip(own["mine"], own["locked"]) if locked and not pattern.pull]

        def message(i: int, m) -> bool:  # (``Arrived``: to agent i, from a neighbour, its payload kept and held)
            ok = isinstance(m, list) and len(m) == 7 and int_in(m[0], 0, 2**62) and int_in(m[1]) \
                and m[1] in sent_by(i) and int_in(m[2], 0, 2**62) and number(m[3]) \
                and int_in(m[4], 0, 2**31) and m[5] in pattern.names \
                and (m[6] is None or m[6] in kept)
            if ok and m[6] is not None:
                refs.append(m[6])
            return ok

        for k in ("replies", "requests"):
            if not each(k, lambda q: isinstance(q, list)) \
                    or not all(message(i, m) for i, q in enumerate(own[k]) for m in q):
                return f"own.{k}"
        made = lambda i, v: int_in(v, 1, xround[i] + 1)  # noqa: E731  (a timer or transmission of an exchange made)
        if not queued(plain, n, {ARR: message, SERVE_NEXT: message, RESUME: lambda i, v: v is None or message(i, v),
                                 TIMER: made, SENT: made}):
            return "events"
        return holds_of(plain, refs)

    def take_hold(self, own, tensors: dict[str, torch.Tensor]) -> None:
        self.programs.load(own)
        for q in self.events.far.values():  # the queue's messages, made tuples again by the JSON
            q[:] = [(t, seq, kind, i, Arrived(*v)) if kind in self.MESSAGES and v is not None else (t, seq, kind, i, v)
                    for t, seq, kind, i, v in q]

    # the tensor work --------------------------------------------------------------------------------------
    def tensor_work(self, first_ticket: int) -> None:
        """Each agent's operations of the window in its order, one per agent and lock step (``in_order``)."""
        self.in_order(first_ticket, (self.asks, self.sends, self.serves, self.replies_in, self.steps), ASK, STEP)

    def rows_of(self, step: list) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        who = [i for i, _ in step]
        idx = torch.tensor(who, device=self.X.device)
        return who, idx, self.X.index_select(0, idx)

    def asks(self, step: list) -> None:
        self.grad.asked_at(step, self.X)

    def sends(self, step: list) -> None:
        _, _, x = self.rows_of(step)
        self.payloads.put([o[1] for _, o in step], x)

    def serves(self, step: list) -> None:
        """The reply's model (kept if the reply is under way), then (x + x_req) / 2 (not for a pull)."""
        _, idx, x = self.rows_of(step)
        kept = [k for k, (_, o) in enumerate(step) if o[3]]
        if kept:
            self.payloads.keep([step[k][1][2] for k in kept], x, kept)
        if not self.pull:
            self.X.index_copy_(0, idx, (x + self.payloads.peek([o[1] for _, o in step])) / 2)

    def replies_in(self, step: list) -> None:
        """x + (x_rep - x_mine) / 2 (``PairwiseGossip.exchange``'s delta form); a pull's through ``combine``."""
        who, idx, x = self.rows_of(step)
        rep = self.payloads.peek([o[1] for _, o in step])
        if self.pull:
            b = Batch([self.ctx.agents[i] for i in who], self.ctx.agents[who[0]].round, x, None, self.ctx.state)
            self.ctx.kernel.combine(b, self.ctx.p, rep)
            self.X.index_copy_(0, idx, b.x)
            return
        mine = self.payloads.peek([o[2] for _, o in step])
        self.X.index_copy_(0, idx, x + (rep - mine) / 2)

    def steps(self, step: list) -> None:
        who, idx, x = self.rows_of(step)
        b = Batch([self.ctx.agents[i] for i in who], self.ctx.agents[who[0]].round, x, None, self.ctx.state)
        self.ctx.kernel.update(b, self.ctx.p, self.grad.evaluated.take([o[1] for _, o in step]))
        self.X.index_copy_(0, idx, b.x)
