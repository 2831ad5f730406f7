"""Synchronous barrier rounds: wake, gradient, ``local``, send to every out-neighbour, wait for every
in-neighbour's message of the round or the timeout, ``combine`` (Lian et al., "Can Decentralized
Algorithms Outperform Centralized Algorithms?", NeurIPS 2017, Algorithm 1's round structure).

``program`` is the events engine's generator for one agent; ``play`` the windowed driver, which plays every
round of every agent as one batch and emits exactly the rows the engine would, in its order (the contract in
docs/architecture.md, "Round kernels"):

- simpy orders simultaneous events by insertion, so round k's agents are activated in the order their
  barriers completed in round k-1 (the order of the delivery that completed each, then the timed-out ones in
  the order their timers were set); their gradient requests follow that order (``compute_start``), and so do
  the gradients' completions (``compute_end``), each followed by the agent's releases and its sends;
- each send draws its link's latency and loss in send order (a lost message is a ``drop`` row at once);
- deliveries follow the sends; a barrier completes on its last expected delivery; the others time out at
  ``compute end + round_timeout`` (a ``timeout`` row with the missing count), in the order they were set;
- after ``run.rounds`` activations every agent finishes as it wakes: those whose barrier completed, at their
  last delivery, before the timed-out ones.

The driver is exact only where these rules decide the order: ``refusal`` says why not otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import numpy as np

from netsim.rounds.kernel import (
    LOOKAHEAD,
    ROUNDS,
    Arrivals,
    Batch,
    GradientRequest,
    Path,
    Pattern,
    Requests,
    RoundKernel,
    RowViews,
    drive,
)
from netsim.sim import rows as shapes
from netsim.sim.activation import Periodic
from netsim.sim.loop import Between, Order
from netsim.sim.network import delay as link_delay
from netsim.sim.network import payload_size
from netsim.sim.rows import CODES, fill
from netsim.sim.streams import Draws

if TYPE_CHECKING:  # torch and pyarrow are imported where they are used: a kernel's module (its Params) loads without
    import torch

    from netsim.trace.io import Words


class SyncKernel(RoundKernel):
    """An algorithm of barrier rounds (``SyncRounds``): per round and agent ``gradient``, ``local`` and, per exchange,
    ``combine`` (each hook says when it runs); ``b.k`` is the round, one for every agent of a batch. ``batch_local``:
    the events engine batches ``local`` over the agents whose gradients come back at one instant (``LocalAhead``)."""

    batch_local: ClassVar[bool] = True
    # ``gradient`` is asked in the first round only (an initial value, e.g. a tracker's y_0 = grad f(x_0))
    first_gradient: ClassVar[bool] = False

    def gradient(self, p: Any, state: Any, i: int) -> GradientRequest | None:
        """Agent ``i``'s gradient request of the round (None: none; a round's agents all ask, or none does)."""
        return None

    def asks(self, p: Any, state: Any, i: int, k: int) -> GradientRequest | None:
        """``gradient``'s request of agent ``i`` in round ``k`` (none after round 0 with ``first_gradient``)."""
        return None if k and self.first_gradient else self.gradient(p, state, i)

    def exchanges(self, p: Any, state: Any) -> int:
        """Barrier exchanges per round (default 1): after each but the last, ``combine`` sends the next payload
        (``b.s``: the exchange just done)."""
        return 1

    def routes(self, b: Batch, p: Any) -> tuple[list, list] | None:
        """For a batch of one (the agent, its row ``x``, its payload ``out``, the round ``b.k``, the exchange ``b.s``
        and the kernel's state): (out-neighbours to send to, in-neighbours to wait for) in that exchange (None: the
        graph's, a time-varying topology's of this activation). They must agree: j waits for i only if i sends to j
        (a message nobody waits for would stay queued), and every agent waits for someone."""
        return None

    def horizon(self, p: Any, state: Any) -> int | None:
        """The algorithm's own number of rounds (its paper's K), after which every agent finishes as after
        ``run.rounds`` (None: ``run.rounds`` alone; the smaller of the two ends the run)."""
        return None

    def payload_bytes(self, p: Any, state: Any, params: torch.Tensor) -> int | None:
        """The bytes on the wire of every payload ``local`` sends, when they are known before it is made (``params``:
        an agent's parameter row, for its shape and dtype); None (the default): the payload's values decide them
        (compression) or the kernel does not say. The lookahead windows time a send's transmission (bandwidth,
        uplinks) before their tensor work makes the payload, so they play transmission times only where it is known."""
        return None

    def between(self, sim: Any, p: Any) -> float | None:
        """Where ``combine`` takes gradients (or a lookahead service's ``Requests``) after an exchange that is not the
        round's last (it then returns a generator there, None after the last: e.g. cross-gradients at the models just
        received, sent back in the next exchange): the seconds from the round's first barrier to its last exchange's
        sends, with constant compute times and latency; None (the default): it takes none. The synchronous windows
        play them where every agent of a round asks for the same number."""
        return None

    def local(self, b: Batch, p: Any) -> Generator | None:
        """After the gradient of ``gradient`` (``b.g``): what each agent sends (``b.send``). It may be a generator
        whose local steps yield waves of gradients (``b.gradients``), each answered with the gradient rows. It may
        set ``b.k`` to its own round index (message rounds are ``b.k * exchanges + s``)."""
        raise NotImplementedError

    def combine(self, b: Batch, p: Any, got: Sequence[dict]) -> Generator | None:
        """After exchange ``b.s``: each agent's update from ``got[n]`` = {sender: payload} of what arrived. It may be
        a generator that yields waves of gradients (``b.gradients``, e.g. at the mixed models), each answered with the
        gradient rows: each agent asks when its barrier completes (or times out) and calls its next ``wake`` after its
        last gradient (the windowed driver plays it after the round's last exchange only), or, after an exchange that
        is not the last, sends the next payload after it (a plain ``combine`` returning such a generator there:
        ``between``)."""
        raise NotImplementedError


class MixStepKernel(SyncKernel):
    """A barrier round of D-PSGD's shape (Lian et al., NeurIPS 2017, Algorithm 1, lines 4-6): agent i sends its
    model x_i^k and takes x_i^{k+1} = sum_j W_ij x_j^k - gamma_k g_i, with g_i the gradient it asked for (``gradient``;
    none: the mix alone). A kernel of this shape states its request and gamma_k (``step_size``); ``local`` and
    ``combine`` are the shape's, so the events engine runs its rounds as one plain loop per agent, with no batch of
    one (``SyncRounds.program``). One that overrides ``local``, ``combine`` or a hook shaping the round (``asks``,
    ``routes``, ``exchanges``, ``horizon``) is run by the generic program."""

    batch_local: ClassVar[bool] = False  # its local step only sends x: nothing for the events engine to batch

    def step_size(self, p: Any, k: int) -> float:
        """gamma_k, the step size of round k."""
        raise NotImplementedError

    def local(self, b: Batch, p: Any) -> None:
        b.send(b.x)                                                         # x_i^k to the out-neighbours

    def combine(self, b: Batch, p: Any, got: Sequence[dict]) -> None:
        b.mix_into_params(b.x, got, step=b.g, lr=self.step_size(p, b.k))    # sum_j W_ij x_j^k - gamma_k g_i


_SHAPED = ("local", "combine", "asks", "routes", "exchanges", "horizon")  # the hooks a MixStepKernel keeps as they are


def _mix_step(kernel) -> bool:
    """Whether the kernel is of the mix-and-step shape with every hook that shapes its round as the shape's."""
    t = type(kernel)
    return isinstance(kernel, MixStepKernel) and not kernel.first_gradient and all(
        getattr(t, h) is getattr(MixStepKernel, h) for h in _SHAPED)


@attrs.frozen
class SyncRounds(Pattern):
    """The pattern: messages tagged ``tag``, round k's barrier waits ``params.round_timeout`` seconds."""

    kernel: ClassVar[type] = SyncKernel
    records: ClassVar[frozenset[str]] = frozenset({ROUNDS, LOOKAHEAD})
    curves: ClassVar[bool] = True
    until: ClassVar[bool] = True
    lookahead: ClassVar[bool] = True  # agents on their own clocks: lookahead windows (rounds/barrier_windows.py)
    restores: ClassVar[bool] = True  # their checkpoints are restored (rounds/barrier_windows.py)
    dynamic: ClassVar[bool] = True  # each activation adopts its epoch's links (``Exchange.adopt``)
    tag: str = "model"
    reads: frozenset[str] = frozenset({"round_timeout"})
    # the tags of the further messages an exchange carries (``b.send(..., message=m)``, m = 1, 2, ...): each agent
    # sends them right after its first, to the same neighbours, then gathers tag after tag (each gather its own
    # barrier and timeout, as a program of back-to-back broadcasts and gathers); ``combine``'s ``got`` is then one
    # per tag, (got of ``tag``, got of more[0], ...)
    more: tuple[str, ...] = ()

    def program(self, kernel, agent, p) -> Generator:
        """One agent's rounds in the events engine: the kernel's hooks on a batch of one, or, for a kernel of the
        mix-and-step shape (``MixStepKernel``), that shape's round as one plain loop."""
        state = kernel.state_of(agent, p)
        if _mix_step(kernel) and not self.more:  # what its local and combine do on a batch of one, called on the
            # agent (send x_i^k, then mix what arrived and step by gamma_k g_i): no batch to renew, no view of a row
            wake, i, ask, gather, broadcast, mix = (agent.wake, agent.id, agent.gradient, agent.gather,
                                                    agent.broadcast, agent.mix_into_params)
            gradient, step_size, tag, timeout = kernel.gradient, kernel.step_size, self.tag, p.round_timeout
            k = 0
            while True:
                yield wake()
                x = agent.params
                req = gradient(p, state, i)
                g = None if req is None else (yield ask(req.batch, x, req.clip, req.clip_kind))
                yield broadcast(x, tag, k)
                mix(x, (yield gather(tag, k, None, timeout)), step=g, lr=step_size(p, k))
                k += 1
        ahead = None if _local_steps(kernel) or not kernel.batch_local else \
            agent.service((LocalAhead, kernel), lambda: LocalAhead(kernel, p, state))
        own = Batch([agent], 0, None, None, state)  # the agent's batch of one, renewed each round
        # the hooks a kernel leaves as SyncKernel's cost no call a round
        own_routes = type(kernel).routes is not SyncKernel.routes
        own_exchanges = type(kernel).exchanges is not SyncKernel.exchanges
        horizon = kernel.horizon(p, state)
        gradient = _direct_gradient(kernel)
        # what every round calls and reads, looked up once (an agent-round of D-PSGD is ~70 µs)
        wake, i, ask, gather, broadcast = agent.wake, agent.id, agent.gradient, agent.gather, agent.broadcast
        renew, local, combine = own.renew, kernel.local, kernel.combine
        tag, more, timeout = self.tag, self.more, p.round_timeout
        to = senders = None  # the graph's neighbours, unless the kernel routes each exchange (``routes``)
        k = 0
        while True:
            if k == horizon:  # the algorithm's own K rounds done: finish as ``wake`` does at run.rounds
                yield agent.finish()
            yield wake()
            x = agent.params
            req = gradient(p, state, i) if gradient is not None else kernel.asks(p, state, i, k)
            if req is not None and ahead is not None:  # ``local`` batched with the agents done at the same time
                ev = ask(req.batch, x, req.clip, req.clip_kind)
                ahead.ask(agent, x, ev, k)
                yield ev
                b = ahead.take(agent)
            else:
                b = own
                xm = x[None]  # the batch's (1, P) row, its one view: the gradient asked at it comes back as one
                renew(k, x, None if req is None else (yield ask(req.batch, xm, req.clip, req.clip_kind)), xm)
                gen = local(b, p)
                if gen is not None:  # local steps: each wave of gradients is this agent's request
                    yield from drive(agent, gen)
            steps = kernel.exchanges(p, state) if own_exchanges else 1
            for s in range(steps):  # the round's exchanges, each a barrier (messages tagged round k * steps + s)
                b.s = s
                rnd = b.k * steps + s
                if own_routes:
                    to, senders = kernel.routes(b, p) or (None, None)  # (None: the graph's)
                if not more:
                    out, size = b.out[0], b.sizes
                    size = None if size is None else size[0]
                    yield agent.send_each(out, tag, rnd, to, size) if isinstance(out, dict) else \
                        broadcast(out, tag, rnd, to, size)
                    after = combine(b, p, [(yield gather(tag, rnd, senders, timeout))])
                else:  # several messages: sent back to back (none where the payload is None), gathered tag by tag
                    msgs = [(tag, b.out, b.sizes), *((t, o, z) for t, (o, z) in zip(more, b.more, strict=True))]
                    for t, out, sizes in msgs:
                        if out[0] is not None:
                            yield broadcast(out[0], t, rnd, to, None if sizes is None else sizes[0])
                    gots = []
                    for t, _, _ in msgs:
                        gots.append([(yield gather(t, rnd, senders, timeout))])
                    after = combine(b, p, tuple(gots))
                if after is not None:  # gradients at the mixed point: each wave is this agent's request
                    yield from drive(agent, after)
            k += 1

    # the windowed driver ------------------------------------------------------------------------------
    def refusal(self, sim, path: Path) -> str | None:
        """Why the rounds of this built simulation are not exact windows for this driver (None: they are); on the
        lookahead path, why rounds/barrier_windows.py cannot play them."""
        from netsim.rounds.windowed import round_limit

        sc, p, kernel = sim.world.scenario, sim.params, sim.program
        between = kernel.between(sim, p) is not None
        if between and path != ROUNDS:  # (its own rule first: the rounds would refuse it too)
            return kernel.refusal(sim, path) or (
                f"{sc.algorithm.name} takes gradients between its exchanges: the lookahead windows do not play it — "
                "use periodic activation, one clock and compute time, a constant latency and no loss (synchronous "
                "windows play it)")
        if (self.more or kernel.first_gradient) and path != ROUNDS:
            what = f"sends {len(self.more) + 1} messages an exchange" if self.more else \
                "takes a gradient in round 0 only"
            return (f"{sc.algorithm.name} {what}: the lookahead windows do not play it — give every agent the same "
                    "clock and compute time (synchronous windows play it)")
        if path != ROUNDS:
            from netsim.rounds import barrier_windows

            return barrier_windows.refusal(sim)
        lat = sc.network.latency
        if lat.kind != "constant":
            return (f"latency {lat.kind!r}: barrier rounds need links of one constant latency (the barrier orders "
                    "agents by arrival) — set network.latency to a constant")
        state = kernel.state_of(sim.loop.agents[0], p)
        after = _combine_steps(kernel)
        before = not any(kernel.asks(p, state, a.id, 0) is None for a in sim.loop.agents)
        if not before and not _local_steps(kernel) and not after and not between:
            return (f"{sc.algorithm.name} takes no gradients with these parameters (its rounds have no compute "
                    "phase) — give it a learning rate (algorithm.lr > 0)")
        why = kernel.refusal(sim, path)
        if why is not None:
            return why
        if after and kernel.exchanges(p, state) > 1:
            return (f"{sc.algorithm.name} takes gradients after each of several exchanges a round: synchronous "
                    "windows play them after the last only — nothing to change: it runs on the events engine")
        if (after or between) and sc.privacy is not None and sc.privacy.record is not None:
            return (f"privacy.record with gradients after the exchange: {sc.algorithm.name}'s synchronous windows do "
                    "not write the records of its mixes — remove privacy.record")
        r = sc.run
        limit = round_limit(sim)  # run.rounds, or the kernel's own horizon
        last_t = r.until if limit is None else (limit + 1) * sc.agents.activation.period
        if r.stop_on_divergence and sc.evaluation.every <= last_t:
            return ("run.stop_on_divergence with evaluations inside the run: the events engine stops inside a round, "
                    "after the events already due then — remove run.stop_on_divergence (summary.json's 'diverged' "
                    "still says when)")
        took = sc.agents.compute_time.value + lat.value
        if took >= p.round_timeout:
            return (f"compute time + latency = {took:g} s >= algorithm.round_timeout: a round's messages can miss "
                    f"the barrier's timeout — raise algorithm.round_timeout above {took:g} s")
        if self.more and sc.network.loss:
            return (f"{sc.algorithm.name} sends {len(self.more) + 1} messages an exchange with lossy links: a barrier "
                    "gathers them one after the other, each with its own timeout — set network.loss = 0")
        if self.more and sc.privacy is not None and sc.privacy.record is not None:
            return (f"privacy.record with {len(self.more) + 1} messages an exchange: synchronous windows record one — "
                    "remove privacy.record")
        if sc.network.loss and kernel.exchanges(p, state) > 1:
            return ("several exchanges a round with lossy links: the barriers of one exchange would time out at "
                    "different times — set network.loss = 0")
        if sc.network.loss and not after:  # (the rounds run.until reaches when nothing else ends the run)
            rounds = limit if limit is not None else min(200_000, int(r.until / sc.agents.activation.period) + 1)
            why = _round_times(sc, p.round_timeout, rounds)
            if why is not None:
                return why
        cut = limit is None or r.until is not None and r.until <= last_t  # run.until may end the run inside a round
        if r.rounds is None and cut and (_local_steps(kernel) or kernel.exchanges(p, state) > 1):
            return (f"run.until without run.rounds: {sc.algorithm.name}'s local steps or exchanges leave a round's "
                    "end unknown before the run — set run.rounds")
        if between:  # its gradients and exchanges, then the last exchange's latency, before the round's end
            return _timeline(sc, p.round_timeout, before, kernel.between(sim, p) + float(lat.value), limit)
        if after or r.rounds is None and r.until is not None:
            return _timeline(sc, p.round_timeout, 1 if kernel.first_gradient and before else before, after, limit)
        return None

    def play_lookahead(self, sim, kernel) -> bool:
        """Agents on their own clocks, compute times of their own: conservative lookahead windows."""
        from netsim.rounds import barrier_windows

        return barrier_windows.play(self, sim, kernel)

    @staticmethod
    def _stop_at(sim, kernel, net, rows, woken, k: int, state, t_act, ids, at, until: float) -> None:
        """The run stops at ``run.until`` (a round activated after it: nothing of it; activated at it: what the engine
        processes before its stop, the events set before until's instant: the activations, and each agent's gradient
        request, or its ``local`` and sends)."""
        import torch

        at_until = t_act == until
        if at_until.any():
            if not at_until.all():
                raise RuntimeError("synchronous windows: run.until falls among a round's activations (refusal should "
                                   "have said so)")
            p, bank, B = sim.params, sim.world.bank, len(ids)
            hook = kernel.asks(p, state, int(ids[0]), k)
            if hook is not None:  # the gradient requests: their completions come after the stop
                rows.add(activations(t_act, ids, at, woken, t_act, net.compute_times(woken, ids, t_act)))
            else:  # ``local`` at the activation and the sends; their deliveries come after the stop
                released = {n: [shapes.activate(until, i, float(at[n]), woken[n].round)]
                            for n, i in enumerate(ids.tolist())}
                x = bank.W.index_select(0, torch.from_numpy(ids).to(bank.W.device))
                b = Batch(woken, k, x, None, state, lambda n: (until, released.setdefault(n, [])),
                          rows=(RowViews(x), None))
                sim.loop.env.advance_to(until)
                kernel.local(b, p)
                steps = kernel.exchanges(p, state)
                net.exchange(b, rows, ids, np.arange(B), t_act, b.k * steps, False, released)
                del rows.parts[-2:]  # the deliveries and the timeouts
            rows.emit(sim.recorder.writer)
        sim.loop.env.advance_to(until)

    def _waves(self, sim, kernel, b, p, got, rows, ids, done, late, last: bool, net, now: list,
               released: dict) -> tuple:
        """The round's last ``combine`` with its gradients after the exchange (``SyncKernel.combine``): each agent asks
        when its barrier completes (those completed, in completion order, at their last delivery; then the timed-out
        ones, after every timeout row of that instant), the gradient service evaluates each of these two groups' wave
        at its first completion (one batched call, the engine's flush), and each agent calls its next ``wake`` (or
        finishes) after its last gradient (at its barrier if it asks for none). Returns the next round's order (agents,
        when each called wake), where each asked its first gradient (by id; NaN: none) and the round's last event."""
        agents, svc, words = sim.loop.agents, sim.world.gradients, net.words
        B, pos = len(ids), net.made[3]  # (each agent's batch position)
        parent = np.full(len(agents), np.nan)
        groups = []  # per group (completed, timed out): its agents, positions, clocks, who still asks, rows, wakes
        for gids, t in (done, late):
            t = np.array(t, np.float64)
            for n, tn in zip(pos[gids].tolist(), t.tolist(), strict=True):
                now[n] = tn  # the agent's clock for what ``combine`` records (its releases)
            groups.append({"ids": gids, "pos": pos[gids], "t": t, "on": np.ones(len(gids), bool), "ct": None,
                           "made": [], "who": [gids[:0]], "when": [t]})
        live = [grp for grp in groups if len(grp["ids"])]  # (a group of none: no rows, no requests)
        for grp in live:
            grp["when"] = []
        comb = kernel.combine(b, p, got)
        try:
            w = next(comb)
            while True:
                g = None
                for grp in live:
                    gids, gp, t, on = grp["ids"], grp["pos"], grp["t"], grp["on"]
                    asks = np.array([w.rows[n] is not None for n in gp.tolist()], bool)
                    if (asks & ~on).any():
                        raise RuntimeError("synchronous windows: an agent asks for a gradient after a wave it asked "
                                           "none in")
                    stop = on & ~asks
                    aid, ap = gids[asks], gp[asks]
                    ct = np.zeros(len(gids))
                    if len(aid):  # (drawn in request order, as each agent's ``Agent.gradient`` draws it)
                        ct[asks] = net.compute_times([agents[i] for i in aid.tolist()], aid, t[asks])
                    grp["made"].append(_level_rows(words, gids, gp, t, released, on, grp["ct"], asks, stop, last,
                                                   agents, ct))
                    grp["who"].append(gids[stop])
                    grp["when"].append(t[stop])
                    grp["on"] = on = asks
                    if not on.any():
                        continue
                    if grp["ct"] is None:
                        parent[aid] = t[on]
                    end = t + ct
                    # (gradients of no compute time asked at one instant: each completion is queued after every
                    # request of that instant, so one flush answers them all, as when each is asked before any ends)
                    at_once = (ct[on] == 0).all() and t[on].min() == t[on].max()
                    if on.sum() > 1 and t[on].max() >= end[on].min() and not at_once:
                        raise RuntimeError("synchronous windows: an agent asks for its gradient after another's "
                                           "completes in one group (refusal should have said so)")
                    g = _wave(svc, w, aid, ap, B, g)
                    grp["t"], grp["ct"] = end, ct
                    for n, tn in zip(ap.tolist(), end[on].tolist(), strict=True):
                        now[n] = tn
                w = comb.send(g if g is not None else w.at.new_zeros(w.at.shape))
        except StopIteration:
            pass
        for grp in live:
            on = grp["on"]
            grp["made"].append(_level_rows(words, grp["ids"], grp["pos"], grp["t"], released, on, grp["ct"],
                                           np.zeros(len(on), bool), on, last, agents, None))
            grp["who"].append(grp["ids"][on])
            grp["when"].append(grp["t"][on])
        d_when, l_when = (np.concatenate(grp["when"]) for grp in groups)
        if len(d_when) and len(l_when) and d_when.max() >= late[1].min():
            raise RuntimeError("synchronous windows: a completed barrier's gradients end after the others' timeouts "
                               "(refusal should have said so)")
        rows.parts[len(rows.parts) - 1:len(rows.parts) - 1] = groups[0]["made"]  # before the last part: the timeouts
        rows.parts.extend(groups[1]["made"])
        who = np.concatenate(groups[0]["who"] + groups[1]["who"]).astype(np.int64)
        when = np.concatenate([d_when, l_when])
        if last:
            for i in who.tolist():
                agents[i].mark_finished()
        return who, when, parent, float(when.max())

    @staticmethod
    def _between(sim, waves, b, rows, ids, done, late, net, now: list, released: dict) -> tuple:
        """A ``combine``'s gradients (or ``Requests``) between two exchanges (``SyncKernel.between``): each agent asks
        at its barrier's completion, in completion order, and every agent asks in every wave (one batched call a wave,
        the engine's flush); its rows per wave: the last gradient's ``compute_end``, its releases, its next request. The
        last wave's ``compute_end`` and releases head the next exchange's sends. Returns the senders' batch positions
        and times for it, and whether they took gradients."""
        agents, svc, words = sim.loop.agents, sim.world.gradients, net.words
        if len(late[0]):
            raise RuntimeError("synchronous windows: a barrier times out before gradients between exchanges (refusal "
                               "should have said so)")
        gids, t = done[0], np.array(done[1], np.float64)
        gp = net.made[3][gids]  # (their batch positions)
        for n, tn in zip(gp.tolist(), t.tolist(), strict=True):
            now[n] = tn  # the agent's clock for what its ``combine`` records (its releases)
        on, ended = np.ones(len(gids), bool), None
        try:
            w = next(waves)
            while True:
                asked = w.items if type(w) is Requests else w.rows
                if any(asked[n] is None for n in gp.tolist()):
                    raise RuntimeError("synchronous windows: agents take different numbers of gradients between "
                                       "exchanges (refusal should have said so)")
                if type(w) is Requests:
                    ct = np.array(w.ct, np.float64)[gp]
                else:
                    ct = net.compute_times([agents[i] for i in gids.tolist()], gids, t)
                rows.parts.append(_level_rows(words, gids, gp, t, released, on, ended, on, ~on, False, agents, ct))
                end = t + ct
                if len(t) > 1 and t.max() >= end.min() and not ((ct == 0).all() and t.min() == t.max()):
                    raise RuntimeError("synchronous windows: an agent asks for its gradient after another's completes "
                                       "(refusal should have said so)")
                t, ended = end, ct
                for n, tn in zip(gp.tolist(), t.tolist(), strict=True):
                    now[n] = tn
                if type(w) is Requests:  # the service's one flush: every request of the wave, in request order
                    got: list = [None] * len(ids)
                    for n, r in zip(gp.tolist(), w.service.value([w.items[n] for n in gp.tolist()]), strict=True):
                        got[n] = r
                    w = waves.send(got)
                    continue
                w = waves.send(_wave(svc, w, gids, gp, len(ids)))
        except StopIteration:
            pass
        return gp, t, ended is not None

    def play(self, sim, kernel, rounds) -> None:
        """Play the run round by round (see the module docstring), from round 0 or from where a restored
        checkpoint stands (``rounds``: windowed.Rounds). Each step works on arrays over the round's agents
        (``Exchange``, ``wake_all``); only the local steps of a kernel with its own gradients go agent by agent.
        The evaluations inside the run are made where the engine's evaluator makes them (rounds/curves.py)."""
        import torch

        from netsim.rounds.curves import Curves, Round
        from netsim.rounds.windowed import round_limit
        from netsim.sim.agent import RowsAhead

        p, agents, writer = sim.params, sim.loop.agents, sim.recorder.writer
        svc, bank = sim.world.gradients, sim.world.bank
        state = kernel.state_of(agents[0], p)
        limit = round_limit(sim)  # run.rounds, or the kernel's own horizon
        net = Exchange(sim, self.tag, p.round_timeout, self.more)
        sampler = RowsAhead(agents)
        words = net.words
        now0 = float(sim.loop.env.now)
        fresh = Between(0, Order(np.arange(len(agents), dtype=np.int64), np.full(len(agents), now0)), now0)
        start = rounds.begin(fresh)
        k = start.k
        who, when = start.order.who, start.order.when  # the next round's order: agents, when they woke
        curves = Curves(sim, len(sim.recorder.metrics) - 1)  # (the start's evaluation, then those made inside)
        gen = _local_steps(kernel)
        batch_local = kernel.batch_local and not gen  # the engine's ``LocalAhead``
        after = _combine_steps(kernel)  # gradients after the exchange: each agent wakes after its own
        between = kernel.between(sim, p) is not None  # gradients between two exchanges
        r = sim.world.scenario.run
        until = r.until if r.rounds is None else None  # the run may stop at run.until (``refusal`` says where)
        parent = None  # with ``after``: each agent's last barrier completion (its wake's chain of parents)
        held = HeldRows(words)  # the rounds' rows not yet written (a whole batch of the trace at a time)
        marks = sim.loop.marks
        gradient = _direct_gradient(kernel)
        while True:
            rows = RoundRows(words)
            t_act, ids, at, woken = rounds.wake_all(who, when)
            net.adopt(woken, t_act)  # a time-varying topology: the epoch's links, as the engine's listener adopts them
            B = len(woken)
            id_list = ids.tolist()
            woke = np.empty(len(agents))
            woke[who] = when
            ev = Round(curves, ids, t_act, woke[ids], start is fresh and k == start.k,
                       None if parent is None else parent[ids])
            while curves.first(curves.j, ev.chain(0, 0)) and (until is None or curves.T(curves.j) < until):
                held.write_to(writer, final=True)
                writer.emit_rows(curves.evaluate())  # evaluations before the round's first activation
            if until is not None and float(t_act[0]) >= until:  # the run's end: this round's events at until only
                held.write_to(writer, final=True)
                self._stop_at(sim, kernel, net, rows, woken, k, state, t_act, ids, at, until)
                end = until
                break
            X = bank.W  # each agent's params as the engine snapshots them at its activation
            x = X.index_select(0, torch.from_numpy(ids).to(X.device))
            # the gradient asked for before ``local`` (``gradient`` itself where ``asks`` is SyncKernel's and asked
            # every round, as the engine's program calls it)
            hook = [gradient(p, state, i) for i in id_list] if gradient is not None else \
                [kernel.asks(p, state, i, k) for i in id_list]
            if 0 < list(map(type, hook)).count(type(None)) < len(hook):  # (types: a C loop, no request's __eq__)
                raise ValueError("windowed rounds need every agent to ask for the round's first gradient, or none")
            hook = hook if hook[0] is not None else None
            released: dict[int, list[tuple]] = {}  # agent n's rows made inside ``local`` (its releases)
            pending = False  # every agent's gradient is out: their compute_end rows are due
            xs = RowViews(x)  # the rows of x: one unbind if asked for, no indexing per agent
            g = None
            now = t_act.tolist()  # each agent's clock where its program runs on
            if hook is not None:  # activate, then the gradient request
                ct = net.compute_times(woken, ids, t_act)
                rows.add(activations(t_act, ids, at, woken, t_act, ct))
                ev.level_events(0, 2)
                now = (t_act + ct).tolist()
                ev.completed(now)
                batches = set(map(_BATCH, hook))
                asks = sampler.take(woken, ids, batches.pop()) if len(batches) == 1 else \
                    [a.sample_rows(req.batch) for a, req in zip(woken, hook, strict=True)]
                g = _evaluate(svc, id_list, x, asks, hook)  # every request in one batched call (the first completion)
                pending = True

            def at_(n: int, now=now, released=released):  # the agent's clock when its program runs on, its rows
                return now[n], released.setdefault(n, [])

            b = Batch(woken, k, x, g, state, at_, rows=(xs, None))
            b.order = ids
            sim.loop.env.advance_to(float(t_act[0]))  # local starts at the activation (every agent's: one tick)
            if not gen and hook is not None:  # ``local``'s writes at each agent's gradient completion
                ev.before_level(bank, one=batch_local)  # ``LocalAhead``: every agent's at the first completion
            elif not gen:  # no compute phase before the exchange: ``local`` runs at the activation, after its row
                for n in range(B):
                    released[n] = [shapes.activate(float(t_act[n]), id_list[n], float(at[n]), woken[n].round)]
                ev.before_level(bank)
            local = kernel.local(b, p)
            if not gen:
                ev.after_write(bank)
            if local is not None:
                part: list[tuple] = []
                rows.parts.append(part)
                row = part.append
                try:
                    ev.before_level(bank)  # its first part
                    w = next(local)
                    ev.after_write(bank)
                    while True:  # a wave: per agent, its compute_end (or activation), its releases, its request
                        level = len(ev.levels) - 1
                        counts = np.full(B, 2, np.int64)  # each agent's rows: one before its releases, one after
                        for n, made in released.items():
                            counts[n] += len(made)
                        for n in range(B):
                            i = id_list[n]
                            if pending:
                                row(shapes.compute_end(now[n], i))
                            elif hook is None:  # the first wave: the activation that led to it
                                row(shapes.activate(float(t_act[n]), i, float(at[n]), woken[n].round))
                            part += released.pop(n, ())
                            ct = woken[n].compute_time(now[n])  # its next request, as ``Agent.gradient`` makes it
                            row(shapes.compute_start(now[n], i, ct))
                            now[n] += ct
                        ev.level_events(level, counts)
                        ev.completed(now)
                        pending = True
                        ev.before_level(bank)
                        w = local.send(_evaluate(svc, id_list, w.at, w.rows, [w] * B))
                        ev.after_write(bank)
                except StopIteration:
                    ev.after_write(bank)
            if hook is None and not pending and not after and not between:
                raise ValueError("windowed rounds need a compute phase (a gradient) every round")
            steps = kernel.exchanges(p, state)
            own_routes = type(kernel).routes is not SyncKernel.routes
            ready, t_ready = np.arange(B), np.array(now)  # (batch position, when it sends), in the engine's order
            last = False
            head = (pending, released)  # the senders' rows before their sends: compute_end, releases
            for s in range(steps):  # the round's exchanges; after the first, each agent sends when its barrier is done
                rnd = b.k * steps + s
                if own_routes:  # the kernel's routes of this exchange, agent by agent as the engine asks for them
                    net.route(kernel, b, p, s)
                got, done, late = net.exchange(b, rows, ids, ready, t_ready, rnd, *head)
                head = (False, None)
                order_ids, order_t = np.concatenate([done[0], late[0]]), np.concatenate([done[1], late[1]])
                if s + 1 == steps:
                    last = limit is not None and agents[int(order_ids[0])].round >= limit  # all at it together
                per_sender, arr, src, pos = net.made
                ev.exchange(s, ready, t_ready, per_sender, arr, src, done, late, pos, last)
                b.s = s
                if s + 1 < steps:
                    ev.before_barriers(s, bank)
                    waves = kernel.combine(b, p, got)
                    ready, t_ready = pos[order_ids], order_t
                    if waves is not None:  # gradients between the exchanges: each agent sends after its last
                        ready, t_ready, asked = self._between(sim, waves, b, rows, ids, done, late, net, now, released)
                        head = (asked, released)
                    b.record_mixes(order_ids, order_t)  # the mixing record, where privacy.record asks for it
                    ev.after_write(bank)
            if after:  # the last combine's gradients, each agent's from its barrier's completion (or timeout)
                if curves.made or ev.pending:
                    raise RuntimeError("synchronous windows: an evaluation falls inside a round whose gradients come "
                                       "after the exchange (refusal should have said so)")
                who, when, parent, end = self._waves(sim, kernel, b, p, got, rows, ids, done, late, last, net, now,
                                                     released)
                rows.hold(held, writer)
                b.record_mixes(order_ids, order_t)  # the mixing record, where privacy.record asks for it
            else:
                end = float(order_t[-1])
                if between and (curves.made or ev.pending):
                    raise RuntimeError("synchronous windows: an evaluation falls inside a round with gradients between "
                                       "its exchanges (refusal should have said so)")
                if last:  # waking, each finishes: those done at the last arrival before the timeouts fire
                    rows.parts.insert(len(rows.parts) - 1, finishes(*done, agents))  # the last part: the timeouts
                    rows.add(finishes(*late, agents))
                    for i in order_ids.tolist():
                        agents[i].mark_finished()
                ev.before_barriers(steps - 1, bank)
                if not curves.made and not ev.pending:
                    with writer.capturing([]) as made:  # (rows ``combine`` writes itself: after the round's)
                        kernel.combine(b, p, got)
                    rows.parts.append(made)
                    rows.hold(held, writer)
                    b.record_mixes(order_ids, order_t)  # the mixing record, where privacy.record asks for it
                else:  # the round's evaluations among its rows: the last combine first, its rows where they were
                    w_last = ev.resumed[-1]

                    def counts_at(j: int, w_last=w_last, ids=ids, last=last) -> np.ndarray:
                        """Each agent's activations at evaluation j (its next wake: at its barrier's completion)."""
                        out = rounds_of(agents, None)
                        if not last:
                            out[ids] += curves.T(j) > w_last
                        return out

                    with writer.capturing([]) as made:
                        kernel.combine(b, p, got)
                    b.record_mixes(order_ids, order_t)
                    rows.parts.append(made)
                    ev.after_write(bank, counts_at)
                    held.write_to(writer, final=True)
                    rows.emit_placed(writer, ev.offsets())
                ev.close()
                who, when = order_ids, order_t
            if last:
                break
            k += 1
            if marks.checkpointer is not None:  # (a checkpoint holds the trace written)
                held.write_to(writer, final=True)
            if rounds.between(Between(k, Order(who, when), end)):  # interrupted: between rounds
                held.write_to(writer, final=True)
                return
            if sim.recorder.progress is not None:
                sim.recorder.progress(end)
        held.write_to(writer, final=True)
        sim.loop.env.advance_to(end)  # the engine's clock where its last event happened (the run's end)


class RoundRows:
    """A round's trace rows in the engine's order: blocks of columns (``trace.io.columns_batch``'s, their strings as
    codes of ``words``) and lists of row tuples, emitted at the end of the round."""

    def __init__(self, words: Words):
        self.parts: list = []
        self.words = words

    def add(self, cols: tuple) -> None:
        self.parts.append(cols)

    def hold(self, held: HeldRows, writer) -> None:
        """``emit`` into ``held``, which writes each whole batch of the trace as it fills (``HeldRows``)."""
        from netsim.trace.io import row_columns

        for part in self.parts:
            if isinstance(part, list):
                if part:
                    held.add(row_columns(part, self.words))
            else:
                held.add(part)
        held.write_to(writer)

    def emit_placed(self, writer, placed: list[tuple[int, list]]) -> None:
        """``emit``, with the rows of ``placed`` ((rows of the round before them, rows), in order) among them."""
        parts, self.parts = self.parts, []
        done = 0
        for at, made in [*placed, (None, [])]:
            while parts and (at is None or done < at):
                part = parts.pop(0)
                n = len(part) if isinstance(part, list) else len(part[0])
                if at is not None and done + n > at:  # the evaluation falls inside this part: cut it there
                    cut = at - done
                    head, tail = (part[:cut], part[cut:]) if isinstance(part, list) else \
                        (tuple(c[:cut] for c in part), tuple(c[cut:] for c in part))
                    parts.insert(0, tail)
                    part, n = head, cut
                self.parts.append(part)
                done += n
            self.emit(writer)
            self.parts = []
            if made:
                writer.emit_rows(made)

    def emit(self, writer) -> None:
        """Into the trace, in order: consecutive blocks of columns as one (the writer converts whole batches)."""
        run: list[tuple] = []
        for part in [*self.parts, []]:
            if isinstance(part, list):
                if run:
                    writer.emit_columns(run[0] if len(run) == 1 else tuple(np.concatenate(c) for c in zip(*run)),
                                        self.words, owned=True)
                    run = []
                if part:
                    writer.emit_rows(part)
            else:
                run.append(part)


class HeldRows:
    """A run's rows held across rounds as blocks of columns, written to the trace a whole batch at a time (as
    ``PackedRows.write_to`` writes them): ``emit_columns`` keeps a partial batch as row tuples, converted back when
    the next rows come (~2 us a row, most of a small fleet's round). The driver writes them all (``final``) before
    anything else writes to the trace."""

    def __init__(self, words: Words):
        self.words = words
        self.blocks: list[tuple] = []
        self.n = 0

    def add(self, cols: tuple) -> None:
        if len(cols[0]):
            self.blocks.append(cols)
            self.n += len(cols[0])

    def write_to(self, writer, final: bool = False) -> None:
        """The rows that complete the writer's batches (``final``: all of them) into the trace; the rest held. Each
        batch is handed over as views of the blocks it lies in (joined where it spans two), never all the blocks
        joined: at 10^6 agents a round's rows are ~360 MB, and the writer keeps its batches' arrays till written."""
        n, every = self.n, writer.flush_every
        k = n if final or every == math.inf else n - (len(writer.buffer) + n) % every
        if k <= 0:
            return
        if every == math.inf or len(self.blocks) == 1:
            runs = [k]
        else:  # a batch's rows at a time: the first completes the writer's buffer
            first = (every - len(writer.buffer) % every) % every or every
            runs = [min(first, k), *(min(every, k - m) for m in range(first, k, every))]
        blocks, rest = self.blocks, 0  # (rows of blocks[0] already handed over)
        for size in runs:
            pieces = []
            while size:
                cols = blocks[0]
                m = len(cols[0]) - rest
                take = min(m, size)
                pieces.append(tuple(c[rest:rest + take] for c in cols))
                size -= take
                rest += take
                if rest == len(cols[0]):
                    blocks, rest = blocks[1:], 0
            writer.emit_columns(pieces[0] if len(pieces) == 1 else tuple(np.concatenate(c) for c in zip(*pieces)),
                                self.words, owned=True)
        self.blocks = ([tuple(c[rest:] for c in blocks[0])] if rest else []) + list(blocks[1 if rest else 0:])
        self.n = n - k


def _level_rows(words, ids: np.ndarray, pos: np.ndarray, t: np.ndarray, released: dict, on: np.ndarray, ended,
                asks: np.ndarray, stop: np.ndarray, last: bool, agents, ct) -> tuple | list:
    """A group's rows at one level of its gradients (agents ``ids`` at batch positions ``pos``, each at ``t``),
    agent by agent, of those still asking (``on``): the ``compute_end`` of its last gradient (``ended``: None before
    the first), the rows its ``combine`` made (``released``), then its next request's ``compute_start`` (``asks``;
    ``ct``: its compute times) or, where it stops (``stop``) in the run's last round, its ``finish``. Columns where
    every agent of the group makes the same rows, else row tuples."""
    own = [released.pop(n, ()) for n in pos.tolist()] if released else None
    fin = last and bool(stop.any())
    if (own is not None and any(own)) or not (on.all() and (asks.all() or stop.all())):
        out: list[tuple] = []
        for m, (i, tn) in enumerate(zip(ids.tolist(), t.tolist(), strict=True)):
            if not on[m]:
                continue
            if ended is not None:
                out.append(shapes.compute_end(tn, i))
            if own is not None:
                out += own[m]
            if asks[m]:
                out.append(shapes.compute_start(tn, i, float(ct[m])))
            elif last:
                out.append(shapes.finish(tn, i, agents[i].round))
        return out
    kinds = int(ended is not None) + int(bool(asks.all())) + int(fin)
    if not len(ids) or not kinds:
        return []
    c = columns(kinds * len(ids))
    j = 0
    if ended is not None:
        fill(c, slice(j, None, kinds), shapes.compute_end(t, ids, CODES))
        j += 1
    if asks.all():
        fill(c, slice(j, None, kinds), shapes.compute_start(t, ids, ct, CODES))
        j += 1
    if fin:
        fill(c, slice(j, None, kinds), shapes.finish(t, ids, rounds_of(agents, ids), CODES))
    return tuple(c)


def columns(n: int) -> list:
    """n trace rows as columns (COLUMNS order, strings as ``sim.rows.CODES``) to fill with ``sim.rows.fill``."""
    return [np.empty(n), np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int64),
            np.empty(n, np.int64), np.empty(n), np.empty(n, np.int32), np.empty(n, np.int32)]


def rounds_of(agents, ids: np.ndarray | None) -> np.ndarray:
    """``Agent.round`` of the agents ``ids`` (None: all) of a run whose agents include ``agents``, as a new array
    (``Simulation.rounds``)."""
    return agents[0].sim.rounds(ids) if len(agents) else np.zeros(0, np.int64)


_BATCH = attrgetter("batch")  # (maps of attrgetters: C loops over a round's agents)


def activations(t_act, ids, at, woken, t_start, ct) -> tuple:
    """Each agent's ``activate`` row (``Agent._activated``) followed by its ``compute_start`` (``Agent.gradient``),
    agent after agent in firing order."""
    c = columns(2 * len(ids))
    fill(c, slice(0, None, 2), shapes.activate(t_act, ids, at, rounds_of(woken, ids), CODES))
    fill(c, slice(1, None, 2), shapes.compute_start(t_start, ids, ct, CODES))
    return tuple(c)


def finishes(ids, t, agents) -> tuple:
    """``finish`` rows (``Agent.finish``) of agents ``ids`` at times ``t``, in that order."""
    c = columns(len(ids))
    fill(c, slice(None), shapes.finish(t, ids, rounds_of(agents, ids), CODES))
    return tuple(c)


class Exchange:
    """A round's exchange over arrays: every agent sends to its out-neighbours, deliveries and barriers follow
    (the rules of the module docstring). The out-links are the graph's (``Agent.neighbors``: a time-varying
    topology's of the round, ``adopt``; or the kernel's ``routes``, ``route``), made when the agents first send on
    them, in send order, as ``Network.send`` makes them."""

    def __init__(self, sim, tag: str, timeout: float, more: tuple[str, ...] = ()):
        agents = sim.loop.agents
        self.sim, self.agents, self.timeout, self.net = sim, agents, timeout, sim.world.network
        self.tags = (tag, *more)  # the messages of an exchange (``SyncRounds.more``), in send order: ``tag`` first
        self.dynamic = sim.world.network.dynamic  # a time-varying topology (sim/dynamic.py), adopted at activations
        self._use([a.neighbors for a in agents], [a.in_neighbors for a in agents])
        from netsim.sim.agent import ComputeTimes

        self.words = shapes.words()
        self.compute_times = ComputeTimes(agents)  # (woken, ids, when) -> each one's ``Agent.compute_time``
        log = sim.recorder.mixing_log  # privacy.record = "payloads": the delivered payloads (privacy/payloads.py)
        self.views = None if log is None else log.views

    def _use(self, outs: Sequence[list[int]], ins: Sequence[list[int]]) -> None:
        """Agent i sends to ``outs[i]`` and its barrier waits for ``ins[i]`` (the exchanges from now on)."""
        self.graph_links = False  # (``route`` says when these are the graph's own)
        agents = self.agents
        if not all(ins):
            i = next(i for i, got in enumerate(ins) if not got)
            raise ValueError(f"agent {i} waits for no in-neighbour in a round (its barrier completes at once): not "
                             "played by synchronous windows — run --engine events")
        self.outs = outs
        self.expect = np.array([len(got) for got in ins], np.int64)
        self.deg = np.array([len(out) for out in outs], np.int64)
        self.ptr = np.concatenate([[0], np.cumsum(self.deg)])  # agent i's out-links: ptr[i]..ptr[i + 1]
        self.dst = np.array([j for out in outs for j in out], np.int64)
        # the weight each receiver gives the sender (``Agent.weights``; NaN where it has none: ``Batch`` then mixes
        # from the dicts, which says so)
        self.w = np.array([agents[j].weights.get(i, np.nan) for i, out in enumerate(outs) for j in out], np.float64)
        self.links: list | None = None
        self._plans: dict[tuple, tuple[_Plan, int]] = {}  # (``exchange``: each kept plan and its bytes)

    def adopt(self, woken: Sequence, t: np.ndarray) -> None:
        """The engine's activation listener of a time-varying topology: each agent woken at ``t`` takes its epoch's
        links (``DynamicTopology.adopt`` at its activation time), which the round's exchanges then use."""
        if self.dynamic is None:
            return
        adopt = self.dynamic.adopt
        for a, when in zip(woken, t.tolist(), strict=True):
            adopt(a, when)
        agents = self.agents
        self._use([a.neighbors for a in agents], [a.in_neighbors for a in agents])

    def route(self, kernel, b, p, s: int) -> None:
        """Exchange ``s``'s links by the kernel's ``routes``, asked agent by agent on its batch of one as the
        engine's program asks (None: the agent's graph links)."""
        agents = self.agents
        b.s = s
        own = {}
        for n, a in enumerate(b.agents):  # (its batch of one: the agent, its row and payload, the round, the exchange)
            one = Batch([a], b.k, b.x[n:n + 1], None, b.state)
            one.s, one.out = s, None if b.out is None else [b.out[n]]
            r = kernel.routes(one, p)
            if r is not None:
                own[a.id] = r
        if not own and self.graph_links:  # every agent on the graph's links, as in the exchange before
            return
        outs, ins = [a.neighbors for a in agents], [a.in_neighbors for a in agents]
        for i, r in own.items():
            outs[i], ins[i] = list(r[0]), list(r[1])
        want = {(i, j) for j, got in enumerate(ins) for i in got}
        stray = next(((i, j) for i, out in enumerate(outs) for j in out if (i, j) not in want), None)
        if stray is not None:
            raise ValueError(f"{type(kernel).__name__}.routes: agent {stray[0]} sends to {stray[1]}, which does not "
                             "wait for it (the message would stay queued): routes must agree")
        self._use(outs, ins)
        self.graph_links = not own

    def _made(self, senders: list[int]) -> None:
        """Every out-link, made in send order where not made yet (``Network.link``)."""
        net, outs = self.net, self.outs
        links = [None] * len(self.dst)
        for i in senders:
            for e, j in zip(range(self.ptr[i], self.ptr[i + 1]), outs[i], strict=True):
                links[e] = net.links.get((i, j)) or net.link(i, j)
        self.links = links
        lat = list({link.latency for link in links})  # a constant latency: one callable shared by every link
        self.latency = lat[0]() if len(lat) == 1 and not isinstance(lat[0], Draws) else None

    def _plan(self, ids: np.ndarray, ready: np.ndarray, computed: bool, n_rel: np.ndarray, lost) -> _Plan:
        """An exchange's index arrays (who sends on which link, where each row goes, which barriers complete): they
        depend on the agents' order, the senders' rows before their sends and the losses only, so a round of a static
        topology without loss reuses its round before's (``exchange``)."""
        M = len(self.tags)
        senders = ids[ready]
        B = len(ready)
        deg = self.deg[senders]
        E = int(deg.sum()) * M  # the sends
        by = np.repeat(np.arange(B), M * deg)  # each send's sender, as an index into ready
        first = np.cumsum(M * deg) - M * deg
        if M == 1:
            edge = np.repeat(self.ptr[senders] - first, deg) + np.arange(E)  # the out-links in send order
            mi = None
        else:
            at_s = np.arange(E) - first[by]
            mi = at_s // deg[by]  # each send's message
            edge = self.ptr[senders][by] + at_s - mi * deg[by]
        dst = self.dst[edge]
        if lost is None:
            lost = np.zeros(E, bool)
        # rows of each sender: a head (compute_end, releases), then per send a send (and drop): offsets by one cumsum
        head = n_rel + int(computed)
        lens = np.empty(B + E, np.int64)
        head_at = np.arange(B) + first  # the sender's head among the items, before its links
        link_at = np.arange(E) + by + 1
        lens[head_at], lens[link_at] = head, 1 + lost
        starts = np.cumsum(lens) - lens
        ok = ~lost  # deliveries, in send order
        to, src = dst[ok], by[ok]
        # a barrier completes on its expected count's delivery: its last (one message per link and exchange)
        count = np.bincount(to, minlength=len(self.agents))
        seq = np.argsort(to, kind="stable")
        ends = np.flatnonzero(np.r_[to[seq][1:] != to[seq][:-1], True]) if len(to) else np.zeros(0, np.int64)
        last = np.sort(seq[ends])  # each receiver's last delivery, in delivery order
        last = last[count[to[last]] == M * self.expect[to[last]]]
        complete = np.zeros(len(self.agents), bool)
        complete[to[last]] = True
        out_ = ~complete[senders]  # the barriers, set in ready order, that time out
        pos = np.empty(len(self.agents), np.int64)
        pos[ids] = np.arange(len(ids))
        w_ok = self.w[edge][ok]
        made = head + M * deg + np.bincount(by, weights=lost, minlength=B).astype(np.int64)
        return _Plan(senders, by, mi, edge, dst, lost, int(lens.sum()), starts[head_at], starts[link_at], ok, to, src,
                     (to[last], last), (senders[out_], out_), (self.expect - count).astype(np.float64), pos,
                     (pos[to], ready[src]), w_ok, made, ids.tolist())

    def exchange(self, b, rows: RoundRows, ids: np.ndarray, ready: np.ndarray, t_ready: np.ndarray, rnd: int,
                 computed: bool, released: dict | None):
        """Exchange ``rnd``: the agents at batch positions ``ready`` send, in that order, at ``t_ready``; each one's
        rows are its ``compute_end`` (``computed``) and its releases (``released``, first exchange), then per
        out-link a ``send`` and, when lost, a ``drop``. Then the deliveries in send order, then the ``timeout`` of
        each barrier not complete, in the order the barriers were set (``ready``). Returns what arrived
        (``Arrivals``), the barriers done ((agents, times) in completion order: at their last delivery) and the
        timed-out ones (agents, times)."""
        from netsim.trace.io import row_columns

        net, words = self.net, self.words
        if self.links is None:
            self._made(ids[ready].tolist())
        M = len(self.tags)  # messages per out-link: sender by sender, message by message, link by link
        outs = [(b.out, b.sizes), *(b.more or ())]
        if len(outs) != M:
            raise ValueError(f"an exchange of {M} messages ({', '.join(self.tags)}) with {len(outs)} sent")
        rel = [] if not released else [released.pop(n, ()) for n in ready.tolist()]
        n_rel = np.array([len(r) for r in rel], np.int64) if rel else np.zeros(len(ready), np.int64)
        # the plan of the round before where the agents' order and the rows before the sends match (its losses
        # aside: with loss, the plan is made again once the round's are drawn)
        key = (ids.tobytes(), ready.tobytes(), computed, n_rel.tobytes())
        plan, _ = self._plans.get(key, (None, 0))
        if plan is None:
            plan = self._plan(ids, ready, computed, n_rel, None)
            size = plan.nbytes() + sum(map(len, key[:2]))  # (its key's bytes included)
            if size <= PLAN_CACHE:  # kept for the rounds that match (a big fleet's plans are made again instead)
                if len(self._plans) > 8 or sum(z for _, z in self._plans.values()) + size > PLAN_CACHE:
                    self._plans.clear()
                self._plans[key] = (plan, size)
        edge = plan.edge
        t = t_ready[plan.by]
        if self.latency is not None:  # one constant: ``network.delay`` with nothing to transmit (tx_end = now)
            delay = link_delay(t, t, self.latency)
        else:
            links = self.links
            delay = link_delay(t, t, np.array([links[e].latency() for e in edge.tolist()], np.float64))
        if net.p_loss > 0:  # each link's own loss stream, one draw per message in send order
            links = self.links
            lost = np.array([links[e].lost() for e in edge.tolist()], np.float64) < net.p_loss
            if lost.any():
                plan = self._plan(ids, ready, computed, n_rel, lost)
        senders, by, mi, dst, lost = plan.senders, plan.by, plan.mi, plan.dst, plan.lost
        B, E = len(ready), len(edge)
        msg = net.take_ids(E) + np.arange(E, dtype=np.int64)
        # one payload per out-neighbour (``Agent.send_each``); a tensor's rows (``RowViews``) are not: asking its
        # first row would make a view of every row (~0.4 ms a thousand agents, each round)
        each = M == 1 and B > 0 and type(b.out) is not RowViews and isinstance(b.out[0], dict)
        tag = words(self.tags[0])
        if each:
            try:
                per = [b.out[n][j] for n, j in zip(ready[by].tolist(), dst.tolist(), strict=True)]
            except KeyError:
                raise RuntimeError("synchronous windows: an agent sends nothing to an out-neighbour (refusal should "
                                   "have said so)") from None
            size = np.array([payload_size(x) for x in per] if b.sizes is None else b.sizes, np.int64)
            size = size if b.sizes is None else size[ready[by]]
        elif M == 1:
            size = np.array(b.sizes if b.sizes is not None else [payload_size(o) for o in b.out], np.int64)[ready[by]]
        else:
            sized = [np.array(z if z is not None else [payload_size(o) for o in out], np.int64) for out, z in outs]
            size = np.stack(sized)[mi, ready[by]]
            tag = np.array([words(x) for x in self.tags], np.int32)[mi]
        c = columns(plan.n_rows)
        h = plan.h
        if computed:
            fill(c, h, shapes.compute_end(t_ready, senders, CODES))
        if rel and n_rel.any():
            flat = [r for rs in rel for r in rs]
            at = np.repeat(h + int(computed) - (np.cumsum(n_rel) - n_rel), n_rel) + np.arange(len(flat))
            for col, values in zip(c, row_columns(flat, words), strict=True):
                col[at] = values
        at = plan.at
        fill(c, at, shapes.send(t, senders[by], dst, msg, size, delay, rnd, tag, CODES))
        if lost.any():
            d = at[lost] + 1
            fill(c, d, shapes.drop(t[lost], senders[by][lost], dst[lost], msg[lost], size[lost], delay[lost], rnd,
                                   CODES.loss, CODES))
        rows.add(tuple(c))
        ok, to, src = plan.ok, plan.to, plan.src
        arr, sent = (t + delay)[ok], t[ok]
        c = columns(len(arr))
        fill(c, slice(None), shapes.deliver(arr, to, senders[src], msg[ok], size[ok], sent, rnd,
                                            tag if M == 1 else tag[ok], CODES))
        rows.add(tuple(c))
        done = (plan.done[0], arr[plan.done[1]])
        late_ids, out_ = plan.late
        if M > 1 and len(late_ids):
            raise RuntimeError("synchronous windows: a barrier of several messages times out (refusal should have "
                               "said so)")
        late = (late_ids, t_ready[out_] + self.timeout)
        c = columns(len(late_ids))
        fill(c, slice(None), shapes.timeout(late[1], late[0], rnd, plan.missing[late[0]], CODES))
        rows.add(tuple(c))
        pos = plan.pos
        if each:  # each delivery its own payload
            got = Arrivals(senders[src].tolist(), [per[e] for e in np.flatnonzero(ok).tolist()], None, plan.arrivals[0],
                           np.arange(len(to)), plan.w, receivers=len(ids))
        elif M == 1:
            got = Arrivals(list(plan.id_list), b.out, b.sent, *plan.arrivals, plan.w)
        else:  # one ``got`` per message
            m_ok, w_ok = mi[ok], plan.w
            got = tuple(Arrivals(ids.tolist(), out, b.sent if m == 0 else None, pos[to[m_ok == m]],
                                 ready[src[m_ok == m]], w_ok[m_ok == m]) for m, (out, _) in enumerate(outs))
        if self.views is not None:  # what each receiver got, in delivery order
            if M > 1:
                raise RuntimeError("synchronous windows: privacy.record with several messages an exchange (refusal "
                                   "should have said so)")
            self.views.deliver_rows(to, senders[src], rnd, arr, self.tags[0], got.payloads())
        # what the round's evaluations are placed by (rounds/curves.py): each sender's rows, the deliveries
        self.made = (plan.made, arr, src, pos)
        return got, done, late


@attrs.frozen
class _Plan:
    """``Exchange._plan``'s arrays (never written: shared by the rounds that reuse them)."""

    senders: np.ndarray
    by: np.ndarray
    mi: np.ndarray | None
    edge: np.ndarray
    dst: np.ndarray
    lost: np.ndarray
    n_rows: int
    h: np.ndarray  # each sender's head row
    at: np.ndarray  # each send's row
    ok: np.ndarray
    to: np.ndarray
    src: np.ndarray
    done: tuple  # (the completed barriers' agents, each one's last delivery), in completion order
    late: tuple  # (the agents whose barriers time out, their batch positions), in ready order
    missing: np.ndarray  # per agent: its barrier's messages not arrived
    pos: np.ndarray
    arrivals: tuple  # (each arrival's receiver position, its sender's), for ``Arrivals``
    w: np.ndarray
    made: np.ndarray
    id_list: list

    def arrays(self) -> list[np.ndarray]:
        out = []
        for v in attrs.astuple(self, recurse=False):
            out += [x for x in (v if isinstance(v, tuple) else (v,)) if isinstance(x, np.ndarray)]
        return out

    def __attrs_post_init__(self) -> None:
        for v in self.arrays():
            v.setflags(write=False)

    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.arrays())


def _evaluate(svc, ids: list[int], at: torch.Tensor, rows: list, reqs: list) -> torch.Tensor:
    """The gradients of a batch's requests (agent n's at ``at[n]`` on ``rows[n]``, as asked by ``reqs[n]``), as the
    events engine's one flush of them computes them: one block where they share a length and a clipping, else
    request by request (the service groups them as it grouped the engine's)."""
    r0 = reqs[0]
    m = len(rows[0])
    if (reqs.count(r0) == len(reqs) or all(r.clip == r0.clip and r.clip_kind == r0.clip_kind for r in reqs)) and (
            isinstance(rows, np.ndarray) or all(len(r) == m for r in rows)):
        blk = svc.submit_block(ids, at, rows, r0.clip, r0.clip_kind)
        svc.flush()
        return blk.result
    tickets = [svc.submit(i, a, r, q.clip, q.clip_kind) for i, a, r, q in zip(ids, at.unbind(0), rows, reqs,
                                                                              strict=True)]
    svc.flush()
    import torch

    return torch.stack([t.result for t in tickets])


def _wave(svc, w, ids: np.ndarray, pos: np.ndarray, B: int, g: torch.Tensor | None = None) -> torch.Tensor:
    """The gradients of wave ``w`` asked by agents ``ids`` at batch positions ``pos`` (``_evaluate``), as the batch's
    B rows (``g``: the rows of the wave's other agents, filled in place; zeros where none asked)."""
    import torch

    if len(pos) == B and (pos == np.arange(B)).all():  # the batch's rows as they stand: no copies
        return _evaluate(svc, ids.tolist(), w.at, w.rows, [w] * B)
    sel = torch.from_numpy(pos)
    res = _evaluate(svc, ids.tolist(), w.at.index_select(0, sel.to(w.at.device)), [w.rows[n] for n in pos.tolist()],
                    [w] * len(ids))
    if len(pos) == B:  # every row, in another order: one gather back, not zeros and a scatter
        return res.index_select(0, torch.from_numpy(np.argsort(pos)).to(res.device))
    if g is None:
        g = w.at.new_zeros((B, *res.shape[1:]), dtype=res.dtype)
    return g.index_copy_(0, sel.to(res.device), res)


def _round_times(sc, timeout: float, rounds: int) -> str | None:
    """With lossy links an agent wakes from its barrier either when its last message arrives (D) or when the
    barrier times out (T); the engine orders the next round by time first, so both must give the very same
    float activation time in every round (and so the same compute end, arrivals and timeout). Checked on
    the scalar times before the run: None if they do. (They do whenever the next tick is within twice the
    wake time, by Sterbenz's lemma: ``w + (tick - w)`` is then exactly ``tick``; the check costs nothing.)"""
    ag = sc.agents
    period, ct = ag.activation.period, float(ag.compute_time.value) * 1.0
    lat = float(sc.network.latency.value)
    from_d, from_t = Periodic(period, 0.0), Periodic(period, 0.0)
    d = t = 0.0
    for r in range(rounds):
        at_d, at_t = from_d.next(0.0 + 1.0 * d), from_t.next(0.0 + 1.0 * t)
        a_d, a_t = d + max(0.0, (at_d - 0.0) / 1.0 - d), t + max(0.0, (at_t - 0.0) / 1.0 - t)
        if at_d != at_t or a_d != a_t:
            return (f"round {r + 1}: agents woken by their last message and by the barrier's timeout would "
                    f"activate at different float times ({a_d!r} / {a_t!r}) — change agents.activation.period or "
                    "algorithm.round_timeout, or set network.loss = 0")
        c = a_d + ct
        d, t = c + link_delay(c, c, lat), c + timeout
    return None


def _direct_gradient(kernel):
    """``kernel.gradient`` where ``asks`` is SyncKernel's and asks it every round (both engines then call it
    directly: a call less an agent-round), else None (``asks`` it is)."""
    return kernel.gradient if type(kernel).asks is SyncKernel.asks and not kernel.first_gradient else None


def _combine_steps(kernel) -> bool:
    """Whether the kernel's ``combine`` is a generator (gradients after the exchange)."""
    import inspect

    return inspect.isgeneratorfunction(type(kernel).combine)


# the bytes of exchange plans kept for later rounds (``Exchange.exchange``): a small fleet's round is mostly its fixed
# cost, which a kept plan saves; a big fleet's plan (~300 MB at 10^6 agents on a ring) is made again each round
PLAN_CACHE = 16 << 20
_TIMELINE_ROUNDS = 200_000  # (a scalar round costs ~2 µs to play before the run)


def _timeline(sc, timeout: float, before: bool | int, after: bool | float, limit: int | None) -> str | None:
    """The rounds' times, played on scalars before the run (as ``_round_times``): each round's activation, sends
    (after a compute time when the kernel takes its gradient ``before`` the exchange: True, every round; an int, the
    first rounds only), barrier completion by the last delivery (D) or by the timeout (T, lossy links), and the wake
    after a compute time when it takes gradients ``after`` it (a float: that many seconds after it, e.g. gradients
    and a further exchange). None if the driver's rules decide the engine's order: with lossy links, D and T lead to
    the same float activation; with ``after``, no evaluation falls inside a round; run.until (without run.rounds)
    falls at a round's activation or between two rounds. ``limit``: the round limit (``round_limit``; None: run.until
    ends the run). Else the one line of the first that does not hold."""
    ag, r = sc.agents, sc.run
    period, ct = ag.activation.period, float(ag.compute_time.value) * 1.0
    lat, lossy = float(sc.network.latency.value), bool(sc.network.loss)
    until = r.until if r.rounds is None else None
    n = limit if limit is not None else int(until / period) + 2
    n = n if until is None else min(n, int(until / period) + 2)
    if until is not None and n > _TIMELINE_ROUNDS:
        return (f"run.rounds is not set and run.until = {until:g} spans {n} rounds, more than the {_TIMELINE_ROUNDS} "
                "whose times are checked before the run — set run.rounds")
    every = float(sc.evaluation.every)
    T_prev, T = 0.0, every  # the evaluator's previous and next times
    from_d, from_t = Periodic(period, 0.0), Periodic(period, 0.0)
    d = t = 0.0  # where the agents call wake (D: their barrier completed, T: it timed out)
    end = -1.0  # the last round's last event
    for k in range(n):
        at_d, at_t = from_d.next(0.0 + 1.0 * d), from_t.next(0.0 + 1.0 * t)
        a_d, a_t = d + max(0.0, (at_d - 0.0) / 1.0 - d), t + max(0.0, (at_t - 0.0) / 1.0 - t)
        if lossy and (at_d != at_t or a_d != a_t):
            return (f"round {k}: agents waking after a completed and after a timed-out barrier would activate at "
                    f"different float times ({a_d!r} / {a_t!r}) — change agents.activation.period or "
                    "algorithm.round_timeout, or set network.loss = 0")
        if until is not None and a_d >= until:
            if end >= until:
                return (f"run.until = {until:g} falls inside round {k - 1} (its last event at {end!r}) — give "
                        "run.until at an activation tick or between two rounds, or set run.rounds")
            break
        woke = min(d, t) if lossy else d  # where round k's wake was called (the activation's parent)
        s = a_d + ct if before is True or before > k else a_d
        d, t = s + link_delay(s, s, lat), s + timeout
        if after is not False:
            gap = ct if after is True else float(after)
            d, t = d + gap, t + gap
        end = max(d, t) if lossy else d
        while after is not False and T <= end and (until is None or T < until):  # the evaluations up to the round's end
            if T > a_d or T == a_d and not (k > 0 and T_prev < woke):  # (at the activation: first by its parent)
                return (f"evaluation.every = {every:g}: the evaluation at {T!r} falls inside round {k}, whose "
                        "gradients come after the exchange — give evaluation.every a multiple of "
                        "agents.activation.period")
            T_prev, T = T, T + every
    return None


def _local_steps(kernel) -> bool:
    """Whether the kernel's ``local`` is a generator (local steps with their own gradients)."""
    import inspect

    return inspect.isgeneratorfunction(type(kernel).local)


class LocalAhead:
    """The events engine's batched ``local``: the agents whose gradients come back at the same time (one flush of
    the gradient service, every completion at this instant) run ``local`` as one batch when the first of them
    resumes; each then takes its row (``Batch.row``) and the trace rows its ``local`` made (its releases), emitted
    where its own program would have made them. Exact: ``local`` is row-wise, an agent's state is its own, and
    nothing of those agents changes between the first resume and theirs (they are suspended until this instant).
    So the events engine batches a round's compression and noise as the windowed driver does."""

    def __init__(self, kernel, p, state):
        self.kernel, self.p, self.state = kernel, p, state
        # completion time -> {agent id: (agent, x, its gradient's completion, round)}, in the order they asked: an
        # instant's group is found without a scan of every waiting agent (asynchronous runs have one per instant)
        self.pending: dict[float, dict[int, tuple]] = {}
        self.done: dict[int, tuple[Batch, list]] = {}  # agent id -> (its batch of one, its rows)

    def ask(self, agent, x, ev, k: int) -> None:
        self.pending.setdefault(ev.at, {})[agent.id] = (agent, x, ev, k)

    def take(self, agent) -> Batch:
        got = self.done.pop(agent.id, None)
        if got is None:
            self._run(agent)
            got = self.done.pop(agent.id)
        b, rows = got
        if rows:
            agent.sim.recorder.writer.emit_rows(rows)
        return b

    def _run(self, first) -> None:
        now = first.env.now
        waiting = self.pending[now]
        k = waiting[first.id][3]
        group = [e for e in waiting.values() if e[2].ticket.result is not None and e[3] == k]
        for a, *_ in group:
            del waiting[a.id]
        if not waiting:
            del self.pending[now]
        if len(group) == 1:  # alone at this instant: its own batch of one, its rows made where it runs
            _, x, ev, _ = group[0]
            g = ev.ticket.result
            b = Batch([first], k, x[None], g[None], self.state, rows=((x,), (g,)))  # [None]: unsqueeze(0), cheaper
            self.kernel.local(b, self.p)
            self.done[first.id] = (b, [])
            return
        import torch

        agents = [a for a, *_ in group]
        rows: list[list] = [[] for _ in group]
        x = torch.stack([e[1] for e in group])
        g = torch.stack([e[2].ticket.result for e in group])
        b = Batch(agents, k, x, g, self.state, at=lambda n: (now, rows[n]))
        self.kernel.local(b, self.p)
        for n, a in enumerate(agents):
            self.done[a.id] = (b.row(n, self.kernel.per_row), rows[n])
