"""Barrier rounds (rounds/sync.py: D-PSGD, DP-D-PSGD, CHOCO-SGD, Muffliato, a plugin's ``SyncKernel``) as conservative
lookahead windows: the fast path for agents on their own clocks (offsets, drift, jitter; Bernoulli or Poisson
activation), per-agent compute times and stragglers, lossy links whose barriers time out, any latency distribution
(lognormal and exponential too), transmission times (bandwidth, node uplinks, per-link bandwidth, link traces), churn
and link models of the scenario. Byte for byte the events engine's trace, metrics and models.

The windows are push gossip's (rounds/lookahead.py, whose admitted region, refusals and window statistics this driver
shares), but no lookahead is needed: a barrier completes on a delivery, or times out with what was delivered, and its
``combine`` reads only delivered payloads, each made by its sender's ``local`` (or, in a later exchange of the round,
its ``combine`` of the exchange before) before it was sent. The control never reads a tensor; so the tensor work of
``gathers`` windows is done together in dependency order, a ``combine`` in a lock step after the ``local`` that makes a
payload it reads (``lock_steps``), and a message may be sent and delivered inside one window. A window's length
(``window``: the smallest latency where it is positive, else a typical one) only sizes the control's buckets and the
lock steps.

The control plays each agent's program (``SyncRounds.program``) as events in simpy's order (time, insertion): the
activation (its ``activate`` and ``compute_start`` rows, the gradient request), the gradient's completion (the engine's
batches; ``compute_end``, the agent's releases, a ``send`` and maybe a ``drop`` per out-neighbour, then the barrier, or
first the end of the broadcast's transmission where it takes time (``Agent.broadcast``'s Timeout of the longest
``tx_end - now`` of its links, set after their arrivals: an event of its own, then the barrier): the messages already
queued offered in arrival order, older rounds' discarded as ``stale``, its timer set unless it completed), each
delivery (offered to the barrier or queued, as ``Inbox.put``), the barrier's timer (a ``timeout`` row with the missing
count) and the barrier's completion (an event of its own, as ``succeed`` schedules it: ``combine``, then the next
exchange's sends and barrier, its messages of round ``k * exchanges + s``, or after the round's last exchange the next
wake or the finish; processed right after the event that completes it, without the queue, where nothing else is due
by then: the queue would pop it next). Every stream is drawn by the engine's calls in the engine's order
(``Agent.plan_wake``, ``Agent.compute_time``, a broadcast's links in one call: ``network.outcomes``; the mini-batches,
drawn from each agent's own stream in its own order, are drawn in the tensor work, a lock step's at once:
``RowsAhead``).

The tensor work then plays each agent's operations of the window in its program's order, each in the earliest lock step
that keeps that order (a step takes an agent's ``combine``, then its next point and ``local``) and comes after what it
waits for, planned over arrays (``lock_steps``): the gradient's point (the agent's parameters at its activation),
``local`` once its gradient is evaluated (the engine's gradient batches, or per step for a batch-invariant model), and
``combine`` with the payloads in arrival order; each kind's agents of one round index in one kernel call (its hooks are
row-wise: ``netsim check``). ``local`` runs where the engine's ``LocalAhead`` runs it: with the agents whose gradients
complete at the same instant, at the first one's completion. Two things the control writes before the tensor work has
them: a message's bytes (``b.sizes`` or the payload's; where the kernel declares them before the payload is made,
``SyncKernel.payload_bytes``, those, checked after its ``local``, and nothing to patch), patched into the window's
``send`` and ``drop`` and ``deliver`` rows after the work (the rows of its windows are held until then: ``holds_rows``),
and an agent's releases (``Batch.privatize`` through its ledger, placed at the agent's completion time, round and tick),
spliced in after its ``compute_end``. The privacy records (``privacy.record``) are made in the tensor work, out of the
engine's order: its batches hold them (``Batch.held``) and ``_Records.write`` writes them after the work in the engine's
order (deliveries as the control met them, release values and mixing steps as it met each ``local`` and each barrier's
completion).

Where the run allows it (``barrier_plan.admits``), the control is not played event by event: the whole run's control is
planned round by round as arrays and replayed window by window (rounds/barrier_plan.py), with the same rows, operations
and records in the same order, and its tensor work read from the plan's arrays (``barrier_plan.RoundWork``: round by
round where the gradients are batch-invariant, else in lock steps over the same waits as here).

Checkpoints are cut between two tensor works, as push gossip's windows cut them (``WindowDriver.held``): the driver's
state is then data (``hold``), restored by ``netsim resume`` into a fresh driver (``take_hold``).

Refused (``refusal``): what push gossip's windows refuse (a link model of its own, checkpoints with a plugin's link
model or churn; not a latency with no positive minimum), transmission times of payloads whose size the kernel does not
declare (the send's wait depends on the bytes: compression), a time-varying topology, a kernel's own routes or local
steps with their own gradients, gradients after the exchange, a budget cap, agents that take no gradient or ask for
different ones, and the kernel's own reason (several messages an exchange: ``SyncRounds.refusal``).
"""

from __future__ import annotations

import heapq
import itertools
import struct
from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from netsim.compute.mixing import POOLED_BYTES, unused
from netsim.rounds import barrier_plan, lookahead
from netsim.rounds.kernel import LOOKAHEAD, AnyRound, Arrivals, Batch, Picked, RowViews, as_index
from netsim.rounds.lookahead import ACT, ARR, DONE, EVAL, OFF, STOP, UNTIL, WindowDriver, lock_steps, pack
from netsim.rounds.sync import SyncKernel, _combine_steps, _local_steps
from netsim.sim.agent import RowsAhead
from netsim.sim.network import outcomes, payload_size
from netsim.sim.rows import CODES, TEXT
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
    if getattr(sim.world.scenario.privacy, "epsilon_cap", None) is not None:  # (``AgentLedger.record``'s cap check
        # traces a release at the agent's round when the tensor work makes it, not at the round the windows place it in)
        return ("privacy.epsilon_cap: a release's budget check is traced when the windows' tensor work makes it, after "
                "its agent moved on (not played by these windows) — remove privacy.epsilon_cap (the summary still "
                "reports each agent's epsilon)")
    sync = ("; synchronous rounds play it: periodic activation on identical clocks, one compute time and a "
            "constant latency")
    state = kernel.state_of(agents[0], p)
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


SMALL = 4096  # parameters: a model up to this size has its payloads handed to ``combine`` as one tensor (``Arrivals``)


def play(pattern, sim, kernel) -> bool:
    """Play a started run to its end window by window (see the module docstring); True when an interrupt stopped it
    between two tensor works."""
    return _Driver(pattern, sim, kernel).run()


def _planned(i: int, now: float) -> None:
    """A planned run's first wakes: made by the plan."""


class _Gather:
    """An agent's open barrier (``Agent.gather``): its round, the senders it waits for, what arrived ({sender:
    the payload's round record}, in arrival order) and its number (its timer's)."""

    __slots__ = ("round", "expect", "got", "gid")

    def __init__(self, rnd: int, expect: frozenset, gid: int):
        self.round, self.expect, self.got, self.gid = rnd, expect, {}, gid


class _Driver(WindowDriver):
    """The module docstring's driver: its control (``_Control``), what the rounds made (``_Store``), the tensor work's
    lock steps (``_Work``) and the privacy records (``_Records``); the rest is ``WindowDriver``'s."""

    gathers = 64  # (a window is one latency, often a small part of a round: 64 of them fill the lock steps)
    holds_rows = True  # (``decide`` patches the sizes of the gather's sends and deliveries)

    def __init__(self, pattern, sim, kernel):
        super().__init__(pattern, sim, kernel)
        p, W = self.ctx.p, self.ctx.bank.W
        self.grad.first = kernel.gradient(p, self.ctx.state, self.ctx.agents[0].id)
        self.grad.evaluated = _Evaluated(W)  # (the gradient batches' results as they are: no (B, P) copy in and out)
        self.store = _Store(kernel.payload_bytes(p, self.ctx.state, W[0]), W[0])
        self.records = _Records(sim.recorder.mixing_log)
        self.work = _Work(self)
        if not self.work.small:
            self.gathers = 8
        if barrier_plan.admits(self):  # the run planned round by round (rounds/barrier_plan.py)
            self.control = barrier_plan.Replay(self)
            self.wake = _planned  # (the plan made each program's first wake)
        else:
            self.control = _Control(self)

    def events_until(self, end: float) -> None:
        self.control.until(end)

    def first_due(self) -> float | None:
        first = self.events.first_due()
        if isinstance(self.control, barrier_plan.Replay):
            planned = self.control.first_due()
            if first is None or (planned is not None and planned < first):
                return planned
        return first

    def decide(self) -> None:
        """After the window's tensor work: its payloads' bytes into the ``send`` and ``drop`` rows (then only those of
        payloads a message carries or whose round is open are kept: no other is read again), its releases after
        their agents' ``compute_end``."""
        c, st = self.control, self.store
        self.records.write(st, self.ctx.tag)
        buf, R, sizes, guess = self.rows.buf, RECORD.size, st.sizes, st.guess
        for at, rid in c.patches:
            if sizes[rid] != guess:
                _pack_size(buf, at * R + _SIZE_AT, sizes[rid])
        c.patches.clear()
        refs, recs, payload = st.refs, st.recs, st.payload
        for pid in [q for q in sizes if q not in refs and q not in recs and q not in payload]:
            del sizes[pid]
        if not c.slots:
            return
        out, last = bytearray(), 0
        made = PackedRows(self.rows.words)
        for at, rid in c.slots:
            rows = st.released.pop(rid)
            if rows:
                made.clear()
                made.extend(rows)
                out += buf[last:at * R]
                out += made.buf
                last = at * R
        c.slots.clear()
        if last:
            out += buf[last:]
            self.rows.clear()
            self.rows.put(out)

    # checkpoints (``WindowDriver.held``): between two tensor works ------------------------------------------------
    def hold(self) -> tuple[object, dict[str, torch.Tensor]]:
        """Each program's round, exchange and round record, its open barrier (round, what it took, its timer's
        number) and its queue; the round records, the completions grouped for ``local``, the payloads' bytes,
        references and values, the releases made ahead, the parameters kept for a ``local`` and each agent's part
        kept for its ``combine`` (the kernel's values on it: ``per_row`` ones by row)."""
        c, st, work = self.control, self.store, self.work
        pool = _Pool(self.ctx.bank.W.dtype)
        rid, gid, order = next(c.rids), next(c.gids), next(c.order)  # (read, and skipped: keys only)
        parts: dict[int, tuple] = {}  # the parts by the batch they are rows of: (batch, its kept values, rids, rows)
        for r, (b, n, (kept, _)) in work.parts.items():
            e = parts.setdefault(id(b), (b, kept, [], []))
            e[2].append(r)
            e[3].append(n)
        groups, per_row = [], self.ctx.kernel.per_row
        for b, kept, rids, ns in parts.values():
            groups.append({"rids": rids, "agents": [b.agents[n].id for n in ns], "s": b.s,
                           "out": [pool.add(b.out[n]) for n in ns],
                           "sizes": None if b.sizes is None else [b.sizes[n] for n in ns],
                           "x": pool.add(join_rows([(b.x, n) for n in ns])),
                           "g": pool.add(None if b.g is None else join_rows([(b.g, n) for n in ns])),
                           "kept": [[name, True, pool.add([b.cut(name, v, n, per_row) for n in ns])]
                                    if name in per_row and v is not None else [name, False, pool.add(v)]
                                    for name, v in kept.items()]})
        x_keys = list(work.x_at)
        own = {"k": c.k, "s": c.s, "rid": c.rid, "next": [rid, gid, order], "flushed": c.flushed,
               "waiter": [None if w is None else [w.round, list(w.got.items()), w.gid] for w in c.waiter],
               "queue": [list(q) for q in c.queue], "recs": list(st.recs.items()),
               "pend": [[t, list(g.items())] for t, g in c.pend.items()], "localed": sorted(c.localed),
               "sizes": list(st.sizes.items()), "refs": list(st.refs.items()),
               "released": list(st.released.items()),
               "payload": [[pid, pool.add(v)] for pid, v in st.payload.items()],
               "x_at": [x_keys, pool.add(join_rows([work.x_at[r] for r in x_keys]) if x_keys else None)],
               "parts": groups}
        return {**own, "pool": pool.shapes()}, pool.tensors()

    def take_hold(self, own, tensors: dict[str, torch.Tensor]) -> None:
        n = len(self.ctx.agents)
        if any(len(own[k]) != n for k in ("k", "s", "rid", "waiter", "queue")):
            raise ValueError(f"held.own: not {n} agents' state")
        pool = _Pool.of(own["pool"], tensors, self.ctx.bank.W.device)
        c, st, work = self.control, self.store, self.work
        c.k[:], c.s[:], c.rid[:], c.flushed = own["k"], own["s"], own["rid"], own["flushed"]
        agents = self.ctx.agents
        c.waiter[:] = [None if w is None else _Gather(w[0], frozenset(agents[i].in_neighbors), w[2])
                       for i, w in enumerate(own["waiter"])]
        for w, saved in zip(c.waiter, own["waiter"], strict=True):
            if w is not None:
                w.got.update((src, r) for src, r in saved[1])
        c.queue[:] = [deque(tuple(m) for m in q) for q in own["queue"]]
        st.recs.update((r, list(rec)) for r, rec in own["recs"])
        c.pend.update((t, {i: tuple(v) for i, v in g}) for t, g in own["pend"])
        c.localed.update(own["localed"])
        st.sizes.update(own["sizes"])
        st.refs.update(own["refs"])
        st.released.update((r, [tuple(row) for row in rows]) for r, rows in own["released"])
        st.payload.update((pid, pool.get(v)) for pid, v in own["payload"])
        keys, x = own["x_at"]
        if keys:
            x = pool.get(x)
            work.x_at.update((r, (x, m)) for m, r in enumerate(keys))
        for g in own["parts"]:
            b = Batch([agents[i] for i in g["agents"]], 0, pool.get(g["x"]), pool.get(g["g"]), self.ctx.state)
            b.s, b.out, b.sizes = g["s"], [pool.get(v) for v in g["out"]], g["sizes"]
            for name, rows, v in g["kept"]:
                v = pool.get(v)
                if rows:  # (each row as ``Batch.cut`` made it: a (1, ...) tensor or a one-item list)
                    v = torch.cat(v) if all(isinstance(u, torch.Tensor) for u in v) else [u[0] for u in v]
                setattr(b, name, v)
            cuts = work.cuts(b)
            work.parts.update((r, (b, m, cuts)) for m, r in enumerate(g["rids"]))
        if self.grad.at_of:  # (``take`` kept them as rows: ``point`` reads (tensor, row) pairs)
            keys = list(self.grad.at_of)
            at = torch.stack([self.grad.at_of[k] for k in keys])
            self.grad.at_of.update((k, (at, m)) for m, k in enumerate(keys))
        for q in self.events.far.values():  # a barrier's completion holds what it took: {sender: record}, int keys
            q[:] = [(t, seq, kind, i, {int(src): r for src, r in v.items()} if kind == BARRIER else v)
                    for t, seq, kind, i, v in q]

    KINDS = frozenset((ACT, DONE, ARR, STOP, UNTIL, EVAL, OFF, TIMER, BARRIER, SENT))
    WORDS = (Stale.kind,)

    @classmethod
    def check_own(cls, sim, plain: dict, tensors: dict[str, torch.Tensor]) -> str | None:
        """``hold``'s state as this driver goes on from it: each program's round, exchange and record, its barrier
        and queue; the records, the payloads' references, bytes and values (a message in flight, queued or taken
        carries one still referenced), the parts a barrier's ``combine`` takes, the pooled tensors each reference."""
        from netsim.sim.restore import int_in, ints_in, number, numbers, trace_rows

        bad = super().check_own(sim, plain, tensors)
        if bad is not None:
            return bad
        own, agents = plain["own"], sim.loop.agents
        n, kernel, p = len(agents), sim.program, sim.params
        steps = kernel.exchanges(p, kernel.state_of(agents[0], p))
        pairs = lambda v, ok: isinstance(v, list) and all(  # noqa: E731  ([key, value] pairs, keys distinct)
            isinstance(e, list) and len(e) == 2 and int_in(e[0]) and ok(e[1]) for e in v) \
            and len({e[0] for e in v}) == len(v)
        keys = ("k", "s", "rid", "next", "flushed", "waiter", "queue", "recs", "pend", "localed", "sizes", "refs",
                "released", "payload", "x_at", "parts", "pool")
        if set(own) != set(keys):
            return "own"
        nxt = own["next"]
        if not (isinstance(nxt, list) and len(nxt) == 3 and ints_in(nxt, -1, 2**62)):
            return "own.next"
        pid_top, gid_top = nxt[0] + 1, nxt[1] + 1  # (every number taken before the counters stood there)
        top = 2**31 // steps - 1  # (a message round, k * steps + s, is a trace row's 32-bit round)
        for key, low, high in (("k", 0, top), ("s", 0, steps), ("rid", -1, pid_top)):
            if not (isinstance(own[key], list) and len(own[key]) == n and ints_in(own[key], low, high)):
                return f"own.{key}"
        if not int_in(own["flushed"], 0, plain["tickets"][0] + 1):
            return "own.flushed"
        rec = lambda r: isinstance(r, list) and len(r) == 5 and int_in(r[0], 0, n) and int_in(r[1], 0, top) \
            and numbers(r[2:3]) and int_in(r[3], 0, 2**31) and numbers(r[4:])  # noqa: E731
        if not pairs(own["recs"], rec) or not ints_in([r for r, _ in own["recs"]], 0, pid_top):
            return "own.recs"
        recs = {r: v for r, v in own["recs"]}
        if not pairs(own["refs"], lambda c: int_in(c)) or not pairs(own["sizes"], lambda c: int_in(c)):
            return "own.refs"
        refs = {r for r, _ in own["refs"]}
        pooled = lambda v: v is None or type(v) in (bool, int, float, str) or isinstance(v, dict)  # noqa: E731
        if not pairs(own["payload"], pooled):
            return "own.payload"
        held = refs & {r for r, _ in own["payload"]}  # (a message's payload: referenced, its value kept)
        msg = lambda m: isinstance(m, list) and len(m) == 4 and int_in(m[0], 0, 2**62) and int_in(m[1], 0, n) \
            and m[2] in held and int_in(m[3], 0, 2**31)  # noqa: E731  (message id, sender, payload, message round)
        waiter, queue = own["waiter"], own["queue"]
        if not (isinstance(queue, list) and len(queue) == n and all(isinstance(q, list) and all(map(msg, q))
                                                                    for q in queue)):
            return "own.queue"
        if not (isinstance(waiter, list) and len(waiter) == n):
            return "own.waiter"
        for i, w in enumerate(waiter):
            if w is not None and not (isinstance(w, list) and len(w) == 3 and int_in(w[0], 0, 2**31)
                                      and int_in(w[2], 0, gid_top)
                                      and pairs(w[1], held.__contains__)
                                      and set(src for src, _ in w[1]) <= set(agents[i].in_neighbors)):
                return "own.waiter"
        pend = own["pend"]
        if not (isinstance(pend, list) and all(isinstance(g, list) and len(g) == 2 and number(g[0]) and pairs(
                g[1], lambda e: isinstance(e, list) and len(e) == 3 and int_in(e[0]) and int_in(e[1]) and e[2] in recs)
                and ints_in([i for i, _ in g[1]], 0, n) for g in pend)) or len({g[0] for g in pend}) != len(pend):
            return "own.pend"
        if not (isinstance(own["localed"], list) and all(r in recs for r in own["localed"])):
            return "own.localed"
        localed, instants = set(own["localed"]), {g[0] for g in pend}
        ahead = kernel.batch_local and not _local_steps(kernel)  # (``LocalAhead``: the control's)
        if not pairs(own["released"], trace_rows):
            return "own.released"
        x_at = own["x_at"]
        if not (isinstance(x_at, list) and len(x_at) == 2 and isinstance(x_at[0], list) and ints_in(x_at[0])
                and pooled(x_at[1])):
            return "own.x_at"
        parts: set[int] = set()
        group = {"rids": list, "agents": list, "s": int, "out": list, "sizes": (list, type(None)), "x": dict,
                 "g": (dict, type(None)), "kept": list}
        for g in own["parts"] if isinstance(own["parts"], list) else [None]:
            if not (isinstance(g, dict) and set(g) == set(group)
                    and all(isinstance(g[k], kind) for k, kind in group.items())
                    and len(g["rids"]) == len(g["agents"]) == len(g["out"]) >= 1 and ints_in(g["agents"], 0, n)
                    and all(r in recs for r in g["rids"]) and (g["sizes"] is None or (
                        len(g["sizes"]) == len(g["rids"]) and ints_in(g["sizes"])))
                    and all(isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and type(e[1]) is bool
                            for e in g["kept"])):
                return "own.parts"
            parts.update(g["rids"])
        try:  # every pooled value as ``take_hold`` gets it: the payloads, parameters and parts of their kinds
            pool = _Pool.of(own["pool"], tensors, torch.device("cpu"))
            if not all(map(pool.valid, [*(v for _, v in own["payload"]), x_at[1], *(
                    v for g in own["parts"] for v in (*g["out"], g["x"], g["g"], *(e[2] for e in g["kept"])))])):
                return "own.pool"
            W = sim.world.bank.W
            rows = lambda v, m: isinstance(v, torch.Tensor) and v.shape == (m, *W.shape[1:])  # noqa: E731
            if not all(isinstance(pool.get(v), (torch.Tensor, tuple, list)) for _, v in own["payload"]):
                return "own.payload"
            if not (rows(pool.get(x_at[1]), len(x_at[0])) if x_at[0] else x_at[1] is None):
                return "own.x_at"
            for g in own["parts"]:
                m = len(g["rids"])
                if not (rows(pool.get(g["x"]), m) and (g["g"] is None or rows(pool.get(g["g"]), m))
                        and all(isinstance(pool.get(v), (torch.Tensor, tuple, list)) for v in g["out"])):
                    return "own.parts"
                for e in g["kept"]:
                    pool.get(e[2])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError):
            return "own.pool"
        rid, asked = own["rid"], set(plain["grads"])
        acts = [e for e in plain["events"] if e[2] == ACT]  # (most of them: an agent and a time each, as columns)
        if not (ints_in([e[3] for e in acts], 0, n) and numbers([e[4] for e in acts])):
            return "events"
        for t, _, kind, i, v in (e for e in plain["events"] if e[2] != ACT):  # (``WindowDriver.check_own``'s)
            if kind in (DONE, ARR, TIMER, BARRIER, SENT) and not int_in(i, 0, n):
                return "events"
            ok = True
            if kind == DONE:  # its gradient back: its record's ``local`` (with those done at its instant)
                ok = int_in(v, 0, plain["tickets"][0]) and (v >= plain["tickets"][1] or v in asked) \
                    and rid[i] in recs and (
                    not ahead or rid[i] in localed or t in instants)
            elif kind == ARR:
                ok = isinstance(v, list) and len(v) == 5 and msg([v[0], v[1], v[2], v[4]]) and number(v[3])
            elif kind in (TIMER, SENT):
                ok = int_in(v, 0, 2**31 if kind == SENT else gid_top)
            elif kind == BARRIER:  # its completion: ``combine`` of the round's part with what it took
                ok = isinstance(v, dict) and all(src.isdigit() and int(src) in agents[i].in_neighbors and r in held
                                                 for src, r in v.items()) and rid[i] in parts and rid[i] in recs
            if not ok:
                return "events"
        return None

    def points_kept(self, tickets: list[int]) -> torch.Tensor:
        return join_rows([self.grad.at_of[k] for k in tickets])

    # the tensor work --------------------------------------------------------------------------------------
    def tensor_work(self, first_ticket: int) -> None:
        """Every agent's operations of the work in its program's order, planned as arrays: each operation's lock step
        is the earliest that keeps its agent's order (a step takes ``combine``, then the gradient's point, then
        ``local``) and comes after what it waits for (``lock_steps``): a ``combine`` the ``local`` or ``combine`` that
        makes a payload it reads, a ``local`` its gradient batch (the engine's: evaluated at the end of its last
        request's step; a batch-invariant model's, in its ask's step). Then each step's operations of a kind in one
        call per round index (``by_round``), the gradient batches due at its end evaluated in the engine's order."""
        rounds = getattr(self.control, "rounds", None)
        if rounds is not None:  # a planned run's, round by round from the plan's arrays (``barrier_plan.RoundWork``)
            rounds.run(self.control.at)
            self.work_done([], {})
            return
        flush_of, left, waiting = self.grad.batches(first_ticket)
        waiting = self.grad.evaluate_ready(left, waiting, {}, [])  # (those whose requests were all made before)
        ops = self.ops
        if not ops:
            self.work_done(waiting, {})
            return
        flat = [(i, o) for i, os in ops.items() for o in os]
        m = len(flat)
        kind = np.fromiter([o[0] for _, o in flat], np.int64, m)
        first = np.zeros(m, bool)
        first[np.cumsum([0, *map(len, ops.values())])[:-1]] = True
        combines = np.flatnonzero(kind == COMBINE).tolist()
        locals_ = np.flatnonzero(kind == LOCAL).tolist()
        made_by = {flat[n][1][2]: n for n in locals_}  # pid -> the operation that makes it in this work
        made_by.update((o[4], n) for n, o in ((n, flat[n][1]) for n in combines) if o[4] is not None)
        payload, waiter, waited, gap = self.store.payload, [], [], []
        for n in combines:
            for r in flat[n][1][2].values():
                if r not in payload:  # (made in an earlier work: kept)
                    by = made_by.get(r)
                    if by is None:  # a payload is made before it is delivered, so in this work at the latest
                        raise RuntimeError("barrier windows: a combine waits for a payload that was not made")
                    waiter.append(n)
                    waited.append(by)
        gap = [1] * len(waiter)
        batch_op: dict[int, int] = {}  # the engine's gradient batch with a request in this work -> its own operation
        if not self.grad.free:  # (at its last request's step, gap 0; the ``local``s on it come a step later)
            for n in np.flatnonzero(kind == ASK).tolist():
                f = flush_of.get(flat[n][1][1])
                if f is not None:
                    v = batch_op.get(f)
                    if v is None:
                        v = batch_op[f] = m + len(batch_op)
                    waiter.append(v)
                    waited.append(n)
                    gap.append(0)
            evaluated = self.grad.evaluated.row_of
            for n in locals_:
                tk = flat[n][1][1]
                v = batch_op.get(flush_of.get(tk, -1))
                if v is not None:
                    waiter.append(n)
                    waited.append(v)
                    gap.append(1)
                elif tk not in evaluated:
                    raise RuntimeError("lookahead windows: a gradient batch of the window was not evaluated")
        nb = len(batch_op)
        if nb:
            kind = np.concatenate((kind, np.zeros(nb, np.int64)))
            first = np.concatenate((first, np.ones(nb, bool)))
        step = lock_steps(kind, first, np.array(waiter, np.int64), np.array(waited, np.int64),
                          np.array(gap, np.int64))
        due_at: dict[int, list[int]] = {}  # step -> the gradient batches evaluated at its end, in the engine's order
        for f in waiting:
            due_at.setdefault(int(step[batch_op[f]]), []).append(f)
        step, kind = step[:m], kind[:m]
        groups = np.lexsort((kind, step))  # by step, then kind (the handlers' order)
        sk = step[groups] * 3 + kind[groups]
        cut = np.flatnonzero(np.diff(sk)) + 1
        starts, ends = [0, *cut.tolist()], [*cut.tolist(), m]
        order, keys = groups.tolist(), sk.tolist()
        handlers = (self.work.combines, self.work.asks, self.work.locals)
        for a, b in zip(starts, ends, strict=True):
            s, kd = divmod(keys[a], 3)
            handlers[kd]([flat[n] for n in order[a:b]])
            if b == m or keys[b] // 3 != s:  # the step's end: its gradient batches
                for f in due_at.pop(s, ()):
                    self.grad.evaluate_batch(f)
        self.work_done([*itertools.chain.from_iterable(due_at.values())], {})

    def point(self, tk: int) -> torch.Tensor:
        x, n = self.grad.at_of.pop(tk)
        return x[n]

    def points(self, tickets) -> torch.Tensor:
        """The points of ``tickets`` (kept as (tensor, row) by ``asks``), joined: no tensor per row."""
        return join_rows(list(map(self.grad.at_of.pop, tickets)), share=True)


def local_ahead(pend: dict, localed: set, ops_of: dict, recs: dict, t: float, k: int, rid: int, flushed: int,
                order: Callable[[], int]) -> None:
    """The engine's ``LocalAhead`` at a gradient's completion at ``t`` (round index ``k``, round record ``rid``): the
    first of its instant runs ``local`` for every agent of round index k done at t whose request is evaluated (its
    operation ``(LOCAL, ticket, record, order())``, the completion time on its record); the others ran with it.
    ``pend``: completion time -> {agent: (k, ticket, record)}; ``localed``: the records whose ``local`` ran early."""
    if rid in localed:
        localed.discard(rid)
        return
    group = pend[t]
    for j, (kj, tj, rj) in list(group.items()):
        if kj == k and tj < flushed:
            del group[j]
            recs[rj][2] = t
            ops = ops_of.get(j)
            if ops is None:
                ops = ops_of[j] = []
            ops.append((LOCAL, tj, rj, order()))
            if rj != rid:
                localed.add(rj)
    if not group:
        del pend[t]


class _Control:
    """The control (the module docstring): each agent's program as events in simpy's order (``until``), and what it
    keeps between them (each program's round, exchange, record, barrier and queue; where rows wait for the work)."""

    def __init__(self, d: _Driver):
        n = len(d.ctx.agents)
        self.k, self.s, self.rid = [0] * n, [0] * n, [-1] * n  # each program's round, exchange in it, round record
        self.waiter: list[_Gather | None] = [None] * n  # its open barrier
        self.queue: list[deque] = [deque() for _ in range(n)]  # arrived and not taken: (id, sender, record, round)
        restored = d.ctx.sim.loop.programs.between  # (a checkpoint's state: the counters go on where they stood)
        at = restored.plain["own"]["next"] if restored is not None and restored.plain else (-1, -1, -1)
        # the numbers of round records and payloads (a round's first payload has its record's), of barriers (their
        # timers') and of each ``local`` and ``combine`` where the control meets it (the engine's order: ``_Records``)
        self.rids, self.gids, self.order = (itertools.count(c + 1) for c in at)
        self.pend: dict[float, dict[int, tuple]] = {}  # ``LocalAhead``: completion time -> {agent: (k, ticket, rid)}
        self.localed: set[int] = set()  # rounds whose ``local`` ran with an earlier agent's at their instant
        self.flushed = 0  # the tickets the engine's gradient batches have evaluated so far
        self.slots: list[tuple[int, int]] = []  # (row of this window, rid): the round's releases go there
        self.patches: list[tuple[int, int]] = []  # (row of this window, pid): a send or drop of the payload
        self.until = self._events(d)

    def _events(self, d: _Driver) -> Callable[[float], None]:
        """``until(end)``, the driver's ``events_until``: a closure over this state and the driver's, as push gossip's
        is: it runs for every event, and reading locals (no attribute lookups, the rows packed in place) is what keeps
        the per-event Python small."""
        agents, enqueue, wake, ops_of, housekeeping = d.ctx.agents, d.events.push, d.wake, d.ops, d.housekeeping
        rows, cur, soon, st = d.rows, d.events.cur, d.events.soon, d.store
        put, buf, R = rows.put, rows.buf, RECORD.size
        kernel, p, state, req0 = d.ctx.kernel, d.ctx.p, d.ctx.state, d.grad.first
        free, timeout, steps = d.grad.free, p.round_timeout, d.work.steps
        ahead = kernel.batch_local and not _local_steps(kernel)  # the engine's ``LocalAhead``
        ks, ss, rid_of, waiter, queue = self.k, self.s, self.rid, self.waiter, self.queue
        order, views, viewed = self.order, d.records.views, d.records.viewed
        next_order = order.__next__
        recs, pend, localed, slots, patches = st.recs, self.pend, self.localed, self.slots, self.patches
        sizes, released, refs, payload = st.sizes, st.released, st.refs, st.payload
        ticket_of, flushes, fixed, guess = d.grad.ticket_of, d.grad.flushes, st.fixed, st.guess
        gids, rids, words, tag = self.gids, self.rids, d.rows.words, d.ctx.tag_code
        links, take_ids, unref, gradient = outcomes(d.ctx.net.lean()), d.ctx.net.take_ids, st.unref, kernel.gradient
        adopt = None if d.ctx.dynamic is None else d.ctx.dynamic.adopt
        pop, take = heapq.heappop, cur.pop
        C = CODES
        expects: list[tuple] = [(None, None)] * len(agents)  # each agent's (in-neighbours, their set)
        c_act, c_start, c_end, c_send, c_drop, c_deliver, c_timeout, c_none = (
            C.activate, C.compute_start, C.compute_end, C.send, C.drop, C.deliver, C.timeout, C.none)
        c_stale = words(Stale.kind)
        if event_row(Stale(0.0, 0, 1, 2, 3)) != (0.0, Stale.kind, 0, 1, 2, 0, 0.0, 3, TEXT.none):
            raise RuntimeError("barrier windows: a stale row's shape is not the one packed here")

        ready: list[tuple] = []  # barriers completed by the event being processed, whose completion comes next

        def close(i: int, w: _Gather, t: float) -> None:
            """The barrier resolves (``succeed``): its completion is an event at ``t``, scheduled now — processed
            right after the current event (``ready``) where nothing else is due by ``t``: the queue would pop it
            next (what the current event schedules after it comes later in simpy's order too)."""
            waiter[i] = None
            if (soon and soon[0][0] <= t) or (cur and cur[-1][0] <= t):
                enqueue(t, BARRIER, i, w.got)
            else:
                ready.append((t, i, w.got))

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
                put(pack(t, c_stale, i, src, mid, 0, 0.0, rnd, c_none))  # (``Stale``'s row)
                unref(rid)
                return True
            return False

        def gather(i: int, t: float, rnd: int) -> None:
            """``Agent.gather`` of message round ``rnd``: the queued messages offered in arrival order, then the timer
            unless done."""
            expect = agents[i].in_neighbors
            made = expects[i]  # (the set made once per list of in-neighbours)
            if made[0] is not expect:
                made = expects[i] = (expect, frozenset(expect))
            w = _Gather(rnd, made[1], next(gids))
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

        def broadcast(i: int, t: float, pid: int, rnd: int) -> None:
            """``Agent.broadcast`` of payload ``pid`` with message round ``rnd``, then the gather of that round (or
            first the end of the broadcast's transmission)."""
            size = fixed if fixed is not None else sizes.get(pid)
            s = guess if size is None else size
            held = 0
            nb = agents[i].neighbors
            # ``Agent.broadcast`` (links transmit in parallel): each link's outcome from its streams, in one call, and
            # how long the sends hold the program
            delays, reasons, tx = links(i, nb, t, s)
            mid = take_ids(len(nb)) - 1  # (the sends' ids, in send order: nothing else sends in between)
            for j, delay, reason in zip(nb, delays, reasons):  # ``Network.send``'s rows and arrivals
                mid += 1
                if size is None:
                    patches.append((len(buf) // R, pid))
                put(pack(t, c_send, i, j, mid, s, delay, rnd, tag))
                if reason:
                    if size is None:
                        patches.append((len(buf) // R, pid))
                    put(pack(t, c_drop, i, j, mid, s, delay, rnd, words(reason)))
                else:
                    held += 1
                    enqueue(t + delay, ARR, j, (mid, i, pid, t, rnd))
            if held or pid not in payload:  # (0 until it is made: no payload is kept then)
                refs[pid] = held
            else:
                del payload[pid]
            if tx <= 0:  # nothing to transmit: the barrier at once
                gather(i, t, rnd)
            else:  # the program waits for its longest transmission (a Timeout, set after the arrivals)
                enqueue(t + tx, SENT, i, rnd)

        def events_until(end: float) -> None:
            """Process every event due before ``end`` (or to the run's stop), as the engine's queue does."""
            t, pending_lo, flushed = d.events.now, d.grad.pending_lo, self.flushed
            try:
                while True:  # ``due``, inlined
                    if ready:  # a barrier's completion, due before anything queued (``close``)
                        t, i, v = ready.pop(0)
                        kind = BARRIER
                    elif soon and (not cur or soon[0] < cur[-1]):
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
                        if views is not None:  # ``ViewLog.deliver``: written after the work, its payload kept till then
                            viewed.append((i, src, rnd, t, rid))
                            refs[rid] += 1
                        w = waiter[i]
                        if w is not None and rnd == w.round and src in w.expect:  # ``offer``'s taking, inlined
                            got = w.got
                            got[src] = rid
                            if len(got) == len(w.expect):
                                close(i, w, t)
                        elif w is None or not offer(i, w, (mid, src, rid, rnd), t):
                            queue[i].append((mid, src, rid, rnd))
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
                            ops.append((LOCAL, v, rid, next(order)))
                        else:  # ``LocalAhead``: the first of its instant runs every ``local`` done now
                            local_ahead(pend, localed, ops_of, recs, t, k, rid, flushed, next_order)
                        made = released.pop(rid, None)
                        if made is None:
                            slots.append((len(buf) // R, rid))
                        else:  # its ``local`` ran in an earlier window's work (an agent done at this instant first)
                            rows.extend(made)
                        broadcast(i, t, rid, k * steps)
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
                        ticket_of.append(None)  # (its mini-batch is drawn where its point is taken: ``asks``)
                        done = t + ct
                        enqueue(done, DONE, i, tk)
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
                        s = ss[i]
                        if s + 1 < steps:  # ``combine`` sends the next exchange's payload, then its gather
                            pid = next(rids)
                            ops.append((COMBINE, rid_of[i], v, s, pid, next(order), t))
                            ss[i] = s + 1
                            broadcast(i, t, pid, ks[i] * steps + s + 1)
                        else:  # the round's last: the next wake or the finish
                            ops.append((COMBINE, rid_of[i], v, s, None, next(order), t))
                            ss[i] = 0
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
                d.events.now, d.grad.pending_lo, self.flushed = t, pending_lo, flushed

        return events_until


class _Store:
    """What the rounds made, by number: round records, releases and payloads, written by the control as its events
    happen and by the tensor work as it makes them, each kept while something reads it (``unref``, ``decide``)."""

    def __init__(self, fixed: int | None, like: torch.Tensor):
        self.recs: dict[int, list] = {}  # rid -> [agent, k, completion time, activations, latest tick] (the releases')
        self.released: dict[int, list] = {}  # rid -> its release rows (once its ``local`` ran)
        # payloads (pid): a round's first is made by ``local`` (pid = its rid), each later exchange's by the ``combine``
        # of the exchange before
        self.sizes: dict[int, int] = {}  # pid -> its payload's bytes (once made; while it is read: ``decide``)
        self.refs: dict[int, int] = {}  # pid -> messages in flight or queued that carry its payload
        self.payload: dict[int, object] = {}  # pid -> the payload its agent sent
        # every payload's bytes, where the kernel knows them before ``local`` makes it (``payload_bytes``), else a
        # guess until its ``local`` ran (the rows patched where it was wrong: ``decide``)
        self.fixed, self.guess = fixed, payload_size(like) if fixed is None else fixed

    def unref(self, rid: int) -> None:
        n = self.refs[rid] - 1
        if n or rid not in self.sizes:  # (0 before its ``local`` ran: ``locals`` keeps no payload then)
            self.refs[rid] = n
        else:
            del self.refs[rid]
            self.payload.pop(rid, None)


class _Records:
    """The privacy records (``privacy.record``) made out of the engine's order, written after each work in it
    (``write``); the deliveries' payloads are kept until then."""

    def __init__(self, log):
        self.log, self.mixing, self.views = log, log is not None, None if log is None else log.views
        self.mixes: list[tuple] = []  # batches' mixing steps (``Batch.take_mix_rows``), for ``MixingLog.mix_batches``
        self.values: list[tuple] = []  # (order, agent, round, value before the noise, value)
        self.viewed: list[tuple] = []  # (receiver, sender, message round, time, pid)

    def write(self, store: _Store, tag: str) -> None:
        """The privacy records this work made, as the events engine's agents write them: the deliveries in delivery
        order (``ViewLog.deliver_rows``), the release values and the mixing steps (``Agent.record_mix``, each at its
        barrier's completion) in the order the control met their ``local`` and ``combine``."""
        views, seen = self.views, self.viewed.copy()  # (the control's closure holds the list)
        self.viewed.clear()
        for rnd, run in itertools.groupby(seen, key=lambda e: e[2]):  # runs of one message round: one call each
            run = list(run)
            views.deliver_rows([e[0] for e in run], [e[1] for e in run], rnd, [e[3] for e in run], tag,
                               [store.payload[e[4]] for e in run])
        for e in seen:
            store.unref(e[4])
        self.values.sort(key=lambda e: e[0])
        for _, i, rnd, clean, value in self.values:
            views.released(i, rnd, clean, value)
        self.values.clear()
        if self.mixes:
            self.log.mix_batches(self.mixes)
            self.mixes.clear()


class _Work:
    """What a lock step computes (``tensor_work`` plans the steps): ``asks``, ``locals`` and ``combines``, one kernel
    call per round index, and what they keep between steps (the points, each agent's part for its ``combine``)."""

    def __init__(self, d: _Driver):
        self.d, self.store, self.records = d, d.store, d.records
        ctx = d.ctx
        self.steps = ctx.kernel.exchanges(ctx.p, ctx.state)  # barrier exchanges a round (round k * steps + s's)
        self.spare: torch.Tensor | None = None  # a large lock step's parameters, written over once nothing reads them
        self.sampler = RowsAhead(ctx.agents)  # ``Agent.sample_rows`` of a lock step's agents at once
        self.x_at: dict[int, tuple] = {}  # rid -> the agent's parameters at its activation: (a tensor, its row)
        self.parts: dict[int, tuple] = {}  # rid -> (batch, row, ``cuts``): its part after ``local`` or ``combine``
        self.any_round = ctx.kernel.any_round(ctx.p)  # one call per lock step, any agents' rounds (``by_round``)
        self.mixed = AnyRound(type(ctx.kernel).__name__)
        # a large model's payloads are copied once more by ``Arrivals`` and held longer by 64 windows' work: with
        # those, the dicts per agent and 8 windows are faster
        self.small = ctx.bank.W.shape[1] <= SMALL

    def by_round(self, step: list, at: int) -> list[tuple]:
        """A lock step's operations by their round index (a batch has one ``b.k``), as (k, its operations); all in one
        where the kernel reads no ``b.k`` (``any_round``), k then ``AnyRound`` unless all are at one round."""
        recs = self.store.recs
        if self.any_round:
            ks = {recs[o[at]][1] for _, o in step}
            return [(ks.pop() if len(ks) == 1 else self.mixed, step)]
        groups: dict[int, list] = {}
        for i, o in step:
            groups.setdefault(recs[o[at]][1], []).append((i, o))
        return list(groups.items())

    def asks(self, step: list) -> None:
        """The gradients' points: each agent's parameters at its activation (``agent.params``); and their mini-batches,
        drawn here for every agent of the step at once (``RowsAhead``: each agent's draws from its own stream, in its
        own order, as ``Agent.gradient`` draws them at the activation)."""
        d = self.d
        who = [i for i, _ in step]
        x = self.gather(who)
        self.x_at.update((o[2], (x, n)) for n, (_, o) in enumerate(step))  # (x, row): ``join_rows`` joins them
        tickets = [o[1] for _, o in step]
        rows = self.sampler.take(list(map(d.ctx.agents.__getitem__, who)), np.array(who, np.int64), d.grad.first.batch)
        if d.grad.free:
            d.grad.evaluate_step(who, tickets, x, rows)
            return
        ticket_of, at_of = d.grad.ticket_of, d.grad.at_of  # (evaluated with their batch: ``rows_of_ticket``)
        for n, (tk, i, r) in enumerate(zip(tickets, who, rows, strict=True)):
            ticket_of[tk] = (i, r)
            at_of[tk] = (x, n)

    def gather(self, who: list[int]) -> torch.Tensor:
        """The parameters of agents ``who`` now, as one tensor's rows: a large one written over the last one's tensor
        where nothing reads it any more (no fresh pages to fault in)."""
        W, spare = self.d.ctx.bank.W, self.spare
        at = as_index(who, W.device)
        if spare is not None and len(spare) == len(who) and unused(spare):  # (no payload, part or point reads it)
            return torch.index_select(W, 0, at, out=spare)
        x = W.index_select(0, at)
        self.spare = x if x.numel() * x.element_size() >= POOLED_BYTES else None
        return x

    def locals(self, step: list) -> None:
        """``local`` of the agents whose gradients are evaluated, one call per round index."""
        d, st, values = self.d, self.store, self.records.values
        kernel, p, recs, x_at = d.ctx.kernel, d.ctx.p, st.recs, self.x_at
        for k, ops in self.by_round(step, 2):
            rids = [o[2] for _, o in ops]
            x = join_rows([x_at.pop(r) for r in rids], share=True)
            g = d.grad.evaluated.take([o[1] for _, o in ops])
            made: list[list] = [[] for _ in ops]

            def at(n: int, rids=rids, made=made) -> tuple:
                rec = recs[rids[n]]
                return rec[2], made[n], rec[3], rec[4]

            b = Batch([d.ctx.agents[i] for i, _ in ops], k, x, g, d.ctx.state, at)
            if self.records.views is not None:
                b.held = []
            if kernel.local(b, p) is not None:
                raise RuntimeError("barrier windows: local returned a generator (local steps are refused)")
            if b.k is not k and (k is self.mixed or b.k != k):
                raise RuntimeError("barrier windows: local changed the round index b.k (not played by these windows)")
            self.made(b, ops, rids)
            st.released.update(zip(rids, made))
            for n, clean, value in b.held or ():  # the release values, written in the engine's order
                values.append((ops[n][1][3], b.agents[n].id, recs[rids[n]][3], clean, value))

    def made(self, b: Batch, ops: list, pids: list) -> None:
        """The payloads batch ``b`` sent (``local``'s, or ``combine``'s for the next exchange) as payloads ``pids``,
        kept while a message carries them, and each agent's part of the batch for its next ``combine``."""
        st, parts, cuts = self.store, self.parts, self.cuts(b)
        refs, sizes, fixed = st.refs, st.sizes, st.fixed
        for n, pid in enumerate(pids):
            payload = b.out[n]
            size = sizes[pid] = b.sizes[n] if b.sizes is not None else payload_size(payload)
            if fixed is not None and size != fixed:  # (its sends were timed with the declared bytes)
                raise RuntimeError(f"barrier windows: {type(self.d.ctx.kernel).__name__}.payload_bytes says {fixed} "
                                   f"bytes, and agent {b.agents[n].id} sent a payload of {size}")
            held = refs.get(pid)  # (None: its sends come later, at its own completion)
            if held is None or held:
                st.payload[pid] = payload
            else:  # sent nowhere, every message lost, or discarded as stale before this work
                del refs[pid]
            parts[ops[n][1][1 if ops[n][1][0] == COMBINE else 2]] = (b, n, cuts)  # (``rows_of`` joins them)

    def combines(self, step: list) -> None:
        """``combine`` with what each barrier took, in arrival order, one call per exchange (and round index, unless
        ``any_round``); before the round's last exchange it sends the next payloads."""
        kernel, p, st, rec = self.d.ctx.kernel, self.d.ctx.p, self.store, self.records
        groups: dict = {}  # by exchange and round index, or by exchange alone (``by_round``)
        recs, joined = st.recs, self.any_round
        for i, o in step:
            groups.setdefault(o[3] if joined else (recs[o[1]][1], o[3]), []).append((i, o))
        for key, ops in groups.items():
            if joined:
                s, ((k, _),) = key, self.by_round(ops, 1)
            else:
                k, s = key
            parts = [self.parts.pop(o[1]) for _, o in ops]
            b = self.rows_of(parts)
            b.s, b.k = s, k
            if rec.mixing:
                b.held = []
            if self.small:
                got = self.arrivals([i for i, _ in ops], [o[2] for _, o in ops])
            else:
                got = [{src: st.payload[r] for src, r in o[2].items()} for _, o in ops]
            if kernel.combine(b, p, got) is not None:
                raise RuntimeError("barrier windows: combine returned a generator (gradients after the exchange are "
                                   "refused)")
            if b.held:
                raise RuntimeError("barrier windows: combine made releases (the patterns release in local)")
            if rec.mixing:  # each agent's mixing steps, written in the engine's order with its releases so far
                rec.mixes += b.take_mix_rows(got, np.array([o[5] for _, o in ops], np.int64),
                                             np.array([o[6] for _, o in ops], np.float64))
            if s + 1 < self.steps:
                self.made(b, ops, [o[4] for _, o in ops])
            unref, last = st.unref, s + 1 == self.steps
            for _, o in ops:
                for r in o[2].values():
                    unref(r)
                if last:
                    del recs[o[1]]

    def arrivals(self, who: list[int], took: list[dict]) -> Arrivals:
        """What each barrier took ({sender: round record}, in arrival order) as ``combine``'s ``got``: the payloads
        delivered (each once) as one tensor's rows where they are tensors, and each delivery's receiver, payload and
        weight as arrays (``Arrivals``: no dict per agent)."""
        payload, agents, chain = self.store.payload, self.d.ctx.agents, itertools.chain.from_iterable
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

    def cuts(self, b: Batch) -> tuple:
        """What ``rows_of`` joins of a batch's rows, checked once for all its agents (``Batch.row``'s cut): its kept
        values, and {name: (whether a tensor with a row per agent, the value)} for those the kernel declares
        ``per_row``."""
        kept = b.kept()
        per_row, rows = self.d.ctx.kernel.per_row, {}
        for name, v in kept.items():
            if name not in per_row or v is None:
                continue
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == len(b):
                rows[name] = (True, v)
            elif isinstance(v, (list, tuple, RowViews)) and len(v) == len(b):
                rows[name] = (False, v)
            else:
                b.cut(name, v, 0, per_row)  # (its TypeError)
        return kept, rows

    def rows_of(self, parts: list[tuple[Batch, int, tuple]]) -> Batch:
        """(batch, row, its ``cuts``) parts as one batch: their rows, payloads and sizes, and the kernel's kept values
        (those it declares ``per_row`` joined row by row, as ``Batch.row`` cuts them; the others the first batch's) —
        no batch of one per agent."""
        first, n0, (kept, _) = parts[0]
        per_row = self.d.ctx.kernel.per_row
        if len(parts) == 1:
            return first.row(n0, per_row)
        b = Batch([q.agents[n] for q, n, _ in parts], first.k, join_rows([(q.x, n) for q, n, _ in parts], share=True),
                  None if first.g is None else join_rows([(q.g, n) for q, n, _ in parts], share=True), self.d.ctx.state)
        b.s = first.s
        b.out = Picked([(q.out, n) for q, n, _ in parts])  # (read only where a hook or a checkpoint reads them)
        if any(q.sizes is not None for q, _, _ in parts):
            b.sizes = [payload_size(q.out[n]) if q.sizes is None else q.sizes[n] for q, n, _ in parts]
        for name, v in kept.items():
            if name in per_row:  # (a None value stays None: ``Batch.cut``)
                cut = [c[1].get(name) for _, _, c in parts]
                if all(u is not None and u[0] for u in cut):
                    v = join_rows([(u[1], n) for u, (_, n, _) in zip(cut, parts)])
                else:
                    v = [None if u is None else u[1][n] for u, (_, n, _) in zip(cut, parts)]
            setattr(b, name, v)
        return b


class _Evaluated:
    """The gradients evaluated and not yet taken by a ``local``, by ticket (``RowStore``'s ``put``, ``take``,
    ``row_of``, ``save`` and ``load``): each kept as (its batch's result tensor, its row), the result itself kept, not
    copied into a store (a batch's gradients are its own: no one writes them). A ``local`` of a whole batch in order
    takes that tensor (``join_rows``); others a copy of their rows."""

    __slots__ = ("row_of", "none")

    def __init__(self, like: torch.Tensor):
        self.row_of: dict[int, tuple[torch.Tensor, int]] = {}
        self.none = like[:0].clone()  # (no rows)

    def save(self) -> tuple[list[int], torch.Tensor]:
        """The keys kept and their rows (a checkpoint's)."""
        keys = list(self.row_of)
        return keys, join_rows([self.row_of[k] for k in keys]) if keys else self.none

    def load(self, keys: list[int], rows: torch.Tensor) -> None:
        if keys:
            self.put(keys, rows)

    def put(self, keys, src: torch.Tensor) -> None:
        self.row_of.update(zip(keys, zip(itertools.repeat(src), range(len(src)))))

    def take(self, keys: list[int]) -> torch.Tensor:
        """The rows of ``keys``, which are then forgotten."""
        return join_rows(list(map(self.row_of.pop, keys)), share=True)


class _Pool:
    """A checkpoint's values of the driver (payloads, the kernel's values kept on a part) as JSON and a few tensors:
    a tensor of the bank's dtype into the stack of its shape (one array a shape, not one a payload), another tensor as
    its values' list (exact), a list or tuple item by item, a plain value as it is; anything else by its type's name,
    refused when restored."""

    __slots__ = ("dtype", "device", "index", "stacks")

    def __init__(self, dtype: torch.dtype | None, device: torch.device | None = None):
        self.dtype, self.device, self.index, self.stacks = dtype, device, {}, []

    def add(self, v) -> object:
        if v is None or type(v) in (bool, int, float, str):
            return v
        if isinstance(v, torch.Tensor):
            if v.dtype != self.dtype:
                return {"values": v.tolist(), "dtype": str(v.dtype).removeprefix("torch.")}
            k = self.index.get(v.shape)
            if k is None:
                k = self.index[v.shape] = len(self.stacks)
                self.stacks.append([])
            self.stacks[k].append(v)
            return {"t": [k, len(self.stacks[k]) - 1]}
        if isinstance(v, (list, tuple, RowViews)):
            return {"tuple" if type(v) is tuple else "list": [self.add(u) for u in v]}
        if isinstance(v, np.generic):
            return v.item()
        return {"type": type(v).__name__}

    def shapes(self) -> list[list[int]]:
        return [list(shape) for shape in self.index]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f"pool.{k}": torch.stack(rows) for k, rows in enumerate(self.stacks)}

    @classmethod
    def of(cls, shapes: list, tensors: dict[str, torch.Tensor], device: torch.device) -> _Pool:
        """``shapes`` and ``tensors`` back as a pool to ``get`` values from (on ``device``); ValueError where they do
        not match."""
        pool = cls(None, device)
        for k, shape in enumerate(shapes):
            t = tensors[f"pool.{k}"]
            if list(t.shape[1:]) != shape:
                raise ValueError(f"held.own.pool.{k}: not rows of shape {shape}")
            pool.stacks.append(t)
        return pool

    def valid(self, v) -> bool:
        """Whether ``v`` is a value ``add`` gives back (a restore checks each before ``get``)."""
        if not isinstance(v, dict):
            return v is None or type(v) in (bool, int, float, str)
        if len(v) != 1 and set(v) != {"values", "dtype"}:
            return False
        if "t" in v:
            at = v["t"]
            return isinstance(at, list) and len(at) == 2 and all(type(k) is int for k in at) \
                and 0 <= at[0] < len(self.stacks) and 0 <= at[1] < len(self.stacks[at[0]])
        if "values" in v:
            return isinstance(v["values"], list) and isinstance(v["dtype"], str)
        seq = v.get("list", v.get("tuple"))
        return isinstance(seq, list) and all(map(self.valid, seq))

    def get(self, v) -> object:
        """A value ``add`` gave back as it was."""
        if not isinstance(v, dict):
            return v
        if "t" in v:
            k, n = v["t"]
            return self.stacks[k][n]
        if "values" in v:
            dtype = getattr(torch, v["dtype"])
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"held: {v['dtype']!r} is not a dtype")
            return torch.tensor(v["values"], dtype=dtype, device=self.device)
        if "list" in v:
            return [self.get(u) for u in v["list"]]
        if "tuple" in v:
            return tuple(self.get(u) for u in v["tuple"])
        raise ValueError(f"held: a {v.get('type', 'value')!r} kept by the driver cannot be restored")


def join_rows(rows: list[tuple[torch.Tensor, int]], share: bool = False) -> torch.Tensor:
    """Rows (tensor, row n) as one tensor, a copy (``torch.stack`` of the rows' values): one ``index_select`` per
    tensor they come from (a lock step's parts come from a few batches), no view per row. ``share``: where the rows
    are all of one tensor's, in order, that tensor itself (no copy of a (B, P) block: the parameters and gradients
    of a lock step of all agents; no hook writes into a batch's ``x`` or ``g``, which are copies the windows own)."""
    t = rows[0][0]
    if all(r[0] is t for r in rows):  # (a lock step's rows often come from one batch)
        ns = [r[1] for r in rows]
        if share and len(ns) == len(t) and ns == list(range(len(ns))):
            return t
        return t.index_select(0, as_index(ns, t.device))
    by: dict[int, tuple] = {}
    for at, (t, n) in enumerate(rows):
        e = by.get(id(t))
        if e is None:
            e = by[id(t)] = (t, [], [])
        e[1].append(n)
        e[2].append(at)
    if len(by) == 1:
        return t.index_select(0, as_index(e[1], t.device))
    out = torch.cat([t.index_select(0, as_index(ns, t.device)) for t, ns, _ in by.values()])
    order = [at for _, _, ats in by.values() for at in ats]  # the joined rows' places in ``rows``
    back = np.empty(len(order), np.int64)
    back[order] = np.arange(len(order))
    return out.index_select(0, torch.from_numpy(back).to(out.device))
