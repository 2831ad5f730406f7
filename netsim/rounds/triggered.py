"""Event-triggered sends: each activation, the gradient at the model as activated; once it is back, every model that
arrived since is absorbed into the agent's copies of its in-neighbours (the latest round per sender wins), the
model mixed with those copies, x_i <- W_ii x_i + sum_j W_ij xhat_j (``comm.NeighborCopies``), the kernel's
update applied, and the result sent to each out-neighbour whose trigger fires, ||x_i - (what i last sent j)|| >
tau_k (``comm.EventTrigger``). Nothing waits: a neighbour whose trigger stays silent is mixed at its last copy.

An algorithm of this pattern is a ``TriggeredKernel``, written once: ``program`` is the events engine's generator
for one agent, ``play_lookahead`` the windowed driver (rounds/triggered_windows.py). Whether a message goes out
depends on the model, so the driver decides the window's sends in its tensor work and only then numbers its
messages and draws their links; when things happen does not depend on the decisions (a send takes no time here:
links with bandwidth are refused), which is what lets the lookahead hold.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from netsim.comm.patterns import NeighborCopies, drain
from netsim.comm.triggers import EventTrigger, TriggerKind
from netsim.rounds.broadcast import Broadcast, BroadcastKernel
from netsim.rounds.kernel import LOOKAHEAD, Batch, Path, updated

if TYPE_CHECKING:  # torch is imported where it is used: an algorithm's module (its Params) loads without it
    import torch


class TriggeredKernel(BroadcastKernel):
    """An algorithm of the event-triggered pattern (module docstring): ``gradient`` (per activation; None: no step),
    ``trigger`` (the send rule's kind, threshold and decay), ``noise`` (the release of each gradient, if any) and
    ``update`` (the step after the mix, on ``b.x``). A batch's agents may be at different activations: agent n's
    count so far is ``b.rounds()[n] - 1`` (in the events engine's batch of one, ``b.k`` too). Its windowed driver is
    the broadcast's with another control, so it is a ``BroadcastKernel`` whose broadcast hooks keep their defaults
    (no ``request``, ``extra_rows``, ...)."""

    def trigger(self, p: Any) -> tuple[TriggerKind, float, float]:
        raise NotImplementedError

    def noise(self, state: Any, agent: Any, p: Any) -> tuple[float, float, float] | None:
        """The Gaussian release of the agent's gradient at each step, made by ``update`` through ``b.privatize``:
        (sigma, sensitivity, sampling rate q); None (the default): no release. The windows record each one where
        the engine makes it (its ledger entry and row at the gradient's completion, a budget cap's refusal) and
        ``b.privatize`` then draws only its noise (``Batch.recorded``)."""
        return None

    def update(self, b: Batch, p: Any, g: torch.Tensor) -> None:
        """The step of each row of ``b.x`` with its gradient ``g`` (rows), after the mix with the copies."""
        raise NotImplementedError


@attrs.frozen
class Triggered(Broadcast):
    """The pattern: models tagged ``tag``, sent where the trigger fires (module docstring)."""

    kernel: ClassVar[type] = TriggeredKernel
    tag: str = "model"
    restores: ClassVar[bool] = True  # its windows' checkpoints are restored (rounds/triggered_windows.py)

    def program(self, kernel: TriggeredKernel, agent, p) -> Generator:
        state = kernel.state_of(agent, p)
        copies = NeighborCopies(agent, tag=self.tag)
        kind, threshold, decay = kernel.trigger(p)
        trig = EventTrigger(agent, kind=kind, threshold=threshold, decay=decay)
        k = 0  # the agent's activations so far (the trigger's k, the messages' round)
        while True:
            yield agent.wake()
            x = agent.params
            req = kernel.gradient(p, state, agent.id)
            if req is not None:
                g = yield agent.gradient(batch=req.batch, params=x, clip=req.clip, clip_kind=req.clip_kind)
            copies.absorb()
            x = copies.mix(x)
            if req is not None:
                x = updated(kernel, agent, p, state, k, x, g)
            agent.params = x
            yield trig.send(x, k, tag=self.tag)
            k += 1

    # the windowed driver ------------------------------------------------------------------------------
    def refusal(self, sim, path: Path) -> str | None:
        """The kernel's reason first (the parameters the windows do not play), a send that takes time to transmit
        (whether it goes out depends on the model, and the program waits for it: when the agent goes on would too),
        then the broadcast's."""
        from netsim.rounds import lookahead

        if path == LOOKAHEAD and lookahead.transmits(sim) and not sim.program.refusal(sim, path):
            return ("bandwidth or uplinks: a triggered send waits for its transmission, so when the agent goes on "
                    "depends on whether the model fires the trigger (the windows decide it after the control) — "
                    "remove network.bandwidth, network.uplink and the links' bandwidth")
        # a positive lookahead: whether a send goes out is decided after the window's control, so it must land in a
        # later window
        return (path == LOOKAHEAD and (sim.program.refusal(sim, path) or lookahead.refusal(sim, sim.program))) \
            or super().refusal(sim, path)

    def play_lookahead(self, sim, kernel) -> bool:
        from netsim.rounds import triggered_windows

        return triggered_windows.play(self, sim, kernel)


class DeltasKernel(TriggeredKernel):
    """An algorithm of the event-triggered deltas pattern (``TriggeredDeltas``): ``gradient``, ``trigger``,
    ``update`` (the local step, before the trigger) and ``init``, the run's ``comm.compression.PublicCopyRows``
    (each agent's compressor and the consensus step gamma)."""


@attrs.frozen
class TriggeredDeltas(Triggered):
    """Event-triggered compressed differences to CHOCO public copies (SPARQ-SGD's exchange): each activation,
    (a) every compressed q that arrived added to the copy of its sender, xhat_j += q_j; (b) the gradient at the
    model as activated and the kernel's update; (a) again, for what arrived meanwhile; (c) if ||x - xhat_i|| >
    tau_k: q_i = C(x - xhat_i), xhat_i += q_i, q_i broadcast to every out-neighbour; (d) x_i = x + gamma sum_j
    W_ij (xhat_j - xhat_i). The copies are the run's state (``PublicCopyRows``), so both engines do the same row
    operations; the windowed driver decides (c) in its tensor work, as for ``Triggered``."""

    kernel: ClassVar[type] = DeltasKernel
    tag: str = "sparq"

    def program(self, kernel: DeltasKernel, agent, p) -> Generator:
        kind, threshold, decay = kernel.trigger(p)
        trig = EventTrigger(agent, kind=kind, threshold=threshold, decay=decay, initial={})
        k = 0
        while True:  # (the copies are read through ``state_of``: a local would hold every agent's in checkpoints)
            yield agent.wake()
            _absorb(kernel.state_of(agent, p), agent, self.tag)                 # (a)
            x = agent.params
            req = kernel.gradient(p, None, agent.id)
            if req is not None:
                g = yield agent.gradient(batch=req.batch, params=x)
                x = updated(kernel, agent, p, None, k, x, g)                   # (b)
            _absorb(kernel.state_of(agent, p), agent, self.tag)                 # (a), what came meanwhile
            send = _triggered(kernel.state_of(agent, p), agent, trig, x, k, self.tag)  # (c)
            agent.params = _consensus(kernel.state_of(agent, p), agent, x)     # (d)
            k += 1
            if send is not None:
                yield send


def _absorb(pc, agent, tag: str) -> None:
    """xhat_j += q_j for each q that arrived, one message after the other (two from one sender add in turn)."""
    for m in drain(agent, tag):
        pc.receive([agent], [{m.src: m.payload}])


def _triggered(pc, agent, trig: EventTrigger, x, k: int, tag: str):
    """(c): q = C(x - xhat_i) broadcast (xhat_i += q) if the trigger fires on ||x - xhat_i||; the send's event."""
    n_out, i = len(agent.neighbors), agent.id
    if trig.fires(x, pc.own[i], k):
        q, sizes = pc.delta([agent], x.unsqueeze(0))
        trig.count(n_out, 0, 0)
        return agent.broadcast(q[0], tag=tag, round=k, size=sizes[0])
    trig.count(0, n_out, n_out * pc.comps[i].encoded_size(x.numel(), x.element_size()))
    return None


def _consensus(pc, agent, x):
    """(d): x + gamma sum_j W_ij (xhat_j - xhat_i), in ``compute.mixing``'s operations."""
    from netsim.compute.mixing import evaluate

    return evaluate(pc.consensus([agent], x.unsqueeze(0)), x.dtype)[1][0]
