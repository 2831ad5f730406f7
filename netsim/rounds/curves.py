"""Learning curves on the synchronous windows: the evaluator's evaluations inside a run of barrier rounds, each
seeing exactly the state the events engine's evaluator sees.

The events engine's evaluator (``Simulation._evaluator``) is a process of timers: its j-th evaluation fires at
``T_j = T_{j-1} + every`` (``T_0`` the run's start), set when the one before fired. simpy processes events by
(time, priority, insertion), and an event is inserted when the event that schedules it (its parent) is processed,
so two events at one time go in the order their parents were processed: compared by time, then their parents'
times, and so on up the chain of parents (the programs' starts at time 0, urgent and set before the evaluator's,
end every agent's chain). The evaluator's chain is (T_j, T_{j-1}, ..., T_1, its start), strictly decreasing; so a
chain that reaches an event scheduled at its own parent's time (a barrier's completion, set by the delivery or
the timer that completes it) is decided there: the evaluation comes first. ``Curves.first`` compares these chains.

A synchronous round's events, in the engine's order, with their chains (``Round``): each agent's activation (its
wake was called at its previous barrier's completion, ``w``: chain ``(t_a, w, w)``; in the run's first round at its
program's start), its gradients' completions (each scheduled at the event that asked), its sends (at the last
completion, or at the previous exchange's barrier), the deliveries (scheduled at their send), the barriers'
timers (at the agent's send), and the barriers' completions (zero delay: ``(w, w)``). The evaluation sees every
row of the events before it, and the bank as those events left it: an agent's row changes at its ``local``
(at its last completion; a ``LocalAhead`` batch at the first agent's) and at each exchange's ``combine`` (at its
barrier's completion), and its activation count at its next ``wake`` (at its last barrier's completion). The
driver (``SyncRounds.play``) asks at each of these writes which evaluations come before every agent's write (the
live bank: evaluated there), which fall among them (the bank copied before the write: evaluated after it from
both), and at the round's end where each evaluation's row goes among the round's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

AGENT_START = -2.0  # an agent program's start: time 0, urgent, set before the evaluator's
EVALUATOR_START = -1.0  # the evaluator's start: time 0, urgent, after the programs'


class Curves:
    """The evaluator's times and the evaluations a synchronous driver makes at them (``done``: evaluations inside
    the run already made, e.g. before a restored checkpoint)."""

    def __init__(self, sim: Any, done: int):
        self.sim = sim
        self.every = float(sim.world.scenario.evaluation.every)
        self.times = [0.0]  # T_0: the evaluator's start
        self.j = done + 1  # the next evaluation
        self.made: list[tuple[int, list]] = []  # this round's evaluations: (j, its trace rows), placed at its end

    def T(self, j: int) -> float:
        times = self.times
        while len(times) <= j:
            times.append(times[-1] + self.every)  # Timeout(every) at the time the timer fired
        return times[j]

    def first(self, j: int, chain: Sequence[float]) -> bool:
        """Whether evaluation j is processed before the event whose chain of parents' times is ``chain``."""
        T = self.T(j)
        for level, a in enumerate(chain):
            v = self.times[j - level] if level < j else EVALUATOR_START
            if v != a:
                return v < a
        raise RuntimeError(f"synchronous windows: the evaluation at {T!r} and an event of chain {chain!r} are not "
                           "ordered by their parents")

    def firsts(self, j: int, t: np.ndarray, chain: Callable[[int], tuple]) -> np.ndarray:
        """For events at times ``t`` (chains ``chain(i)``): whether evaluation j comes before each."""
        T = self.T(j)
        out = T < t
        for i in np.flatnonzero(t == T).tolist():
            out[i] = self.first(j, chain(i))
        return out

    def evaluate(self, params: Any = None, rounds: Sequence[int] | None = None) -> list:
        """Evaluation j now, as the engine's evaluator makes it at T_j (``Simulation.evaluate``): its trace rows,
        captured for the driver to place."""
        sim = self.sim
        env = sim.loop.env
        saved = env.now
        env.advance_to(self.T(self.j))
        into: list = []
        with sim.recorder.writer.capturing(into):
            sim.evaluate(params, rounds)
        env.advance_to(saved)
        self.j += 1
        return into


class Round:
    """One round's events as the driver plays them (see the module docstring): enough to give every event its chain
    and its trace rows, and to place the round's evaluations."""

    def __init__(self, curves: Curves, ids: np.ndarray, t_act: np.ndarray, woke: np.ndarray, fresh: bool,
                 parent: np.ndarray | None = None):
        self.curves, self.ids, self.B = curves, ids, len(ids)
        self.woke, self.fresh = woke, fresh  # each agent's wake call: its last barrier's completion, or its start
        self.parent = parent  # where the wake was called at a gradient's completion: the barrier's that asked for it
        self.levels: list[np.ndarray] = [np.asarray(t_act, np.float64)]  # the activation, then each completion
        self.groups: list[tuple[np.ndarray, Any, Callable[[int], tuple]]] = []  # (times, rows, chain)
        self.sends: list[Callable[[int], tuple]] = []  # per exchange: the chain of agent n's send event
        self.resumed: list[np.ndarray] = []  # per exchange: each agent's barrier completion (batch positions)
        self.pending: list[tuple[int, np.ndarray, Any]] = []  # evaluations among a write's events: (j, first, copy)

    def close(self) -> None:
        """The round is written: drop its events. Their chains are closures over this round (a reference cycle that
        only the cyclic collector frees, late: at 10^5 agents a run's memory grew ~0.5 GiB over 50 rounds)."""
        self.groups, self.sends, self.levels, self.resumed = [], [], [], []

    # the events -----------------------------------------------------------------------------------------
    def chain(self, level: int, n: int) -> tuple:
        """The chain of agent n's event at ``level`` (0: its activation, m: its m-th gradient's completion)."""
        w = float(self.woke[n])  # the activation's parents: its program's start, or a barrier's completion (zero delay)
        if self.fresh:
            parents: tuple = (AGENT_START,)
        elif self.parent is None or self.parent[n] != self.parent[n]:  # (NaN: it asked for none)
            parents = (w, w)
        else:  # a gradient's completion, asked for at a barrier's completion
            parents = (w, float(self.parent[n]), float(self.parent[n]))
        return tuple(float(self.levels[m][n]) for m in range(level, -1, -1)) + parents

    def completed(self, now: Sequence[float]) -> None:
        """Each agent's newest gradient request completes at ``now[n]`` (a new level)."""
        self.levels.append(np.asarray(now, np.float64))

    def add(self, times, rows, chain: Callable[[int], tuple]) -> None:
        """Events in the engine's order: their times, their trace rows' count, each one's chain."""
        self.groups.append((np.asarray(times, np.float64), rows, chain))  # (the rows as an array where placed)

    def level_events(self, level: int, rows) -> None:
        self.add(self.levels[level], rows, lambda n: self.chain(level, n))

    def exchange(self, s: int, ready: np.ndarray, t_ready: np.ndarray, per_sender: np.ndarray, arr: np.ndarray,
                 src: np.ndarray, done: tuple, late: tuple, pos: np.ndarray, finishes: bool) -> None:
        """Exchange s's events: the sends (at batch positions ``ready``), the deliveries (``src``: index into ready),
        the completed barriers (``done``: agents, times), the timers of the others (``late``), and the finishes of the
        run's last round; then each agent's barrier completion."""
        if s == 0:
            last = len(self.levels) - 1
            send = lambda n: self.chain(last, n)  # noqa: E731 (the last completion)
        else:
            before = self.resumed[s - 1]
            send = lambda n: (float(before[n]), float(before[n]))  # noqa: E731 (the barrier before)
        self.sends.append(send)
        self.add(t_ready, per_sender, lambda k: send(int(ready[k])))
        self.add(arr, 1, lambda i: (float(arr[i]), *send(int(ready[src[i]]))))
        dpos, lpos = pos[done[0]], pos[late[0]]
        zero = lambda t: lambda i: (float(t[i]), float(t[i]))  # noqa: E731 (a barrier's completion)
        self.add(done[1], int(finishes), zero(done[1]))
        self.add(late[1], 1, lambda i: (float(late[1][i]), *send(int(lpos[i]))))
        self.add(late[1], int(finishes), zero(late[1]))
        resumed = np.empty(self.B)
        resumed[dpos], resumed[lpos] = done[1], late[1]
        self.resumed.append(resumed)

    # the evaluations at a write -------------------------------------------------------------------------
    def before_write(self, t: np.ndarray, chain: Callable[[int], tuple], bank: Any, rounds: Any = None) -> None:
        """Agents' rows of the bank are written at events of times ``t`` (chains ``chain(n)``, batch positions): the
        evaluations before all of them are made now; those among them take a copy of the bank, made after the write
        (``after_write``)."""
        c = self.curves
        while True:
            first = c.firsts(c.j + len(self.pending), t, chain)
            if first.all() and not self.pending:
                c.made.append((c.j, c.evaluate(rounds=rounds)))
            elif first.any():
                copy = self.pending[0][2] if self.pending else bank.W.clone()
                self.pending.append((c.j + len(self.pending), first, copy))
            else:
                return

    def before_level(self, bank: Any, one: bool = False) -> None:
        """``before_write`` at the newest level's events, where ``local``'s code runs (``one``: at the first agent's
        for every agent, as ``LocalAhead`` runs a batch)."""
        level = len(self.levels) - 1
        t = self.levels[level]
        if one:
            self.before_write(np.full(self.B, t[0]), lambda n: self.chain(level, 0), bank)
        else:
            self.before_write(t, lambda n: self.chain(level, n), bank)

    def after_write(self, bank: Any, rounds: Callable[[int], Any] | None = None) -> None:
        """The evaluations among the write's events, from the bank after it and the copy before it (an agent whose
        write comes after the evaluation: its row before)."""
        c = self.curves
        for j, first, copy in self.pending:
            W = bank.W.clone()
            idx = self.ids[first]
            if len(idx):
                import torch

                at = torch.from_numpy(idx).to(W.device)
                W.index_copy_(0, at, copy.index_select(0, at))
            c.made.append((j, c.evaluate(W, None if rounds is None else rounds(j))))
        self.pending = []

    def before_barriers(self, s: int, bank: Any, rounds: Any = None) -> None:
        """``before_write`` for exchange s's ``combine``, at each agent's barrier completion."""
        w = self.resumed[s]
        self.before_write(w, lambda n: (float(w[n]), float(w[n])), bank, rounds)

    # the rows ---------------------------------------------------------------------------------------------
    def offsets(self) -> list[tuple[int, list]]:
        """Where this round's evaluations go among its rows: (rows before it, its rows), in order."""
        out = []
        c = self.curves
        for j, made in c.made:
            n, after = 0, False
            for t, rows, chain in self.groups:
                if not len(t):
                    continue
                rows = np.broadcast_to(np.asarray(rows, np.int64), t.shape)
                first = c.firsts(j, t, chain)
                k = int(np.argmax(first)) if first.any() else len(t)
                if first[k:].size and not first[k:].all() or after and k:
                    raise RuntimeError(f"synchronous windows: the evaluation at {c.T(j)!r} falls between events "
                                       "out of the engine's order")
                n += int(rows[:k].sum())
                after = after or k < len(t)
            out.append((n, made))
        c.made = []
        return out
