"""Broadcast to every out-neighbour: each activation, merge what arrived, take a gradient step, push the result to
every out-neighbour and go on; nothing waits (asynchronous push gossip SGD, push-sum).

An algorithm of this pattern is a ``BroadcastKernel``, written once and run by both engines: ``program`` is the
events engine's generator for one agent (a batch of one), ``play_lookahead`` the windowed driver, which plays
every agent's activations of a lookahead window in lock step (rounds/broadcast_windows.py). What the kernel says
splits in two, so that when things happen never depends on a tensor:

- its control, per agent and at the event's time in both engines: ``start`` (the agent's own values: floats,
  rounds, the handles of the payloads it keeps), ``choose`` (which of the arrived messages it merges, with what
  weight and against what base: decided from senders, rounds and the payloads' scalars), ``scalars`` (the values
  the next tensor operation needs, as they are now) and ``pushed`` (its own values after a push, and the pushed
  payload's scalar);
- its tensor operations, over a batch of rows: ``gradient_at``, ``merge``, ``update``, ``params`` and ``push``.

The order of one activation: activated; ``merge`` first when ``merge_first`` (push-sum absorbs, then asks for its
gradient at the de-biased estimate), else after the gradient is back (the gradient at the model as it was when
activated, the merge of what arrived meanwhile); ``update`` with the gradient (``request``: None, no gradient);
``params`` written to the bank; ``push``'s payload broadcast with the agent's round (``Agent.broadcast``: one message
per out-neighbour, in neighbour order).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import attrs

from netsim.comm.patterns import drain
from netsim.rounds.kernel import LOOKAHEAD, Batch, GradientRequest, Path, Pattern, RoundKernel

if TYPE_CHECKING:  # torch is imported where it is used: an algorithm's module (its Params) loads without it
    import torch

OWN = "own"  # a take's base: the row as it was before the merge (else None: zero, or a kept payload's handle)


class Incoming(NamedTuple):
    """An arrived message as ``choose`` sees it: its sender, round, the payload's scalar and the payload's handle
    (the payload itself in the events engine, the windowed driver's reference in a window)."""

    src: int
    round: int
    scalar: float
    handle: Any


class Take(NamedTuple):
    """One merged payload: x += weight * (payload - base), base ``OWN``, None (zero) or a kept payload's handle."""

    handle: Any
    weight: float
    base: Any


class BroadcastKernel(RoundKernel):
    """An algorithm of the broadcast pattern (module docstring). Tensor operations take a ``Batch`` whose ``x`` are
    the agents' rows, ``rows[name]`` their rows of each of ``extra_rows`` (zero at the start) and ``scalars`` the
    agents' ``scalars``; they set ``b.x`` (and the extra rows) to the new values."""

    merge_first: ClassVar[bool] = False
    extra_rows: ClassVar[tuple[str, ...]] = ()
    keeps: ClassVar[bool] = False  # every taken payload stays kept until a later take names it as its base

    def request(self, p: Any) -> GradientRequest | None:
        """The gradient each activation asks for (None: none)."""
        return None

    def start(self, agent: Any, p: Any) -> Any:
        """The agent's own values (control: no tensors), before its first activation."""
        return None

    def choose(self, own: Any, agent: Any, p: Any, got: list[Incoming]) -> list[Take]:
        """What the agent merges of ``got`` (every message that arrived since its last merge, in arrival order)."""
        raise NotImplementedError

    def scalars(self, own: Any) -> Any:
        """The agent's values the next tensor operation reads, as they are now."""
        return None

    def pushed(self, own: Any, agent: Any, p: Any) -> float:
        """After ``push``: the agent's own values updated; returns the payload's scalar."""
        return 0.0

    def payload(self, row: torch.Tensor, scalar: float) -> Any:
        """What travels: the pushed row and its scalar."""
        return row

    def incoming(self, payload: Any) -> tuple[torch.Tensor, float]:
        """A received payload as (row, scalar)."""
        return payload, 0.0

    def gradient_at(self, b: Batch, p: Any) -> torch.Tensor:
        """Where each agent's gradient is taken (new rows, or rows not written before the gradient is back)."""
        return b.x

    def merge(self, b: Batch, p: Any, takes: Sequence[Sequence[Take]], rows_of: Callable) -> None:
        """Row n += sum of takes[n]'s weight * (payload - base), one take after the other (``add_differences``)."""
        b.x = add_differences(b.x, takes, rows_of)

    def update(self, b: Batch, p: Any, g: torch.Tensor) -> None:
        raise NotImplementedError

    def params(self, b: Batch, p: Any) -> torch.Tensor:
        """What the bank holds of each agent (what evaluation sees)."""
        return b.x

    def push(self, b: Batch, p: Any) -> torch.Tensor:
        """The pushed rows (they are not written afterwards); may change ``b.x`` and the extra rows."""
        return b.x


def add_differences(x: torch.Tensor, takes: Sequence[Sequence[Take]], rows_of: Callable) -> torch.Tensor:
    """``out = x.clone()``, then for each row n and each of its takes in order ``out[n].add_(payload - base,
    alpha=weight)`` (base: x[n] for ``OWN``, zero for None: the payload itself). ``rows_of(handles)`` gives the
    handles' payload rows as one tensor. Rows are computed by the same float operations in any batch: slot s of
    every row at once, grouped by weight and base kind."""
    import torch

    out = x.clone()
    n = x.shape[0]
    for s in range(max((len(t) for t in takes), default=0)):
        groups: dict[tuple[float, str], list[int]] = {}
        for k, t in enumerate(takes):
            if len(t) > s:
                base = t[s].base
                groups.setdefault((t[s].weight, "own" if base == OWN else "zero" if base is None else "kept"),
                                  []).append(k)
        for (w, kind), ks in groups.items():
            got = rows_of([takes[k][s].handle for k in ks])
            if kind == "own":
                d = got - (x if len(ks) == n else x[ks])
            elif kind == "kept":
                d = got - rows_of([takes[k][s].base for k in ks])
            else:
                d = got
            if len(ks) == n:
                out.add_(d, alpha=w)
            else:
                idx = torch.tensor(ks, dtype=torch.long, device=x.device)
                out.index_copy_(0, idx, out.index_select(0, idx).add_(d, alpha=w))
    return out


@attrs.frozen
class Broadcast(Pattern):
    """The pattern: payloads tagged ``tag``, broadcast after every activation."""

    kernel: ClassVar[type] = BroadcastKernel
    lookahead: ClassVar[bool] = True
    tag: str = "push"
    reads: frozenset[str] = frozenset()
    restores: ClassVar[bool] = True  # its lookahead windows' checkpoints are restored (rounds/broadcast_windows.py)

    def program(self, kernel: BroadcastKernel, agent, p) -> Generator:
        """The events engine's program: the kernel's operations on a batch of one."""
        import torch

        state = kernel.state_of(agent, p)
        own = kernel.start(agent, p)
        req = kernel.request(p)
        one = [agent]
        x = agent.params  # this agent's x between activations
        extra = {name: torch.zeros_like(x) for name in kernel.extra_rows}
        while True:
            yield agent.wake()
            b = Batch(one, agent.round, x.unsqueeze(0), None, state)
            b.rows = {name: r.unsqueeze(0) for name, r in extra.items()}
            if kernel.merge_first:
                self._merge(kernel, b, p, agent, own)
            if req is not None:
                b.scalars = [kernel.scalars(own)]
                g = yield agent.gradient(batch=req.batch, params=kernel.gradient_at(b, p)[0])
            if not kernel.merge_first:
                self._merge(kernel, b, p, agent, own)
            if req is not None:
                kernel.update(b, p, g.unsqueeze(0))
            b.scalars = [kernel.scalars(own)]
            agent.params = kernel.params(b, p)[0]
            sent = kernel.push(b, p)[0]
            scalar = kernel.pushed(own, agent, p)
            x = b.x[0]
            extra = {name: r[0] for name, r in b.rows.items()}
            yield agent.broadcast(kernel.payload(sent, scalar), tag=self.tag, round=agent.round)

    def _merge(self, kernel: BroadcastKernel, b: Batch, p, agent, own) -> None:
        import torch

        got = []
        for m in drain(agent, self.tag):
            row, scalar = kernel.incoming(m.payload)
            got.append(Incoming(m.src, m.round, scalar, row))
        if not got:
            return
        takes = kernel.choose(own, agent, p, got)
        if takes:
            b.scalars = [kernel.scalars(own)]
            kernel.merge(b, p, [takes], torch.stack)

    # the windowed driver ------------------------------------------------------------------------------
    def refusal(self, sim, path: Path) -> str | None:
        """Why the run cannot be played as conservative lookahead windows (rounds/broadcast_windows.py): push gossip's
        reasons (rounds/lookahead.py), then the kernel's own reason. No synchronous rounds."""
        from netsim.rounds import lookahead

        if path != LOOKAHEAD:
            return "every agent broadcasts on its own clock: played as lookahead windows only"
        # (any latency: a merge waits in lock step for the push of its payloads)
        return lookahead.refusal(sim, sim.program, bound=False) or sim.program.refusal(sim, path)

    def play_lookahead(self, sim, kernel) -> bool:
        from netsim.rounds import broadcast_windows

        return broadcast_windows.play(self, sim, kernel)
