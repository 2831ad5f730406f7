"""Asynchronous push gossip as conservative lookahead windows (``--engine windowed`` when activations are not
simultaneous: Poisson, Bernoulli or periodic clocks with offsets, drift and jitter, any compute time, any
latency, per-link settings, link traces, bandwidth and uplinks, Bernoulli or Gilbert-Elliott
loss, outages, agents going offline).

The lookahead. A message sent at t arrives no earlier than t + L, L = the smallest latency any link can give (the
scenario's distribution, the per-link overrides', a link trace's measurements; an agent with nothing to merge
pushes at once, so the compute time before a send is 0 at least). An activation at a merges only what arrived
before a, sent before a - L; so every activation of the window [T, T + L) reads payloads sent before T: the
window's tensor work depends only on earlier windows, and all of it is done together, in batched calls.
Transmission times and offline time keep that true: a link's or an uplink's queue only delays an arrival (a push
does not wait for its transmission), and an activation moved out of an interval, a gradient that waits for the
agent to be back and a drop decided when the message is sent (sender offline then, receiver offline when it
would land, an outage, a burst's loss) change when things happen and what arrives, never how soon a message can
land. A latency with no positive lower bound leaves no lookahead: a message may then be sent and merged inside one
window, and the tensor work, done in dependency order (a merge a lock step after its payload's push, ``lock_steps``),
is exact on windows of any length (``window``: a typical latency). What breaks it: a link model of its own (a
plugin's or a replay's: outcomes not from the engine's streams). A time-varying topology is played: each
activation adopts its epoch's links, as the engine's activation listener does.

Checkpoints are cut between two windows, once their tensor work is done (``Simulation.between_windows``): the
driver's state is then data (``held``: its event queue, the payloads in flight, the gradients waiting for their
update and the requests waiting for their batch, each agent's place in its activation, the trace rows not yet
written), and ``netsim resume`` restores it into a freshly built simulation (sim/restore.py) instead of
recomputing. The built-in patterns' lookahead windows restore; refused (``checkpoint_refusal``): a plugin's link
model, whose state is not restored (the composed models' links are: bursts, outages, per-link settings, link traces
and uplinks; the random churn drawn so far; the epoch of a time-varying topology each agent holds).

What happens when does not depend on any tensor: times, peers, latencies, losses, gradient counts and the engine's
gradient batches follow from the streams and from how many models arrived. So the driver first plays the
window's events as the events engine's queue would, in the order of (time, insertion number): simpy's (the
events of later windows wait in buckets of one lookahead; a window sorts those it reaches once, and the events
scheduled inside it join a small heap):
simultaneous events in the order they were scheduled (a Timeout is scheduled when the event before it in its
agent's program is processed); every row of one processed event together, as the engine writes them
(``activate`` then ``compute_start``, or ``send`` and its ``drop`` and the agent's ``finish``; ``compute_end``
then what follows it; one ``deliver``; one ``offline``). Each agent's streams are consumed in its own order by
the same calls the engine makes (``Schedule.next``, the jitter and churn of ``activation_moves``,
``Agent.compute_time``, ``sample_rows``, the program's ``rng``), and each link's latency, loss
and burst state from its own streams in send order (the lean path's draws, or the engine's installed
``ComposedLinks.outcome`` with its drop reasons ``loss``, ``outage``, ``offline``); message ids are numbered in
processing order. A random churn's intervals are drawn lazily from the agent's ``churn`` stream, the same ones
whichever query grows them first. Each churn recorder (``Churn.recorder``: an ``offline`` row when an interval
starts) is a timer event, its first set after run.until's and before the programs' first wakes, where the
engine's recorders, started with the network, set theirs. The run stops where the engine's does: at
``run.until`` (the events then due that were scheduled before it) or after the last agent's finish; the
evaluator's timer ends a window where it falls, and the models are scored there after the window's work (only
pushes write the bank).

Then the tensor work: each agent's operations in the window (merge a payload, ask for a gradient, update
with it, push) in its program's order, all agents in lock step, each step's merges in one ``combine`` and its
updates in one ``update`` call (row-wise operations: the same bits in any batch). Gradients are evaluated in
the batches the engine evaluates them (the requests pending when one completes, in request order), by the
gradient service itself: a logistic gradient's bits depend on which rows share its call, so only the engine's
batches are exact, and ``gradient_batches`` is the engine's too. With a batch-invariant model
(``model.batch_invariant``: the same bits in any batch, in both engines) every step's requests are evaluated
together instead, right after the step's merges: one gradient call per step, and ``gradient_batches`` counts
those calls. Push gossip's tensor work is done for 128 windows at once (``gathers``: fewer, fuller lock steps; a
merge then waits in lock step for a push of an earlier window of the same work), 32 where checkpoints are cut
(between two works).
"""

from __future__ import annotations

import base64
import heapq
import itertools
import json
import time
from array import array
from collections import defaultdict
from collections.abc import Callable
from operator import is_, itemgetter
from typing import Any

import attrs
import numpy as np
import torch

from netsim.rounds.kernel import AgentsOf, Batch, as_index
from netsim.rounds.push import Peers
from netsim.sim import rows as shapes
from netsim.sim.network import ComposedLinks, LinksAhead, hold_time, payload_size
from netsim.sim.rows import CODES
from netsim.trace.events import Offline
from netsim.trace.events import row as event_row
from netsim.trace.io import RECORD, PackedRows

ACT, DONE, ARR, STOP, UNTIL, EVAL, OFF = 0, 1, 2, 3, 4, 5, 6  # events (time, seq, kind, agent, value)
SENT = 7  # the end of a broadcast's transmission (``WindowDriver.broadcast``: the program goes on)
_INF, _NEVER = float("inf"), 1 << 62  # an infinite time, and its bucket
_ROWS = itemgetter(1)  # a ticket's rows (``ticket_of``)
# the trace rows' strings as codes (``PackedRows``): ``sim.rows.CODES``, the first words of every driver's ``Words``
pack = RECORD.pack
UPDATE, MERGE, ASK, PUSH = 0, 1, 2, 3  # an agent's tensor operations, in the order a step takes them; an operation
# on v (a ticket, a message id, -1: none) is the int v << 2 | kind (no tuple to make per operation)


@attrs.define
class WindowStats:
    """What the summary reports of a windowed run (``summary()``): why it is as fast as it is."""

    lookahead: float
    windows: int = 0
    events: int = 0
    fewest: int = 0
    tensor_s: float = 0.0  # wall seconds in the batched tensor work (merges, updates, gradient batches)
    gradient_s: float = 0.0  # of which in the gradient batches (the engine's own)
    wall_s: float = 0.0
    control_cpu_s: float = 0.0  # CPU seconds of the thread that plays the events and does the tensor work

    def add(self, events: int) -> None:
        self.fewest = events if not self.windows else min(self.fewest, events)
        self.windows += 1
        self.events += events

    def summary(self) -> dict:
        return {"lookahead_s": self.lookahead, "windows": self.windows,
                "events_per_window_mean": self.events / max(1, self.windows),
                "events_per_window_min": self.fewest,
                "tensor_share": self.tensor_s / max(self.wall_s, 1e-12),
                "gradient_share": self.gradient_s / max(self.wall_s, 1e-12), "control_cpu_s": self.control_cpu_s}


def _plain_number(v):
    """A numpy number in a checkpoint's JSON as the Python number it is."""
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"a {type(v).__name__} in the lookahead windows' state")


def min_latency(lat) -> float | None:
    """The smallest latency a draw of ``lat`` can give (None: no positive lower bound)."""
    low = {"constant": lat.value, "uniform": lat.low}.get(lat.kind)
    return low if low is not None and low > 0 else None


def lookahead(sim) -> tuple[float | None, str]:
    """The run's lookahead L, the smallest latency any message can see: the scenario's distribution, every
    per-link override's and every latency a link trace measured (its empty cells fall back to those). None, and
    why, when there is no positive one."""
    net = sim.world.scenario.network
    lows = [(net.latency, "latency")] + [(o.latency, f"network.links[{k}].latency")
                                         for k, o in enumerate(net.links or ()) if o.latency is not None]
    bound = None
    for lat, key in lows:
        low = min_latency(lat)
        if low is None:
            what, fix = (f"{key} {lat.kind!r} has no positive lower bound", f"a uniform {key} with low > 0 (or a "
                         "constant) runs fast") if lat.kind not in ("constant", "uniform") \
                else (f"the minimum {key} is 0", f"give {key} a minimum > 0")
            return None, f"{what}: no lookahead (a message can arrive at once) — {fix}"
        bound = low if bound is None else min(bound, low)
    measured = [v for s in getattr(sim.world.network, "series", {}).values() for v in s.latency if v is not None]
    if measured and min(measured) <= 0:
        return None, ("network.trace measures a latency of 0: no lookahead (a message can arrive at once) — a link "
                      "trace whose latencies are all > 0 runs fast")
    return (min(bound, *measured) if measured else bound), ""


def window(sim) -> float:
    """A window's length: the lookahead where the latencies have a positive minimum, else the smallest typical one (a
    distribution's mean, a uniform's midpoint) of the scenario's and the per-link overrides', else ``FALLBACK``. Without
    a lookahead a message may be sent and delivered inside one window, which a driver whose tensor work waits for the
    payloads it reads plays exactly (``refusal(bound=False)``); then the length only sizes the control's buckets and
    the lock steps."""
    L = lookahead(sim)[0]
    if L is not None:
        return L
    net = sim.world.scenario.network
    lats = [net.latency, *(o.latency for o in net.links or () if o.latency is not None)]
    typical = [t for lat in lats if (t := _typical(lat)) > 0]
    return min(typical) if typical else FALLBACK


FALLBACK = 0.01  # seconds: a window where no latency is positive on average


def _typical(lat) -> float:
    return {"constant": lat.value, "uniform": None if lat.low is None else (lat.low + lat.high) / 2}.get(
        lat.kind, lat.mean) or 0.0


def transmits(sim) -> bool:
    """Whether any send can take time to transmit (bandwidth or uplinks: the scenario's, a per-link override's, a link
    trace's measured ones): what the drivers whose programs wait for a send do not play."""
    net = sim.world.scenario.network
    series = getattr(sim.world.network, "series", {}).values()
    rates = [net.bandwidth, net.uplink, *(o.bandwidth for o in net.links or ()),
             *(b for s in series for b in s.bandwidth)]
    return any(r is not None for r in rates)


def refusal(sim, kernel, bound: bool = True) -> str | None:
    """Why this run cannot be played as lookahead windows with the engine's exact trace (None: it can); ``bound``:
    whether the driver needs a positive lookahead (one whose tensor work is done in dependency order does not)."""
    if checkpoints(sim):
        why = checkpoint_refusal(sim, kernel)
        if why is not None:
            return why
    model = sim.world.network.model
    if model is not None and type(model) is not ComposedLinks:
        from netsim.rounds.windowed import link_model_refusal

        return link_model_refusal(sim)
    L, why = lookahead(sim) if bound else (0.0, "")
    if L is None:
        return why
    dynamic = sim.world.network.dynamic
    adopt = None if dynamic is None else dynamic.adopt  # the one listener the drivers play (at each activation)
    for a in sim.loop.agents:
        if any(f != adopt for f in a.activation_listeners):
            return (f"agent {a.id} has activation listeners — leave its wakes to agents.activation (no setup hook "
                    "or plugin listening to them)")
    return None


def checkpoints(sim) -> bool:
    """Whether the run writes checkpoints (``run.checkpoint_every``, ``run.checkpoint_every_rounds``)."""
    r = sim.world.scenario.run
    return r.checkpoint_every is not None or r.checkpoint_every_rounds is not None


def checkpoint_refusal(sim, kernel) -> str | None:
    """Why a checkpoint of these windows could not be restored (None: it can; the module docstring)."""
    fix = "remove run.checkpoint_every and run.checkpoint_every_rounds (or run --engine events)"
    if not getattr(kernel.pattern, "restores", False):
        return f"checkpoints: this pattern's lookahead windows cannot be restored from one — {fix}"
    model = sim.world.network.model  # (the composed models' links, the churn and the epochs are restored)
    if model is not None and type(model) is not ComposedLinks:
        return f"checkpoints with a link model of a plugin: its state is not restored by the lookahead windows — {fix}"
    return None


def per_agent(own: dict, keys, n: int) -> None:
    """ValueError unless each of ``own``'s ``keys`` holds ``n`` agents' values (a driver's ``take_hold``)."""
    if any(len(own[k]) != n for k in keys):
        raise ValueError(f"held.own: not {n} agents' state")


def queued(plain: dict, n: int, own: dict[int, Callable[[int, Any], bool]]) -> bool:
    """A driver's queued events checked (``check_own``): activations of an agent at a time, completions of a ticket
    asked for or kept, and each of the driver's own kinds of an agent by ``own[kind](agent, value)``."""
    from netsim.sim.restore import int_in, number

    top, lo, asked = *plain["tickets"][:2], set(plain["grads"])
    for _t, _, kind, i, v in plain["events"]:
        if kind == ACT:
            ok = int_in(i, 0, n) and number(v)
        elif kind == DONE:
            ok = int_in(i, 0, n) and int_in(v, 0, top) and (v >= lo or v in asked)
        elif kind in own:
            ok = int_in(i, 0, n) and own[kind](i, v)
        else:
            continue
        if not ok:
            return False
    return True


def queued_holds(plain: dict, n: int, arrival: Callable[[int, list], bool]) -> list | None:
    """A broadcast-pattern driver's queued events checked (``queued``: transmission ends with no value, arrivals by
    ``arrival(agent, value)``): the payload handle each arrival holds (its value's last), or None where one is
    wrong."""
    held: list = []

    def arrived(i: int, v) -> bool:
        ok = isinstance(v, list) and arrival(i, v)
        if ok:
            held.append(v[-1])
        return ok

    return held if queued(plain, n, {ARR: arrived, SENT: lambda i, v: v is None}) else None


def holds_of(plain: dict, refs: list) -> str | None:
    """``check_own``'s last word: whether the state's holds are one for each reference ``refs`` makes to a payload."""
    from collections import Counter

    return None if Counter(refs) == dict(plain["holds"]) else "holds"


def stacked(rows: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(rows)``; where the rows lie back to back in one storage, in order (a gradient batch's results),
    a (B, P) view of them: the same values, without a copy (a (B, P) copy per batch of a large model)."""
    r0 = rows[0]
    p = r0.numel()
    if r0.dim() == 1 and r0.is_contiguous():
        at, step, store = r0.data_ptr(), p * r0.element_size(), r0.untyped_storage().data_ptr()
        if all(r.dim() == 1 and r.is_contiguous() and r.numel() == p and r.dtype == r0.dtype
               and r.data_ptr() == at + n * step and r.untyped_storage().data_ptr() == store
               for n, r in enumerate(rows)):
            return r0.as_strided((len(rows), p), (p, 1))
    return torch.stack(rows)


class RowStore:
    """Rows kept by key between lock steps (payloads in flight, gradients waiting for their update): one tensor
    grown as needed and a free list, so keeping and taking are one ``index_copy_`` and one ``index_select`` per
    step, with no tensor per row."""

    __slots__ = ("rows", "row_of", "free")  # ``key in store.row_of``: whether a key is kept

    def __init__(self, like: torch.Tensor):
        self.rows = torch.empty_like(like)
        self.row_of: dict[int, int] = {}
        self.free = list(range(len(like) - 1, -1, -1))

    def put(self, keys: list[int], src: torch.Tensor) -> None:
        free = self.free
        if len(free) < len(keys):  # grow: twice the rows, the new ones free
            old = self.rows
            self.rows = torch.empty((2 * len(old) + len(keys), old.shape[1]), dtype=old.dtype, device=old.device)
            self.rows[:len(old)] = old
            free.extend(range(len(self.rows) - 1, len(old) - 1, -1))
        cut = len(free) - len(keys)
        rows = free[cut:][::-1]  # (the free list's last rows, last first: as popped one by one)
        del free[cut:]
        self.row_of.update(zip(keys, rows))
        self.rows.index_copy_(0, as_index(rows, src.device), src)

    def take(self, keys: list[int]) -> torch.Tensor:
        """The rows of ``keys``, which are then forgotten."""
        rows = list(map(self.row_of.pop, keys))
        self.free.extend(rows)
        return self.rows.index_select(0, as_index(rows, self.rows.device))

    def peek(self, keys: list[int]) -> torch.Tensor:
        """The rows of ``keys``, still kept."""
        return self.rows.index_select(0, as_index(list(map(self.row_of.__getitem__, keys)), self.rows.device))

    def drop(self, key: int) -> None:
        self.free.append(self.row_of.pop(key))

    def save(self) -> tuple[list[int], torch.Tensor]:
        """The keys kept and their rows (a checkpoint's)."""
        keys = list(self.row_of)
        return keys, self.peek(keys) if keys else self.rows[:0].clone()

    def load(self, keys: list[int], rows: torch.Tensor) -> None:
        """``save``'s rows kept again under their keys."""
        if keys:
            self.put(keys, rows)


class Payloads(RowStore):
    """The payloads a driver's messages carry (its ``payloads``): their rows by handle, each one's holds (the
    messages, copies and takes that still read it: its row goes with the last) and the next handle (``new``)."""

    __slots__ = ("holds", "next", "gone")

    def __init__(self, like: torch.Tensor):
        super().__init__(like)
        self.holds: dict[int, int] = {}
        self.next = 0
        self.gone: list[int] = []  # let go of by the control (``release(later=True)``), dropped by ``done``

    def new(self) -> int:
        """A new payload's handle."""
        pid = self.next
        self.next = pid + 1
        return pid

    def hold(self, pid: int, n: int = 1) -> None:
        self.holds[pid] = self.holds.get(pid, 0) + n

    def release(self, pid: int, later: bool = False) -> None:
        """One hold of ``pid`` given up; its row dropped with the last (``later``: by the control, whose window's
        tensor work may still read it, so after that work: ``done``)."""
        n = self.holds[pid] - 1
        if n:
            self.holds[pid] = n
        else:
            del self.holds[pid]
            if later:
                self.gone.append(pid)
            else:
                self.drop(pid)

    def keep(self, keys: list[int], sent: torch.Tensor, which: list[int], holds: list[int] | None = None) -> None:
        """Rows ``which`` of ``sent`` kept under ``keys`` (and each one's ``holds``, where given)."""
        self.put(keys, sent if len(which) == len(sent) else sent.index_select(0, as_index(which, sent.device)))
        if holds is not None:
            self.holds.update(zip(keys, holds, strict=True))

    def add_into(self, copies: torch.Tensor, step: list) -> None:
        """x_hat_j += d_j: a lock step's arrivals (its ops' second values: (slot, handle) each, in arrival order) added
        into the agents' ``copies``, each agent's n-th of the step at once (one agent's in turn), each released."""
        dev = copies.device
        got = [(i, o[1]) for i, o in step]
        for n in range(max(len(g) for _, g in got)):
            at = [(i, g[n]) for i, g in got if len(g) > n]
            rows = torch.tensor([i for i, _ in at], device=dev)
            slots = torch.tensor([s for _, (s, _) in at], device=dev)
            pids = [h for _, (_, h) in at]
            copies[rows, slots] = copies[rows, slots] + self.peek(pids)
            for h in pids:
                self.release(h)

    def done(self) -> None:
        """After a window's tensor work: the rows its control let go of dropped (no later window reads them)."""
        for h in self.gone:
            if h in self.row_of:
                self.drop(h)
        self.gone.clear()


def lock_steps(kind: np.ndarray, first: np.ndarray, waiter: np.ndarray, waited: np.ndarray,
               gap: np.ndarray | int = 1) -> np.ndarray:
    """The lock step of every tensor operation (``kind``: UPDATE, MERGE, ASK, PUSH, agent after agent in program
    order; ``first``: an agent's first), the earliest that keeps each agent's order and what waits: an operation
    joins the step of the one before it when its kind comes later in a step (update, merge, ask, push), else goes
    to the next step; and it comes after every operation it waits for (``waiter[n]`` waits for ``waited[n]``: a
    merge for the push of its payload, an update for its gradient batch's last request) by one step at least. So
    step[k] = max(step[k - 1] + (kind[k] <= kind[k - 1]), wait[k]) along each agent, found as a running maximum
    (one numpy pass per round of waits: a wait moves a step, which may move the waits on it). ``gap``: the steps
    between a waiter and what it waits for (1: the next step at the earliest; 0 for a wait on a step's end, such as a
    gradient batch evaluated after its last request's step, written as an operation of its own)."""
    n = len(kind)
    inc = np.zeros(n, np.int64)
    inc[1:] = kind[1:] <= kind[:-1]
    inc[first] = 0
    climb = np.cumsum(inc)
    seg = np.cumsum(first) - 1
    big = 2 * n + 2  # apart: each agent's values above every earlier agent's
    wait = np.zeros(n, np.int64)
    for _ in range(len(waiter) + 2):  # a chain of k waits settles in k + 1 rounds (then one to see it)
        step = climb + np.maximum.accumulate(wait - climb + big * seg) - big * seg
        need = np.zeros(n, np.int64)
        np.maximum.at(need, waiter, step[waited] + gap)
        if np.array_equal(need, wait):
            return step
        wait = need
    raise RuntimeError("lookahead windows: the window's operations wait on each other")


def play(pattern, sim, kernel) -> bool:
    """Play a started run to its end window by window (see the module docstring); True when an interrupt stopped it
    between two windows."""
    return _Driver(pattern, sim, kernel).run()


class Context:
    """The run as a window driver reads it (``ctx``): the objects it takes from ``sim`` once, the run's constants and
    the window statistics the summary reports (``stats``)."""

    __slots__ = ("pattern", "sim", "kernel", "p", "agents", "writer", "net", "bank", "state", "until", "tag",
                 "tag_code", "churn", "outcome", "checkpoints", "dynamic", "stats")

    def __init__(self, pattern, sim, kernel, tag_code: int):
        world = sim.world
        self.pattern, self.sim, self.kernel, self.tag, self.tag_code = pattern, sim, kernel, pattern.tag, tag_code
        self.p, self.agents, self.writer = sim.params, sim.loop.agents, sim.recorder.writer
        self.net, self.bank = world.network, world.bank
        self.state = kernel.state_of(self.agents[0], self.p)
        self.until = world.scenario.run.until
        self.churn = world.churn  # offline intervals: moved activations (moves), waiting gradients, offline rows
        # what happens to a message: the engine's installed model (bursts, outages, churn's drops: ComposedLinks), else
        # the lean default path as a model (latency, bandwidth, loss): the engine's own code, its streams in send order
        self.outcome = (world.network.model or world.network.lean()).outcome
        self.checkpoints = checkpoints(sim)  # cut between windows (``between_windows``)
        if not self.checkpoints:
            world.network.without_checkpoints()  # links keep their draws' positions only for checkpoints
        self.dynamic = world.network.dynamic  # a time-varying topology: each activation adopts its epoch's links
        self.stats = WindowStats(window(sim))
        sim.services.put("windows", self.stats)


class EventQueue:
    """The pending events (time, insertion number: simpy's order of simultaneous ones, kind, agent, value) and where
    the window loop stands in them. Those of later windows wait in buckets of one lookahead (t in bucket
    int(t * inv)); a window sorts the buckets up to its end into ``cur``, latest first, and pops from its end
    (``load``); an event scheduled during a window that falls in it joins ``soon``, a heap (a gradient's completion:
    few at once). One sort per window compares the times as floats in C, where a heap of ~2 windows' events (every
    event pushed and popped) cost a fifth of the control's time. ``now``: the time of the last event processed;
    ``ended``: the run's stop was; ``evaluation``: the time of an evaluation that ends the window (None: none)."""

    __slots__ = ("cur", "soon", "far", "end", "inv", "seq", "push", "now", "ended", "evaluation")

    def __init__(self, lookahead: float, seq: int, now: float):
        self.cur: list[tuple] = []
        self.soon: list[tuple] = []
        self.far: dict[int, list[tuple]] = {}
        self.end = [-_INF]  # the current window's end (a cell: ``push`` reads it)
        self.inv = 1.0 / lookahead
        self.seq = itertools.count(seq)  # (a checkpoint's state: the counter goes on where it stood)
        self.push = self._pusher()
        self.now, self.ended, self.evaluation = now, False, None

    def _pusher(self) -> Callable[[float, int, int, object], None]:
        """``push(t, kind, agent, value)``: an event into ``soon`` if it falls in the current window, else into its
        bucket (a closure: it runs for every event scheduled)."""
        soon, far, end, seq, push, inv = self.soon, self.far, self.end, self.seq, heapq.heappush, self.inv

        def enqueue(t: float, kind: int, i: int, v=None) -> None:
            e = (t, next(seq), kind, i, v)
            if t < end[0]:
                push(soon, e)
                return
            b = int(t * inv) if t < _INF else _NEVER
            q = far.get(b)
            if q is None:
                far[b] = [e]
            else:
                q.append(e)

        return enqueue

    def numbered(self, t: float, seq: int, kind: int, i: int, v) -> None:
        """``push`` with an insertion number taken earlier (``next(seq)`` where the engine schedules it)."""
        e = (t, seq, kind, i, v)
        if t < self.end[0]:
            heapq.heappush(self.soon, e)
        else:
            self.far.setdefault(int(t * self.inv) if t < _INF else _NEVER, []).append(e)

    def load(self, end: float) -> None:
        """The window ending at ``end`` begins: every event that may be due before it sorted into ``cur`` (what is
        left there, ``soon``'s and the buckets' up to ``end``'s: ``int(t * inv)`` never decreases with t)."""
        top, far, cur = int(end * self.inv) if end < _INF else _NEVER, self.far, self.cur
        for b in [b for b in far if b <= top]:
            cur.extend(far.pop(b))
        cur.extend(self.soon)
        self.soon.clear()
        cur.sort(reverse=True)
        self.end[0] = end

    def due(self, end: float):
        """The events due before ``end``, in simpy's order, as the window pops them (push gossip's loop inlines
        this)."""
        cur, soon, pop = self.cur, self.soon, heapq.heappop
        while True:
            if soon and (not cur or soon[0] < cur[-1]):
                yield pop(soon)
            elif cur and cur[-1][0] < end:
                yield cur.pop()
            else:
                return

    def first_due(self) -> float | None:
        """The time of the next event (None: none): the earliest of ``cur``'s last, ``soon``'s first and the
        nearest bucket's."""
        firsts = [e[0] for e in (self.cur[-1] if self.cur else None, self.soon[0] if self.soon else None,
                                 min(self.far[min(self.far)]) if self.far else None) if e is not None]
        return min(firsts) if firsts else None

    def pending(self) -> list[tuple]:
        """Every event still to come (a checkpoint's)."""
        return [*self.cur, *self.soon, *(e for q in self.far.values() for e in q)]

    def restore(self, events: list) -> None:
        """``pending``'s events, as a checkpoint's JSON holds them, into the buckets (no window is loaded yet)."""
        for t, seq, kind, i, v in events:
            self.numbered(t, seq, kind, i, tuple(v) if isinstance(v, list) else v)


class Gradients:
    """The run's gradient requests and their evaluation (``grad``): each request's ticket (``ticket_of``: (agent,
    rows; None: its whole part), None once evaluated), the engine's batches (``flushes``: the requests from
    ``pending_lo`` on, at a batch's first completion), or one call per lock step for a batch-invariant model
    (``free``), where each is taken (``at_of``, or the driver's ``point``) and the results kept until their update
    takes them (``evaluated``)."""

    __slots__ = ("svc", "agents", "stats", "first", "free", "ticket_of", "pending_lo", "sampled", "flushes",
                 "evaluated", "at_of", "parts", "point", "points")

    def __init__(self, ctx: Context, svc, point: Callable, points: Callable):
        self.svc, self.agents, self.stats = svc, ctx.agents, ctx.stats
        self.first = None  # the request of an activation's first gradient (the driver's: None, none)
        self.free = bool(getattr(svc.model, "batch_invariant", False))  # batch as the windows like
        self.ticket_of: list = []
        self.pending_lo = 0  # the first ticket not yet in a gradient batch
        self.sampled = False  # whether a ticket has rows of its own (a mini-batch), not its agent's whole part
        self.flushes: list[range] = []  # this window's gradient batches, in the engine's order
        self.evaluated = RowStore(ctx.bank.W)  # the gradients evaluated and not yet taken by an update, by ticket
        self.at_of: dict[int, torch.Tensor] = {}  # ticket -> where its gradient is taken (``asked``)
        self.parts = None  # the agents' whole parts stacked by length, once a lock step asks for gradients on them
        self.point, self.points = point, points  # the driver's: where a ticket's gradient is taken (one, several)

    def ticket(self, i: int, rows, whole) -> int:
        """A new request of agent i on ``rows`` (``whole``: its agent's part); returns its ticket."""
        tk = len(self.ticket_of)
        if rows is whole:
            self.ticket_of.append((i, None))
        else:
            self.ticket_of.append((i, rows))
            self.sampled = True
        return tk

    def completed(self, tk: int) -> None:
        """Ticket ``tk``'s completion: a batch's first makes every pending request a batch (the engine's)."""
        if tk >= self.pending_lo and not self.free:
            self.flushes.append(range(self.pending_lo, len(self.ticket_of)))
            self.pending_lo = len(self.ticket_of)

    def batches(self, first_ticket: int) -> tuple[dict[int, int], list[int], list[int]]:
        """The window's gradient batches as its tensor work tracks them: each ticket's batch, each batch's requests
        still to be made in this work (from ``first_ticket`` on; earlier ones were), every batch still waiting."""
        flush_of, left = {}, []
        for f, r in enumerate(self.flushes):
            left.append(sum(tk >= first_ticket for tk in r))
            for tk in r:
                flush_of[tk] = f
        return flush_of, left, list(range(len(self.flushes)))

    def asked_at(self, step: list, X: torch.Tensor) -> None:
        """``asked`` for a lock step's requests of ``WindowDriver.in_order`` ((ASK, ticket) each) at their agents'
        rows of ``X``."""
        who = [i for i, _ in step]
        self.asked(who, [o[1] for _, o in step], X.index_select(0, as_index(who, X.device)))

    def asked(self, who: list[int], tickets: list[int], at: torch.Tensor) -> None:
        """A lock step's gradient requests at the rows ``at``: evaluated at once for a batch-invariant model, else
        kept until their batch is (``point``)."""
        if self.free:
            self.evaluate_step(who, tickets, at)
            return
        for tk, row in zip(tickets, at.unbind(0), strict=True):
            self.at_of[tk] = row

    def clipping(self) -> tuple:
        """The per-sample clipping of the gradients asked for (``first``'s clip and kind; none without one)."""
        first = self.first
        return () if first is None or first.clip is None else (first.clip, first.clip_kind)

    def rows_of_ticket(self, tk: int):
        """The training rows of ticket ``tk``'s gradient (None in ``ticket_of``: the agent's whole part)."""
        i, rows = self.ticket_of[tk]
        return self.agents[i].rows if rows is None else rows

    def evaluate_ready(self, left: list[int], waiting: list[int], blocked: dict[int, int],
                       woken: list[int]) -> list[int]:
        """Evaluate the gradient batches of ``waiting`` whose requests are all in, in the engine's order (the same
        call, the same bits); the agents ``blocked`` on one of them go to ``woken``; the others, still waiting."""
        still = []
        for f in waiting:
            if left[f]:
                still.append(f)
                continue
            for tk in self.evaluate_batch(f):
                i = blocked.pop(tk, None)
                if i is not None:
                    woken.append(i)
        return still


    def evaluate_batch(self, f: int) -> range:
        """The engine's gradient batch ``f`` (``flushes[f]``, all its requests in), in one call as the engine makes
        it (the same bits); returns its tickets."""
        svc, ticket_of = self.svc, self.ticket_of
        t0 = time.perf_counter()
        r = self.flushes[f]
        rows = [self.rows_of_ticket(tk) for tk in r]
        m = len(rows[0])
        if all(len(x) == m for x in rows):  # one block: the call the engine's tickets make, no tensor per request
            block = svc.submit_block([ticket_of[tk][0] for tk in r], self.points(r), rows, *self.clipping())
            svc.flush()
            self.evaluated.put(r, block.result)
        else:
            tickets = [svc.submit(ticket_of[tk][0], self.point(tk), x, *self.clipping()) for tk, x in zip(r, rows)]
            svc.flush()
            self.evaluated.put(r, stacked([t.result for t in tickets]))
        for tk in r:
            ticket_of[tk] = None
        self.stats.gradient_s += time.perf_counter() - t0
        return r

    def evaluate_step(self, who: list[int], tickets: list[int], at: torch.Tensor, rows=None) -> None:
        """A batch-invariant model's requests of one lock step, at the rows ``at``, in one call (``rows``: their
        mini-batches, else ``ticket_of``'s)."""
        t0 = time.perf_counter()
        svc, ticket_of = self.svc, self.ticket_of
        if rows is None:
            # every request on its agent's whole part (C loops: no Python frame a ticket)
            if not self.sampled or all(map(is_, map(_ROWS, map(ticket_of.__getitem__, tickets)),
                                           itertools.repeat(None))):
                self.evaluate_parts(who, tickets, at)
                return
            rows = [self.rows_of_ticket(tk) for tk in tickets]
        m = len(rows[0])
        if isinstance(rows, np.ndarray) or all(len(r) == m for r in rows):  # one block: no per-request tensors
            block = svc.submit_block(who, at, rows, *self.clipping())
            svc.flush()
            self.evaluated.put(tickets, block.result)
        else:  # one block per mini-batch length (an agent's whole part: lengths differ by a row or two)
            by_len: dict[int, list[int]] = {}
            for k, r in enumerate(rows):
                by_len.setdefault(len(r), []).append(k)
            blocks = [(ks, svc.submit_block([who[k] for k in ks], at[as_index(ks, at.device)], [rows[k] for k in ks],
                                            *self.clipping())) for ks in by_len.values()]
            svc.flush()
            for ks, block in blocks:
                self.evaluated.put([tickets[k] for k in ks], block.result)
        for tk in tickets:
            ticket_of[tk] = None
        self.stats.gradient_s += time.perf_counter() - t0

    def evaluate_parts(self, who: list[int], tickets: list[int], at: torch.Tensor) -> None:
        """``evaluate_step`` of requests on their agents' whole parts: the blocks of one part length each (in the
        order of their first request, each in request order, as ``evaluate_step`` makes them) take their rows as
        one (B, m) array from the parts stacked once, with no list of per-agent arrays."""
        t0 = time.perf_counter()
        svc, ticket_of = self.svc, self.ticket_of
        if self.parts is None:  # the agents' parts by length: (length, row of each agent in its stack, the stacks)
            agents = self.agents
            lens = np.fromiter((len(a.rows) for a in agents), np.int64, len(agents))
            row = np.zeros(len(agents), np.int64)
            stacks = {}
            for m in np.unique(lens).tolist():
                ids = np.flatnonzero(lens == m)
                row[ids] = np.arange(len(ids))
                stacks[m] = np.stack([agents[i].rows for i in ids.tolist()])
            self.parts = (lens, row, stacks)
        lens, row, stacks = self.parts
        w = np.asarray(who, np.int64)
        ms = lens[w]
        if not (ms == ms[0]).all():
            _, first = np.unique(ms, return_index=True)
            groups = [np.flatnonzero(ms == ms[k]) for k in np.sort(first).tolist()]
        else:
            groups = [None]
        blocks = []
        for ks in groups:
            if ks is None:
                ids, params, tks = who, at, tickets
            else:
                ks_l = ks.tolist()
                ids, params, tks = [who[k] for k in ks_l], at[as_index(ks_l, at.device)], [tickets[k] for k in ks_l]
            sel = w if ks is None else w[ks]
            blocks.append((tks, svc.submit_block(ids, params, stacks[int(lens[sel[0]])][row[sel]], *self.clipping())))
        svc.flush()
        for tks, block in blocks:
            self.evaluated.put(tks, block.result)
        for tk in tickets:
            ticket_of[tk] = None
        self.stats.gradient_s += time.perf_counter() - t0

    def saved(self) -> list:
        """The tickets as a checkpoint keeps them: how many were made, the first not evaluated, the others (agent,
        rows, their dtype)."""
        tickets, lo = self.ticket_of, self.pending_lo
        while lo < len(tickets) and tickets[lo] is None:  # evaluated (a batch-invariant model: as asked)
            lo += 1
        return [len(tickets), lo, [[i, None, ""] if rows is None else [i, rows.tolist(), rows.dtype.str]
                                   for i, rows in tickets[lo:]]]

    def load(self, saved: list, pending_lo: int) -> None:
        """``saved``'s tickets back (and where the next batch starts)."""
        n, lo, pending = saved
        self.pending_lo = pending_lo
        self.ticket_of[:] = [None] * lo + [(i, None if rows is None else np.array(rows, dtype=np.dtype(dt)))
                                           for i, rows, dt in pending]
        self.sampled = any(t is not None and t[1] is not None for t in self.ticket_of)
        if len(self.ticket_of) != n:
            raise ValueError(f"held.tickets: {len(self.ticket_of)} tickets where {n} were made")


class WindowDriver:
    """What a pattern's lookahead-window driver shares (push gossip's below, the other patterns' in
    rounds/*_windows.py), composed of parts: the run's context (``ctx``), the event queue in simpy's order
    (``events``), the gradient requests and batches (``grad``), the window's packed trace rows (``rows``), the
    payloads in flight (``payloads``) and each agent's tensor operations of the window (``ops``); itself ``Agent.wake``
    and the finish, the churn recorders' timers, the run's own events (the evaluator's timer, run.until, the stop:
    ``housekeeping``), the lock steps of the operations and the loop over windows (``run``). A driver adds its
    control (``events_until``: what an activation, a delivery and a completed gradient do), its tensor work
    (``tensor_work``), where a ticket's gradient is taken (``point``) and ``grad.first``, the request of an
    activation's first gradient (None: none)."""

    gathers = 1  # windows whose tensor work is done together (fewer, fuller lock steps; ``tensor_work`` must let
    # a merge wait for a push of an earlier window in the same work)
    gathers_checkpointed: int | None = None  # the windows of a work where checkpoints are cut (None: ``gathers``)
    holds_rows = False  # the rows of a gather's windows stay in ``rows`` until its tensor work (``decide`` patches
    # them: values the control wrote before the tensor work made them)

    def __init__(self, pattern, sim, kernel):
        words = shapes.words()
        self.rows = PackedRows(words)  # the window's trace rows, packed as they are made (strings: ``rows.words``)
        self.ctx = Context(pattern, sim, kernel, words(pattern.tag))
        restored = sim.loop.programs.between  # (a checkpoint's state: the counter goes on where it stood)
        self.events = EventQueue(self.ctx.stats.lookahead, restored.plain["seq"] if restored is not None
                                 and restored.plain else 0, float(sim.loop.env.now))
        self.grad = Gradients(self.ctx, sim.world.gradients, self.point, self.points)
        self.ops: dict[int, list] = defaultdict(list)  # agent: its tensor operations in this window, in program order
        self.unfinished = sum(not a.finished for a in self.ctx.agents)
        self.payloads = Payloads(self.ctx.bank.W)  # the payloads in flight or kept, by key
        self.wake = self._waker()

    def first_due(self) -> float | None:
        """The time of the next event (None: none): the queue's."""
        return self.events.first_due()

    def _waker(self) -> Callable[[int, float], None]:
        """``wake`` as a closure over the driver's state: it runs for every activation, and reading locals is what
        keeps the per-event Python small."""
        agents, enqueue = self.ctx.agents, self.events.push
        limit, finish, count = self.ctx.sim.world.scenario.run.rounds, self.finish, self.ctx.sim.count_wakes
        ones = [(a,) for a in agents]  # each agent as a batch of one, made once

        def wake(i: int, now: float) -> None:
            """``Agent.wake`` at ``now``: the next activation planned and counted (or the agent's finish)."""
            a = agents[i]
            if limit is not None and a.round >= limit:
                finish(a, now)
                return
            at, delay = a.plan_wake(now)
            count(ones[i])
            enqueue(now + delay, ACT, i, at)

        return wake

    # the control's shared steps (push gossip's closure inlines them: its per-event Python is the run's bound) -----
    def activate(self, i: int, t: float, at: float) -> None:
        """An activation's ``activate`` row, after the engine's activation listener (the epoch's links) if any."""
        a = self.ctx.agents[i]
        if self.ctx.dynamic is not None:
            self.ctx.dynamic.adopt(a, t)
        self.rows.put(pack(*shapes.activate(t, i, at, a.round, CODES)))

    def request(self, i: int, now: float, batch: int) -> int:
        """``Agent.gradient``: the compute time (and a wait while offline), its ``compute_start`` row, the
        mini-batch, the completion event; returns the ticket."""
        a = self.ctx.agents[i]
        ct = a.compute_time(now)
        self.rows.put(pack(*shapes.compute_start(now, i, ct, CODES)))
        tk = self.grad.ticket(i, a.sample_rows(batch), a.rows)
        self.events.push(now + ct, DONE, i, tk)
        return tk

    def completion(self, i: int, t: float, tk: int) -> None:
        """A gradient's completion: a batch's first evaluates every pending request (the engine's batches), then
        its ``compute_end`` row."""
        self.grad.completed(tk)
        self.rows.put(pack(*shapes.compute_end(t, i, CODES)))

    def message(self, i: int, j: int, now: float, size: int, rnd: int, tag: str,
                rows: PackedRows) -> tuple[int, float | None, float]:
        """A send as ``Network.send`` makes it: the link's outcome from its streams, the next message id, its ``send``
        row (and ``drop`` row) into ``rows``; (the id, the arrival time or None when it is dropped, the end of its
        transmission: a driver whose sender waits for it reads it)."""
        tx_end, delay, reason = self.ctx.outcome(i, j, now, size)
        mid = self.ctx.net.take_ids(1)
        words = self.rows.words
        rows.put(pack(*shapes.send(now, i, j, mid, size, delay, rnd, words(tag), CODES)))
        if reason:
            rows.put(pack(*shapes.drop(now, i, j, mid, size, delay, rnd, words(reason), CODES)))
            return mid, None, tx_end
        return mid, now + delay, tx_end

    def broadcast(self, i: int, now: float, size: int, rnd: int, *extra) -> tuple[int, int]:
        """``Agent.broadcast`` of a new payload: a message to every out-neighbour (an arrival's value: id, sender,
        bytes, when sent, round, ``extra``, the payload's handle), then the next wake once the longest transmission
        is over (its Timeout, ``SENT``, set after the arrivals); returns the handle and the messages under way."""
        pid, held, tx = self.payloads.new(), 0, 0.0
        tag, rows, push = self.ctx.tag, self.rows, self.events.push
        for j in self.ctx.agents[i].neighbors:  # this activation's (a time-varying topology changes them)
            mid, at, tx_end = self.message(i, j, now, size, rnd, tag, rows)
            h = hold_time(tx_end, now)
            if h > tx:
                tx = h
            if at is not None:
                held += 1
                push(at, ARR, j, (mid, i, size, now, rnd, *extra, pid))
        if tx <= 0:
            self.wake(i, now)
        else:
            push(now + tx, SENT, i)
        return pid, held

    def finish(self, a, now: float, row: bool = True) -> None:
        """An agent past the run's round limit finishes (once); the last one's finish stops the run. ``row``: its
        ``finish`` row put here (a planned run's rows hold it)."""
        if not a.mark_finished():
            return
        if row:
            self.rows.put(pack(*shapes.finish(now, a.id, a.round, CODES)))
        self.unfinished -= 1
        if not self.unfinished:  # the stop event: processed after what is already due now
            self.events.push(now, STOP, -1, self.ctx.until is not None)

    def offline_next(self, i: int, now: float, after: float) -> None:
        """``Churn.recorder`` of agent i at ``now``: its timer for the next interval starting after ``after``."""
        nxt = self.ctx.churn.next_interval(i, after)
        if nxt is None:
            self.ctx.sim.housekeeping_ended()
            return
        a, b = nxt
        self.events.push(now + max(0.0, a - now), OFF, i, (b - a, b))

    def housekeeping(self, t: float, kind: int, i: int, v) -> bool:
        """The run's own events, as ``events_until`` pops them; True when the window ends here."""
        if kind == EVAL:  # the evaluator's timer: the window ends here, the models scored after its work
            self.events.evaluation = t
            return True
        if kind == OFF:  # a churn recorder's timer: the interval starts
            self.rows.append(event_row(Offline(t, i, v[0])))
            self.offline_next(i, t, v[1])
            return False
        if kind == UNTIL or v:  # run.until's condition, or the run's stop event followed by run.until's condition
            self.events.push(t, STOP, -1, False)  # (processed after what is due now)
            return False
        self.events.ended = True
        return True

    def events_until(self, end: float) -> None:
        """Process every event due before ``end`` (or to the run's stop), as the engine's queue does: here a driver's
        whose programs broadcast (``activated``, ``completed``; an arrival's value as ``broadcast`` makes it, into
        the ``inbox`` as ``incoming`` makes it); push gossip, pairwise and barrier rounds play their own."""
        put, inbox, incoming, tag, t = self.rows.put, self.inbox, self.incoming, self.ctx.tag_code, self.events.now
        deliver = shapes.deliver
        try:
            for t, _, kind, i, v in self.events.due(end):
                if kind == ACT:
                    self.activate(i, t, v)
                    self.activated(i, t, v)
                elif kind == ARR:
                    put(pack(*deliver(t, i, v[1], v[0], v[2], v[3], v[4], tag, CODES)))
                    inbox[i].append(incoming(v))
                elif kind == DONE:
                    self.completion(i, t, v)
                    self.completed(i, t, v)
                elif kind == SENT:
                    self.wake(i, t)
                elif self.housekeeping(t, kind, i, v):
                    return
        finally:
            self.events.now = t

    def tensor_work(self, first_ticket: int) -> None:
        """Every agent's tensor operations of the window, in lock step."""
        raise NotImplementedError

    def op(self, i: int, *o) -> None:
        """Agent i's next tensor operation of the window, a tuple (``ops``; push gossip's closure packs its own as
        ints)."""
        ops = self.ops.get(i)
        if ops is None:
            ops = self.ops[i] = []
        ops.append(o)

    def decide(self) -> None:
        """After a window's tensor work (in this process): what the control takes from it (a driver whose sends
        depend on values plays them here)."""

    reads: dict[int, int] = {}  # (``in_order``) an operation's kind -> the place in it of a payload's handle it reads

    def in_order(self, first_ticket: int, handlers: tuple, ask: int, update: int) -> None:
        """Every agent's operations of the window (``ops``: tuples, the kind first) in its order, one per agent and lock
        step; the kind k of a step in one call ``handlers[k](step)`` (step: its (agent, operation) pairs). The second
        value of an ``ask`` and an ``update`` is a ticket: an update waits for its gradient batch, evaluated once all
        its requests are made (those of earlier windows were). An operation that reads a payload (``reads``) waits
        for the step after the one that makes it, where that is in this window (a message sent and delivered inside
        it: a latency with no positive minimum). Every wait is on an operation the control made earlier, so the
        earliest operation left can always go."""
        grad = self.grad
        flush_of, left, waiting = grad.batches(first_ticket)
        ops, ptr = self.ops, dict.fromkeys(self.ops, 0)
        active = list(ops)
        blocked: dict[int, int] = {}
        evaluated, free = grad.evaluated.row_of, grad.free
        reads, made = self.reads, self.payloads.row_of
        waiting = grad.evaluate_ready(left, waiting, blocked, active)
        while active:
            steps: list[list] = [[] for _ in handlers]
            nxt = []
            for i in active:
                o = ops[i][ptr[i]]
                if o[0] == update and o[1] not in evaluated:  # its batch waits for a request still to come
                    blocked[o[1]] = i
                    continue
                if reads:
                    at = reads.get(o[0])
                    if at is not None and o[at] is not None and o[at] not in made:  # its payload is still to come
                        nxt.append(i)
                        continue
                if o[0] == ask and not free:
                    f = flush_of.get(o[1])
                    if f is not None:
                        left[f] -= 1
                steps[o[0]].append((i, o))
                ptr[i] += 1
                if ptr[i] < len(ops[i]):
                    nxt.append(i)
            if not any(steps):
                raise RuntimeError("lookahead windows: the window's operations wait on each other")
            for handle, step in zip(handlers, steps, strict=True):
                if step:
                    handle(step)
            if waiting:
                waiting = grad.evaluate_ready(left, waiting, blocked, nxt)
            active = nxt
        self.work_done(waiting, blocked)

    def work_done(self, waiting: list[int], blocked: dict[int, int]) -> None:
        """The end of a window's tensor work: every gradient batch of it was evaluated (all its requests were made by
        the window's end, since every batch of the window completes in it)."""
        self.ops.clear()
        self.payloads.done()
        if waiting or blocked:
            raise RuntimeError("lookahead windows: a gradient batch of the window was not evaluated")
        self.grad.flushes.clear()

    def point(self, tk: int) -> torch.Tensor:
        """Where ticket ``tk``'s gradient is taken (for the engine's batches): kept when it was asked for."""
        return self.grad.at_of.pop(tk)

    def points(self, tickets) -> torch.Tensor:
        """``point`` of each of ``tickets``, as one tensor's rows."""
        return stacked([self.point(tk) for tk in tickets])

    def run(self) -> bool:
        """Play the run window by window: each window's events, then its tensor work, its rows, and the evaluation
        that ended it, if one did; True when an interrupt stopped it between two windows (taken only where
        checkpoints are kept: elsewhere the run is played to its end)."""
        ctx = self.ctx
        sim, stats, first = ctx.sim, ctx.stats, self.grad.first
        t0, c0 = time.perf_counter(), time.thread_time()
        if first is not None and not first.batch:  # every gradient on the agent's whole part: gathered once
            for a in ctx.agents:
                self.grad.svc.keep_rows(a.rows)
        rows = PackedRows(self.rows.words)  # the trace rows made since the last write (written a batch at a time:
        # columns of fewer rows would wait in the writer as row tuples)
        restored = sim.loop.programs.between  # a checkpoint's state (netsim resume), or None
        if restored is not None:
            self.take(restored.held, rows, restored.plain)
        try:
            interrupted = self._windows(rows, restored is None)
        except BaseException:
            rows.write_to(ctx.writer, final=True)
            raise
        if not interrupted:  # (interrupted: the clock stays where the checkpoint of this state has it)
            sim.loop.env.advance_to(self.events.now)
        stats.wall_s, stats.control_cpu_s = time.perf_counter() - t0, time.thread_time() - c0
        return interrupted

    def _windows(self, shipped: PackedRows, fresh: bool) -> bool:
        """The window loop (``fresh``: from the run's start, else from a restored checkpoint); True when an
        interrupt stopped it between two windows."""
        ctx, q = self.ctx, self.events
        sim, stats, until, writer = ctx.sim, ctx.stats, ctx.until, ctx.writer
        every = sim.world.scenario.evaluation.every
        if fresh:
            if until is not None:
                q.push(until, UNTIL, -1, None)  # scheduled at the start, before any activation
            if ctx.churn is not None:  # the churn recorders' first timers: started with the network, run first
                for i in ctx.churn.sources:
                    self.offline_next(i, q.now, 0.0)
            for a in ctx.agents:  # each program's first wake, in agent order
                self.wake(a.id, q.now)
            q.push(q.now + every, EVAL, -1)  # the evaluator's first timer, set after them
        L = stats.lookahead
        gathers = self.gathers if not ctx.checkpoints or self.gathers_checkpointed is None \
            else min(self.gathers, self.gathers_checkpointed)
        progress: Callable | None = sim.recorder.progress
        gathered, first_ticket = 0, 0
        while not q.ended and (start := self.first_due()) is not None:
            if not gathered:
                first_ticket = len(self.grad.ticket_of)
            held = len(self.rows)  # (rows of the gather's earlier windows, ``holds_rows``)
            q.load(start + L)
            self.events_until(start + L)
            gathered += 1
            if gathered == gathers or q.evaluation is not None or q.ended \
                    or not (q.cur or q.soon or q.far):  # (no event left: ``first_due`` is None)
                gathered = 0
                t1 = time.perf_counter()
                self.tensor_work(first_ticket)
                stats.tensor_s += time.perf_counter() - t1
                self.decide()
            stats.add(len(self.rows) - held)  # (the window's sends played by ``decide`` too)
            if not (gathered and self.holds_rows):
                shipped.extend(self.rows)
                self.rows.clear()
                shipped.write_to(writer)  # (whole batches)
            if q.evaluation is not None:  # the engine's evaluator (Simulation._evaluator), at its time
                t, q.evaluation = q.evaluation, None
                sim.loop.env.advance_to(t)
                if until is None or t < until:
                    shipped.write_to(writer, final=True)  # the rows before its own
                    sim.evaluate()
                    if sim.diverging_stop:  # run.stop_on_divergence: the run ends at this evaluation
                        q.ended = True
                q.push(t + every, EVAL, -1)
            if progress is not None:
                progress(q.now)
            if ctx.checkpoints and not gathered and not q.ended \
                    and sim.between_windows(stats.windows, q.now, lambda: self.held(shipped)):
                return True  # interrupted: the run folder writes the checkpoint of this state
        shipped.write_to(writer, final=True)
        return False

    # checkpoints ------------------------------------------------------------------------------------------
    def held(self, shipped: PackedRows) -> dict:
        """The driver's state between two windows, as a checkpoint keeps it (sim/restore.py): plain data as one JSON
        text and the tensors (of the bank's dtype) beside it. Nothing of a window is pending then: its operations
        and gradient batches are done; what is left is the event queue, the payloads in flight, the gradients
        waiting for their update, the requests waiting for their batch (made after the last completion), the
        trace rows not yet written (``shipped``) and the driver's own (``hold``)."""
        q, grad = self.events, self.grad
        seq = next(q.seq) + 1  # the next insertion number (this one is skipped: only the order counts)
        pay_keys, pay_rows = self.payloads.save()
        grad_keys, grad_rows = grad.evaluated.save()
        at_keys = list(grad.at_of)
        at_rows = self.points_kept(at_keys) if at_keys else self.ctx.bank.W[:0].clone()
        own, tensors = self.hold()
        st = self.ctx.stats
        plain = {"now": q.now, "seq": seq, "events": q.pending(), "pending_lo": grad.pending_lo,
                 "tickets": grad.saved(), "payloads": pay_keys, "grads": grad_keys, "at": at_keys,
                 "words": self.rows.words.words, "stats": [st.windows, st.events, st.fewest],
                 "shipped": base64.b64encode(bytes(shipped.buf)).decode("ascii"), "own": own,
                 "driver": self.driver_name(), "holds": list(self.payloads.holds.items()),
                 "next_pid": self.payloads.next}
        return {"json": json.dumps(plain, default=_plain_number), "payloads": pay_rows, "grads": grad_rows,
                "at": at_rows, **{f"own.{k}": v for k, v in tensors.items()}}

    def take(self, held: dict, shipped: PackedRows, plain: dict | None = None) -> None:
        """``held``'s state put back into this freshly made driver (``netsim resume``; its counters were made where
        they stood); ``shipped``: the trace rows not yet written; ``plain``: its JSON text as read (and checked) by
        the restore. ValueError, KeyError or TypeError when it is not such a state."""
        if plain is None:
            plain = json.loads(held["json"])
        self.events.now = float(plain["now"])
        self.events.restore(plain["events"])
        grad = self.grad
        grad.load(plain["tickets"], plain["pending_lo"])
        self.payloads.load(plain["payloads"], held["payloads"])
        self.payloads.holds, self.payloads.next = dict(plain["holds"]), plain["next_pid"]
        grad.evaluated.load(plain["grads"], held["grads"])
        grad.at_of.update(zip(plain["at"], held["at"].unbind(0)))
        for k, w in enumerate(plain["words"]):
            if self.rows.words(w) != k:
                raise ValueError(f"held.words: {w!r} is not word {k}")
        st = self.ctx.stats
        st.windows, st.events, st.fewest = plain["stats"]
        shipped.clear()
        shipped.put(base64.b64decode(plain["shipped"]))
        self.unfinished = sum(not a.finished for a in self.ctx.agents)
        from netsim.sim.restore import under

        self.take_hold(plain["own"], under(held, "own"))

    def points_kept(self, tickets: list[int]) -> torch.Tensor:
        """The points ``grad.at_of`` keeps for ``tickets``, as one tensor's rows (``held``), still kept."""
        return torch.stack([self.grad.at_of[k] for k in tickets])


    def hold(self) -> tuple[object, dict[str, torch.Tensor]]:
        """A driver's own state between two windows for ``held``: (JSON data, tensors by name)."""
        raise NotImplementedError

    @classmethod
    def driver_name(cls) -> str:
        """The name ``held`` gives this driver's state (``check_restored`` finds its ``check_own`` by it)."""
        return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__qualname__}"

    KINDS: frozenset | None = None  # the kinds of events this driver's queue holds (None: not checked)
    WORDS: tuple[str, ...] = ()  # the words a driver's control takes when it is made, after its tag's

    @classmethod
    def check_own(cls, sim, plain: dict, tensors: dict[str, torch.Tensor]) -> str | None:
        """The first key of a restored state (``held``'s plain data, its ``own`` part read as ``hold`` made it) that
        this driver could not play on from (None: none): each value of its kind and range, every reference to
        something the state holds. Checked before the resumed run writes anything (``check_restored``). Here: the
        run's own events (``housekeeping``'s) and, where the driver names them (``KINDS``), every event's kind."""
        from netsim.sim.restore import int_in

        n = len(sim.loop.agents)
        if cls.KINDS is not None:  # (the words a fresh driver takes before ``take`` reads the state's: the same)
            words = shapes.words()
            for w in (sim.program.pattern.tag, *cls.WORDS):
                words(w)
            if any(words(w) != k for k, w in enumerate(plain["words"])):
                return "words"
        for _t, _, kind, i, v in plain["events"]:
            if cls.KINDS is not None and kind not in cls.KINDS:
                return "events"
            if kind in (EVAL, UNTIL) and not (v is None and i == -1) or kind == STOP and type(v) is not bool \
                    or kind == OFF and not (int_in(i, 0, n) and isinstance(v, list) and len(v) == 2
                                            and all(type(x) in (int, float) and x >= 0 for x in v)):
                return "events"  # (an OFF's duration and end: +inf for an agent that never comes back)
        return None

    def take_hold(self, own, tensors: dict[str, torch.Tensor]) -> None:
        """``hold``'s state back, into this freshly made driver's objects (in place: its closures hold them)."""
        raise NotImplementedError


# the modules of the lookahead drivers (``check_restored`` finds a state's driver among theirs)
DRIVERS = ("lookahead", "barrier_windows", "broadcast_windows", "pairwise_windows", "ticks_windows",
           "triggered_windows")


def check_restored(sim) -> None:
    """A restored lookahead driver's state (sim/restore.py put it into ``between``, its shared part checked) checked
    by its driver (``WindowDriver.check_own``): ValueError naming the first key it could not play on from."""
    import importlib

    from netsim.sim.restore import under

    b = sim.loop.programs.between
    if b is None or b.plain is None:
        return
    name = b.plain["driver"]
    module, _, qualname = name.partition(".")
    cls = getattr(importlib.import_module(f"netsim.rounds.{module}"), qualname, None) if module in DRIVERS else None
    if not (isinstance(cls, type) and issubclass(cls, WindowDriver)):
        raise ValueError(f"state.windowed.held.driver: {name!r} is not a lookahead driver")
    try:
        bad = cls.check_own(sim, b.plain, under(b.held, "own"))
    except (TypeError, KeyError, IndexError, AttributeError, ValueError):  # (a value of another kind than checked)
        bad = "own"
    if bad is not None:
        raise ValueError(f"state.windowed.held.{bad} is not what {qualname} holds between two windows")


class _Driver(WindowDriver):
    """Push gossip's control and tensor work (the module docstring)."""

    gathers = 128
    gathers_checkpointed = 32  # checkpoints are cut between two tensor works: with them, 32 windows a work

    def __init__(self, pattern, sim, kernel):
        super().__init__(pattern, sim, kernel)
        agents = self.ctx.agents
        self.grad.first = kernel.update_after(self.ctx.p, 1, 1)
        self.peers = [Peers(a.rng(), not a.links_change) for a in agents]  # as the program draws them
        self.inbox: list[list[int]] = [[] for _ in agents]  # message ids, in arrival order
        self.got: list[list[int]] = [[] for _ in agents]  # what the current activation merges
        self.pos = [0] * len(agents)  # receipts merged so far in the current activation
        # the window's tensor operations in processing order, agent then operation, as int64s (two appends an
        # operation to one array, not a lookup of the agent's own list; no int object kept per operation):
        # ``tensor_work`` groups them by agent
        self.log = array("q")
        self.X = self.ctx.bank.W.clone()  # each program's x (between activations: its parameters)
        self._control()  # the models in flight are kept under their message ids

    # the control flow -------------------------------------------------------------------------------------
    # ``go_on`` is a closure over the driver's state (made once, ``_control``): it runs for every event, and
    # reading locals is what keeps the per-event Python small.
    def _control(self) -> None:
        ctx, grad = self.ctx, self.grad
        agents, enqueue, wake, op = ctx.agents, self.events.push, self.wake, self.log.append
        put, words, ticket_of, gots, pos = self.rows.put, self.rows.words, grad.ticket_of, self.got, self.pos
        asks_by: dict[int, list] = {}  # receipts -> the gradient request after each (None: none)
        kernel, p, peers, net, tag = ctx.kernel, ctx.p, self.peers, ctx.net, ctx.tag_code
        size = payload_size(self.X[0])  # every push's bytes (the engine's ``payload_size(x)``)
        # a push's link by its neighbour's place (the topology's links' first draws in flat arrays: no link object
        # or lookup per push), where the lean path decides every push (no bandwidth) over fixed links: each agent's
        # (neighbour, link row); else None (by id)
        flat = targets = None
        if isinstance(net.ahead, LinksAhead) and net.model is None and net.bandwidth is None and not net.links \
                and ctx.dynamic is None and not any(a.links_change for a in agents):
            flat = net.ahead.flat()
            targets = [list(zip(a.neighbors, net.ahead.rows_of(a.id, a.neighbors))) for a in agents]
        helds = [q.held for q in peers]  # (the lists themselves: ``take_hold`` refills them in place)
        outcome, take_ids, compute_start, send, drop = (ctx.outcome, net.take_ids, shapes.compute_start, shapes.send,
                                                        shapes.drop)
        def go_on(i: int, now: float) -> None:
            """The program from a merge on: merges until a gradient is asked for, else the push and the next
            wake."""
            got, n = gots[i], pos[i]
            k = len(got)
            if n < k:
                asks = asks_by.get(k)
                if asks is None:
                    asks = asks_by[k] = [kernel.update_after(p, m, k) for m in range(1, k + 1)]
                while n < k:
                    op(i)
                    op(got[n] << 2 | MERGE)
                    req = asks[n]
                    n += 1
                    if req is not None:
                        pos[i] = n
                        a = agents[i]
                        ct = a.compute_time(now)
                        put(pack(*compute_start(now, i, ct, CODES)))
                        tk = len(ticket_of)
                        rows = a.sample_rows(req.batch)
                        if rows is a.rows:
                            ticket_of.append((i, None))
                        else:
                            ticket_of.append((i, rows))
                            grad.sampled = True
                        op(i)
                        op(tk << 2 | ASK)
                        enqueue(now + ct, DONE, i, tk)
                        return
                pos[i] = n
            nb = agents[i].neighbors if flat is None else targets[i]  # (a time-varying topology changes them)
            if nb:
                if flat is None:
                    j = peers[i](nb)
                    _, delay, reason = outcome(i, j, now, size)
                else:
                    held = helds[i]  # (the picks drawn ahead, next last: ``Peers.slot`` draws more when none is left)
                    j, r = nb[held.pop() if held else peers[i].slot(len(nb))]
                    _, delay, reason = flat(r, i, j, now)
                mid = take_ids(1)
                rnd = agents[i].round
                put(pack(*send(now, i, j, mid, size, delay, rnd, tag, CODES)))
                if reason:
                    put(pack(*drop(now, i, j, mid, size, delay, rnd, words(reason), CODES)))
                    op(i)
                    op(-1 << 2 | PUSH)
                else:
                    op(i)
                    op(mid << 2 | PUSH)
                    enqueue(now + delay, ARR, j, (mid, i, size, now, rnd))
            elif k:
                op(i)
                op(-1 << 2 | PUSH)  # agent.params = x, with no one to push to
            wake(i, now)

        self.go_on = go_on

    def events_until(self, end: float) -> None:
        """Process every event due before ``end`` (or to the run's stop), as the engine's queue does."""
        q, grad, ctx = self.events, self.grad, self.ctx
        cur, soon, put, agents, go_on, op = q.cur, q.soon, self.rows.put, ctx.agents, self.go_on, self.log.append
        gots, inbox, pos, ticket_of, flushes, tag = self.got, self.inbox, self.pos, grad.ticket_of, grad.flushes, \
            ctx.tag_code
        pop, take, free, pending_lo, t = heapq.heappop, cur.pop, grad.free, grad.pending_lo, q.now
        adopt = None if ctx.dynamic is None else ctx.dynamic.adopt
        activate, deliver, compute_end = shapes.activate, shapes.deliver, shapes.compute_end
        try:
            while True:  # ``due``, inlined
                if soon and (not cur or soon[0] < cur[-1]):
                    t, _, kind, i, v = pop(soon)
                elif cur and cur[-1][0] < end:
                    t, _, kind, i, v = take()
                else:
                    break
                if kind == ACT:
                    if adopt is not None:  # the engine's activation listener: the epoch's links, before the row
                        adopt(agents[i], t)
                    put(pack(*activate(t, i, v, agents[i].round, CODES)))
                    box = inbox[i]
                    if box:
                        gots[i], inbox[i] = box, []
                    else:  # (nothing to merge: no new list)
                        gots[i] = ()
                    pos[i] = 0
                    go_on(i, t)
                elif kind == ARR:
                    mid, src, size, sent, rnd = v
                    put(pack(*deliver(t, i, src, mid, size, sent, rnd, tag, CODES)))
                    inbox[i].append(mid)
                elif kind == DONE:
                    if v >= pending_lo and not free:  # a batch's first completion: every pending one evaluated
                        flushes.append(range(pending_lo, len(ticket_of)))
                        pending_lo = len(ticket_of)
                    put(pack(*compute_end(t, i, CODES)))
                    op(i)
                    op(v << 2 | UPDATE)
                    go_on(i, t)
                elif self.housekeeping(t, kind, i, v):
                    return
        finally:
            q.now, grad.pending_lo = t, pending_lo

    def hold(self) -> tuple[object, dict[str, torch.Tensor]]:
        return {"inbox": self.inbox, "got": self.got, "pos": self.pos,
                "picks": [p.held for p in self.peers]}, {"X": self.X}

    KINDS = frozenset((ACT, DONE, ARR, STOP, UNTIL, EVAL, OFF))

    @classmethod
    def check_own(cls, sim, plain: dict, tensors: dict[str, torch.Tensor]) -> str | None:
        """``hold``'s state as push gossip goes on from it: each agent's inbox and what its activation merges (models
        kept under their message ids), the picks drawn ahead (places among its neighbours), each program's x; the
        pushes in flight (their models kept) and the completions (their gradients asked for or kept)."""
        from netsim.sim.restore import int_in, ints_in, number

        bad = super().check_own(sim, plain, tensors)
        if bad is not None:
            return bad
        own, agents = plain["own"], sim.loop.agents
        n, kept = len(agents), set(plain["payloads"])
        if set(own) != {"inbox", "got", "pos", "picks"}:
            return "own"
        lists = lambda v: isinstance(v, list) and len(v) == n and all(isinstance(e, list) for e in v)  # noqa: E731
        if not (lists(own["inbox"]) and all(all(m in kept for m in box) for box in own["inbox"])):
            return "own.inbox"
        got, pos = own["got"], own["pos"]
        if not (isinstance(pos, list) and len(pos) == n and ints_in(pos)):
            return "own.pos"
        if not (lists(got) and all(p <= len(g) and all(m in kept for m in g[p:]) for g, p in zip(got, pos))):
            return "own.got"
        if not (lists(own["picks"]) and all(ints_in(picks, 0, max(1, len(a.neighbors)))
                                            for a, picks in zip(agents, own["picks"]))):
            return "own.picks"
        X = tensors.get("X")
        if set(tensors) != {"X"} or X.shape != sim.world.bank.W.shape:
            return "own.X"
        lo, asked = plain["tickets"][1], set(plain["grads"])
        for _t, _, kind, i, v in plain["events"]:
            if kind in (ACT, DONE, ARR) and not int_in(i, 0, n) or kind == ACT and not number(v) \
                    or kind == DONE and not (int_in(v, 0, plain["tickets"][0]) and (v >= lo or v in asked)) \
                    or kind == ARR and not (isinstance(v, list) and len(v) == 5 and v[0] in kept
                                            and int_in(v[1], 0, n) and int_in(v[2], 0, 2**62) and number(v[3])
                                            and int_in(v[4], 0, 2**31)):
                return "events"
        return None

    def take_hold(self, own, tensors: dict[str, torch.Tensor]) -> None:
        per_agent(own, ("inbox", "got", "pos", "picks"), len(self.ctx.agents))
        self.inbox[:], self.got[:], self.pos[:] = own["inbox"], own["got"], own["pos"]
        for p, picks in zip(self.peers, own["picks"], strict=True):
            p.held[:] = picks
        self.X.copy_(tensors["X"])

    # the tensor work --------------------------------------------------------------------------------------
    def batch(self, who: list[int], idx: torch.Tensor) -> Batch:
        """The agents ``who`` (their rows ``idx``) as a batch of their x."""
        agents = self.ctx.agents
        return Batch(AgentsOf(agents, who), agents[who[0]].round, self.X.index_select(0, idx), None, self.ctx.state)

    def tensor_work(self, first_ticket: int) -> None:
        """Every agent's operations of the window, in lock step: in each step an agent goes as far as it can in
        the order update, merge, ask, push (one batched call per kind and step; ``lock_steps`` finds each
        operation's step from the arrays of all of them); the gradient batches whose requests are all in are
        evaluated at the end of the step of their last request."""
        kernel, p, X, free = self.ctx.kernel, self.ctx.p, self.X, self.grad.free
        grads, payloads = self.grad.evaluated, self.payloads
        if not self.log:
            self.work_done([], {})
            return
        logged = np.array(self.log, np.int64).reshape(-1, 2)  # (agent, operation) in processing order
        del self.log[:]
        # each agent's operations together, in program order (a stable sort by agent: a radix sort on 16-bit ids), the
        # agents in the order of their first operation
        ids = logged[:, 0]
        order = np.argsort(ids.astype(np.uint16) if len(self.ctx.agents) <= 1 << 16 else ids, kind="stable")
        heads = np.flatnonzero(np.diff(ids[order], prepend=-1))  # where each agent's operations start in ``order``
        sizes = np.diff(heads, append=len(order))
        by_first = np.argsort(order[heads])
        start, size = heads[by_first], sizes[by_first]
        logged = logged[order[np.arange(len(order)) + np.repeat(start - (np.cumsum(size) - size), size)]]
        agent, flat = logged[:, 0], logged[:, 1]
        kind, v = flat & 3, flat >> 2
        first = np.ones(len(flat), bool)  # each agent's first operation
        first[1:] = agent[1:] != agent[:-1]
        # the operations another one waits for: a merge the push of its payload in this work (else it was kept
        # before), an update its gradient batch (the engine's: its last request; a batch-invariant model's: its own)
        pushes = np.flatnonzero((kind == PUSH) & (v >= 0))
        order = np.argsort(v[pushes], kind="stable")
        pushed_mid, pushed_at = v[pushes][order], pushes[order]
        merges = np.flatnonzero(kind == MERGE)
        at = np.minimum(np.searchsorted(pushed_mid, v[merges]), max(len(pushed_mid) - 1, 0))
        here = (pushed_mid[at] == v[merges]) if len(pushed_mid) else np.zeros(len(merges), bool)
        in_flight = payloads.row_of
        if any(m not in in_flight for m in v[merges[~here]].tolist()):
            raise RuntimeError("lookahead windows: a merge waits for a push that was not made")
        waiter, waited = [merges[here]], [pushed_at[at[here]]]  # op index -> the op (or ops) it waits for
        flush_of, _, waiting = self.grad.batches(first_ticket)
        asks = np.flatnonzero(kind == ASK)
        updates = np.flatnonzero(kind == UPDATE)
        batch_last: dict[int, list[int]] = {}  # the engine's batch -> its asks in this work
        evaluated = grads.row_of
        if free:  # an update waits for its own ask, where that is in this work (tickets are unique): found by a sort
            ask_tk, upd_tk = v[asks], v[updates]
            by_tk = np.argsort(ask_tk)
            at = np.minimum(np.searchsorted(ask_tk[by_tk], upd_tk), max(len(asks) - 1, 0))
            mine = ask_tk[by_tk][at] == upd_tk if len(asks) else np.zeros(len(updates), bool)
            if any(tk not in evaluated for tk in upd_tk[~mine].tolist()):
                raise RuntimeError("lookahead windows: a gradient batch of the window was not evaluated")
            waiter.append(updates[mine])
            waited.append(asks[by_tk[at[mine]]])
        else:
            for tk, k in zip(v[asks].tolist(), asks.tolist(), strict=True):
                f = flush_of.get(tk)
                if f is not None:
                    batch_last.setdefault(f, []).append(k)
            uw, uk = [], []
            for k, tk in zip(updates.tolist(), v[updates].tolist(), strict=True):
                f = flush_of.get(tk)
                if f is None and tk not in evaluated:
                    raise RuntimeError("lookahead windows: a gradient batch of the window was not evaluated")
                for k_ask in batch_last.get(f, ()):
                    uw.append(k)
                    uk.append(k_ask)
            waiter.append(np.array(uw, np.int64))
            waited.append(np.array(uk, np.int64))
        step = lock_steps(kind, first, np.concatenate(waiter), np.concatenate(waited))
        # the gradient batches (the engine's) evaluated at the end of a step: those with no request in this work
        # first, then each at its last request's step
        due_at: dict[int, list[int]] = {}
        for f in waiting:
            ks = batch_last.get(f)
            due_at.setdefault(-1 if ks is None else int(step[ks].max()), []).append(f)
        for f in due_at.pop(-1, ()):
            self.grad.evaluate_batch(f)
        groups = np.lexsort((kind, step))  # by step, then kind; each agent has one operation of a kind in a step
        sk = step[groups] * 4 + kind[groups]
        cut = np.flatnonzero(np.diff(sk)) + 1
        starts, ends = np.concatenate(([0], cut)), np.concatenate((cut, [len(sk)]))
        who_np, v_np = agent[groups], v[groups]
        who_all, v_all = who_np.tolist(), v_np.tolist()
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            s, kd = divmod(int(sk[a]), 4)
            who, vs = who_all[a:b], v_all[a:b]
            idx = torch.from_numpy(who_np[a:b]).to(X.device)  # (a view of the ids, on the CPU)
            if kd == UPDATE:
                bt = self.batch(who, idx)
                kernel.update(bt, p, grads.take(vs))
                X.index_copy_(0, idx, bt.x)
            elif kd == MERGE:
                bt = self.batch(who, idx)
                kernel.combine(bt, p, payloads.take(vs))
                X.index_copy_(0, idx, bt.x)
            elif kd == ASK:  # after the step's merges
                if free:
                    self.grad.evaluate_step(who, vs, X.index_select(0, idx))
            else:
                sent = X.index_select(0, idx)
                self.ctx.bank.W.index_copy_(0, idx, sent)  # agent.params = x
                self.keep_payloads(v_np[a:b], sent)
            if b == len(sk) or int(sk[b]) // 4 != s:  # the step's end: its gradient batches
                for f in due_at.pop(s, ()):
                    self.grad.evaluate_batch(f)
        self.work_done([*itertools.chain.from_iterable(due_at.values())], {})

    def point(self, tk: int) -> torch.Tensor:
        return self.X[self.grad.ticket_of[tk][0]].clone()  # x is not written between the request and the batch

    def keep_payloads(self, mids: np.ndarray, sent: torch.Tensor) -> None:
        """Rows of ``sent`` whose message id is not -1 (lost, or no one to send to) are kept."""
        m = mids
        which = np.flatnonzero(m >= 0)
        if len(which):
            self.payloads.keep(m[which].tolist(), sent, which.tolist())
