"""The run loop's state: the simpy environment, the agents and their programs, how and why the run stops,
and the checkpoint marks the loop stops at.

``Simulation`` (sim/kernel.py) drives it (``start``, ``advance``, ``finish``); the world it runs is
sim/world.py, what it records sim/recorder.py.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import simpy

from netsim.sim.env import Environment

if TYPE_CHECKING:
    import numpy as np


class Marks:
    """Where the loop stops between two events to look: checkpoint marks in simulated time
    (``run.checkpoint_every``) and in activations (``run.checkpoint_every_rounds``), and an interrupt.
    The loop stops when the next event's time reaches ``next_boundary`` (the time mark; -inf: now, set by a
    round mark or an interrupt)."""

    def __init__(self, every: float | None, every_rounds: int | None, n: int):
        self.every = every or math.inf
        self.mark = self.every  # the next checkpoint mark (-inf: a round mark passed)
        self.next_boundary = self.every  # when the loop stops to look: the mark, or -inf on an interrupt
        self.round_every = (every_rounds or math.inf) * n
        self.round_mark = self.round_every
        self.activations = 0  # Agent.wake calls, for round-based checkpoints
        self.checkpointer: Callable[[Any, str], None] | None = None
        self.interrupted = False

    def interrupt(self) -> None:
        """Stop at the next event boundary (a signal handler may call this: it only sets flags)."""
        self.interrupted = True
        self.next_boundary = -math.inf

    def round_passed(self) -> None:
        """Agent.wake: the agents' mean activation count passed a multiple of checkpoint_every_rounds."""
        self.round_mark += self.round_every
        self.mark = self.next_boundary = -math.inf

    def due(self, env: Environment) -> bool:
        """Whether the next event is at or past the mark."""
        q = env.queue
        return bool(q) and q[0][0] >= self.mark

    def round_done(self, end: float) -> bool:
        """A windowed driver finished a round whose last event is at ``end`` (every agent woke once more):
        whether a checkpoint mark passed (a round mark, or a time mark at or before ``end``); the next marks
        are set past it."""
        due = self.activations >= self.round_mark
        while self.activations >= self.round_mark:
            self.round_mark += self.round_every
        if end >= self.mark:
            self.passed(end)
            due = True
        return due

    def passed(self, head: float) -> None:
        """The loop stopped at a mark; the next event is at ``head``: the next mark after it (marks with no
        event between merge)."""
        self.mark = (math.floor(head / self.every) + 1) * self.every if self.every < math.inf else math.inf
        self.next_boundary = self.mark


class Order(Sequence):
    """A round's order as two arrays, the agents and when each called wake, read as (agent, time) pairs only where
    a checkpoint asks: a million agents' pairs are ~120 MB of tuples, made every round for nothing."""

    def __init__(self, who: np.ndarray, when: np.ndarray):
        self.who, self.when = who, when

    @classmethod
    def of(cls, pairs) -> Order:
        """(agent, time) pairs (a round's wakes, a checkpoint's order) as an ``Order``."""
        import numpy as np

        pairs = list(pairs)
        return cls(np.array([i for i, _ in pairs], np.int64), np.array([t for _, t in pairs], np.float64))

    def __len__(self) -> int:
        return len(self.who)

    def __getitem__(self, n):
        return list(zip(self.who[n].tolist(), self.when[n].tolist())) if isinstance(n, slice) else \
            (int(self.who[n]), float(self.when[n]))

    def __iter__(self) -> Iterator[tuple[int, float]]:
        return zip(self.who.tolist(), self.when.tolist())


@attrs.define
class Between:
    """Where a windowed driver (netsim/rounds/) stands between two rounds, besides the world and the recorder:
    ``k``, the next round's index; ``order``, each agent and when it called wake (the next round's order);
    ``end``, the time of the round's last event; ``held``, the pattern's own (push gossip: the peers drawn
    ahead, the models that arrived). A checkpoint keeps it, and a restored run's driver goes on from it.
    ``windows``: a lookahead-window driver's (rounds/lookahead.py) between two windows: ``k`` the windows played,
    ``end`` the time of the last event, ``order`` empty, ``held`` the driver's whole state (its event queue);
    ``plain``: a restored one's plain data as read (and checked) from ``held``'s JSON text, for its driver to take."""

    k: int
    order: Order | Sequence  # (agent, time) of a round's wakes: an ``Order`` (the lookahead windows': empty)
    end: float
    held: dict = attrs.Factory(dict)
    windows: bool = False
    plain: dict | None = None


class Programs:
    """The agents' programs: made when the run is prepared (``made``: a program function may check before it
    returns its generator) or, where making one checks nothing, at start (``make``); started with the run; then
    each running (agent, process), its program and ``Agent.spawn``'s (their locals go into checkpoints). A windowed
    driver plays the rounds instead of them: ``between`` is where it stands after its last round (what its
    checkpoints keep)."""

    def __init__(self, n: int):
        self.made: list = []
        self.make: Callable[[], list] | None = None  # or the programs, to be made at start
        self.running: list[tuple[int, simpy.Process]] = []
        self.limit = 4 * n + 64
        self.between: Between | None = None  # a windowed driver's state after its last round, when one plays instead

    def start(self, env: Environment, agents: list) -> None:
        if self.make is not None:
            self.made, self.make = self.make(), None
        for a, prog in zip(agents, self.made, strict=True):
            self.running.append((a.id, env.process(prog)))
        self.made = []

    def add(self, env: Environment, i: int, program: Any) -> simpy.Process:
        proc = env.process(program)
        running = self.running
        running.append((i, proc))
        if len(running) >= self.limit:  # a program spawning per round: forget the finished ones
            running[:] = [(j, q) for j, q in running if q.is_alive]
            self.limit = 2 * len(running) + 64
        return proc


class Counts:
    """Every agent's counts, one array each at the agents' ids, so a driver reads and sets a batch of agents' at once:
    ``rounds``, the activations so far (``Agent.round``; ``Simulation.count_wakes``, ``Simulation.rounds``), and
    ``ticks``, each periodic schedule's tick count (``Periodic.ticks_in``). ``ticks_shared``: every agent's schedule
    keeps its tick there (none replaced by ``Agent.use_schedule``, none of another kind). ``draws``: a count of the
    changes to each agent's mini-batch draws (its block drawn ahead replaced, its rows, its stream taken by its
    program), so a driver that laid the agents' blocks out (``RowsAhead``) knows which still hold."""

    __slots__ = ("rounds", "ticks", "ticks_shared", "draws")

    def __init__(self, n: int):
        self.rounds = array("q", bytes(8 * n))
        self.ticks = array("q", bytes(8 * n))
        self.ticks_shared = True
        self.draws = array("q", bytes(8 * n))


class RunLoop:
    """The state of the event loop: what runs (``env``, ``agents``, ``programs``), how far (``steps``: events
    processed, a checkpoint's position; ``wall``), how it is played (``engine``, ``runner``: a windowed
    driver) and when it stops (``stop``, ``stop_reason``, ``finished`` agents, ``housekeeping`` timers)."""

    def __init__(self, env: Environment, marks: Marks, n: int):
        self.env = env
        self.marks = marks
        self.agents: list = []
        self.counts = Counts(n)
        self.programs = Programs(n)
        self.finished = 0
        self.stop = env.event()
        self.stop_reason = ""
        self.housekeeping = 0  # timers of ours besides the evaluator's (ticker, until, churn recorders)
        self.done: list = []  # filled when the run's stop event (or run.until) fires
        self.steps = 0
        self.engine = "events"  # or "windowed" (``Simulation.use_runner``)
        self.runner: Callable[[Any], bool | None] | None = None
        self.wall = 0.0
        self.t0 = 0.0

    def agent_finished(self) -> None:
        self.finished += 1
        if self.finished == len(self.agents) and not self.stop.triggered:
            self.stop_reason = "rounds"
            self.stop.succeed()

    def stalled(self) -> bool:
        """Only our own timers left in the queue: nothing can ever happen again (then the run stops)."""
        if self.env.queued() <= self.housekeeping and not self.stop.triggered:
            self.stop_reason = "stalled (every agent waits for something that cannot come)"
            self.stop.succeed()
            return True
        return False
