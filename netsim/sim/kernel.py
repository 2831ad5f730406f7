"""The simulation: one simpy environment, the agents' programs, the network, the compute service.

Time only moves by events. Gradient requests are gathered and evaluated in one batched call when
simulated time reaches the earliest completion among them (every request was made at or before that
time, with its parameters snapshotted, so evaluating them early changes nothing: exact lookahead).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import simpy
import torch

from netsim.compute import resolve_device
from netsim.compute.bank import ParameterBank
from netsim.compute.data import find_data_file, load_dataset
from netsim.compute.evaluate import evaluate_bank
from netsim.compute.gradients import GradientService, Ticket
from netsim.compute.models import build_model
from netsim.errors import InputError
from netsim.scenario.schema import Scenario
from netsim.sim.activation import moves_for
from netsim.sim.agent import Agent
from netsim.sim.churn import build_churn
from netsim.sim.dists import check_scenario, draws, sampler
from netsim.sim.env import Environment
from netsim.sim.network import Network
from netsim.sim.services import Completion, Services
from netsim.sim.streams import Streams
from netsim.sim.topology import spectral_gap, weighted_graph
from netsim.trace.events import Evaluation
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


class Simulation:
    """Everything one run needs, built from a validated scenario."""

    def __init__(self, scenario: Scenario, program: Program, params: Any, *,
                 writer: TraceWriter | None = None, device: str | None = None, ledger: Any = None,
                 mixing: Any = None, counts: Any = None, restored_metrics: list[dict[str, float]] | None = None):
        self.scenario = sc = scenario
        check_scenario(sc)  # distributions in range (a file's were checked when read; this is for code)
        self.program, self.params = program, params
        self.new_ledger = ledger  # agent -> its privacy ledger (the privacy layer's, handed in by the API)
        self.env = Environment()
        self.services = Services()  # per-run shared services (algorithm statistics, lookahead batches, ...)
        # the privacy layer's record of the mixing weights applied (``mixing(sim)``: None unless the scenario asks)
        self.mixing_log = None if mixing is None else mixing(self)
        self.streams = Streams(sc.run.seed)
        n = sc.agents.count
        self.graph, self.W = weighted_graph(sc.topology, n, self.streams.seed_for("topology"))
        self.gap = spectral_gap(self.W)
        self.writer = writer or TraceWriter(None, {})
        self.emit = self.writer.emit
        self.emit_row = self.writer.emit_row
        self.device = resolve_device(device or sc.run.device)
        self.dtype = torch.float64 if sc.model.dtype == "float64" else torch.float32
        # the data have their own stream tree (data.seed), so they can stay fixed while run.seed varies
        data_seed = sc.run.seed if sc.data.seed is None else sc.data.seed
        self.data = load_dataset(sc.data, n, Streams(data_seed))
        m = sc.model
        self.model = build_model(m, self.data.features, self.data.classes, self.data.shape)
        self.bank = ParameterBank(self.model.init(n, self.dtype, self.device, self.streams.seed_for("init")))
        t = lambda a: torch.as_tensor(a, device=self.device)  # noqa: E731
        self.X, self.y = t(self.data.X).to(self.dtype), t(self.data.y)
        self.X_test, self.y_test = t(self.data.X_test).to(self.dtype), t(self.data.y_test)
        self.X_val = self.y_val = None  # the validation set Q (data.validation) every agent may read
        if self.data.X_val is not None and len(self.data.X_val):
            self.X_val, self.y_val = t(self.data.X_val).to(self.dtype), t(self.data.y_val)
        # the training objective is over the rows the agents hold (per_agent or equal shards may leave some out)
        held = np.zeros(len(self.data.y), dtype=bool)  # a mask, not np.unique (5 s for 5 M distinct rows)
        held[np.concatenate(self.data.parts)] = True
        whole = bool(held.all())
        held = np.flatnonzero(held)  # the held rows, sorted (what np.unique gave)
        self.train_rows = (self.X, self.y) if whole else (self.X[torch.as_tensor(held, device=self.device)],
                                                          self.y[torch.as_tensor(held, device=self.device)])
        self.f_star: float | None = None  # min of the training objective (the suboptimality metric)
        if "suboptimality" in sc.evaluation.metrics:
            from netsim.compute.optimum import optimum

            self.f_star = optimum(self.model, self.data.X[held], self.data.y[held])
        self.gradients = GradientService(self.model, self.X, self.y)
        self.network = Network(self.env, sc.network, self.streams, self.emit, self._deliver, self.emit_row)
        crng = self.streams.rng("clock")
        offsets = sampler(sc.agents.clock_offset, crng, "agents.clock_offset")(n)
        drifts = sampler(sc.agents.clock_drift, crng, "agents.clock_drift")(n)
        if not (drifts > -1).all():
            raise InputError("agents.clock_drift", f"drew a drift of {drifts.min():.3g}; a drift must be > -1 "
                                                   "(a clock cannot stop or run backwards)")
        act = sc.agents.activation
        if act.kind != "poisson" and offsets.max() / act.period > 2**40:
            raise InputError("agents.clock_offset", f"offsets up to {offsets.max():.3g} s are too large for "
                             f"agents.activation.period = {act.period} s: the clock could not tell ticks apart "
                             "(keep offset / period <= 2^40)")
        slow = set(sc.agents.stragglers)
        self.agents = [Agent(self, i, float(offsets[i]), float(drifts[i]),
                             sc.agents.straggler_factor if i in slow else 1.0) for i in range(n)]
        self.metrics: list[dict[str, float]] = []
        self.agent_metrics: list[tuple[float, np.ndarray, np.ndarray]] = []  # (time, loss, accuracy) per agent
        self.eval_rows: list[int] | None = None  # agents whose models are evaluated (None: all; a server)
        self.counts = counts  # the trace's event counter (metrics.summary.EventCounts: the writer feeds it)
        self._finished = 0
        self._stop = self.env.event()
        self.stop_reason = ""
        self._housekeeping = 0  # timers of ours besides the evaluator's (ticker, until, churn recorders)
        self.wall = 0.0
        # checkpoints (sim/checkpoint.py): the loop stops at an event boundary when the next event's time
        # reaches _next_boundary (a simulated-time mark; -inf: now, set by a round mark or an interrupt)
        self.steps = 0  # events processed so far: a checkpoint's position
        self.activations = 0  # Agent.wake calls, for round-based checkpoints
        self.checkpointer: Callable[[Simulation, str], None] | None = None
        self.interrupted = False
        self._every = sc.run.checkpoint_every or math.inf
        self._mark = self._every  # the next checkpoint mark (-inf: a round mark passed)
        self._next_boundary = self._every  # when the loop stops to look: the mark, or -inf on an interrupt
        self._round_every = (sc.run.checkpoint_every_rounds or math.inf) * n
        self.round_mark = self._round_every
        # metrics rows of a checkpoint, reused while a resumed run is rebuilt up to it
        self.restored_metrics: list[dict[str, float]] = list(restored_metrics or [])
        self.programs: list[tuple[int, simpy.Process]] = []  # (agent, process): its program and Agent.spawn's
        self.programs_limit = 4 * n + 64
        self.engine = "events"  # or "windowed" (``use_runner``)
        self.runner = None  # a windowed driver (``rounds.windowed.run``) that plays the run instead of the events
        self.progress: Callable[[float], None] | None = None
        # offline time (sim/churn.py): the network drops what an offline agent sends or would receive, its
        # activations and computations wait until it is back
        self.churn = build_churn(sc.agents, self.streams, find_data_file)
        self.activation_moves = moves_for(sc.agents, self.streams, self.churn)  # jitter, churn (activation.py)
        self.network.attach(self)  # link models beyond the lean default (sim/network.py)
        if "tracking" in sc.evaluation.metrics:
            from netsim.compute.streaming import check_tracking

            check_tracking(sc.model.kind)
        check = getattr(program, "check", None)
        if check is not None:  # an algorithm's checks that need the built simulation (agent count, ...)
            check(self, params)
        # Each agent's program, made now (not at start): a program function may check and calibrate before
        # it returns the generator (do_adp refuses Poisson activation), and those checks must fail while
        # the run is prepared, before any output exists. A generator's body does not run until start().
        self._programs = [program(a, params) for a in self.agents]

    # how the run goes (set by the API before it starts) ----------------------------------------------
    def use_runner(self, engine: str, runner: Callable[[Simulation], None]) -> None:
        """Play the run with ``runner`` (a windowed driver, after ``rounds.windowed.refusal`` said none) instead
        of the events; ``engine`` names it in the summary."""
        self.engine, self.runner = engine, runner

    def checkpoint_with(self, checkpointer: Callable[[Simulation, str], None]) -> None:
        """Call ``checkpointer(sim, kind)`` at each checkpoint mark (sim/checkpoint.py writes one)."""
        self.checkpointer = checkpointer

    def crashed(self) -> None:
        """A program raised: the run stops with reason "error" and the trace keeps every event so far, without
        its end-of-stream marker (it reads as partial)."""
        self.stop_reason = "error"
        self.writer.sync()

    def count_wakes(self, agents: list[Agent]) -> None:
        """One activation of each of ``agents``, counted as ``Agent.wake`` counts it: for a driver that plans
        the activations itself (rounds/windowed.py)."""
        for a in agents:
            a.round += 1
        self.activations += len(agents)

    # services the agents call -----------------------------------------------------------------
    def compute_draws(self, i: int):
        d = self.scenario.agents.compute_time  # a constant draws nothing: its stream is not even made
        return draws(d, None if d.kind == "constant" else self.streams.rng("compute", i), "agents.compute_time")

    def request_gradient(self, i: int, params: torch.Tensor, rows: np.ndarray, ct: float,
                         clip: float | None = None, clip_kind: str = "l2") -> simpy.Event:
        return Completion(self.env, ct, self.gradients.submit(i, params, rows, clip, clip_kind), self._gradient_ready)

    def _gradient_ready(self, ticket: Ticket) -> torch.Tensor:
        if ticket.result is None:
            self.gradients.flush()
        self.emit_row((self.env.now, "compute_end", ticket.agent, -1, -1, 0, 0.0, -1, ""))  # ComputeEnd
        return ticket.result

    def add_program(self, i: int, program: Any) -> simpy.Process:
        """Start agent i's helper program (``Agent.spawn``); its locals go into checkpoints."""
        proc = self.env.process(program)
        progs = self.programs
        progs.append((i, proc))
        if len(progs) >= self.programs_limit:  # a program spawning per round: forget the finished ones
            progs[:] = [(j, q) for j, q in progs if q.is_alive]
            self.programs_limit = 2 * len(progs) + 64
        return proc

    # netsim's own timers --------------------------------------------------------------------------
    def start_housekeeping(self, process: Any) -> simpy.Process:
        """Start a process of netsim's own (a churn recorder, a topology switcher) that must not keep a
        stalled run alive: the stall check counts it as a timer of ours until ``housekeeping_ended``."""
        self._housekeeping += 1
        return self.env.process(process)

    def housekeeping_ended(self) -> None:
        """A process started by ``start_housekeeping`` is about to end (called from inside it)."""
        self._housekeeping -= 1

    @property
    def finished_agents(self) -> int:
        """Agents whose program has finished (``Agent.finish``)."""
        return self._finished

    def wall_time(self) -> float:
        """Wall-clock seconds spent running so far (this process)."""
        return self.wall + time.perf_counter() - self._t0

    def _deliver(self, msg) -> None:
        self.agents[msg.dst].inbox.put(msg)

    def agent_finished(self) -> None:
        self._finished += 1
        if self._finished == len(self.agents) and not self._stop.triggered:
            self.stop_reason = "rounds"
            self._stop.succeed()

    # evaluation ------------------------------------------------------------------------------------
    def _agent_metrics(self, per_agent: dict | None = None) -> None:
        """Every agent's own model on the test rows (evaluation.metrics "agent_accuracy"): one batched call,
        kept as (time, loss per agent, accuracy per agent) for agent_metrics.csv."""
        if per_agent is None:
            loss, acc = self.model.evaluate(self.bank.W, self.X_test, self.y_test)
            per_agent = {"loss": loss.detach().double().cpu().numpy(), "accuracy": acc.detach().double().cpu().numpy()}
        self.agent_metrics.append((float(self.env.now), per_agent["loss"], per_agent["accuracy"]))

    def evaluate(self) -> dict[str, float]:
        per_agent_wanted = "agent_accuracy" in self.scenario.evaluation.metrics
        if len(self.metrics) < len(self.restored_metrics):  # rebuilding up to a checkpoint: rows are known
            row = self.restored_metrics[len(self.metrics)]
            if per_agent_wanted:  # the rebuilt bank is exact: its per-agent rows are the original run's
                self._agent_metrics()
            self.metrics.append(row)
            self.emit(Evaluation(self.env.now, row.get("accuracy", float("nan"))))
            return row
        row = {"time": float(self.env.now),
               "round_mean": float(np.mean([a.round for a in self.agents]))}
        W = self.bank.W if self.eval_rows is None else self.bank.W[self.eval_rows]
        per_agent: dict | None = {} if per_agent_wanted and self.eval_rows is None else None
        row.update(evaluate_bank(self.model, W, self.X_test, self.y_test, self.scenario.evaluation.metrics,
                                 self.train_rows, self.f_star, per_agent))
        if per_agent_wanted:
            self._agent_metrics(per_agent)
        if "tracking" in self.scenario.evaluation.metrics:  # online learners vs theta*_t (Chen & Wang)
            from netsim.compute.streaming import DataStreams, TrackingOracle, tracking_metrics

            m = self.scenario.model
            oracle = lambda: self.services.get(TrackingOracle, lambda: TrackingOracle(  # noqa: E731
                self.data.X, self.data.y, m.l2, len(self.agents), m.bias))
            row.update(tracking_metrics(self.services.find(DataStreams), oracle, self.bank.W))
        self.metrics.append(row)
        self.emit(Evaluation(self.env.now, row.get("accuracy", float("nan"))))
        return row

    def _evaluator(self):
        every = self.scenario.evaluation.every
        until = math.inf if self.scenario.run.until is None else self.scenario.run.until
        while True:
            yield self.env.timeout(every)
            if self.env.now < until:  # the row at the end is finish()'s, after every event at that time
                self.evaluate()
            # Only our own timers left in the queue: nothing can ever happen again.
            if self.env.queued() <= self._housekeeping and not self._stop.triggered:
                self.stop_reason = "stalled (every agent waits for something that cannot come)"
                self._stop.succeed()

    @property
    def events_emitted(self) -> int:
        return self.writer.count + len(self.writer.buffer)

    def _ticker(self, horizon: float, progress: Callable[[float], None]):
        step = horizon / 200
        while True:
            yield self.env.timeout(step)
            progress(self.env.now)

    # running -----------------------------------------------------------------------------------------
    def start(self, progress: Callable[[float], None] | None = None) -> None:
        """Initial evaluation, the agents' programs and our timers (always the same ones, so a rebuilt
        run schedules exactly the events the original did)."""
        sc = self.scenario
        self._t0 = time.perf_counter()
        self.progress = progress  # the windowed runner reports each round through it (the ticker does here)
        self.evaluate()
        for a, prog in zip(self.agents, self._programs, strict=True):
            self.programs.append((a.id, self.env.process(prog)))
        self._programs = []
        self.env.process(self._evaluator())
        stop = self._stop
        if sc.run.until is not None:
            self.env.process(self._ticker(sc.run.until, progress or (lambda t: None)))
            self._housekeeping += 2
            stop = self.env.any_of([self._stop, self.env.timeout(sc.run.until)])
        self._done: list = []
        stop.callbacks.append(self._done.append)

    def interrupt(self) -> None:
        """Stop at the next event boundary (a signal handler may call this: it only sets flags)."""
        self.interrupted = True
        self._next_boundary = -math.inf

    def round_passed(self) -> None:
        """Agent.wake: the agents' mean activation count passed a multiple of checkpoint_every_rounds."""
        self.round_mark += self._round_every
        self._mark = self._next_boundary = -math.inf

    def boundary_due(self) -> bool:
        q = self.env.queue
        return bool(q) and q[0][0] >= self._mark

    def boundary(self) -> None:
        """Between two events, when the loop stopped to look: at a checkpoint mark, flush the trace (so a
        rebuilt run cuts batches at the same events) and let the checkpointer write (an interrupt writes
        its own checkpoint instead)."""
        if not self.boundary_due():  # an interrupt between marks
            self._next_boundary = self._mark
            return
        head = self.env.queue[0][0]  # the next mark after the next event (marks with no event between merge)
        self._mark = (math.floor(head / self._every) + 1) * self._every if self._every < math.inf else math.inf
        self._next_boundary = self._mark
        self.writer.flush()
        if self.checkpointer is not None and not self.interrupted:
            self.checkpointer(self, "periodic")

    def advance(self, to_step: int | None = None) -> None:
        """Process events until the run stops, it is interrupted, or ``to_step`` events are done. With
        a ``runner`` (set by ``api.run`` after ``rounds.windowed.refusal`` said none), the run is played window
        by window instead, with the same trace (netsim/rounds/)."""
        if self.runner is not None:
            with _lean_gc():
                self.runner(self)
            self.wall += time.perf_counter() - self._t0
            self._t0 = time.perf_counter()
            return
        queue, step, done = self.env.queue, self.env.step, self._done
        n = self.steps
        limit = -1 if to_step is None else to_step
        with _lean_gc():
            try:
                while not done and n != limit:
                    if queue and queue[0][0] >= self._next_boundary:
                        self.steps = n
                        self.boundary()
                        if self.interrupted:
                            break
                    step()
                    n += 1
            except simpy.core.EmptySchedule:
                pass
            finally:
                self.steps = n
        self.wall += time.perf_counter() - self._t0
        self._t0 = time.perf_counter()

    def finish(self, interrupted: bool = False) -> None:
        """After the run stopped: the final evaluation and the trace's end (not after an interrupt: the
        run goes on from its checkpoint)."""
        if interrupted:
            self.stop_reason = "interrupted"
            self.writer.sync()
            return
        if not self.stop_reason:
            self.stop_reason = "until"
        if self.metrics and self.metrics[-1]["time"] == self.env.now:
            self.metrics.pop()  # an evaluation at the stopping time saw part of its events: theta_T replaces it
            if self.agent_metrics and self.agent_metrics[-1][0] == self.env.now:
                self.agent_metrics.pop()
        self.evaluate()
        self.writer.close()
        self.wall += time.perf_counter() - self._t0

    def run(self, progress: Callable[[float], None] | None = None) -> None:
        self.start(progress)
        self.advance()
        self.finish(self.interrupted)
