"""Pairwise exchanges with a lock (AD-PSGD's): each activation, the gradient at the model as activated; once it is
back, an initiating agent averages with one random out-neighbour through ``comm.PairwiseGossip`` (request, reply or
refusal, timeout; x_i, x_j <- (x_i + x_j) / 2), then applies the kernel's update with the gradient. Every agent
serves requests on its own server program meanwhile; a request that finds it locked in its own exchange is
refused (``atomic``).

An algorithm of this pattern is a ``PairwiseKernel``, written once: ``program`` is the events engine's generator
for one agent, ``play_lookahead`` the windowed driver (rounds/pairwise_windows.py). The lock protocol depends only
on times and on who is locked, never on a tensor, and a reply carries the server's model as it is when the request
lands, at least the lookahead L after it was sent: so the windows hold.

A pull (``Pairwise(pull=True)``) is the one-sided exchange: the request carries no model, the server replies with
its model and keeps it, and the requester merges the reply with the kernel's ``combine``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, ClassVar

import attrs

from netsim.comm.patterns import PairwiseGossip
from netsim.rounds.kernel import LOOKAHEAD, Batch, Path, Pattern, RoundKernel, updated


class PairwiseKernel(RoundKernel):
    """An algorithm of the pairwise pattern (module docstring): ``gradient`` (per activation; None: no step),
    ``exchange`` (the reply timeout and whether agents lock), ``initiates`` (whether agent i starts exchanges),
    ``update`` (the step, on ``b.x``: after the exchange, or before it with ``step_first``). ``staleness``: the
    summary key of the averagings others made with an agent while its gradient was computed (None: not observed).
    A pull's kernel also has ``combine``: the reply's model merged into each row of ``b.x`` (``received``: the
    (B, P) rows, row n agent n's)."""

    staleness: ClassVar[str | None] = None
    step_first: ClassVar[bool] = False

    def exchange(self, p: Any) -> tuple[float, bool]:
        raise NotImplementedError

    def initiates(self, state: Any, i: int) -> bool:
        return True

    def update(self, b: Batch, p: Any, g: Any) -> None:
        raise NotImplementedError

    def combine(self, b: Batch, p: Any, received: Any) -> None:
        raise NotImplementedError


@attrs.frozen
class Pairwise(Pattern):
    """The pattern: requests and replies tagged ``tag.req`` and ``tag.rep`` (``PairwiseGossip``'s), or ``tags``;
    ``pull``: one-sided exchanges, merged by the kernel's ``combine``."""

    kernel: ClassVar[type] = PairwiseKernel
    lookahead: ClassVar[bool] = True
    tag: str = "gossip"
    tags: tuple[str, str] | None = None
    reads: frozenset[str] = frozenset()
    pull: bool = False
    restores: ClassVar[bool] = True  # its lookahead windows' checkpoints are restored (rounds/pairwise_windows.py)

    @property
    def names(self) -> tuple[str, str]:
        """The (request, reply) tags."""
        return self.tags if self.tags is not None else (f"{self.tag}.req", f"{self.tag}.rep")

    def program(self, kernel: PairwiseKernel, agent, p) -> Generator:
        state = kernel.state_of(agent, p)
        timeout, atomic = kernel.exchange(p)
        one = [agent]

        def merge(x, received):  # a pull's reply, through the kernel on a batch of one
            b = Batch(one, agent.round, x.unsqueeze(0), None, state)
            kernel.combine(b, p, received.unsqueeze(0))
            return b.x[0]

        pg = PairwiseGossip(agent, timeout=timeout, atomic=atomic, tags=self.names, merge=merge if self.pull else None)
        stats = agent.stats
        rng = agent.rng()
        active = kernel.initiates(state, agent.id)
        while True:
            yield agent.wake()
            req = kernel.gradient(p, state, agent.id)
            g = None
            if req is not None:
                x = agent.params                                        # (a) the gradient's point
                seen = pg.served
                g = yield agent.gradient(batch=req.batch, params=x)     # (b) others may average with us meanwhile
                if kernel.staleness is not None:
                    stats.observe(kernel.staleness, float(pg.served - seen))
                if kernel.step_first:
                    agent.params = updated(kernel, agent, p, state, agent.round, agent.params, g)
                    g = None
            if active:
                yield from pg.exchange(pg.random_neighbor(rng))         # (c)
            if g is not None:
                agent.params = updated(kernel, agent, p, state, agent.round, agent.params, g)  # (d)

    # the windowed driver ------------------------------------------------------------------------------
    def refusal(self, sim, path: Path) -> str | None:
        """Push gossip's reasons (rounds/lookahead.py), then the kernel's own reason. No synchronous rounds."""
        from netsim.rounds import lookahead

        if path != LOOKAHEAD:
            return "exchanges wait on replies and agents on their own clocks: played as lookahead windows only"
        return lookahead.refusal(sim, sim.program, bound=False) or sim.program.refusal(sim, path)

    def play_lookahead(self, sim, kernel) -> bool:
        from netsim.rounds import pairwise_windows

        return pairwise_windows.play(self, sim, kernel)

