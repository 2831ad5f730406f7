"""The recorder of a run: the trace writer and what the run measures (metrics rows, each agent's own
accuracy, the mixing log), and the progress callback.

The world (sim/world.py) is what is measured; the recorder keeps the measurements. ``evaluate`` is the one
place that turns the world's state into a metrics row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from netsim.compute.evaluate import divergence, evaluate_bank
from netsim.trace.events import Evaluation
from netsim.trace.io import TraceWriter


class Recorder:
    """Trace and metrics of one run. ``counts``: the trace's event counter (metrics.summary.EventCounts, fed by
    the writer); ``restored_metrics``: a checkpoint's metrics rows, reused while a resumed run is rebuilt up to
    it; ``restored_tracking``: its tracking oracle's warm start (``TrackingOracle.held``), put in place when the
    resumed run makes its oracle; ``mixing_log``: the privacy layer's record of the mixing weights applied (None
    unless asked)."""

    def __init__(self, writer: TraceWriter | None, counts: Any = None,
                 restored_metrics: list[dict[str, float]] | None = None, restored_tracking: dict | None = None):
        self.writer = writer = writer or TraceWriter(None, {})
        self.emit = writer.emit
        self.emit_row = writer.emit_row
        self.counts = counts
        self.metrics: list[dict[str, float]] = []
        self.agent_metrics: list[tuple[float, np.ndarray, np.ndarray]] = []  # (time, loss, accuracy) per agent
        self.eval_rows: list[int] | None = None  # agents whose models are evaluated (None: all; a server)
        self.restored_metrics: list[dict[str, float]] = list(restored_metrics or [])
        self.mixing_log: Any = None
        self.progress: Callable[[float], None] | None = None  # the windowed drivers report each round through it
        self.resumed: tuple[str, float] | None = None  # a resumed run: ("restore" or "re-execution", seconds it took)
        self.diverged: dict[str, Any] | None = None  # the first evaluation that found the models diverged (watch)
        self.tracking: dict[str, Any] | None = restored_tracking

    @property
    def events_emitted(self) -> int:
        return self.writer.count + len(self.writer.buffer)

    def _agent_metrics(self, world, now: float, per_agent: dict | None = None, params: Any = None) -> None:
        """Every agent's own model on the test rows (evaluation.metrics "agent_accuracy"): one batched call,
        kept as (time, loss per agent, accuracy per agent) for agent_metrics.csv."""
        if per_agent is None:
            s = world.splits
            loss, acc = world.model.evaluate(world.bank.W if params is None else params, s.X_test, s.y_test)
            per_agent = {"loss": loss.detach().double().cpu().numpy(), "accuracy": acc.detach().double().cpu().numpy()}
        self.agent_metrics.append((float(now), per_agent["loss"], per_agent["accuracy"]))

    def evaluate(self, world, services, agents: list, now: float, params: Any = None,
                 rounds: Any = None) -> dict[str, float]:
        """The metrics row at ``now`` (kept and traced): the mean model (or ``eval_rows``' models) scored on the
        scenario's metrics. ``params`` and ``rounds``: every agent's parameter row and activation count as they
        stand at ``now`` where a windowed driver has moved the bank and the agents past it (default: the bank's
        rows and ``Agent.round``)."""
        metrics = world.scenario.evaluation.metrics
        per_agent_wanted = "agent_accuracy" in metrics
        all_W = world.bank.W if params is None else params
        if len(self.metrics) < len(self.restored_metrics):  # rebuilding up to a checkpoint: rows are known
            row = self.restored_metrics[len(self.metrics)]
            if per_agent_wanted:  # the rebuilt bank is exact: its per-agent rows are the original run's
                self._agent_metrics(world, now, params=all_W)
            self.metrics.append(row)
            self.watch(world, row, now, all_W)
            self.emit(Evaluation(now, row.get("accuracy", float("nan"))))
            return row
        counts = [a.round for a in agents] if rounds is None else rounds
        row = {"time": float(now), "round_mean": float(np.mean(counts))}
        s = world.splits
        W = all_W if self.eval_rows is None else all_W[self.eval_rows]
        per_agent: dict | None = {} if per_agent_wanted and self.eval_rows is None else None
        row.update(evaluate_bank(world.model, W, s.X_test, s.y_test, metrics, s.train_rows, world.f_star, per_agent))
        if per_agent_wanted:
            self._agent_metrics(world, now, per_agent)
        if "tracking" in metrics:  # online learners vs theta*_t (Chen & Wang)
            from netsim.compute.streaming import DataStreams, TrackingOracle, tracking_metrics

            m, data = world.scenario.model, world.data

            def made() -> TrackingOracle:
                o = TrackingOracle(data.X, data.y, m.l2, len(agents), m.bias)
                if self.tracking is not None:  # a resumed run's: the warm start the checkpoint kept
                    o.take(self.tracking)
                return o

            row.update(tracking_metrics(services.find(DataStreams), lambda: services.get(TrackingOracle, made), all_W))
        self.metrics.append(row)
        self.watch(world, row, now, all_W)
        self.emit(Evaluation(now, row.get("accuracy", float("nan"))))
        return row

    def tracking_held(self, services) -> dict[str, Any] | None:
        """The tracking oracle's warm start for a checkpoint (``TrackingOracle.held``): the run's oracle, or the one a
        resumed run has not made yet; None without the ``tracking`` metric or before its first evaluation."""
        from netsim.compute.streaming import TrackingOracle

        oracle = services.find(TrackingOracle)
        return oracle.held() if oracle is not None else self.tracking

    def watch(self, world, row: dict[str, float], now: float, params: Any = None) -> None:
        """At each evaluation (batched already: one reduction over the bank, nothing per agent), whether the
        models diverged (compute/evaluate.py ``divergence``); the first time, ``diverged`` keeps when (``t``,
        and ``after``: the last evaluation that found them sound), in which agent and what. Reads only."""
        if self.diverged is not None:
            return
        found = divergence(world.bank.W if params is None else params, row)
        if found is not None:
            after = self.metrics[-2]["time"] if len(self.metrics) > 1 else None
            self.diverged = {"t": float(now), "after": after, **found}

    def drop_at(self, now: float) -> None:
        """Forget the rows taken at ``now``: an evaluation at the stopping time saw part of its events (the
        final one replaces it)."""
        if self.metrics and self.metrics[-1]["time"] == now:
            self.metrics.pop()
            if self.agent_metrics and self.agent_metrics[-1][0] == now:
                self.agent_metrics.pop()
