"""Rounds on activation ticks with compressed differences to public copies: an agent wakes only on its active ticks
(Bernoulli activation; periodic is p = 1), replays the rounds it slept through, takes one private gradient step and
broadcasts the compressed difference of its model to its public copy, tagged with the round (DO-ADP's exchange).

Round t of agent i is its tick t + 1 (``Agent.tick``). Each activation:

- what arrived since the last one is bucketed by round; a message of a round already applied here is late: dropped
  and counted (``late``, the run's statistics); that replica then differs from the sender's;
- the rounds slept through (``done`` + 1 .. t - 1) are replayed, each one: the neighbours' differences of the rounds
  before it added to their copies (round after round, senders in increasing order), then the kernel's ``sleep``;
- the differences of the rounds before t are added; the agent asks for its gradient (``request``); once it is back,
  the gradient is released through the agent's ledger (``noise``: one Gaussian release per active round) and the
  kernel's ``step`` makes the new model and the differences it broadcasts with round t;
- at tick T (``horizon``) the rounds left are replayed and the agent finishes; an agent whose budget cap refused a
  release sleeps through every later round it wakes for (no gradient, no send).

An algorithm of this pattern is a ``TickKernel``, written once: ``program`` is the events engine's generator for one
agent, ``play_lookahead`` the windowed driver (rounds/ticks_windows.py). Everything about when and what is control
(ticks, rounds, senders); the kernel's hooks are row-wise tensor operations on a ``Batch`` of agents, so a batch of
one and a batch of many give the same bits.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from netsim.comm.patterns import drain
from netsim.rounds.kernel import LOOKAHEAD, Batch, GradientRequest, Path, Pattern, RoundKernel

if TYPE_CHECKING:  # torch is imported where it is used: an algorithm's module (its Params) loads without it
    import torch

    from netsim.comm.compression import PublicCopyRows

SLEEP = None  # a replayed round's operation among ``Replay.wake``'s (the others: one round's arrivals)


class TickKernel(RoundKernel):
    """An algorithm of the ticked-rounds pattern (module docstring). Its state (``init``) holds the run's
    ``comm.compression.PublicCopyRows`` (``copies``); ``sleep`` and ``step`` work on ``b.x``, the batch's models."""

    def request(self, state: Any, p: Any) -> GradientRequest:
        """The gradient each active round asks for."""
        raise NotImplementedError

    def horizon(self, p: Any) -> int | None:
        """T: the agent finishes at its first tick past round T - 1 (None: never, ``run.rounds`` ends the run)."""
        return None

    def noise(self, state: Any, agent: Any, p: Any) -> tuple[float, float, float]:
        """The agent's Gaussian release of its gradient: (sigma, sensitivity, sampling rate q)."""
        raise NotImplementedError

    def copies(self, state: Any) -> PublicCopyRows:
        raise NotImplementedError

    def sleep(self, b: Batch, p: Any) -> None:
        """A round the agents slept through (or skipped, out of budget): ``b.x`` and the kernel's rows after it."""
        raise NotImplementedError

    def step(self, b: Batch, p: Any, noisy: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """An active round with the released gradients ``noisy``: ``b.x`` after it; returns the broadcast
        differences (rows) and their sizes on the wire."""
        raise NotImplementedError


class Replay:
    """One agent's rounds as control: the last round done, the last round whose neighbours' differences are applied,
    the differences still pending by round, and whether its budget ran out."""

    __slots__ = ("done", "applied", "pending", "spent")

    def __init__(self):
        self.done = self.applied = -1
        self.pending: dict[int, list[tuple[int, Any]]] = {}
        self.spent = False

    def arrived(self, got: list[tuple[int, int, Any]]) -> int:
        """(sender, round, payload) of each arrival, in arrival order, bucketed by round; returns how many were late."""
        late = 0
        for src, rnd, h in got:
            if rnd <= self.applied:
                late += 1  # its round is over here: this replica now differs
            else:
                self.pending.setdefault(rnd, []).append((src, h))
        return late

    def _absorb(self, upto: int, ops: list) -> None:
        for r in sorted(k for k in self.pending if k <= upto):
            ops.append(sorted(self.pending.pop(r), key=lambda m: m[0]))
        self.applied = max(self.applied, upto)

    def wake(self, t: int, horizon: int | None) -> list:
        """The operations of an activation at round t before its gradient: each round's arrivals (a list of (sender,
        payload), senders in increasing order) and ``SLEEP`` for each round replayed, in order."""
        ops: list = []
        end = t if horizon is None else min(t, horizon)
        for s in range(self.done + 1, end):
            self._absorb(s - 1, ops)
            ops.append(SLEEP)
            self.done = s
        if horizon is None or t < horizon:
            self._absorb(t - 1, ops)
            self.done = t
        return ops


@attrs.frozen
class Ticks(Pattern):
    """The pattern: differences tagged ``tag``, late ones counted under ``late`` (module docstring)."""

    kernel: ClassVar[type] = TickKernel
    lookahead: ClassVar[bool] = True
    restores: ClassVar[bool] = True  # its lookahead windows' checkpoints are restored (rounds/ticks_windows.py)
    tag: str = "ticks"
    late: str = "late"
    reads: frozenset[str] = frozenset()

    def program(self, kernel: TickKernel, agent, p) -> Generator:
        """The events engine's program: the kernel's operations on a batch of one."""
        state = kernel.state_of(agent, p)
        pc = kernel.copies(state)
        req, horizon = kernel.request(state, p), kernel.horizon(p)
        sigma, sens, q = kernel.noise(state, agent, p)
        ctl, one = Replay(), [agent]
        while True:
            at = yield agent.wake()
            t = agent.tick(at) - 1
            late = ctl.arrived([(m.src, m.round, m.payload) for m in drain(agent, self.tag)])
            if late:
                agent.stats.add(self.late, late)
            for op in ctl.wake(t, horizon):
                if op is SLEEP:
                    _sleep(kernel, agent, p, state, t)
                else:
                    for src, d in op:
                        pc.receive(one, [{src: d}])
            if horizon is not None and t >= horizon:
                yield agent.finish()
            if ctl.spent:
                _sleep(kernel, agent, p, state, t)
                continue
            g = yield agent.gradient(batch=req.batch, params=agent.params, clip=req.clip, clip_kind=req.clip_kind)
            noisy = agent.privatize(g, sigma=sigma, sensitivity=sens, q=q, what="gradient")
            if noisy is None:  # the budget cap: this round and every later one slept through
                ctl.spent = True
                _sleep(kernel, agent, p, state, t)
                continue
            b = Batch(one, t, agent.params.unsqueeze(0), None, state)
            sent, sizes = kernel.step(b, p, noisy.unsqueeze(0))
            agent.params = b.x[0]
            yield agent.broadcast(sent[0], tag=self.tag, round=t, size=sizes[0])

    # the windowed driver ------------------------------------------------------------------------------
    def refusal(self, sim, path: Path) -> str | None:
        """Why the run cannot be played as lookahead windows (rounds/ticks_windows.py): push gossip's reasons, a budget
        cap (an agent out of budget changes what it asks for), then the kernel's own. No synchronous rounds."""
        from netsim.rounds import lookahead
        from netsim.rounds.windowed import budget_cap_refusal

        if path != LOOKAHEAD:
            return "every agent wakes on its own active ticks: played as lookahead windows only"
        return budget_cap_refusal(sim) or lookahead.refusal(sim, sim.program) or sim.program.refusal(sim, path)

    def play_lookahead(self, sim, kernel) -> bool:
        from netsim.rounds import ticks_windows

        return ticks_windows.play(self, sim, kernel)


def _sleep(kernel: TickKernel, agent, p, state, t: int) -> None:
    b = Batch([agent], t, agent.params.unsqueeze(0), None, state)
    kernel.sleep(b, p)
    agent.params = b.x[0]
