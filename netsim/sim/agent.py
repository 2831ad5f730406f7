"""The agent API an algorithm is written against (see docs/architecture.md, docs/extending.md).

An algorithm is a generator ``fn(agent, params)`` that yields simpy events it gets from the agent:
``wake()``, ``gradient()``, ``send()``/``broadcast()``, ``recv()``/``gather()``, ``finish()``. Everything
that must survive a checkpoint lives outside the generator: parameters and named per-agent state in the
bank, randomness in the stream tree, messages in the network. ``Agent``'s public methods and properties
are the whole API: an algorithm in ``netsim/algorithms/`` touches nothing else of the simulation
(tests/test_agent_api.py checks it); ``netsim algorithms --api`` prints this reference.

Payload convention: ``recv`` returns one ``Message`` (``.src``, ``.payload``, ``.round``, ``.tag``) or None,
because a lone message's sender matters; ``gather`` returns ``{src: payload}`` for a round.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy
import torch

from netsim.compute.mixing import MixUpdate
from netsim.sim import rows as shapes
from netsim.sim.activation import Schedule, schedule_for
from netsim.sim.env import Timeout
from netsim.sim.network import Message, payload_size
from netsim.sim.services import CommStats, Lookahead
from netsim.sim.streams import Ahead, Draws, DrawsAhead, block_rows
from netsim.trace.events import Stale

if TYPE_CHECKING:
    from netsim.sim.kernel import Simulation


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
        a.emit_row(shapes.timeout(a.env.now, a.id, self.round, float(len(self.expect) - len(self.got))))
        self.finish(self.got)


_NOBODY: tuple = (None, frozenset())


class Inbox:
    __slots__ = ("agent", "queues", "waiters", "expected")

    def __init__(self, agent: Agent):
        self.agent = agent
        self.queues: dict[str, deque] = {}
        self.waiters: dict[str, _Recv | _Gather] = {}
        self.expected: tuple = _NOBODY  # (in_neighbors, as a set): whom ``Agent.gather`` waits for by default

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
            timer = Timeout(self.agent.env, timeout)
            timer.callbacks.append(w.timed_out)  # a no-op once w is resolved
        return ev


class _Draws:
    """What an agent draws: its mini-batches (from its ``batch`` stream, drawn ahead in blocks unless the program took
    the stream itself or the rows are drawn without replacement) and its compute times (a sampler, times its scale)."""

    __slots__ = ("streams", "id", "batch_rng", "_ahead", "draw_ahead", "distinct", "compute", "scale", "saved",
                 "changes")

    def __init__(self, streams, i: int, sampling: str, compute: Callable[[], float], scale: float, changes: array):
        self.streams, self.id = streams, i
        self.batch_rng: np.random.Generator | None = None  # the ``batch`` stream, made when first drawn (``batch``)
        self._ahead: DrawsAhead | None = None  # mini-batches drawn ahead from the batch stream (``Agent.sample_rows``)
        self.changes = changes  # every agent's count of changes to its draws (``Counts.draws``)
        self.draw_ahead = True  # until the program draws from the batch stream itself (``Agent.rng("batch")``)
        self.distinct = sampling == "without_replacement"
        self.compute, self.scale = compute, scale
        self.saved: tuple | None = None  # (``_Resumed``)

    @property
    def ahead(self) -> DrawsAhead | None:
        return self._ahead

    @ahead.setter
    def ahead(self, value: DrawsAhead | None) -> None:
        self._ahead = value
        self.changed()

    def changed(self) -> None:
        """Count a change to these draws (``Counts.draws``): a block laid out elsewhere no longer holds."""
        self.changes[self.id] += 1

    def batch(self) -> np.random.Generator:
        """The ``batch`` stream, made when first drawn from (a restore keeps its state as its row until then)."""
        if self.batch_rng is None:
            self.batch_rng = self.streams.rng("batch", self.id)
        return self.batch_rng


class _Resumed(_Draws):
    """An agent's draws as a restore left them (``Agent.resume_draws``): the checkpoint's positions (``saved``: the
    mini-batches drawn ahead, the compute sampler's, the agent's rows) put in place when ``ahead`` or ``compute`` is
    first read or set, the object then a plain ``_Draws`` again (the same slots): a restore of 10,000 agents makes
    no object per agent, and a restored run's capture hands the positions back as the checkpoint gave them."""

    __slots__ = ()

    def _put(self) -> None:
        ahead, compute, n = self.saved
        self.__class__, self.saved = _Draws, None
        self.ahead = DrawsAhead.restored(self.batch, n, ahead)
        self.compute.resume(compute, later=True)  # (a restore sets the stream's position before it is drawn)

    @property
    def ahead(self) -> DrawsAhead | None:
        self._put()
        return self.ahead

    @ahead.setter
    def ahead(self, value: DrawsAhead | None) -> None:
        self._put()
        self.ahead = value

    @property
    def compute(self) -> Callable[[], float]:
        self._put()
        return self.compute

    @compute.setter
    def compute(self, value: Callable[[], float]) -> None:
        self._put()
        self.compute = value


def clock_reading(offset, rate, t):
    """A clock's reading at global time ``t`` (floats or arrays: the same expression, so the same bits)."""
    return offset + rate * t


def clock_time(offset, rate, local):
    """The global time at which a clock reads ``local`` (floats or arrays)."""
    return (local - offset) / rate


class Agent:
    """One node: its clock and activation, its data rows and parameters, its links, streams and state.

    Attributes (read them; only ``params`` is assigned):

    - ``id``: this agent's index, 0 .. agent_count - 1
    - ``round``: activations so far (``wake`` counts them); the default round tag of messages
    - ``finished``: whether ``finish`` was called (or ``run.rounds`` reached)
    - ``neighbors`` / ``in_neighbors``: sorted out- and in-neighbours in the topology (with a time-varying
      topology, ``links_change``, those of the current activation: read them at each use, never keep them)
    - ``weights``: ``{j: W_ij}`` over in-neighbours j != i; ``self_weight``: W_ii
    - ``rows``: indices of this agent's training rows (``training_set``)
    - ``env``: the simpy environment (``simpy.AllOf(agent.env, events)`` waits for several)
    - ``emit``: trace an event record (``netsim.trace.events``; a plugin's registered kind too)
    - ``emit_row``: trace the row such a record makes (COLUMNS order), skipping the record: for hot paths
    - ``offset``, ``rate``: the local clock, local = offset + rate * t
    """

    def __init__(self, sim: Simulation, i: int, offset: float, drift: float, compute_scale: float):
        self.sim = sim
        self.env = sim.loop.env
        self.id = i
        self.emit = sim.recorder.emit
        self.emit_row = sim.recorder.emit_row  # one row in COLUMNS order (TraceWriter.emit_row): no record object
        self.offset = offset
        self.rate = 1.0 + drift  # local clock seconds per global second
        self.finished = False
        self.inbox = Inbox(self)
        topology = sim.world.topology  # arrays: the networkx graph is made only if someone reads it
        self.neighbors: list[int] = topology.neighbors(i)
        self.in_neighbors: list[int] = topology.in_neighbors(i)
        W = sim.world.W  # CSR: row i is indices/data[indptr[i]:indptr[i + 1]], in stored order (as W.getrow(i))
        lo, hi = W.indptr[i], W.indptr[i + 1]
        cols, vals = W.indices[lo:hi].tolist(), W.data[lo:hi].tolist()
        self.weights: dict[int, float] = {j: w for j, w in zip(cols, vals, strict=True) if j != i}
        own = [w for j, w in zip(cols, vals, strict=True) if j == i]
        self.self_weight = own[0] if len(own) == 1 else float(W[i, i])
        act = sim.world.scenario.agents.activation
        # a periodic schedule draws nothing: its stream is made only for the kinds that draw (100,000 agents'
        # unused generators cost seconds of setup)
        draws_ticks = act.kind != "periodic" or getattr(act, "schedule", None) is not None
        act_rng = sim.world.streams.rng("activation", i) if draws_ticks else None
        self._draws = _Draws(sim.world.streams, i, sim.world.scenario.data.sampling, sim.compute_draws(i),
                             compute_scale, sim.loop.counts.draws)
        self._rows = sim.world.data.parts[i]
        # when this agent wakes, on its own clock (sim/activation.py); jitter and churn move what it plans
        counts = sim.loop.counts
        self._schedule: Schedule = schedule_for(act, act_rng, offset, self.local_time(0.0), (counts.ticks, i))
        kept = getattr(self._schedule, "ticks_in", None)  # (a plugin's schedule, or Poisson: its own)
        if kept is None or kept[0] is not counts.ticks or kept[1] != i:
            counts.ticks_shared = False
        self._listeners: list[Callable[[Agent], None]] = []  # on_activation
        self._privacy = None  # the ledger, made on the first release (``ledger``)
        self._decided_round = -1  # the activation in which an event trigger last decided (decided_by_data)

    # clocks -------------------------------------------------------------------------------------
    def local_time(self, t: float | None = None) -> float:
        """This agent's clock reading at global time t (default: now): offset + (1 + drift) t."""
        return clock_reading(self.offset, self.rate, self.env.now if t is None else t)

    def global_time(self, local: float) -> float:
        """The global time at which this agent's clock reads ``local``."""
        return clock_time(self.offset, self.rate, local)

    # activation ---------------------------------------------------------------------------------
    @property
    def round(self) -> int:
        """Activations so far (counted by ``Simulation.count_wakes``; every agent's in one array,
        ``Counts.rounds``)."""
        return self.sim.loop.counts.rounds[self.id]

    @round.setter
    def round(self, k: int) -> None:
        self.sim.loop.counts.rounds[self.id] = k

    CHECKPOINTED = ("round",)  # the values a checkpoint holds that are not in the agent's own dict

    @property
    def rows(self) -> np.ndarray:
        """Indices of this agent's training rows (``training_set``); replacing them draws its mini-batches from the
        new ones."""
        return self._rows

    @rows.setter
    def rows(self, rows: np.ndarray) -> None:
        self._rows = rows
        self._draws.changed()

    def wake(self) -> simpy.Event:
        """The next activation on this agent's own clock (never after the run's round limit)."""
        sim = self.sim
        limit = sim.world.scenario.run.rounds
        if limit is not None and self.round >= limit:
            return self.finish()
        at, delay = self.plan_wake(self.env.now)
        sim.count_wakes((self,))
        ev = Timeout(self.env, delay, at)
        ev.callbacks.append(self._activated)
        return ev

    def plan_wake(self, now: float) -> tuple[float, float]:
        """The next activation of a ``wake`` at ``now``, as (its local tick time, the delay until it): by the
        schedule, moved by clock jitter and churn, settled by a recorded schedule. Not counted: a driver that plans
        activations itself counts them with ``Simulation.count_wakes``, as ``wake`` does."""
        # The schedule never depends on what the agent does: an activation that falls while it is busy is missed.
        schedule = self.schedule
        at = schedule.next(self.local_time(now))
        moves = self.sim.world.activation_moves
        if moves is not None and not schedule.fixed:
            at = moves(self, at)  # clock jitter, churn: the activation moves (activation.Moves)
        delay = max(0.0, self.global_time(at) - now)
        if schedule.settles:  # a recorded schedule fixes the global time too
            at, delay = schedule.settle(at, delay)
        return at, delay

    def _activated(self, ev) -> None:
        if self._listeners:
            for listener in self._listeners:
                listener(self)
        self.emit_row(shapes.activate(self.env.now, self.id, ev.value, self.round))

    def use_schedule(self, schedule: Schedule) -> None:
        """Wake by ``schedule`` from the next ``wake`` on (a ``Schedule``: ``next``, ``defer``, ``tick``,
        ``advance_tick``, and the ``period``, ``probability`` and ``origin`` the privacy ledger and the
        algorithms read: sim/activation.py); jitter, churn and listeners apply to it as to the built-in ones."""
        if not isinstance(schedule, Schedule):
            raise TypeError(f"an activation schedule must subclass netsim.sim.activation.Schedule, got "
                            f"{type(schedule).__name__}")
        self._schedule = schedule
        self.sim.loop.counts.ticks_shared = False  # (this agent's tick is no longer in the run's array)

    @property
    def schedule(self) -> Schedule:
        """This agent's activation schedule (sim/activation.py; replaced by ``use_schedule``)."""
        return self._schedule

    @property
    def links_change(self) -> bool:
        """Whether a time-varying topology (``topology.dynamic``) gives this agent new ``neighbors``,
        ``in_neighbors``, ``weights`` and ``self_weight`` at its activations (sim/dynamic.py)."""
        return self.sim.world.scenario.topology.dynamic is not None

    @property
    def activation_listeners(self) -> tuple[Callable[[Agent], None], ...]:
        """What ``on_activation`` installed, in call order."""
        return tuple(self._listeners)

    def on_activation(self, listener: Callable[[Agent], None]) -> None:
        """Call ``listener(agent)`` at each activation, before it is traced and the program resumes (a
        dynamic topology adopts the current graph there)."""
        self._listeners.append(listener)

    def adopt_links(self, neighbors: list[int], in_neighbors: list[int], weights: dict[int, float],
                    self_weight: float) -> None:
        """Take a time-varying topology's links and mixing row for this activation (sim/dynamic.py)."""
        self.neighbors, self.in_neighbors, self.weights, self.self_weight = (neighbors, in_neighbors, weights,
                                                                             self_weight)

    # compute ------------------------------------------------------------------------------------
    @property
    def params(self) -> torch.Tensor:
        """A copy of this agent's row of the parameter bank."""
        return self.sim.world.bank.get(self.id)

    @params.setter
    def params(self, value: torch.Tensor) -> None:
        self.sim.world.bank.set(self.id, value)

    def params_of(self, j: int) -> torch.Tensor:
        """A copy of agent j's parameter row now: what an agent may assume of a neighbour at the start
        (a common, known initialisation), not a way to read live models the network would carry."""
        return self.sim.world.bank.get(j)

    def sample_rows(self, batch: int | None) -> np.ndarray:
        """``batch`` of the agent's rows from its ``batch`` stream: i.i.d. uniform (data.sampling =
        "with_replacement") or distinct rows ("without_replacement"; a batch at least the part's size
        is the whole part). No batch: the whole part."""
        if not batch:
            return self.rows
        d = self._draws
        if d.distinct:
            if batch >= len(self.rows):
                return self.rows
            return self.rows[np.sort(d.batch().choice(len(self.rows), batch, replace=False))]
        if d.draw_ahead:
            ahead = d.ahead
            if ahead is None or ahead.batch != batch or not ahead.left():
                d.ahead = ahead = DrawsAhead.start(d.batch(), len(self.rows), batch, ahead)
            if ahead is not None:
                return self.rows[ahead.take()]
        return self.rows[d.batch().integers(0, len(self.rows), batch)]

    def gradient(self, batch: int | None = None, params: torch.Tensor | None = None,
                 clip: float | None = None, clip_kind: str = "l2",
                 rows: np.ndarray | None = None) -> simpy.Event:
        """Mini-batch gradient at ``params`` (default: current params); completes after compute time.
        With ``clip``: the mean of per-sample gradients clipped to L2 norm ``clip`` (``clip_kind="l2"``)
        or to [-clip, clip] per coordinate (``"coordinate"``), as DP-SGD needs (no noise added here).
        With ``rows``: exactly these training rows (e.g. an online learner's history) instead of a batch."""
        now = self.env.now
        ct = self.compute_time(now)
        self.emit_row(shapes.compute_start(now, self.id, ct))
        p = self.sim.world.bank.get(self.id) if params is None else params
        r = self.sample_rows(batch) if rows is None else rows
        if clip is None:
            return self.sim.request_gradient(self.id, p, r, ct)
        return self.sim.request_gradient(self.id, p, r, ct, clip, clip_kind)

    @property
    def batches_ahead(self) -> DrawsAhead | None:
        """The mini-batches drawn ahead from the ``batch`` stream and not yet all handed out (``sample_rows``);
        a checkpoint saves where they stand."""
        return self._draws.ahead

    @property
    def compute_sampler(self) -> Callable[[], float]:
        """The sampler ``compute_time`` draws from (``sim.compute_draws``); a checkpoint saves its position."""
        return self._draws.compute

    @property
    def compute_scale(self) -> float:
        """This agent's factor on every compute time it draws (``agents.compute_scale``: stragglers)."""
        return self._draws.scale

    def resume_draws(self, ahead: list | None, compute: list | None) -> None:
        """Stand the mini-batches drawn ahead and the compute-time sampler where a checkpoint saved them
        (``ahead``: the batch stream's state before the block, has_uint32, uinteger, used, batch;
        ``compute``: ``Draws.position``); None leaves that one as it is. Both given to a sampler that keeps positions
        (a windowed run's agents): put in place when first read (``_Resumed``)."""
        d = self._draws
        if ahead is not None and compute is not None and type(d) is _Draws and isinstance(d.compute, Draws):
            if not len(self.rows):
                raise ValueError("mini-batches drawn ahead from no rows")
            d.saved, d.__class__ = (ahead, compute, len(self.rows)), _Resumed
            d.changed()
            return
        if ahead is not None:
            d.ahead = DrawsAhead.restored(d.batch, len(self.rows), ahead)
        if compute is not None:
            d.compute.resume(compute, later=True)  # (a restore sets the stream's position after this)

    @property
    def draws_saved(self) -> list | None:
        """The positions ``resume_draws`` was given ([ahead, compute], as a checkpoint holds them) while nothing has
        read them since (a restored run's capture: the checkpoint's own values); else None."""
        saved = self._draws.saved
        return None if saved is None else [saved[0], saved[1]]

    def compute_time(self, now: float) -> float:
        """The compute time of a gradient asked for at ``now`` (its ``compute_start`` row's value): a draw of
        ``agents.compute_time`` from this agent's stream times its ``compute_scale``, plus the wait until it is
        back when it is offline (churn). What ``gradient`` and every fast driver take (``ComputeTimes``: many
        agents at once)."""
        d = self._draws
        ct = d.compute() * d.scale
        churn = self.sim.world.churn
        if churn is not None:  # requested while offline: starts when the agent is back
            ct += churn.wait(self.id, now)
        return ct

    # communication ------------------------------------------------------------------------------
    def send(self, dst: int, payload: Any, tag: str = "model", round: int | None = None,
             size: int | None = None) -> simpy.Event:
        """Send through the link; the event completes when the transmission ends."""
        tx = self.sim.world.network.send(self.id, dst, payload, tag, self.round if round is None else round, size)
        return self.env.over if tx <= 0 else Timeout(self.env, tx)

    def broadcast(self, payload: Any, tag: str = "model", round: int | None = None,
                  to: Iterable[int] | None = None, size: int | None = None) -> simpy.Event:
        """Send to every out-neighbour (links transmit in parallel)."""
        tx = self.sim.world.network.send_all(self.id, self.neighbors if to is None else to, payload, tag,
                                             self.round if round is None else round, size)
        return self.env.over if tx <= 0 else Timeout(self.env, tx)

    def send_each(self, payloads: dict[int, Any], tag: str = "model", round: int | None = None,
                  to: Iterable[int] | None = None, size: int | None = None) -> simpy.Event:
        """``broadcast`` of one payload per out-neighbour ({neighbour: payload}, e.g. replies computed for each), sent
        in the out-neighbours' order (``to``: those instead); a neighbour without a payload gets nothing."""
        send = self.sim.world.network.send
        rnd = self.round if round is None else round
        tx = 0.0
        for j in self.neighbors if to is None else to:
            if j in payloads:
                x = payloads[j]
                tx = max(tx, send(self.id, j, x, tag, rnd, payload_size(x) if size is None else size))
        return self.env.over if tx <= 0 else Timeout(self.env, tx)

    def recv(self, tag: str = "model", timeout: float | None = None, round: int | None = None) -> simpy.Event:
        """The next message with ``tag`` (a ``Message``), or None after ``timeout``. With ``round``,
        only that round's message is taken; earlier rounds' are discarded as stale."""
        return self.inbox.wait(_Recv(simpy.Event(self.env), tag, self.inbox, round), timeout)

    def gather(self, tag: str = "model", round: int | None = None, senders: Iterable[int] | None = None,
               timeout: float | None = None) -> simpy.Event:
        """Barrier: payloads {src: payload} of ``round`` from all ``senders`` (default in-neighbours),
        or whatever arrived by ``timeout``. Messages of earlier rounds are discarded as stale."""
        if senders is None:  # the in-neighbours' set, made again only when they change (a time-varying topology)
            nb, box = self.in_neighbors, self.inbox
            if nb is not box.expected[0]:
                box.expected = (nb, frozenset(nb))
            expect = box.expected[1]
        else:
            expect = frozenset(senders)
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
        if self.sim.recorder.mixing_log is not None:
            self.record_mix(received, 0.0)
        return out

    @property
    def mixing_record(self):
        """The run's record of which weights were applied to which messages (``privacy.record``), or None: what
        ``mix`` and ``mix_into_params`` write to (``record_mix``) when it is kept."""
        return self.sim.recorder.mixing_log

    def record_mix(self, received, lr: float, t: float | None = None, released: int | None = None) -> None:
        """Into ``mixing_record`` (which must be kept): this agent's weights on ``received`` applied at ``t`` (None:
        now), then a step of size ``lr`` (0: none); what ``mix`` and ``mix_into_params`` do, for a batch that mixes
        rows itself (a windowed driver records a round's steps after it, each at its agent's own time; ``released``:
        ``releases_made`` when it mixed, None: now)."""
        ws = [self.weights[j] for j in received]
        n = self.releases_made if released is None else released
        log = self.sim.recorder.mixing_log
        log.mix(self.id, self.env.now if t is None else t, n, 1.0 - sum(ws), list(received), ws, lr)

    @property
    def releases_made(self) -> int:
        """How many releases this agent has made so far (its ledger's; 0 without one)."""
        return len(self._privacy.releases) if self._privacy is not None else 0

    def mix_into_params(self, own: torch.Tensor, received: dict[int, torch.Tensor], step: torch.Tensor | None = None,
                        lr: float = 1.0) -> None:
        """``params = mix(own, received) - lr * step`` (no step: the mix alone), bit for bit, but computed
        with every other agent's such update in one batched call when the bank is next read (it costs the
        same whenever it is computed; the values cannot differ). ``own``, the received models and ``step`` (a 1-D
        row, or a (1, P) one: a batch of one's gradient) are read then: do not change them in place afterwards."""
        w = self.weights
        ws = [w[j] for j in received]
        self.sim.world.bank.defer(MixUpdate(self.id, own, 1.0 - sum(ws), ws, list(received.values()), lr, step))
        if self.sim.recorder.mixing_log is not None:
            self.record_mix(received, 0.0 if step is None else lr)

    # privacy ------------------------------------------------------------------------------------
    def privatize(self, x: torch.Tensor, sigma: float, sensitivity: float, mechanism: str = "gaussian",
                  q: float = 1.0, what: str = "gradient", to: int = -1) -> torch.Tensor | None:
        """x + noise (Gaussian std ``sigma`` or Laplace scale ``sigma``) from this agent's own noise
        generator, recorded as a ``Release`` in the trace and the agent's ledger (netsim.privacy).
        ``sensitivity``: the L2 (Gaussian) or L1 (Laplace) sensitivity of x; ``q``: probability that a
        record enters x; ``to``: recipient (-1 = public). Returns None once the scenario's
        privacy.epsilon_cap would be exceeded (a ``budget_exhausted`` event is traced): stop releasing."""
        return self.ledger.release(x, sigma, sensitivity, mechanism, q, what, to)

    def decided_by_data(self) -> None:
        """Say that this activation decided from unreleased data whether to release (an event trigger):
        the releases it makes afterwards are marked, and ``netsim privacy`` says their epsilon is not a
        guarantee."""
        self._decided_round = self.round

    @property
    def data_decided_this_activation(self) -> bool:
        """Whether ``decided_by_data`` was called in the current activation."""
        return self._decided_round == self.round

    def add_noise(self, x: torch.Tensor, scale: float, mechanism: str = "gaussian") -> torch.Tensor:
        """x + noise from this agent's noise generator, recorded nowhere: only for values that depend on
        no private data (an initial state); anything data-dependent goes through ``privatize``."""
        return self.ledger.noise.add(mechanism, x, scale)

    @property
    def ledger(self):
        """This agent's privacy ledger (``netsim.privacy.ledger.AgentLedger``: releases, spent epsilon),
        made with the scenario's [privacy] settings on first use."""
        if self._privacy is None:
            if self.sim.new_ledger is None:
                raise RuntimeError("this simulation has no privacy ledger: build it with netsim.api.prepare, or pass "
                                   "ledger=netsim.privacy.ledger.new_ledger to Simulation")
            self._privacy = self.sim.new_ledger(self)
        return self._privacy

    @property
    def existing_ledger(self):
        """The ledger if this agent has one (it released, or asked for ``ledger``), else None."""
        return self._privacy

    @property
    def device(self) -> torch.device:
        """The torch device of the run's parameters and data."""
        return self.sim.world.device

    # the run this agent is part of ---------------------------------------------------------------
    @property
    def scenario(self):
        """The run's resolved scenario (frozen attrs records: read settings, never change them)."""
        return self.sim.world.scenario

    @property
    def agent_count(self) -> int:
        """How many agents the run has (ids 0 .. agent_count - 1)."""
        return len(self.sim.loop.agents)

    @property
    def now(self) -> float:
        """Global simulated time (seconds)."""
        return self.env.now

    def timeout(self, delay: float, value: Any = None) -> simpy.Event:
        """An event ``delay`` simulated seconds from now (a wait that is neither compute nor a message)."""
        return self.env.timeout(delay, value)

    @property
    def graph(self):
        """The run's topology: a networkx DiGraph with ``weight`` edge attributes (for a time-varying
        topology, the initial graph)."""
        return self.sim.world.graph

    @property
    def mixing_matrix(self):
        """The run's mixing matrix W (scipy sparse, rows sum to 1); this agent's row is ``weights`` +
        ``self_weight``."""
        return self.sim.world.W

    @property
    def spectral_gap(self) -> float | None:
        """1 - |lambda_2(W)| of the run's mixing matrix (None where it is not defined)."""
        return self.sim.world.gap

    @property
    def model(self):
        """The run's model (``netsim.compute.models``): batched ``grad``/``evaluate`` on stacked rows."""
        return self.sim.world.model

    @property
    def training_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(X, y) of every training row on the run's device; this agent's are ``X[rows]``."""
        s = self.sim.world.splits
        return s.X, s.y

    @property
    def validation_set(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(X, y) of the validation set Q every agent may read (``data.validation``), or None."""
        s = self.sim.world.splits
        return None if s.X_val is None else (s.X_val, s.y_val)

    @property
    def partition(self) -> list[np.ndarray]:
        """Every agent's training rows (indices into ``training_set``); this agent's is ``rows``."""
        return self.sim.world.data.parts

    def evaluate_only(self, agents: list[int]) -> None:
        """Score only these agents' models (a server's global model) instead of the average of all."""
        self.sim.recorder.eval_rows = list(agents)

    # activation -----------------------------------------------------------------------------------
    @property
    def activation(self):
        """The scenario's activation record (``kind``: periodic, poisson or bernoulli; ``period``,
        ``rate``, ``p``), as written: what the agent's schedule does is ``activation_period``,
        ``activation_probability`` and ``tick`` (a plugin's schedule may differ from the table)."""
        return self.sim.world.scenario.agents.activation

    @property
    def last_tick(self) -> int:
        """Index of the tick of the latest scheduled activation (periodic and Bernoulli activation; the
        privacy ledger counts the ticks a Bernoulli agent skipped from it)."""
        return self.schedule.tick

    @property
    def activation_period(self) -> float | None:
        """Seconds between this agent's activation ticks on its local clock (None: its schedule has no
        ticks, as Poisson activation)."""
        return self.schedule.period

    @property
    def activation_probability(self) -> float:
        """The chance this agent's schedule activates at a tick (p of Bernoulli activation; 1 for periodic
        and Poisson activation)."""
        return self.schedule.probability

    def tick(self, local: float | None = None) -> int:
        """Index of the activation tick at local time ``local`` (default: now): local / period rounded,
        so agents that skipped ticks stay in step with their neighbours (schedules with ticks only)."""
        return self.schedule.tick_at(self.local_time() if local is None else local)

    def finish(self) -> simpy.Event:
        """End this agent's program (``yield agent.finish()``): trace its ``finish`` and let the run stop
        once every agent has finished. The returned event never fires. Also what ``wake`` does after
        ``run.rounds`` activations."""
        if self.mark_finished():
            self.emit_row(shapes.finish(self.env.now, self.id, self.round))
        return self.env.event()  # never fires

    def mark_finished(self) -> bool:
        """``finish`` without its row (a driver traces it where its rows go): whether this call finished the agent
        (False: it had finished already); the run learns of it (``Simulation.agent_finished``)."""
        if self.finished:
            return False
        self.finished = True
        self.sim.agent_finished()
        return True

    # state, statistics and shared services --------------------------------------------------------
    def state(self, name: str, shape: tuple[int, ...] | None = None, fill: float = 0.0) -> torch.Tensor:
        """This agent's named state (momentum, a tracker, a dual variable): a view of row ``id`` of the
        bank's tensor ``name`` (default shape: a parameter row), so writes stay there and checkpoints
        keep it. Created filled with ``fill`` on first use."""
        return self.sim.world.bank.state(name, shape, fill)[self.id]

    def shared_state(self, name: str, shape: tuple[int, ...] | None = None, fill: float = 0.0) -> torch.Tensor:
        """Every agent's state ``name`` as one (agents, *shape) tensor (row i is agent i's ``state``), for
        algorithms whose paper reads a neighbour's state directly."""
        return self.sim.world.bank.state(name, shape, fill)

    @property
    def stats(self):
        """The run's algorithm statistics (``netsim.sim.services.CommStats``: ``add(key, n)``
        counts, ``observe(key, x)`` samples a distribution): they appear in summary.json."""
        return self.sim.services.get(CommStats)

    def service(self, key: Any, factory: Any = None) -> Any:
        """The run's shared service under ``key`` (a class, or any hashable with a ``factory``), made on
        first use: one object all agents of the run share (a graph drawn once per round, data streams)."""
        return self.sim.services.get(key, factory)

    def lookahead(self, name: str, evaluate: Any) -> Lookahead:
        """The run's batched service ``name``: ``request(agent.id, item, compute_time)`` returns an event
        whose value is the item's result after the compute time; the first completion evaluates every
        pending item in one call ``evaluate(items) -> results`` (exact: each request was made at or
        before then). ``evaluate`` is used when the service is first made (one per run and name)."""
        return self.sim.services.get(("lookahead", name), lambda: Lookahead(self.env, self.emit_row, evaluate))

    # random streams and helper programs ------------------------------------------------------------
    def rng(self, purpose: str = "algorithm", *key: int) -> np.random.Generator:
        """This agent's own stream ``(purpose, id, *key)`` for the algorithm's choices (never the
        network's). A plugin's purpose is registered first (``netsim.sim.streams.register_purpose``)."""
        if purpose == "batch" and not key:  # the stream sample_rows draws from: no more drawing ahead
            self._stop_ahead()
            self._draws.draw_ahead = False
            self._draws.changed()
        return self.sim.world.streams.rng(purpose, self.id, *key)

    def _stop_ahead(self) -> None:
        """Put the batch stream back to just after the mini-batches handed out (DrawsAhead)."""
        d = self._draws
        if d.ahead is not None:
            d.ahead.rewind()
            d.ahead = None

    def shared_rng(self, purpose: str, *key: int, cached: bool = True) -> np.random.Generator:
        """The run-wide stream ``(purpose, *key)``: the same generator for every agent (one draw shared by
        all, such as a graph drawn once per round). Each key is its own stream, so none shifts another.
        ``cached=False``: a fresh generator at the stream's start, kept by no one (a stream per round
        that is drawn once and cached by its user)."""
        if not cached:
            return np.random.Generator(np.random.PCG64(self.sim.world.streams.seed_sequence(purpose, *key)))
        return self.sim.world.streams.rng(purpose, *key)

    def compute_time_draws(self, purpose: str = "compute", *key: int):
        """A sampler of the scenario's ``agents.compute_time`` distribution, from this agent's stream
        ``(purpose, id, *key)`` (an algorithm's own compute step, such as PDSL's Shapley values)."""
        from netsim.sim.dists import draws

        return draws(self.sim.world.scenario.agents.compute_time, self.rng(purpose, *key), "agents.compute_time")

    def spawn(self, program: Generator) -> simpy.Process:
        """Start a helper program of this agent (a gossip server, say); its state goes into checkpoints
        like the main program's."""
        return self.sim.add_program(self.id, program)


class ComputeTimes:
    """``Agent.compute_time`` of many agents at once (a fast driver's round of requests): where every agent's compute
    time is one constant shared by all and no agent can be offline, one call of it times each agent's scale (the
    same product, so the same bits); else each agent's own ``compute_time``. ``ahead`` (a run no checkpoint cuts, so
    no stream's position is kept): with no churn, each agent's next ``ahead`` draws are taken at once from its own
    stream (``Draws.take``: the same values in the same order), and a round's compute times are array work."""

    def __init__(self, agents: list[Agent], ahead: int = 0):
        from netsim.sim.streams import Draws

        self.scales = np.array([a.compute_scale for a in agents], np.float64)
        draws = list({a.compute_sampler for a in agents})  # a constant compute time: one callable, no stream
        churn = agents[0].sim.world.churn if agents else None
        self.constant = draws[0] if len(draws) == 1 and not isinstance(draws[0], Draws) and churn is None else None
        self.block: np.ndarray | None = None  # each agent's draws taken ahead, row i agent i's (``ahead``)
        if ahead and self.constant is None and churn is None \
                and all(isinstance(a.compute_sampler, Draws) for a in agents):
            self.agents, self.block, self.ahead = agents, np.empty((len(agents), ahead)), Ahead(len(agents), ahead)

    def __call__(self, agents: list[Agent], ids: np.ndarray, now: np.ndarray) -> np.ndarray:
        """The compute times of ``agents`` (ids ``ids``) asking at ``now`` (one time each), in that order."""
        if self.constant is not None:
            return self.constant() * self.scales[ids]
        block = self.block
        if block is not None:
            col = self.ahead.next(ids, self._take)
            return block[ids, col] * self.scales[ids]  # (``compute_time``'s draw times the scale)
        return np.array([a.compute_time(t) for a, t in zip(agents, now.tolist(), strict=True)], np.float64)

    def _take(self, i: int) -> None:
        self.block[i] = self.agents[i].compute_sampler.take(self.ahead.cols)


class Wakes:
    """``Agent.plan_wake`` of many agents at once (``wakes(ids, now)``: their local tick times and delays). Over arrays
    where each schedule is a plain periodic or Bernoulli one whose tick the run keeps in its array (``Counts.ticks``)
    and nothing moves or settles an activation: ``Periodic.next`` on the clocks' readings, the same operations on the
    same values, so the same bits; a Bernoulli schedule's geometric gaps drawn ``ahead`` at a time from its own stream
    (the values of one draw at a time, in the same order: a run no checkpoint cuts, so no position is kept; with
    ``ahead`` 0, agent by agent). Else each agent's own ``plan_wake``."""

    def __init__(self, agents: list[Agent], ahead: int = 0):
        from netsim.sim.activation import Bernoulli, Periodic

        self.agents = agents
        kinds = {type(a.schedule) for a in agents}
        first = agents[0] if agents else None
        self.arrays = first is not None and first.sim.loop.counts.ticks_shared \
            and first.sim.world.activation_moves is None and kinds <= ({Periodic, Bernoulli} if ahead else {Periodic})
        if self.arrays:
            self.clock = np.array([[a.offset, a.rate, a.schedule.period] for a in agents], np.float64).T
            self.p = np.array([getattr(a.schedule, "p", 1.0) for a in agents], np.float64)
            self.gaps, self.ahead = np.zeros((len(agents), ahead), np.int64), Ahead(len(agents), ahead)

    def __call__(self, ids: np.ndarray, now: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        agents = self.agents
        if not self.arrays or not agents[0].sim.loop.counts.ticks_shared:  # (a schedule replaced since: its own)
            got = [agents[i].plan_wake(t) for i, t in zip(ids.tolist(), now.tolist(), strict=True)]
            return np.array([a for a, _ in got], np.float64), np.array([d for _, d in got], np.float64)
        ticks = np.frombuffer(agents[0].sim.loop.counts.ticks, np.int64)  # (every agent's, at its id)
        offset, rate, period = self.clock[:, ids]
        local = clock_reading(offset, rate, now)
        tick = np.maximum(ticks[ids], np.floor(local / period).astype(np.int64)) + 1  # (``Periodic.next``)
        skip = ids[self.p[ids] < 1.0]  # (``Bernoulli.next``: the ticks skipped, a geometric gap)
        if len(skip):
            tick[self.p[ids] < 1.0] += self.gaps[skip, self.ahead.next(skip, self._gaps)] - 1
        ticks[ids] = tick
        at = tick * period
        return at, np.maximum(0.0, clock_time(offset, rate, at) - now)  # (``plan_wake``'s ``max(0.0, ...)``)

    def _gaps(self, i: int) -> None:
        sched = self.agents[i].schedule
        self.gaps[i] = sched.rng.geometric(sched.p, size=self.ahead.cols)  # (one call at a time's values)


class RowsAhead:
    """``Agent.sample_rows(batch)`` of many agents at once, as one (agents, batch) array of row indices: the
    same rows, and the same draws from each agent's own ``batch`` stream, as one call per agent.

    Where every agent draws i.i.d. mini-batches ahead (``DrawsAhead``; not ``without_replacement``, not a program
    that took the stream itself), an agent's mini-batch is the next row of its block of drawn positions, refilled
    as ``sample_rows`` refills it, and its rows are its part's at those positions: gathered for every agent by
    one index into the parts laid end to end. The blocks are laid out as the rows of one array, row i agent i's
    (each agent's block a view of its row: the same values), and the positions handed out of them are kept in
    one array too (``DrawsAhead.pos_in``: the agent's own ``sample_rows`` moves the same position), so a round's
    mini-batches are gathered by array operations for any of the agents (a round's, or the few of a lock step).
    An agent's block holds while its draws are unchanged since it was laid (``Counts.draws``: its block replaced,
    its rows, its stream taken); only the agents whose block does not hold (changed, used up, none yet) are visited,
    each block (re)drawn and laid into its row at once (no two copies of every block). Anywhere else, each agent's
    own ``sample_rows``."""

    def __init__(self, agents: list[Agent]):
        from netsim.compute.data import end_to_end_base

        self.parts = [a.rows for a in agents]  # by agent id: the parts laid end to end, and where each starts
        flat = end_to_end_base(self.parts)  # (the dataset's own array where the parts are its views)
        self.flat = flat if flat is not None else np.concatenate(self.parts) if self.parts else np.zeros(0, np.int64)
        lengths = np.array([len(r) for r in self.parts], np.int64)
        self.start = np.cumsum(lengths) - lengths
        self.blocks: np.ndarray | None = None  # every agent's DrawsAhead block, row i agent i's (made at the first)
        # positions within a part in the smallest integer type that holds every part's (the same values: an eighth of
        # the blocks' memory for parts under 128 rows, 256 B an agent at batch 16)
        self.position = np.min_scalar_type(-int(lengths.max(initial=1)))
        self.pos = array("q", bytes(8 * len(agents)))  # the laid blocks' positions (``DrawsAhead.pos_in``)
        self.changes = agents[0].sim.loop.counts.draws if agents else array("q")  # (``Counts.draws``)
        self.laid_at = np.full(len(agents), -1, np.int64)  # each agent's count of changes when its block was laid
        self.laid: list = [None] * len(agents)  # each agent's DrawsAhead laid here
        self.laid_batch: int | None = None
        self.rows = 0  # the mini-batches of a block laid here (``ahead_rows``)

    AHEAD_BYTES = 1 << 28  # all agents' blocks laid here together at most (a block is 4 of the engine's at most)

    def ahead_rows(self, batch: int) -> int:
        """A block's mini-batches: four times ``block_rows`` (a quarter of the refills: each draw's call costs ~4
        µs), fewer where every agent's block would pass ``AHEAD_BYTES`` (10⁶ agents: ``block_rows``). Any length
        gives the same values: the blocks follow each other in the stream."""
        room = self.AHEAD_BYTES // max(1, len(self.parts) * batch * self.position.itemsize)
        return max(block_rows(batch), min(4 * block_rows(batch), room))

    def take(self, agents: list[Agent], ids: np.ndarray, batch: int | None) -> np.ndarray | list[np.ndarray]:
        """Agents ``agents`` (ids ``ids``, each once) each draw a mini-batch of ``batch`` rows."""
        if not batch:
            return [a.sample_rows(batch) for a in agents]
        if batch != self.laid_batch:  # (blocks of another batch: none laid holds)
            self.laid_at[:], self.laid_batch, self.blocks = -1, batch, None
            self.rows = self.ahead_rows(batch)
        rows, pos = self.rows, np.frombuffer(self.pos, np.int64)
        at = pos[ids]
        fresh = np.flatnonzero((np.frombuffer(self.changes, np.int64)[ids] != self.laid_at[ids]) | (at >= rows))
        if len(fresh):  # blocks changed, used up or not laid yet: each agent's, as ``sample_rows`` draws it
            at = self._lay(agents, ids, fresh.tolist(), batch, at)
            if at is None:
                return [a.sample_rows(batch) for a in agents]
        pos[ids] = at + 1
        return self.flat[self.start[ids][:, None] + self.blocks[ids, at]]

    def _lay(self, agents: list[Agent], ids: np.ndarray, fresh: list[int], batch: int, at: np.ndarray):
        """The blocks of ``agents[n]`` for n in ``fresh`` laid here, (re)drawn where used up or unlike ours: ``at``
        with their positions; None where the agents must draw their own (a part replaced, the stream taken, rows drawn
        without replacement, or a numpy that cannot draw ahead exactly)."""
        parts, rows, laid = self.parts, self.rows, self.laid
        if any(agents[n].rows is not parts[int(ids[n])] for n in fresh):
            return None  # (a part replaced: every agent's own, as it draws them)
        if any(not agents[n]._draws.draw_ahead or agents[n]._draws.distinct for n in fresh):
            return None
        for n in fresh:
            a = agents[n]
            h = a._draws.ahead
            if h is None or h.batch != batch or h.pos >= len(h.block) or h.rows != rows:
                h = DrawsAhead.start(a._draws.batch(), len(a.rows), batch, h, rows)
                if h is None:  # this numpy cannot draw ahead exactly (then no agent ever drew ahead)
                    return None
            if self.blocks is None:
                self.blocks = np.empty((len(parts), *h.block.shape), self.position)
            if h.block.base is not self.blocks:
                self.blocks[a.id] = h.block
                h.block = self.blocks[a.id]
            old = laid[a.id]
            if old is not None and old is not h and old.pos_in is not None:  # (its position back in itself)
                old.pos_in, old.pos = None, old.pos
            if h.pos_in is None or h.pos_in[0] is not self.pos:  # (its position kept here from now on)
                k = h.pos
                h.pos_in = (self.pos, a.id)
                self.pos[a.id] = k
            a._draws.ahead = laid[a.id] = h  # (counted as a change: another RowsAhead's laying no longer holds)
            self.laid_at[a.id] = self.changes[a.id]
            at[n] = h.pos
        return at
