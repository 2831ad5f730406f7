"""The broadcast pattern (rounds/broadcast.py) as conservative lookahead windows: ``--engine windowed`` for asynchronous
push gossip SGD and push-sum, byte for byte the events engine's trace, metrics and models.

The lookahead is push gossip's (rounds/lookahead.py, whose admitted region, refusals and window statistics this driver
shares): a message sent at t lands no earlier than t + L, so whatever an activation of [T, T + L) merges, at its start
(push-sum) or when its gradient is back (asynchronous push), was pushed before T, by an earlier window's tensor work;
without a lookahead (a latency with no positive minimum) a merge may read a push of its own window, and waits for the
lock step after it.
The driver plays the window's events in simpy's order, each agent's and each link's streams drawn by the engine's calls
in the engine's order, the kernel's control (``choose``, ``scalars``, ``pushed``) called at the event's time as the
program calls it; every agent's tensor operations of the window are then done in lock step: in each step an agent goes
as far as it can through one activation's operations (merge, ask, update, push, in its program's order), each kind in
one batched kernel call. A gradient is taken where the kernel says when it is asked (``gradient_at``, kept until its
batch is evaluated: asynchronous push merges before its update) and evaluated in the engine's batches, or per step for a
batch-invariant model, as push gossip's driver does. A broadcast that takes time to transmit (bandwidth, uplinks) holds
the program until its longest transmission ends (``Agent.broadcast``'s Timeout, an event of its own set after the
arrivals), then it wakes again; the lookahead still holds, as a transmission only delays an arrival. A pushed payload is
one row however many out-neighbours it goes to, freed when the last message carrying it is merged, or, for a kernel that
``keeps`` payloads (push-sum's last running sum per sender), when a later take names it as its base."""

from __future__ import annotations

import torch

from netsim.rounds.broadcast import OWN, Incoming
from netsim.rounds.kernel import Batch, _plain, _restored
from netsim.rounds.lookahead import (
    ACT,
    ARR,
    DONE,
    EVAL,
    OFF,
    SENT,
    STOP,
    UNTIL,
    WindowDriver,
    holds_of,
    lookahead,
    per_agent,
    queued_holds,
)
from netsim.sim.network import payload_size

MERGE, ASK, UPDATE, PUSH = 0, 1, 2, 3  # an agent's tensor operations


def play(pattern, sim, kernel) -> bool:
    """Play a started run to its end window by window (see the module docstring); True when an interrupt stopped it
    between two windows."""
    return _Driver(pattern, sim, kernel).run()


class _Driver(WindowDriver):
    """The broadcast pattern's control and tensor work (the module docstring); the rest is ``WindowDriver``'s."""

    gathers = 32  # windows whose tensor work is done together (a merge waits for the push of its payloads)
    gathers_checkpointed = 1  # (where checkpoints are kept: each cut at the window it falls in)

    # the rank of each operation in an activation's order (by ``kernel.merge_first``): push-sum merges before it asks,
    # asynchronous push after
    RANKS = ({ASK: 0, MERGE: 1, UPDATE: 2, PUSH: 3}, {MERGE: 0, ASK: 1, UPDATE: 2, PUSH: 3})

    def __init__(self, pattern, sim, kernel):
        super().__init__(pattern, sim, kernel)
        self.grad.first = kernel.request(self.ctx.p)
        # the control flow
        self.own = [kernel.start(a, self.ctx.p) for a in self.ctx.agents]
        self.inbox: list[list[Incoming]] = [[] for _ in self.ctx.agents]  # arrived, not yet merged (arrival order)
        # the tensor work
        self.X = self.ctx.bank.W.clone()  # each program's x between activations
        self.extra = {name: torch.zeros_like(self.X) for name in kernel.extra_rows}
        self.size = payload_size(kernel.payload(self.X[0], 0.0))  # every push's bytes
        self.bounded = lookahead(sim)[0] is not None  # a positive lookahead: every payload a window merges is made

    def op(self, i: int, kind: int, *v) -> None:
        """``WindowDriver.op``, ranked first by the operation's place in an activation's order."""
        ops = self.ops.get(i)
        if ops is None:
            ops = self.ops[i] = []
        ops.append((self.RANKS[self.ctx.kernel.merge_first][kind], kind, *v))

    # the control flow -------------------------------------------------------------------------------------
    @staticmethod
    def incoming(v: tuple) -> Incoming:
        return Incoming(v[1], v[4], v[5], v[6])  # (an arrival's value: ``broadcast``'s, its extra the scalar)

    def activated(self, i: int, now: float, _at: float) -> None:
        if self.ctx.kernel.merge_first:
            self.merge(i)
        if self.grad.first is not None:
            self.ask(i, now)
            return
        if not self.ctx.kernel.merge_first:
            self.merge(i)
        self.send(i, now)

    def completed(self, i: int, now: float, tk: int) -> None:
        if not self.ctx.kernel.merge_first:
            self.merge(i)
        self.op(i, UPDATE, tk)
        self.send(i, now)

    def merge(self, i: int) -> None:
        """The program's merge: what arrived, taken from the inbox; the kernel chooses now."""
        got = self.inbox[i]
        if not got:
            return
        self.inbox[i] = []
        takes = self.ctx.kernel.choose(self.own[i], self.ctx.agents[i], self.ctx.p, got)
        self.op(i, MERGE, takes, [m.handle for m in got], self.ctx.kernel.scalars(self.own[i]) if takes else None)

    def ask(self, i: int, now: float) -> None:
        self.op(i, ASK, self.request(i, now, self.grad.first.batch), self.ctx.kernel.scalars(self.own[i]))

    def send(self, i: int, now: float) -> None:
        """The params written, the payload pushed to every out-neighbour (``WindowDriver.broadcast``)."""
        a, kernel = self.ctx.agents[i], self.ctx.kernel
        scal = kernel.scalars(self.own[i])
        pid, held = self.broadcast(i, now, self.size, a.round, kernel.pushed(self.own[i], a, self.ctx.p))
        self.op(i, PUSH, pid, held, scal)

    def hold(self) -> tuple[object, dict[str, torch.Tensor]]:
        return {"inbox": self.inbox, "own": [_plain(vars(o) if hasattr(o, "__dict__") else o) for o in self.own]}, \
            {"X": self.X, **{f"extra.{k}": m for k, m in self.extra.items()}}

    KINDS = frozenset((ACT, DONE, ARR, SENT, STOP, UNTIL, EVAL, OFF))
    OWN = ("inbox", "own")  # the keys of ``hold``'s plain part

    @classmethod
    def check_own(cls, sim, plain: dict, tensors: dict[str, torch.Tensor]) -> str | None:
        """``hold``'s state as this driver goes on from it: each agent's inbox (senders among its in-neighbours,
        payloads kept), the kernel's own values (of the kinds a fresh ``start`` makes; push-sum's last running sums
        kept), each program's rows; the arrivals in flight (their payloads kept), the completions (their gradients
        asked for or kept); each payload held once by each message, inbox entry and running sum that names it."""
        from netsim.sim.restore import int_in, number, peers

        bad = super().check_own(sim, plain, tensors)
        if bad is not None:
            return bad
        own, agents, kernel, heard = plain["own"], sim.loop.agents, sim.program, peers(sim)
        n, kept = len(agents), set(plain["payloads"])
        if set(own) != set(cls.OWN):
            return "own"
        got = lambda i, m: isinstance(m, list) and len(m) == 4 and int_in(m[0]) and m[0] in heard(i) \
            and int_in(m[1], 0, 2**31) and number(m[2]) and m[3] in kept  # noqa: E731  (``Incoming``)
        inbox = own["inbox"]
        if not (isinstance(inbox, list) and len(inbox) == n and all(
                isinstance(box, list) and all(got(i, m) for m in box) for i, box in enumerate(inbox))):
            return "own.inbox"
        refs = [m[3] for box in inbox for m in box]
        if not (isinstance(own["own"], list) and len(own["own"]) == n):
            return "own.own"
        for a, saved in zip(agents, own["own"]):
            o = kernel.start(a, sim.params)
            try:
                o = _restored(saved, vars(o) if hasattr(o, "__dict__") else o)
            except ValueError:
                return "own.own"
            if kernel.keeps:  # push-sum's last running sum of each in-neighbour (``newer_sum``): (round, handle, sum)
                rho = o.get("rho") if isinstance(o, dict) else None
                if not (isinstance(rho, dict) and all(
                        j in a.in_neighbors and isinstance(r, tuple) and len(r) == 3 and int_in(r[0], 0, 2**31)
                        and r[1] in kept and number(r[2]) for j, r in rho.items())):
                    return "own.own"
                refs += [r[1] for r in rho.values()]
        shape = sim.world.bank.W.shape
        if set(tensors) != {"X", *(f"extra.{k}" for k in kernel.extra_rows)} \
                or any(m.shape != shape for m in tensors.values()):
            return "own.X"
        arrivals = queued_holds(plain, n, lambda i, v: len(v) == 7 and int_in(v[0], 0, 2**62) and number(v[3])
                                and got(i, [v[1], v[4], v[5], v[6]]) and int_in(v[2], 0, 2**62))
        if arrivals is None:
            return "events"
        refs += arrivals
        more = cls.held_by(sim, plain)
        if isinstance(more, str):
            return more
        return holds_of(plain, refs + more)

    @classmethod
    def held_by(cls, sim, plain: dict) -> list | str:
        """The payloads the rest of ``hold``'s state (``plain["own"]``) holds (a handle for each hold), or the first key
        that is not what this driver holds (``check_own``)."""
        return []

    def take_hold(self, own, tensors: dict[str, torch.Tensor]) -> None:
        per_agent(own, ("inbox", "own"), len(self.ctx.agents))
        self.inbox[:] = [[Incoming(*m) for m in box] for box in own["inbox"]]
        for k, (o, saved) in enumerate(zip(self.own, own["own"], strict=True)):
            if hasattr(o, "__dict__"):
                _restored(saved, vars(o))
            else:
                self.own[k] = _restored(saved, o)
        self.X.copy_(tensors["X"])
        for k, m in self.extra.items():
            m.copy_(tensors[f"extra.{k}"])

    # the tensor work --------------------------------------------------------------------------------------
    def batch(self, who: list[int], scalars: list | None = None) -> tuple[Batch, torch.Tensor]:
        idx = torch.tensor(who, device=self.X.device)
        b = Batch([self.ctx.agents[i] for i in who], self.ctx.agents[who[0]].round, self.X.index_select(0, idx), None,
                  self.ctx.state)
        b.rows = {name: m.index_select(0, idx) for name, m in self.extra.items()}
        b.scalars = scalars
        return b, idx

    def store(self, b: Batch, idx: torch.Tensor) -> None:
        self.X.index_copy_(0, idx, b.x)
        for name, m in self.extra.items():
            m.index_copy_(0, idx, b.rows[name])

    def tensor_work(self, first_ticket: int) -> None:
        """Every agent's operations of the window, in lock step (module docstring); a gradient batch is evaluated
        once all its requests are made (those of earlier windows were)."""
        grad, rank = self.grad, self.RANKS[self.ctx.kernel.merge_first]
        kinds = sorted(rank, key=rank.get)  # a lock step's batched calls, in an activation's order
        flush_of, left, waiting = grad.batches(first_ticket)
        ops, ptr = self.ops, dict.fromkeys(self.ops, 0)
        active = list(ops)
        blocked: dict[int, int] = {}
        evaluated, free = grad.evaluated.row_of, grad.free
        made = None if self.bounded and self.gathers == 1 else self.payloads.row_of  # (a merge may wait for a push)
        waiting = grad.evaluate_ready(left, waiting, blocked, active)  # batches asked for in earlier windows
        while active:
            steps: list[list] = [[], [], [], []]  # by kind: (agent, op)
            nxt = []
            progressed = False
            for i in active:
                mine = ops[i]
                k, n, last, waits = ptr[i], len(mine), -1, False
                while k < n:
                    o = mine[k]
                    if o[0] <= last:
                        break
                    if o[1] == MERGE and made is not None and any(h not in made for h in o[3]):
                        break  # a payload pushed in this window, in a later step
                    if o[1] == UPDATE and o[2] not in evaluated:  # asked for in this step, or its batch waits
                        if not free:  # for a request still to come: woken when it is evaluated
                            blocked[o[2]] = i
                            waits = True
                        break
                    if o[1] == ASK and not free:
                        f = flush_of.get(o[2])
                        if f is not None:
                            left[f] -= 1
                    steps[o[1]].append((i, o))
                    last = o[0]
                    k += 1
                if k > ptr[i]:
                    progressed = True
                    ptr[i] = k
                if k < n and not waits:
                    nxt.append(i)
            if not progressed:
                raise RuntimeError("lookahead windows: the window's operations wait on each other")
            for kind in kinds:
                if steps[kind]:
                    (self.merges, self.asks, self.updates, self.pushes)[kind](steps[kind])
            if waiting:
                waiting = self.grad.evaluate_ready(left, waiting, blocked, nxt)
            active = nxt
        self.work_done(waiting, blocked)

    def merges(self, step: list) -> None:
        kernel = self.ctx.kernel
        mathy = [(i, o) for i, o in step if o[2]]
        if mathy:
            b, idx = self.batch([i for i, _ in mathy], [o[4] for _, o in mathy])
            kernel.merge(b, self.ctx.p, [o[2] for _, o in mathy], self.payloads.peek)
            self.store(b, idx)
        pay = self.payloads
        for _, o in step:
            if kernel.keeps:
                for t in o[2]:
                    pay.hold(t.handle)
            for pid in o[3]:
                pay.release(pid)
            if kernel.keeps:
                for t in o[2]:
                    if t.base is not None and t.base != OWN:
                        pay.release(t.base)

    def asks(self, step: list) -> None:
        who = [i for i, _ in step]
        b, _ = self.batch(who, [o[3] for _, o in step])
        self.grad.asked(who, [o[2] for _, o in step], self.ctx.kernel.gradient_at(b, self.ctx.p))

    def updates(self, step: list) -> None:
        b, idx = self.batch([i for i, _ in step])
        self.ctx.kernel.update(b, self.ctx.p, self.grad.evaluated.take([o[2] for _, o in step]))
        self.store(b, idx)

    def pushes(self, step: list) -> None:
        b, idx = self.batch([i for i, _ in step], [o[4] for _, o in step])
        self.ctx.bank.W.index_copy_(0, idx, self.ctx.kernel.params(b, self.ctx.p))  # agent.params = ...
        sent = self.ctx.kernel.push(b, self.ctx.p)
        self.store(b, idx)
        which = [k for k, (_, o) in enumerate(step) if o[3]]  # payloads in flight or kept, by their handles
        if which:
            self.payloads.keep([step[k][1][2] for k in which], sent, which, [step[k][1][3] for k in which])
