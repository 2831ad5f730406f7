"""``--engine windowed``: a round kernel's run played as batched windows by its pattern's driver.

The events engine runs every message as its own event: exact, and ~6 µs of Python per event. When no
agent's activation can affect another's inside a round, the round's outcome is known without simulating its
events one by one: every agent wakes at the same tick (periodic activation, identical clocks), computes for
the same constant time, and the links' latencies and losses are drawn in the engine's order. The pattern's
driver (``SyncRounds.play``, ``PushGossip.play``) then plays each round as one batch of ``local`` /
``combine`` calls of the algorithm's own kernel, emitting exactly the engine's rows in its order; the
trace, metrics and final models are byte-identical (tests/test_windowed.py). A pattern may also play runs
whose activations are not simultaneous as conservative lookahead windows (``PushGossip.play_lookahead``,
rounds/lookahead.py). ``refusal`` names what keeps a scenario out: the conditions every pattern needs (here),
the pattern's own, what the kernel declares (``RoundKernel.needs``), and, for a pattern with lookahead
windows, why those do not apply either.

Between two rounds the run's state is explicit (the bank, the streams, the links, the ledgers, the kernel's
state, the recorder, and the driver's ``Between``): ``Rounds`` is the driver's seam to the run around its rounds.
A checkpoint written there (``run.checkpoint_every`` / ``checkpoint_every_rounds``) is restored by ``netsim resume``
without recomputing anything (sim/restore.py).
"""

from __future__ import annotations

from netsim.rounds.kernel import RoundKernel
from netsim.sim.activation import Periodic
from netsim.sim.loop import Between

# what a kernel may declare its exactness needs (``RoundKernel.needs``), and how to tell it is missing
NEEDS = {
    "no_budget_cap": lambda sim: None if getattr(sim.world.scenario.privacy, "epsilon_cap", None) is None
    else "privacy.epsilon_cap: an agent out of budget skips its gradient and leaves the round's order",
}


def scenario_refusal(sc) -> str | None:
    """What every driver needs of the scenario: simultaneous, identical, reliable-enough rounds."""
    ag, net = sc.agents, sc.network
    if ag.activation.kind != "periodic":
        return f"activation {ag.activation.kind!r}: only periodic (simultaneous activations)"
    same_clocks = all(d.kind == "constant" and d.value == 0.0 for d in (ag.clock_offset, ag.clock_drift))
    if not same_clocks or ag.clock_jitter is not None:
        return "clock offsets, drift or jitter: activations are not simultaneous"
    if ag.compute_time.kind != "constant" or ag.stragglers:
        return "compute times differ between agents"
    if ag.offline or ag.churn or ag.availability:
        return "agents go offline"
    if net.burst or net.outages or net.links or net.trace:
        return "links are not Bernoulli-lossy with one latency distribution (bursts, outages, per-link settings)"
    if getattr(getattr(sc, "privacy", None), "record", None) is not None:
        return "privacy.record: the mixing record is written by the events engine's agents"
    if net.bandwidth is not None or net.uplink is not None:
        return "bandwidth-limited links (transmission times) are not modelled here"
    if sc.topology.dynamic is not None:
        return "the topology changes over time"
    r = sc.run
    if r.rounds is None:
        return "run.rounds is not set (the windows stop at a round limit)"
    end = (r.rounds + 1) * ag.activation.period  # the run is over before this
    if r.until is not None and r.until <= end:
        return f"run.until = {r.until} may stop the run inside a round (give more than {end:g} s)"
    if sc.evaluation.every <= end:
        return (f"evaluations inside the run (evaluation.every = {sc.evaluation.every}; windows need more than "
                f"{end:g} s: the start and the end are evaluated anyway)")
    return None


def refusal(sim) -> str | None:
    """Why this built simulation cannot run window by window with the engine's exact trace (None: it can)."""
    kernel = sim.program
    if not isinstance(kernel, RoundKernel):
        return (f"algorithm {sim.world.scenario.algorithm.name!r} is a coroutine program, not a round kernel "
                "(docs/extending.md)")
    why = rounds_refusal(sim, kernel)
    if why is None or not hasattr(kernel.pattern, "lookahead_refusal"):
        return why
    other = kernel.pattern.lookahead_refusal(sim, kernel) or needs_refusal(sim, kernel)
    return None if other is None else f"{why}; nor as lookahead windows: {other}"


def needs_refusal(sim, kernel) -> str | None:
    """What the kernel declares its exactness needs (``RoundKernel.needs``), if missing."""
    for need in sorted(kernel.needs):
        why = NEEDS[need](sim)
        if why is not None:
            return why
    return None


def rounds_refusal(sim, kernel) -> str | None:
    """Why the run's rounds are not simultaneous windows (None: they are)."""
    why = scenario_refusal(sim.world.scenario)
    if why is None and (sim.world.network.model is not None or sim.world.activation_moves is not None):
        why = "a link model or an activation hook is installed"
    for a in sim.loop.agents if why is None else ():
        if type(a.schedule) is not Periodic or a._listeners or a.offset != 0.0 or a.rate != 1.0:
            why = f"agent {a.id} has its own activation schedule or listeners"
        elif not a.neighbors or not a.in_neighbors:
            why = f"agent {a.id} has no out- or in-neighbours"
        if why is not None:
            break
    if why is None:
        why = needs_refusal(sim, kernel)
    return why if why is not None else kernel.pattern.refusal(sim, kernel)


def run(sim) -> None:
    """Play a started simulation to its end window by window; ``sim.finish`` then evaluates and closes the
    trace as after the engine."""
    why = refusal(sim)
    if why is not None:
        raise ValueError(f"not a window-synchronous run: {why}")
    kernel = sim.program
    if rounds_refusal(sim, kernel) is None:
        kernel.pattern.play(sim, kernel, Rounds(sim))
    else:
        kernel.pattern.play_lookahead(sim, kernel)


class Rounds:
    """What a driver's ``play`` asks of the run around its rounds: where to ``begin`` (round 0, or where a
    restored checkpoint stands), wake a round's agents (``wake_all``), and ``between`` two rounds (a checkpoint
    when a mark passed; True when the driver must stop, interrupted)."""

    def __init__(self, sim):
        self.sim = sim

    def begin(self, fresh: Between) -> Between:
        """The restored run's ``Between`` if there is one, else ``fresh`` (the run's start)."""
        return self.sim.loop.programs.between or fresh

    def wake_all(self, ids, when):
        return wake_all(self.sim, ids, when)

    def between(self, state: Between) -> bool:
        return self.sim.between_rounds(state)


def wake(sim, order: list[tuple[int, float]]) -> list[tuple[float, int, int, float]]:
    """The rule ``wake_all`` plays over arrays, agent by agent (what its test compares it with): each agent of
    ``order`` ((agent, when it called wake), in call order) woken as ``Agent.wake`` does (its round counted):
    (activation time, call order, agent, local tick time), sorted as simpy fires them: by time, then by the
    order the activations were set."""
    acts, woken = [], []
    for seq, (i, w) in enumerate(order):
        a = sim.loop.agents[i]
        at = a.schedule.next(a.local_time(w))
        acts.append((w + max(0.0, a.global_time(at) - w), seq, i, at))
        woken.append(a)
    sim.count_wakes(woken)
    acts.sort()
    return acts


def wake_all(sim, ids, when):
    """``wake`` for a whole round as arrays: ``ids`` (agents) and ``when`` (when each called wake), in call order,
    give (activation times, agents, local tick times, the agents), sorted as simpy fires them.

    Every agent's schedule is periodic on an identical clock (``rounds_refusal``), so an activation depends only
    on (when, the schedule's tick before it): each distinct pair is planned once, by the first such agent's own
    ``schedule.next`` as ``wake`` plans it, and every agent of the pair takes its tick and times. simpy fires by
    time, then in the order the activations were set: a stable sort by time keeps the call order among equals."""
    import numpy as np

    agents = sim.loop.agents
    woken = [agents[i] for i in ids.tolist()]
    ticks = np.fromiter((a.schedule.tick for a in woken), np.int64, len(woken))
    pairs = np.stack([when.view(np.int64), ticks], axis=1)  # the float's bits: equal pairs are the same float
    _, first, which = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
    act, at, tick = np.empty(len(first)), np.empty(len(first)), np.empty(len(first), np.int64)
    for u, n in enumerate(first.tolist()):
        a, w = woken[n], float(when[n])
        planned = a.schedule.next(a.local_time(w))
        act[u], at[u], tick[u] = w + max(0.0, a.global_time(planned) - w), planned, a.schedule.tick
    which = which.reshape(-1)
    for a, t in zip(woken, tick[which].tolist(), strict=True):
        a.schedule.tick = t
    sim.count_wakes(woken)
    times = act[which]
    fire = np.argsort(times, kind="stable")
    return times[fire], ids[fire], at[which][fire], [woken[n] for n in fire.tolist()]
