"""The agent API an algorithm is written against (see docs/architecture.md).

An algorithm is a generator ``fn(agent, params)`` that yields simpy events it gets from the agent:
``wake()``, ``gradient()``, ``send()``/``broadcast()``, ``recv()``/``gather()``. Everything that
must survive a checkpoint lives outside the generator: parameters in the bank, randomness in the
stream tree, messages in the network.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy
import torch

from netsim.sim.network import Message
from netsim.trace.events import Activate, ComputeStart, Finish, Stale, Timeout

if TYPE_CHECKING:
    from netsim.sim.kernel import Simulation


def processed_event(env: simpy.Environment) -> simpy.Event:
    """An event that is already over: yielding it resumes the process at once, at no cost."""
    ev = simpy.Event(env)
    ev._ok, ev._value, ev.callbacks = True, None, None
    return ev


class _Waiter:
    """A pending ``recv``/``gather``. Once resolved it lets go of its event and what it collected: a
    timeout timer stays in the event queue until it fires (simpy cannot cancel one) and references its
    waiter, so with a long timeout (a 'wait forever' barrier) every round's payloads would otherwise
    stay in memory for the whole run."""

    __slots__ = ()

    def finish(self, value) -> None:
        del self.inbox.waiters[self.tag]
        ev, self.event = self.event, None
        ev.succeed(value)

    def timed_out(self, _timer) -> None:
        if self.event is not None:
            self.expire()


class _Recv(_Waiter):
    __slots__ = ("event", "tag", "inbox", "round")

    def __init__(self, event, tag, inbox, rnd):
        self.event, self.tag, self.inbox, self.round = event, tag, inbox, rnd

    def offer(self, msg: Message) -> bool:
        if self.round is not None and msg.round != self.round:
            if msg.round > self.round:
                return False
            a = self.inbox.agent
            a.emit(Stale(a.env.now, msg.dst, msg.src, msg.id, msg.round))
            return True
        self.finish(msg)
        return True

    def expire(self) -> None:
        self.finish(None)


class _Gather(_Waiter):
    """Collects one message per expected sender for one round; older rounds are stale."""

    __slots__ = ("event", "tag", "inbox", "round", "expect", "got")

    def __init__(self, event, tag, inbox, rnd, expect):
        self.event, self.tag, self.inbox, self.round = event, tag, inbox, rnd
        self.expect = expect
        self.got: dict[int, Any] = {}

    def offer(self, msg: Message) -> bool:
        if msg.round == self.round and msg.src in self.expect:
            self.got[msg.src] = msg.payload
            if len(self.got) == len(self.expect):
                self.finish(self.got)
            return True
        if msg.round < self.round:
            self.inbox.agent.emit(Stale(self.inbox.agent.env.now, msg.dst, msg.src, msg.id, msg.round))
            return True
        return False

    def finish(self, value) -> None:
        self.got = self.expect = None
        _Waiter.finish(self, value)

    def expire(self) -> None:
        a = self.inbox.agent
        a.emit(Timeout(a.env.now, a.id, self.round, float(len(self.expect) - len(self.got))))
        self.finish(self.got)


class Inbox:
    __slots__ = ("agent", "queues", "waiters")

    def __init__(self, agent: Agent):
        self.agent = agent
        self.queues: dict[str, deque] = {}
        self.waiters: dict[str, _Recv | _Gather] = {}

    def put(self, msg: Message) -> None:
        w = self.waiters.get(msg.tag)
        if w is None or not w.offer(msg):
            q = self.queues.get(msg.tag)
            if q is None:
                q = self.queues[msg.tag] = deque()
            q.append(msg)

    def wait(self, w: _Recv | _Gather, timeout: float | None) -> simpy.Event:
        if w.tag in self.waiters:
            raise RuntimeError(f"agent {self.agent.id} already waits on tag {w.tag!r}")
        ev = w.event
        q = self.queues.get(w.tag)
        self.waiters[w.tag] = w
        if q:
            keep = deque()
            while q and not ev.triggered:
                m = q.popleft()
                if not w.offer(m):
                    keep.append(m)
            keep.extend(q)
            self.queues[w.tag] = keep
        if not ev.triggered and timeout is not None:
            timer = simpy.events.Timeout(self.agent.env, timeout)
            timer.callbacks.append(w.timed_out)  # a no-op once w is resolved
        return ev


class Agent:
    def __init__(self, sim: Simulation, i: int, offset: float, drift: float, compute_scale: float):
        self.sim = sim
        self.env = sim.env
        self.id = i
        self.emit = sim.emit
        self.offset = offset
        self.rate = 1.0 + drift  # local clock seconds per global second
        self.compute_scale = compute_scale
        self.round = 0  # activations so far
        self.finished = False
        self.inbox = Inbox(self)
        g = sim.graph
        self.neighbors: list[int] = sorted(g.successors(i))
        self.in_neighbors: list[int] = sorted(g.predecessors(i))
        row = sim.W.getrow(i)
        self.weights: dict[int, float] = {int(j): float(w) for j, w in zip(row.indices, row.data) if j != i}
        self.self_weight = float(sim.W[i, i])
        act = sim.scenario.agents.activation
        self._act = act
        self._act_rng = sim.streams.rng("activation", i)
        self._batch_rng = sim.streams.rng("batch", i)
        self._distinct_rows = sim.scenario.data.sampling == "without_replacement"
        self._compute = sim.compute_draws(i)
        self.rows = sim.data.parts[i]
        self._tick = math.floor(self.local_time(0.0) / act.period) if act.kind != "poisson" else 0
        self._next = offset + (self._act_rng.exponential(1.0 / act.rate) if act.kind == "poisson" else 0.0)
        self._done = processed_event(self.env)

    # clocks -------------------------------------------------------------------------------------
    def local_time(self, t: float | None = None) -> float:
        """This agent's clock reading at global time t (default: now): offset + (1 + drift) t."""
        return self.offset + self.rate * (self.env.now if t is None else t)

    def global_time(self, local: float) -> float:
        return (local - self.offset) / self.rate

    # activation ---------------------------------------------------------------------------------
    def wake(self) -> simpy.Event:
        """The next activation on this agent's own clock (never after the run's round limit)."""
        limit = self.sim.scenario.run.rounds
        if limit is not None and self.round >= limit:
            if not self.finished:
                self.finished = True
                self.emit(Finish(self.env.now, self.id, self.round))
                self.sim.agent_finished()
            return self.env.event()  # never fires
        act = self._act
        now_local = self.local_time()
        if act.kind == "poisson":
            # The schedule is a Poisson process on the local clock, drawn independently of what the
            # agent does; arrivals that fall while it is busy are missed (as ticks are, below).
            at = self._next
            while at < now_local:
                at += self._act_rng.exponential(1.0 / act.rate)
            self._next = at + self._act_rng.exponential(1.0 / act.rate)
        else:
            self._tick = max(self._tick, math.floor(now_local / act.period)) + 1
            if act.kind == "bernoulli" and act.p < 1.0:
                self._tick += int(self._act_rng.geometric(act.p)) - 1
            at = self._tick * act.period
        hook = self.sim.network.wake_hook
        if hook is not None:  # clock jitter, churn: the activation moves (Network.wake_hook)
            at = hook(self, at)
        delay = max(0.0, self.global_time(at) - self.env.now)
        self.round += 1
        sim = self.sim
        sim.activations += 1
        if sim.activations >= sim.round_mark:
            sim.round_passed()
        ev = simpy.events.Timeout(self.env, delay, at)
        ev.callbacks.append(self._activated)
        return ev

    def _activated(self, ev) -> None:
        self.emit(Activate(self.env.now, self.id, self.round, ev._value))

    # compute ------------------------------------------------------------------------------------
    @property
    def params(self) -> torch.Tensor:
        """A copy of this agent's row of the parameter bank."""
        return self.sim.bank.get(self.id)

    @params.setter
    def params(self, value: torch.Tensor) -> None:
        self.sim.bank.set(self.id, value)

    def sample_rows(self, batch: int | None) -> np.ndarray:
        """``batch`` of the agent's rows from its ``batch`` stream: i.i.d. uniform (data.sampling =
        "with_replacement") or distinct rows ("without_replacement"; a batch at least the part's size
        is the whole part). No batch: the whole part."""
        if not batch:
            return self.rows
        if self._distinct_rows:
            if batch >= len(self.rows):
                return self.rows
            return self.rows[np.sort(self._batch_rng.choice(len(self.rows), batch, replace=False))]
        return self.rows[self._batch_rng.integers(0, len(self.rows), batch)]

    def gradient(self, batch: int | None = None, params: torch.Tensor | None = None,
                 clip: float | None = None, clip_kind: str = "l2",
                 rows: np.ndarray | None = None) -> simpy.Event:
        """Mini-batch gradient at ``params`` (default: current params); completes after compute time.
        With ``clip``: the mean of per-sample gradients clipped to L2 norm ``clip`` (``clip_kind="l2"``)
        or to [-clip, clip] per coordinate (``"coordinate"``), as DP-SGD needs (no noise added here).
        With ``rows``: exactly these training rows (e.g. an online learner's history) instead of a batch."""
        ct = self._compute() * self.compute_scale
        churn = self.sim.network.churn
        if churn is not None:  # requested while offline: starts when the agent is back
            ct += churn.wait(self.id, self.env.now)
        self.emit(ComputeStart(self.env.now, self.id, ct))
        p = self.sim.bank.get(self.id) if params is None else params
        r = self.sample_rows(batch) if rows is None else rows
        if clip is None:
            return self.sim.request_gradient(self.id, p, r, ct)
        return self.sim.request_gradient(self.id, p, r, ct, clip, clip_kind)

    # communication ------------------------------------------------------------------------------
    def send(self, dst: int, payload: Any, tag: str = "model", round: int | None = None,
             size: int | None = None) -> simpy.Event:
        """Send through the link; the event completes when the transmission ends."""
        tx = self.sim.network.send(self.id, dst, payload, tag, self.round if round is None else round, size)
        return self._done if tx <= 0 else simpy.events.Timeout(self.env, tx)

    def broadcast(self, payload: Any, tag: str = "model", round: int | None = None,
                  to: Iterable[int] | None = None, size: int | None = None) -> simpy.Event:
        """Send to every out-neighbour (links transmit in parallel)."""
        send = self.sim.network.send
        rnd = self.round if round is None else round
        tx = max((send(self.id, j, payload, tag, rnd, size) for j in (self.neighbors if to is None else to)),
                 default=0.0)
        return self._done if tx <= 0 else simpy.events.Timeout(self.env, tx)

    def recv(self, tag: str = "model", timeout: float | None = None, round: int | None = None) -> simpy.Event:
        """The next message with ``tag`` (a ``Message``), or None after ``timeout``. With ``round``,
        only that round's message is taken; earlier rounds' are discarded as stale."""
        return self.inbox.wait(_Recv(simpy.Event(self.env), tag, self.inbox, round), timeout)

    def gather(self, tag: str = "model", round: int | None = None, senders: Iterable[int] | None = None,
               timeout: float | None = None) -> simpy.Event:
        """Barrier: payloads {src: payload} of ``round`` from all ``senders`` (default in-neighbours),
        or whatever arrived by ``timeout``. Messages of earlier rounds are discarded as stale."""
        expect = frozenset(self.in_neighbors if senders is None else senders)
        w = _Gather(simpy.Event(self.env), tag, self.inbox, self.round if round is None else round, expect)
        if not expect:
            w.event.succeed({})
            return w.event
        return self.inbox.wait(w, timeout)

    def mix(self, own: torch.Tensor, received: dict[int, torch.Tensor]) -> torch.Tensor:
        """sum_j W_ij x_j over what arrived; a missing neighbour's weight stays on ``own``."""
        out = own * (1.0 - sum(self.weights[j] for j in received))
        for j, x in received.items():
            out.add_(x, alpha=self.weights[j])
        return out

    # privacy ------------------------------------------------------------------------------------
    def privatize(self, x: torch.Tensor, sigma: float, sensitivity: float, mechanism: str = "gaussian",
                  q: float = 1.0, what: str = "gradient", to: int = -1) -> torch.Tensor | None:
        """x + noise (Gaussian std ``sigma`` or Laplace scale ``sigma``) from this agent's own noise
        generator, recorded as a ``Release`` in the trace and the agent's ledger (netsim.privacy).
        ``sensitivity``: the L2 (Gaussian) or L1 (Laplace) sensitivity of x; ``q``: probability that a
        record enters x; ``to``: recipient (-1 = public). Returns None once the scenario's
        privacy.epsilon_cap would be exceeded (a ``budget_exhausted`` event is traced): stop releasing."""
        from netsim.privacy.ledger import ledger_of

        return ledger_of(self).release(x, sigma, sensitivity, mechanism, q, what, to)

    # misc ---------------------------------------------------------------------------------------
    def rng(self, purpose: str = "algorithm") -> np.random.Generator:
        """This agent's own stream for the algorithm's choices (never the network's)."""
        return self.sim.streams.rng(purpose, self.id)

    def spawn(self, program: Generator) -> simpy.Process:
        proc = self.env.process(program)
        progs = self.sim.programs  # their locals go into checkpoints (sim/checkpoint.py)
        progs.append((self.id, proc))
        if len(progs) >= self.sim.programs_limit:  # a program spawning per round: forget the finished ones
            progs[:] = [(i, q) for i, q in progs if q.is_alive]
            self.sim.programs_limit = 2 * len(progs) + 64
        return proc
