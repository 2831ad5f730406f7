"""The simulation: the world a scenario builds, the run loop that plays it, the recorder of what happens.

Time only moves by events. Gradient requests are gathered and evaluated in one batched call when
simulated time reaches the earliest completion among them (every request was made at or before that
time, with its parameters snapshotted, so evaluating them early changes nothing: exact lookahead).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from operator import attrgetter
from typing import Any

import numpy as np
import simpy
import torch

from netsim.compute import release_free_memory
from netsim.compute.gradients import Ticket
from netsim.scenario.schema import Scenario
from netsim.sim import rows as shapes
from netsim.sim.agent import Agent
from netsim.sim.dists import check_scenario, clocks, draws
from netsim.sim.env import Environment
from netsim.sim.loop import Between, Marks, RunLoop
from netsim.sim.recorder import Recorder
from netsim.sim.services import Completion, Services
from netsim.sim.world import World
from netsim.trace.io import TraceWriter

Program = Callable[[Agent, Any], Any]


@contextmanager
def _lean_gc() -> Iterator[None]:
    """Run with the setup's objects frozen out of the cyclic GC and rarer collections: the event loop
    allocates millions of short-lived (acyclic, refcount-freed) objects, and each default gen-0/1/2
    pass rescans the long-lived ones (data, graph, agents, the trace buffer). Measured 1.8x less CPU
    on benchmarks/bench_gossip_learning.py (1000 nodes); results and traces are unchanged. A young
    generation of 10^6 objects rather than 5 x 10^4: 10,000 agents of D-PSGD ran ~15% faster (the run
    makes almost no cyclic garbage: ~10 objects per collection, so collecting rarely costs no memory)."""
    gc.freeze()
    old = gc.get_threshold()
    gc.set_threshold(1_000_000, 50, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def _read(path: str, doc: str) -> property:
    """A read-only attribute of ``Simulation`` that is a part's (``path``: "part.name")."""
    return property(attrgetter(path), doc=doc)


class Simulation:
    """Everything one run needs, built from a validated scenario, in three parts with one concern each:
    ``world`` (sim/world.py: what the scenario builds), ``recorder`` (sim/recorder.py: trace and metrics) and
    ``loop`` (sim/loop.py: the event loop's state, its stop and checkpoint marks); besides them the algorithm
    (``program``, ``params``), the privacy ledger's factory (``new_ledger``) and the per-run ``services``.
    The parts' attributes are assigned inside ``sim/`` only; the names algorithms and tools read
    (``sim.bank``, ``sim.agents``, ...) are read-only properties that delegate to the parts."""

    def __init__(self, scenario: Scenario, program: Program, params: Any, *,
                 writer: TraceWriter | None = None, device: str | None = None, ledger: Any = None,
                 mixing: Any = None, counts: Any = None, restored_metrics: list[dict[str, float]] | None = None,
                 restored_tracking: dict | None = None):
        sc = scenario
        check_scenario(sc)  # distributions in range (a file's were checked when read; this is for code)
        self.program, self.params = program, params
        self.new_ledger = ledger  # agent -> its privacy ledger (the privacy layer's, handed in by the API)
        self.services = Services()  # per-run shared services (algorithm statistics, lookahead batches, ...)
        n = sc.agents.count
        env = Environment()
        self.recorder = rec = Recorder(writer, counts, restored_metrics, restored_tracking)
        self.loop = loop = RunLoop(env, Marks(sc.run.checkpoint_every, sc.run.checkpoint_every_rounds, n), n)
        self.world = world = World(sc, device, env, rec.emit, rec.emit_row, self._deliver)
        # the privacy layer's record of the mixing weights applied (``mixing(sim)``: None unless the scenario asks)
        rec.mixing_log = None if mixing is None else mixing(self)
        offsets, drifts = clocks(sc.agents, world.streams.rng("clock"))
        slow = set(sc.agents.stragglers)
        # every agent's mini-batch and compute-time streams (made when first drawn from), seeded at once: the same
        # generators, ~10x faster
        drawn = ("batch",) if sc.agents.compute_time.kind == "constant" else ("batch", "compute")
        world.streams.seed_ahead(drawn, np.arange(n, dtype=np.int64)[:, None])
        loop.agents = [Agent(self, i, float(offsets[i]), float(drifts[i]),
                             sc.agents.straggler_factor if i in slow else 1.0) for i in range(n)]
        world.network.attach(self)  # link models beyond the lean default (sim/network.py)
        if "tracking" in sc.evaluation.metrics:
            from netsim.compute.streaming import check_tracking

            check_tracking(sc.model.kind)
        check = getattr(program, "check", None)
        if check is not None:  # an algorithm's checks that need the built simulation (agent count, ...)
            check(self, params)
        # Each agent's program, made now (not at start): a program function may check and calibrate before
        # it returns the generator (do_adp refuses Poisson activation), and those checks must fail while
        # the run is prepared, before any output exists. A generator's body does not run until start(). A
        # program that checks nothing when made (``made_at_start``: a round kernel's) is made at start, and not
        # at all where a windowed driver plays the rounds (~650 B an agent: 0.6 GB at 10^6 agents).
        if getattr(program, "made_at_start", False):
            loop.programs.make = lambda: [program(a, params) for a in loop.agents]
        else:
            loop.programs.made = [program(a, params) for a in loop.agents]

    # read-only names of the parts (the agent API's and tools' reads) --------------------------------------
    scenario = _read("world.scenario", "The run's resolved scenario.")
    streams = _read("world.streams", "The run's named random streams (sim/streams.py).")
    graph = _read("world.graph", "The topology (networkx DiGraph with ``weight`` edges).")
    W = _read("world.W", "The mixing matrix (scipy CSR).")
    gap = _read("world.gap", "The mixing matrix's spectral gap.")
    device = _read("world.device", "The torch device.")
    dtype = _read("world.dtype", "The parameters' torch dtype.")
    data = _read("world.data", "The dataset and its partition (compute/data.py).")
    model = _read("world.model", "The model (compute/models.py).")
    bank = _read("world.bank", "The parameter bank: every agent's parameters and named state.")
    X = _read("world.splits.X", "The training rows (a tensor).")
    y = _read("world.splits.y", "The training labels.")
    X_test = _read("world.splits.X_test", "The evaluated test rows.")
    y_test = _read("world.splits.y_test", "The test labels.")
    X_val = _read("world.splits.X_val", "The validation set Q's rows (None without data.validation).")
    y_val = _read("world.splits.y_val", "The validation set Q's labels.")
    train_rows = _read("world.splits.train_rows", "The training objective's rows (those some agent holds).")
    f_star = _read("world.f_star", "The training objective's minimum (suboptimality metric), else None.")
    gradients = _read("world.gradients", "The batched gradient service.")
    network = _read("world.network", "The network (sim/network.py).")
    churn = _read("world.churn", "The run's churn (sim/churn.py), None without one.")
    activation_moves = _read("world.activation_moves", "Jitter and churn moving activations, None without.")
    writer = _read("recorder.writer", "The trace writer.")
    emit = _read("recorder.emit", "Trace an event record.")
    emit_row = _read("recorder.emit_row", "Trace an event row (COLUMNS order).")
    counts = _read("recorder.counts", "The trace's event counter (None when nothing counts).")
    metrics = _read("recorder.metrics", "The metrics rows so far.")
    agent_metrics = _read("recorder.agent_metrics", "(time, loss, accuracy) per agent, with agent_accuracy.")
    mixing_log = _read("recorder.mixing_log", "The mixing weights applied (privacy.record = 'mixing'), else None.")
    progress = _read("recorder.progress", "The progress callback (simulated time) or None.")
    events_emitted = _read("recorder.events_emitted", "Events traced so far (written and buffered).")
    env = _read("loop.env", "The simpy environment (sim/env.py).")
    agents = _read("loop.agents", "The agents (sim/agent.py), by id.")
    steps = _read("loop.steps", "Events processed so far: a checkpoint's position.")
    stop_reason = _read("loop.stop_reason", "Why the run stopped ('' while it runs).")
    engine = _read("loop.engine", "How the run is played: 'events' or 'windowed'.")
    wall = _read("loop.wall", "Wall-clock seconds of the run's finished stretches.")
    finished_agents = _read("loop.finished", "Agents whose program has finished (``Agent.finish``).")
    activations = _read("loop.marks.activations", "Agent.wake calls so far.")
    interrupted = _read("loop.marks.interrupted", "Whether the run was interrupted (it stops at an event boundary).")

    @property
    def programs(self) -> list[tuple[int, simpy.Process]]:
        """Each running (agent, process): its program and ``Agent.spawn``'s."""
        return self.loop.programs.running

    # how the run goes (set by the API before it starts) ----------------------------------------------
    def use_runner(self, engine: str, runner: Callable[[Simulation], bool | None]) -> None:
        """Play the run with ``runner`` (a windowed driver, after ``rounds.windowed.refusal`` said none) instead
        of the events; ``engine`` names it in the summary. The runner returns whether an interrupt stopped it
        (None: it stops through ``between_rounds``)."""
        self.loop.engine, self.loop.runner = engine, runner

    def checkpoint_with(self, checkpointer: Callable[[Simulation, str], None]) -> None:
        """Call ``checkpointer(sim, kind)`` at each checkpoint mark (sim/checkpoint.py writes one)."""
        self.loop.marks.checkpointer = checkpointer

    def resumed(self, how: str, seconds: float) -> None:
        """The run goes on from a checkpoint, reached by ``how`` ("restore" or "re-execution") in ``seconds``."""
        self.recorder.resumed = (how, seconds)

    def crashed(self) -> None:
        """A program raised: the run stops with reason "error" and the trace keeps every event so far, without
        its end-of-stream marker (it reads as partial)."""
        self.loop.stop_reason = "error"
        self.recorder.writer.sync()

    def count_wakes(self, agents: Sequence[Agent], ids: np.ndarray | None = None) -> None:
        """One activation of each of ``agents`` counted (the wake rule: ``Agent.wake`` calls it with a batch of one,
        a driver that plans activations itself with its batch, and their ids as an array where it has them): each
        agent's ``round``, the run's activations, and the round mark of ``run.checkpoint_every_rounds`` when they
        pass it."""
        if ids is None:
            counts = self.loop.counts.rounds
            for a in agents:
                counts[a.id] += 1
        else:
            np.add.at(np.frombuffer(self.loop.counts.rounds, np.int64), ids, 1)
        marks = self.loop.marks
        marks.activations += len(agents)
        if marks.activations >= marks.round_mark:
            marks.round_passed()

    def rounds(self, ids: np.ndarray | None = None) -> np.ndarray:
        """The activations so far (``Agent.round``) of agents ``ids`` (None: every agent), as a new array."""
        counts = np.frombuffer(self.loop.counts.rounds, np.int64)
        return counts.copy() if ids is None else counts[ids]

    def between_rounds(self, between: Between) -> bool:
        """A windowed driver finished a round but the last (``between``: where it stands): the clock goes to
        the round's last event, a checkpoint is written when a mark passed, and the answer says whether the
        driver must stop (an interrupt: the run folder then writes the interrupt's checkpoint)."""
        loop = self.loop
        release_free_memory()  # (a round's temporaries freed: at 10^6 agents their holes would pile up)
        loop.programs.between = between
        loop.steps = between.k  # a windowed checkpoint's position: the rounds done
        loop.env.advance_to(between.end)
        marks = loop.marks
        if marks.round_done(between.end) and marks.checkpointer is not None and not marks.interrupted:
            marks.checkpointer(self, "periodic")
        return marks.interrupted

    def between_windows(self, k: int, now: float, held: Callable[[], dict]) -> bool:
        """A lookahead-window driver finished its ``k``-th window and its tensor work (``now``: the time of its last
        event): as ``between_rounds``, a checkpoint when a mark passed, and whether the driver must stop (an
        interrupt); ``held()``, the driver's state, is made only then (a window costs no more without one)."""
        loop = self.loop
        release_free_memory()
        marks = loop.marks
        due = marks.round_done(now) and marks.checkpointer is not None
        if due or marks.interrupted:
            loop.steps = k  # the checkpoint's position: the windows played (the clock is left where the driver
            # keeps it: the driver's own time is in its state)
            loop.programs.between = Between(k, [], now, held(), windows=True)
            if due and not marks.interrupted:
                marks.checkpointer(self, "periodic")
        return marks.interrupted

    # services the agents call -----------------------------------------------------------------
    def compute_draws(self, i: int):
        return draws(self.world.scenario.agents.compute_time, lambda: self.world.streams.rng("compute", i),
                     "agents.compute_time", lazy=True)

    def request_gradient(self, i: int, params: torch.Tensor, rows: np.ndarray, ct: float,
                         clip: float | None = None, clip_kind: str = "l2") -> simpy.Event:
        return Completion(self.loop.env, ct, self.world.gradients.submit(i, params, rows, clip, clip_kind),
                          self._gradient_ready)

    def _gradient_ready(self, ticket: Ticket) -> torch.Tensor:
        if ticket.result is None:
            self.world.gradients.flush()
        self.recorder.emit_row(shapes.compute_end(self.loop.env.now, ticket.agent))
        return ticket.result

    def add_program(self, i: int, program: Any) -> simpy.Process:
        """Start agent i's helper program (``Agent.spawn``); its locals go into checkpoints."""
        return self.loop.programs.add(self.loop.env, i, program)

    # netsim's own timers --------------------------------------------------------------------------
    def start_housekeeping(self, process: Any) -> simpy.Process:
        """Start a process of netsim's own (a churn recorder, a topology switcher) that must not keep a
        stalled run alive: the stall check counts it as a timer of ours until ``housekeeping_ended``."""
        self.loop.housekeeping += 1
        return self.loop.env.process(process)

    def housekeeping_ended(self) -> None:
        """A process started by ``start_housekeeping`` is about to end (called from inside it)."""
        self.loop.housekeeping -= 1

    def wall_time(self) -> float:
        """Wall-clock seconds spent running so far (this process)."""
        return self.loop.wall + time.perf_counter() - self.loop.t0

    def _deliver(self, msg) -> None:
        log = self.recorder.mixing_log  # (every delivery: one attribute read when nothing is recorded)
        if log is not None and log.views is not None:  # privacy.record = "payloads": what each observer received
            log.views.deliver(msg, self.loop.env.now)
        self.loop.agents[msg.dst].inbox.put(msg)

    def agent_finished(self) -> None:
        self.loop.agent_finished()

    # evaluation ------------------------------------------------------------------------------------
    def evaluate(self, params: torch.Tensor | None = None, rounds: Sequence[int] | None = None) -> dict[str, float]:
        """The metrics row now (sim/recorder.py). If it finds the models diverged and the scenario asks
        (``run.stop_on_divergence``), the run stops here: the events engine at its stop event, a windowed driver
        when it sees ``diverging_stop`` after its evaluation. ``params``, ``rounds``: a windowed driver's every
        parameter row and activation count as they stand now, when it has played the bank and the agents past now
        (the evaluator's seam: ``Recorder.evaluate``)."""
        rec, loop = self.recorder, self.loop
        row = rec.evaluate(self.world, self.services, loop.agents, loop.env.now, params, rounds)
        if rec.diverged is not None and self.world.scenario.run.stop_on_divergence and not loop.stop_reason:
            loop.stop_reason = "diverged"
            if loop.runner is None and not loop.stop.triggered:
                loop.stop.succeed()
        return row

    @property
    def diverging_stop(self) -> bool:
        """The run stops because its models diverged (``evaluate``): a windowed driver ends its windows."""
        return self.loop.stop_reason == "diverged"

    def _evaluator(self):
        sc, loop = self.world.scenario, self.loop
        every = sc.evaluation.every
        until = math.inf if sc.run.until is None else sc.run.until
        while True:
            yield loop.env.timeout(every)
            if loop.env.now < until:  # the row at the end is finish()'s, after every event at that time
                self.evaluate()
            loop.stalled()

    def _ticker(self, horizon: float, progress: Callable[[float], None]):
        step = horizon / 200
        env = self.loop.env
        while True:
            yield env.timeout(step)
            progress(env.now)

    # running -----------------------------------------------------------------------------------------
    def start(self, progress: Callable[[float], None] | None = None, evaluate: bool = True) -> None:
        """Initial evaluation, the agents' programs and our timers (always the same ones, so a rebuilt
        run schedules exactly the events the original did). ``evaluate``: False where a restore puts the
        recorder back (its metrics rows, the first among them, and each agent's: sim/restore.py)."""
        sc, loop = self.world.scenario, self.loop
        env = loop.env
        loop.t0 = time.perf_counter()
        self.recorder.progress = progress  # the windowed runner reports each round through it (the ticker does here)
        if evaluate:
            self.evaluate()
        if loop.runner is None:
            loop.programs.start(env, loop.agents)
        else:  # a windowed driver plays the rounds: the programs never start (a generator and a process an agent)
            loop.programs.made, loop.programs.make = [], None
        env.process(self._evaluator())
        stop = loop.stop
        if sc.run.until is not None:
            env.process(self._ticker(sc.run.until, progress or (lambda t: None)))
            loop.housekeeping += 2
            stop = env.any_of([loop.stop, env.timeout(sc.run.until)])
        stop.callbacks.append(loop.done.append)

    def interrupt(self) -> None:
        """Stop at the next event boundary (a signal handler may call this: it only sets flags)."""
        self.loop.marks.interrupt()

    def boundary_due(self) -> bool:
        return self.loop.marks.due(self.loop.env)

    def boundary(self) -> None:
        """Between two events, when the loop stopped to look: at a checkpoint mark, flush the trace (so a
        rebuilt run cuts batches at the same events) and let the checkpointer write (an interrupt writes
        its own checkpoint instead)."""
        marks = self.loop.marks
        if not marks.due(self.loop.env):  # an interrupt between marks
            marks.next_boundary = marks.mark
            return
        marks.passed(self.loop.env.queue[0][0])
        self.recorder.writer.flush()
        if marks.checkpointer is not None and not marks.interrupted:
            marks.checkpointer(self, "periodic")

    def advance(self, to_step: int | None = None) -> None:
        """Process events until the run stops, it is interrupted, or ``to_step`` events are done. With
        a ``runner`` (set by ``api.run`` after ``rounds.windowed.refusal`` said none), the run is played window
        by window instead, with the same trace (netsim/rounds/)."""
        loop = self.loop
        if loop.runner is not None:
            with _lean_gc():
                stopped = loop.runner(self)
            if loop.stop_reason or stopped is False:  # played to the end: an interrupt in the last round came too
                loop.marks.interrupted = False  # late to stop it (or lookahead windows without checkpoints took none)
            loop.wall += time.perf_counter() - loop.t0
            loop.t0 = time.perf_counter()
            return
        env, done, marks = loop.env, loop.done, loop.marks
        queue = env.queue
        n = loop.steps
        limit = -1 if to_step is None else to_step
        with _lean_gc():
            try:
                while True:
                    n = env.steps(n, limit, done, marks)  # (every event before the next boundary, in one loop)
                    if done or n == limit or not queue:
                        break
                    loop.steps = n  # the next event is at or past the boundary: stop there to look
                    self.boundary()
                    if marks.interrupted:
                        break
                    env.step()
                    n += 1
            except simpy.core.EmptySchedule:
                pass
            except BaseException:
                n = max(n, env.processed)  # a callback raised inside ``steps``: the events it processed
                raise
            finally:
                loop.steps = n
        loop.wall += time.perf_counter() - loop.t0
        loop.t0 = time.perf_counter()

    def finish(self, interrupted: bool = False) -> None:
        """After the run stopped: the final evaluation and the trace's end (not after an interrupt: the
        run goes on from its checkpoint)."""
        loop, rec = self.loop, self.recorder
        if interrupted:
            loop.stop_reason = "interrupted"
            rec.writer.sync()
            return
        if not loop.stop_reason:
            loop.stop_reason = "until"
        rec.drop_at(loop.env.now)  # an evaluation at the stopping time saw part of its events: theta_T replaces it
        self.evaluate()
        rec.writer.close()
        loop.wall += time.perf_counter() - loop.t0

    def run(self, progress: Callable[[float], None] | None = None) -> None:
        self.start(progress)
        self.advance()
        self.finish(self.loop.marks.interrupted)
