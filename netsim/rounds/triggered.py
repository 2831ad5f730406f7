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
from typing import Any

import attrs

from netsim.comm.patterns import NeighborCopies
from netsim.comm.triggers import EventTrigger, TriggerKind
from netsim.rounds.broadcast import Broadcast, BroadcastKernel
from netsim.rounds.kernel import Batch


class TriggeredKernel(BroadcastKernel):
    """An algorithm of the event-triggered pattern (module docstring): ``gradient`` (per activation; None: no
    step), ``trigger`` (the send rule's kind, threshold and decay), ``update`` (the step after the mix, on
    ``b.x``; ``b.k`` is the agent's activation count) and ``windows_refusal`` (what of its parameters the windowed
    driver cannot play)."""

    def trigger(self, p: Any) -> tuple[TriggerKind, float, float]:
        raise NotImplementedError

    def windows_refusal(self, p: Any) -> str | None:
        return None


@attrs.frozen
class Triggered(Broadcast):
    """The pattern: models tagged ``tag``, sent where the trigger fires (module docstring)."""

    tag: str = "model"

    def program(self, kernel: TriggeredKernel, agent, p) -> Generator:
        state = kernel.state_of(agent, p)
        copies = NeighborCopies(agent, tag=self.tag)
        kind, threshold, decay = kernel.trigger(p)
        trig = EventTrigger(agent, kind=kind, threshold=threshold, decay=decay)
        one = [agent]
        k = 0  # the agent's activations so far (the trigger's k, the messages' round)
        while True:
            yield agent.wake()
            x = agent.params
            req = kernel.gradient(p, state, agent.id)
            if req is not None:
                g = yield agent.gradient(batch=req.batch, params=x, clip=req.clip, clip_kind=req.clip_kind)
            copies.absorb()
            b = Batch(one, k, copies.mix(x).unsqueeze(0), None, state)
            if req is not None:
                kernel.update(b, p, g.unsqueeze(0))
            x = b.x[0]
            agent.params = x
            yield trig.send(x, k, tag=self.tag)
            k += 1

    # the windowed driver ------------------------------------------------------------------------------
    def lookahead_refusal(self, sim, kernel) -> str | None:
        return kernel.windows_refusal(sim.params) or super().lookahead_refusal(sim, kernel)

    def play_lookahead(self, sim, kernel) -> None:
        from netsim.rounds import triggered_windows

        triggered_windows.play(self, sim, kernel)
