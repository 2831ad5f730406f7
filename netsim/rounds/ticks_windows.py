"""Rounds on activation ticks (rounds/ticks.py) as conservative lookahead windows: ``--engine windowed`` for DO-ADP,
byte for byte the events engine's trace, metrics and models.

The lookahead is push gossip's (rounds/lookahead.py): a message sent at t lands no earlier than t + L, so what an
activation of [T, T + L) adds to its copies was sent before T, by an earlier window's tensor work. The control plays
the window's events in simpy's order with the engine's calls (wakes, gradient requests and their batches, links),
and decides at each activation what the program decides there (``Replay``: the rounds replayed, which arrivals are
added when, which are late, the finish at the horizon), at each completion the release (the ledger's record, its
row after ``compute_end``) and the sends of the round's differences. The tensor work then runs each agent's
operations in its order, one per lock step (``WindowDriver.in_order``): arrivals added to the copies (each agent's
n-th of a step at once), replayed rounds (``sleep``), gradient requests at the rows as they then are, and active
rounds (the noise from each agent's own generator, ``step``, the differences kept until their last message is
added). The bank holds each agent's model after every operation, as the program writes it.
"""

from __future__ import annotations

import torch

from netsim.rounds.kernel import Batch
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
    per_agent,
    queued_holds,
)
from netsim.rounds.ticks import SLEEP, Replay

RECV, REPLAY, ASK, STEP = 0, 1, 2, 3  # an agent's tensor operations


def play(pattern, sim, kernel) -> bool:
    """Play a started run to its end window by window (module docstring)."""
    return _Driver(pattern, sim, kernel).run()


class _Driver(WindowDriver):
    def __init__(self, pattern, sim, kernel):
        super().__init__(pattern, sim, kernel)
        p = self.ctx.p
        self.grad.first = kernel.request(self.ctx.state, p)
        self.horizon = kernel.horizon(p)
        self.pc = kernel.copies(self.ctx.state)
        self.ctl = [Replay() for _ in self.ctx.agents]
        self.inbox: list[list] = [[] for _ in self.ctx.agents]  # (sender, round, payload handle), in arrival order
        self.round = [0] * len(self.ctx.agents)  # each agent's round being played
        self.noise = [kernel.noise(self.ctx.state, a, p) for a in self.ctx.agents]
        W = self.ctx.bank.W
        self.size = self.pc.comps[0].encoded_size(W.shape[1], W.element_size())  # every difference's bytes

    # the control flow -------------------------------------------------------------------------------------
    @staticmethod
    def incoming(v: tuple) -> tuple:
        return v[1], v[4], v[5]  # (an arrival's value: ``broadcast``'s)

    def activated(self, i: int, now: float, at: float) -> None:
        a, ctl = self.ctx.agents[i], self.ctl[i]
        t = a.tick(at) - 1
        got, self.inbox[i], applied = self.inbox[i], [], ctl.applied
        late = ctl.arrived(got)
        if late:
            a.stats.add(self.ctx.pattern.late, late)
            for _, rnd, h in got:  # (never added: their holds given up)
                if rnd <= applied:
                    self.payloads.release(h, later=True)
        slot = self.pc.slot[i]
        for op in ctl.wake(t, self.horizon):
            if op is SLEEP:
                self.op(i, REPLAY)
            else:
                self.op(i, RECV, [(slot[src], h) for src, h in op])
        if self.horizon is not None and t >= self.horizon:
            self.finish(a, now)
            return
        if ctl.spent:  # (refused with a budget cap: never here)
            raise RuntimeError("ticked rounds: a budget cap in lookahead windows")
        self.round[i] = t
        self.op(i, ASK, self.request(i, now, self.grad.first.batch))

    def completed(self, i: int, now: float, tk: int) -> None:
        """The release (its row after ``compute_end``), the round's differences sent (``WindowDriver.broadcast``)."""
        sigma, sens, q = self.noise[i]
        self.ctx.agents[i].ledger.record(self.ctx.bank.W.shape[1], sigma, sens, q=q, what="gradient",
                                         at=(now, self.rows))
        self.op(i, STEP, tk, *self.broadcast(i, now, self.size, self.round[i]))

    # checkpoints (``WindowDriver.held``) ------------------------------------------------------------------------
    def hold(self) -> tuple[object, dict[str, torch.Tensor]]:
        ctl = [[c.done, c.applied, list(c.pending.items()), c.spent] for c in self.ctl]
        return {"ctl": ctl, "inbox": self.inbox, "round": self.round}, {}

    KINDS = frozenset((ACT, DONE, ARR, SENT, STOP, UNTIL, EVAL, OFF))

    @classmethod
    def check_own(cls, sim, plain: dict, tensors: dict[str, torch.Tensor]) -> str | None:
        """``hold``'s state as this driver goes on from it: each agent's rounds (``Replay``: the last done, the one
        before it applied, the differences pending by later round, no budget spent), its inbox and the round it
        plays; the arrivals in flight, the completions (their gradients asked for or kept); every difference from an
        in-neighbour, its payload kept and held once by each message, inbox entry and pending entry that names it."""
        from netsim.sim.restore import int_in, ints_in, number, peers

        bad = super().check_own(sim, plain, tensors)
        if bad is not None:
            return bad
        own, agents = plain["own"], sim.loop.agents
        n, kept = len(agents), set(plain["payloads"])
        if set(own) != {"ctl", "inbox", "round"} or tensors:
            return "own"
        heard = peers(sim)
        diff = lambda i, src, h: int_in(src) and src in heard(i) and h in kept  # noqa: E731
        ctl, inbox = own["ctl"], own["inbox"]
        if not (isinstance(ctl, list) and len(ctl) == n and all(
                isinstance(c, list) and len(c) == 4 and int_in(c[0], -1, 2**31) and c[1] == max(c[0] - 1, -1)
                and isinstance(c[2], list) and all(
                    isinstance(r, list) and len(r) == 2 and int_in(r[0], c[1] + 1, 2**31) and isinstance(r[1], list)
                    and all(isinstance(m, list) and len(m) == 2 and diff(i, *m) for m in r[1]) for r in c[2])
                and len({r[0] for r in c[2]}) == len(c[2]) and c[3] is False for i, c in enumerate(ctl))):
            return "own.ctl"
        if not (isinstance(inbox, list) and len(inbox) == n and all(
                isinstance(box, list) and all(isinstance(m, list) and len(m) == 3 and int_in(m[1], 0, 2**31)
                                              and diff(i, m[0], m[2]) for m in box) for i, box in enumerate(inbox))):
            return "own.inbox"
        if not (isinstance(own["round"], list) and len(own["round"]) == n and ints_in(own["round"], 0, 2**31)):
            return "own.round"
        refs = [m[2] for box in inbox for m in box] + [h for c in ctl for r in c[2] for _, h in r[1]]
        arrivals = queued_holds(plain, n, lambda i, v: len(v) == 6 and int_in(v[0], 0, 2**62) and number(v[3])
                                and diff(i, v[1], v[5]) and int_in(v[2], 0, 2**62) and int_in(v[4], 0, 2**31))
        if arrivals is None:
            return "events"
        refs += arrivals
        return holds_of(plain, refs)

    def take_hold(self, own, tensors: dict[str, torch.Tensor]) -> None:
        per_agent(own, ("ctl", "inbox", "round"), len(self.ctx.agents))
        for c, (done, applied, pending, spent) in zip(self.ctl, own["ctl"], strict=True):
            c.done, c.applied, c.spent = done, applied, spent
            c.pending = {r: [tuple(m) for m in got] for r, got in pending}
        self.inbox[:] = [[tuple(m) for m in box] for box in own["inbox"]]
        self.round[:] = own["round"]

    # the tensor work --------------------------------------------------------------------------------------
    def tensor_work(self, first_ticket: int) -> None:
        self.in_order(first_ticket, (self.receives, self.replays, self.asks, self.steps), ASK, STEP)

    def batch(self, who: list[int]) -> tuple[Batch, torch.Tensor]:
        idx = torch.tensor(who, device=self.ctx.bank.W.device)
        agents = [self.ctx.agents[i] for i in who]
        return Batch(agents, self.round[who[0]], self.ctx.bank.W.index_select(0, idx), None, self.ctx.state), idx

    def receives(self, step: list) -> None:
        """x_hat_j += d_j (``Payloads.add_into``)."""
        self.payloads.add_into(self.pc.copies, step)

    def replays(self, step: list) -> None:
        b, idx = self.batch([i for i, _ in step])
        self.ctx.kernel.sleep(b, self.ctx.p)
        self.ctx.bank.W.index_copy_(0, idx, b.x)

    def asks(self, step: list) -> None:
        self.grad.asked_at(step, self.ctx.bank.W)

    def steps(self, step: list) -> None:
        """The releases' noise (each agent's own generator), the kernel's step, the differences kept for their
        messages."""
        who = [i for i, _ in step]
        b, idx = self.batch(who)
        b.recorded = [True] * len(who)  # at their completions (``completed``)
        sigma, sens, q = zip(*(self.noise[i] for i in who), strict=True)
        noisy = b.stack(b.privatize(self.grad.evaluated.take([o[1] for _, o in step]), sigma, sens, q))
        sent, _ = self.ctx.kernel.step(b, self.ctx.p, noisy)
        self.ctx.bank.W.index_copy_(0, idx, b.x)
        which = [n for n, (_, o) in enumerate(step) if o[3]]
        if which:
            self.payloads.keep([step[n][1][2] for n in which], sent, which, [step[n][1][3] for n in which])
