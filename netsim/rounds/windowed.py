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
then the pattern's and the kernel's own (one hook for both, ``refusal(sim, path)``, path ``ROUNDS`` or
``LOOKAHEAD``), and, for a pattern with lookahead windows, why those do not apply either. Each reason is one
rule and, after " — ", what to change; ``reason`` is the one line ``--engine auto`` (the default) reports when it
runs the events engine instead.

Between two rounds the run's state is explicit (the bank, the streams, the links, the ledgers, the kernel's
state, the recorder, and the driver's ``Between``): ``Rounds`` is the driver's seam to the run around its rounds.
A checkpoint written there (``run.checkpoint_every`` / ``checkpoint_every_rounds``) is restored by ``netsim resume``
without recomputing anything (sim/restore.py).
"""

from __future__ import annotations

from netsim.rounds.kernel import LOOKAHEAD, ROUNDS, RoundKernel
from netsim.sim.activation import Periodic
from netsim.sim.loop import Between


def budget_cap_refusal(sim) -> str | None:
    """A kernel's ``refusal`` where an agent out of budget would leave a round's order (DP-D-PSGD's)."""
    if getattr(sim.world.scenario.privacy, "epsilon_cap", None) is None:
        return None
    return ("privacy.epsilon_cap: an agent out of budget skips its gradient and leaves the round's order — remove "
            "privacy.epsilon_cap (the summary still reports each agent's epsilon)")

# the other way onto the fast path, for what the lookahead windows play and synchronous rounds do not
ASYNC = ", or use an asynchronous algorithm (push_gossip: lookahead windows)"


def scenario_refusal(sc, alternative: bool = True, curves: bool = False, rounds: int | None = None,
                     dynamic: bool = False, until: bool = False) -> str | None:
    """What every driver needs of the scenario: simultaneous, identical, reliable-enough rounds. Each line names the
    rule, then, after " — ", what to change; ``alternative``: also name the asynchronous algorithms' lookahead
    windows where they play what the rounds cannot (not for an algorithm that has them: its own line says why not);
    ``curves``: the pattern's driver evaluates at the evaluator's times inside the run (``Pattern.curves``);
    ``rounds``: the round limit when the algorithm sets its own (``round_limit``; default ``run.rounds``);
    ``dynamic``: the pattern's driver plays a one-peer exponential time-varying topology (``Pattern.dynamic``);
    ``until``: it stops at run.until without a round limit (``Pattern.until``: its own refusal says where until may
    fall)."""
    ag, net = sc.agents, sc.network
    alt = ASYNC if alternative else ""
    if ag.activation.kind != "periodic":
        return (f"activation {ag.activation.kind!r}: synchronous rounds need simultaneous wakes (only periodic) — set "
                f"agents.activation.kind = \"periodic\"{alt}")
    same_clocks = all(d.kind == "constant" and d.value == 0.0 for d in (ag.clock_offset, ag.clock_drift))
    if not same_clocks or ag.clock_jitter is not None:
        return ("clock offsets, drift or jitter: synchronous rounds need simultaneous wakes — remove "
                f"agents.clock_offset, clock_drift and clock_jitter{alt}")
    if ag.compute_time.kind != "constant" or ag.stragglers:
        return ("compute times differ between agents: synchronous rounds need one compute time — set "
                f"agents.compute_time to a constant and remove agents.stragglers{alt}")
    if ag.offline or ag.churn or ag.availability:
        return ("agents go offline: synchronous rounds need every agent at every tick — remove agents.offline, "
                f"churn and availability{alt}")
    if net.burst or net.outages or net.links or net.trace:
        return ("links are not Bernoulli-lossy with one latency distribution (bursts, outages, per-link settings, "
                f"link traces) — remove network.burst, outages, links and trace (network.loss: Bernoulli loss){alt}")
    if net.bandwidth is not None or net.uplink is not None:
        return ("bandwidth-limited links: synchronous rounds do not model transmission times — remove "
                f"network.bandwidth and network.uplink{alt}")
    dyn = sc.topology.dynamic
    if dyn is not None and not dynamic:
        return f"the topology changes over time: synchronous rounds need one graph — remove topology.dynamic{alt}"
    if dyn is not None and dyn.kind != "one_peer_exponential":
        return (f"topology.dynamic kind {dyn.kind!r}: a drawn or scheduled graph may leave an agent without "
                "in-neighbours in a round (its barrier completes at once: not played by synchronous windows) — use "
                "kind = \"one_peer_exponential\"")
    r = sc.run
    rounds = r.rounds if rounds is None else rounds
    if rounds is None and (r.until is None or not until):
        return "run.rounds is not set: synchronous windows stop at a round limit — set run.rounds"
    end = r.until if rounds is None else (rounds + 1) * ag.activation.period  # the run is over before this
    if rounds is not None and r.until is not None and r.until <= end and (r.rounds is not None or not until):
        return (f"run.until = {r.until} may stop the run inside a round — remove run.until (run.rounds ends the "
                f"run) or give more than {end:g} s")
    if sc.evaluation.every <= end and not curves:
        return (f"evaluations inside the run (evaluation.every = {sc.evaluation.every}): synchronous windows evaluate "
                f"the start and the end only — set evaluation.every above {end:g} s (no learning curve)")
    return None


def refusal(sim) -> str | None:
    """Why this built simulation cannot run window by window with the engine's exact trace (None: it can): the
    synchronous rounds' reason and, for a pattern with lookahead windows, theirs after it."""
    why, other = reasons(sim)
    return why if other is None else f"{why}; nor as lookahead windows: {other}"


def reason(sim) -> str | None:
    """The one line ``--engine auto`` reports when it runs the events engine (None: the fast path runs): the rule of
    the path that would otherwise run, and what to change. For a pattern with lookahead windows that is theirs: they
    play any activation, clock and compute time, so fixing their reason is what puts the run on the fast path."""
    why, other = reasons(sim)
    return why if other is None else other


def reasons(sim) -> tuple[str | None, str | None]:
    """(why not as synchronous rounds, why not as lookahead windows either: None where the pattern has none or
    they play the run); (None, None): the run is played window by window."""
    kernel = sim.program
    if not isinstance(kernel, RoundKernel):
        name = sim.world.scenario.algorithm.name
        return (f"algorithm {name!r} is a coroutine program, not a round kernel: {name} has no fast path yet — "
                "written as a round kernel (docs/extending.md) it would run fast"), None
    lookahead = kernel.pattern.lookahead
    why = rounds_refusal(sim, kernel, alternative=not lookahead)
    if why is None or not lookahead:
        return why, None
    other = record_refusal(sim, kernel, LOOKAHEAD) or kernel.pattern.refusal(sim, LOOKAHEAD)
    return (None, None) if other is None else (why, other)


def record_refusal(sim, kernel, path: str) -> str | None:
    """Why the privacy records the scenario asks for (``privacy.record``) are not written on ``path`` exactly as the
    events engine's agents write them (None: none asked for, or this pattern's driver writes them)."""
    record = getattr(getattr(sim.world.scenario, "privacy", None), "record", None)
    if record is None:
        return None
    if path in kernel.pattern.records:
        return None
    name = sim.world.scenario.algorithm.name
    played = "synchronous rounds" if path == ROUNDS else "lookahead windows"
    other = ("run it as synchronous rounds (periodic activation on identical clocks, one compute time, a constant "
             "latency)") if ROUNDS in kernel.pattern.records else \
        "use an algorithm of barrier rounds (dpsgd, dp_dpsgd, muffliato, dfedsam)"
    return (f"privacy.record = {record!r}: {name}'s {played} do not write the mixing record and payloads — remove "
            f"privacy.record, or {other}")


def link_model_refusal(sim) -> str:
    """Why a link model of its own (``Network.use``) keeps the windows out, which draw each message from the scenario's
    links: a plugin's (``network.model``: remove it) or a replay's recorded network (nothing to change)."""
    name = type(sim.world.network.model).__name__
    if sim.world.scenario.network.model is not None:
        return f"a link model of its own decides the messages ({name}: network.model) — remove network.model"
    return (f"a link model of its own decides the messages ({name}: a replay's recorded network or a setup hook's) "
            "— nothing to change: a replay runs on the events engine")


def rounds_refusal(sim, kernel, alternative: bool = False) -> str | None:
    """Why the run's rounds are not simultaneous windows (None: they are); ``alternative``: ``scenario_refusal``'s."""
    pattern = kernel.pattern
    why = scenario_refusal(sim.world.scenario, alternative, pattern.curves, round_limit(sim), pattern.dynamic,
                           pattern.until)
    if why is None and sim.world.network.model is not None:
        why = link_model_refusal(sim)
    if why is None and sim.world.activation_moves is not None:
        why = "an activation hook is installed — leave the agents' wakes to agents.activation"
    dynamic = sim.world.network.dynamic
    adopt = None if dynamic is None else dynamic.adopt  # the one listener the driver plays (``Exchange.adopt``)
    for a in sim.loop.agents if why is None else ():
        if type(a.schedule) is not Periodic or any(f != adopt for f in a.activation_listeners) or a.offset != 0.0 \
                or a.rate != 1.0:
            why = (f"agent {a.id} has its own activation schedule or listeners — leave its wakes to "
                   "agents.activation (no setup hook or plugin changing them)")
        elif not a.neighbors or not a.in_neighbors:
            why = (f"agent {a.id} has no out- or in-neighbours: every round sends and receives — use a topology in "
                   "which every agent has both")
        if why is not None:
            break
    return why if why is not None else record_refusal(sim, kernel, ROUNDS) or kernel.pattern.refusal(sim, ROUNDS)


def round_limit(sim) -> int | None:
    """The round after which every agent finishes: ``run.rounds``, or the kernel's own ``horizon`` (a barrier-rounds
    algorithm's K), the smaller of the two."""
    r = sim.world.scenario.run.rounds
    from netsim.rounds.sync import SyncKernel

    kernel = sim.program
    own = kernel.horizon if isinstance(kernel, SyncKernel) else None  # (a ticked kernel's horizon counts ticks)
    k = None if own is None else own(sim.params, kernel.state_of(sim.loop.agents[0], sim.params))
    return r if k is None else k if r is None else min(r, k)


def run(sim) -> bool | None:
    """Play a started simulation to its end window by window; ``sim.finish`` then evaluates and closes the
    trace as after the engine. Lookahead windows say whether an interrupt stopped them (False: played to the end,
    an interrupt not taken); synchronous rounds say nothing (None: ``between_rounds`` took it)."""
    why = refusal(sim)
    if why is not None:
        raise ValueError(f"not a window-synchronous run: {why}")
    kernel = sim.program
    if rounds_refusal(sim, kernel) is None:
        kernel.pattern.play(sim, kernel, Rounds(sim))
        return None
    return kernel.pattern.play_lookahead(sim, kernel)


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


def wake_all(sim, ids, when):
    """A whole round's agents woken as ``Agent.wake`` wakes each (its round counted), as arrays: ``ids`` (agents) and
    ``when`` (when each called wake), in call order, give (activation times, agents, local tick times, the agents),
    sorted as simpy fires them.

    Every agent's schedule is periodic on an identical clock (``rounds_refusal``), so an activation depends only
    on (when, the schedule's tick before it): each distinct pair is planned once, by the first such agent's own
    ``plan_wake``, and every agent of the pair takes its tick and times. simpy fires by time, then in the order the
    activations were set: a stable sort by time keeps the call order among equals."""
    from operator import attrgetter

    import numpy as np

    loop = sim.loop
    agents = loop.agents
    woken = list(map(agents.__getitem__, ids.tolist()))  # (map and attrgetter: C loops over a round's agents)
    counts = loop.counts
    kept = np.frombuffer(counts.ticks, np.int64) if counts.ticks_shared else None  # every agent's tick, at its id
    ticks = kept[ids] if kept is not None else np.fromiter(map(attrgetter("schedule.tick"), woken), np.int64,
                                                           len(woken))
    bits = when.view(np.int64)  # the float's bits: equal pairs are the same float
    one = len(bits) and (bits == bits[0]).all() and (ticks == ticks[0]).all()
    if one:  # one pair (all woke at once): no sort
        first, which = np.zeros(1, np.int64), np.zeros(len(woken), np.int64)
    else:
        _, first, which = np.unique(np.stack([bits, ticks], axis=1), axis=0, return_index=True, return_inverse=True)
    act, at, tick = np.empty(len(first)), np.empty(len(first)), np.empty(len(first), np.int64)
    for u, n in enumerate(first.tolist()):
        a, w = woken[n], float(when[n])
        planned, delay = a.plan_wake(w)
        act[u], at[u], tick[u] = w + delay, planned, a.schedule.tick
    which = which.reshape(-1)
    if kept is not None:
        kept[ids] = tick[which]
    elif one:
        t = int(tick[0])
        for a in woken:
            a.schedule.tick = t
    else:
        for a, t in zip(woken, tick[which].tolist(), strict=True):
            a.schedule.tick = t
    sim.count_wakes(woken, ids)
    times = act[which]
    if len(first) == 1:  # one activation time: fired in call order
        return times, ids, at[which], woken
    fire = np.argsort(times, kind="stable")
    return times[fire], ids[fire], at[which][fire], [woken[n] for n in fire.tolist()]
