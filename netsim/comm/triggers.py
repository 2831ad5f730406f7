"""Event-triggered sends: talk to a neighbour only when the model moved far enough since the last
value that neighbour got.

The rule of event-triggered decentralized SGD (George & Gurram, "Distributed stochastic gradient
descent with event-triggered communication", AAAI 2020, the triggering condition; SPARQ-SGD, Singh et al.,
IEEE JSAIT 2021, Algorithm 1, whose threshold decays): agent i sends x_i to neighbour j at round
k iff ``||x_i - xhat_ij|| > tau_k``, where xhat_ij is the copy j last received from i (kept per
neighbour, since loss or other triggers make the copies differ) and

    absolute:  tau_k = threshold
    relative:  tau_k = threshold * ||xhat_ij||
    decaying:  tau_k = threshold * decay**k
    always:    send every round (the baseline; no norm is computed)

The inequality is strict, so threshold 0 sends whenever the model changed at all.

Privacy. A rule other than ``always`` is a decision taken from the values it reads. ``fires`` notes the
activation (``agent.decided_by_data()``) in which it decided; a release the agent makes later in that same
activation (``Agent.privatize``) is recorded as decided by the trigger (``what`` ends with ``@trigger``),
because whether it happens depends on data that was not itself released: composing such releases as a
fixed sequence is not a valid guarantee, and ``netsim privacy`` says so (docs/privacy.md). A trigger that
reads only values computed from earlier releases (a model after noisy gradient steps) is post-processing
and decides nothing new, which is why only a release *after* the decision is marked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from netsim.sim.network import payload_size

if TYPE_CHECKING:  # torch is imported where it is used: an algorithm's module (its Params) loads without it
    import torch

TriggerKind = Literal["always", "absolute", "relative", "decaying"]
TRIGGER_KINDS: tuple[str, ...] = ("always", "absolute", "relative", "decaying")


class Rule:
    """The send rule alone (no agent, no copies): ``fires(x, ref, k)`` iff ||x - ref|| > tau_k. The windowed
    driver of event-triggered sends (rounds/triggered_windows.py) decides with it, as ``EventTrigger`` does."""

    __slots__ = ("kind", "threshold", "decay")

    def __init__(self, kind: TriggerKind = "absolute", threshold: float = 0.0, decay: float = 0.99):
        if kind not in TRIGGER_KINDS:
            raise ValueError(f"trigger kind must be one of {TRIGGER_KINDS}, got {kind!r}")
        self.kind, self.threshold, self.decay = kind, threshold, decay

    def tau(self, ref: torch.Tensor, k: int) -> float:
        import torch

        if self.kind == "relative":
            return self.threshold * float(torch.linalg.vector_norm(ref))
        if self.kind == "decaying":
            return self.threshold * self.decay ** k
        return self.threshold

    def fires(self, x: torch.Tensor, ref: torch.Tensor, k: int) -> bool:
        import torch

        return self.kind == "always" or float(torch.linalg.vector_norm(x - ref)) > self.tau(ref, k)


class EventTrigger:
    """Per-neighbour last-sent copies and the send rule; counts sends and skips for the summary
    (``trigger_sent``, ``trigger_skipped``, ``trigger_bytes_saved``, ``trigger_saved_fraction``)."""

    def __init__(self, agent, *, kind: TriggerKind = "absolute", threshold: float = 0.0,
                 decay: float = 0.99, initial: dict[int, torch.Tensor] | None = None):
        self.agent = agent
        self.rule = Rule(kind, threshold, decay)
        # what each out-neighbour holds of us before any send: the common initial model (an out-neighbour first
        # met later, with a time-varying topology, too)
        self.initial = agent.params
        self.last: dict[int, torch.Tensor] = dict(initial) if initial is not None else {}
        self.stats = agent.stats

    def fires(self, x: torch.Tensor, ref: torch.Tensor, k: int) -> bool:
        """The rule against any reference (per-neighbour copy here; a public copy in SPARQ-SGD)."""
        if self.rule.kind == "always":
            return True
        self.agent.decided_by_data()  # a data-dependent decision in this activation
        return self.rule.fires(x, ref, k)

    def due(self, j: int, x: torch.Tensor, k: int) -> bool:
        return self.fires(x, self.last.get(j, self.initial), k)

    def count(self, sent: int, skipped: int, bytes_saved: int) -> None:
        self.stats.add("trigger_sent", sent)
        if skipped:
            self.stats.add("trigger_skipped", skipped)
            self.stats.add("trigger_bytes_saved", bytes_saved)

    def send(self, x: torch.Tensor, k: int, *, tag: str = "model"):
        """Send ``x`` to each out-neighbour whose trigger fires (links transmit in parallel); returns
        the event that ends with the longest transmission."""
        a = self.agent
        to = []
        for j in a.neighbors:
            if self.due(j, x, k):
                to.append(j)
                self.last[j] = x
        skipped = len(a.neighbors) - len(to)
        self.count(len(to), skipped, skipped * payload_size(x))
        return a.broadcast(x, tag=tag, round=k, to=to)
