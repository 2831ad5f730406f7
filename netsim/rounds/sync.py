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

from collections.abc import Generator
from typing import TYPE_CHECKING

import attrs

from netsim.rounds.kernel import Batch, drive
from netsim.sim.activation import Periodic
from netsim.sim.loop import Between
from netsim.sim.network import payload_size

if TYPE_CHECKING:  # torch is imported where it is used: a kernel's module (its Params) loads without it
    import torch


@attrs.frozen
class SyncRounds:
    """The pattern: messages tagged ``tag``, round k's barrier waits ``params.round_timeout`` seconds."""

    tag: str = "model"
    reads: frozenset[str] = frozenset({"round_timeout"})

    def program(self, kernel, agent, p) -> Generator:
        """One agent's rounds in the events engine (a batch of one)."""
        state = kernel.state_of(agent, p)
        ahead = None if _local_steps(kernel) or not kernel.batch_local else \
            agent.service((LocalAhead, kernel), lambda: LocalAhead(kernel, p, state))
        one = [agent]
        k = 0
        while True:
            yield agent.wake()
            x = agent.params
            req = kernel.gradient(p, state, agent.id)
            if req is not None and ahead is not None:  # ``local`` batched with the agents done at the same time
                ev = agent.gradient(batch=req.batch, params=x, clip=req.clip, clip_kind=req.clip_kind)
                ahead.ask(agent, x, ev, k)
                yield ev
                b = ahead.take(agent)
            else:
                g1 = None
                if req is not None:
                    g1 = yield agent.gradient(batch=req.batch, params=x, clip=req.clip, clip_kind=req.clip_kind)
                b = Batch(one, k, x.unsqueeze(0), None if g1 is None else g1.unsqueeze(0), state,
                          rows=((x,), None if g1 is None else (g1,)))
                local = kernel.local(b, p)
                if local is not None:  # local steps: each wave of gradients is this agent's request
                    yield from drive(agent, local)
            steps = kernel.exchanges(p, state)
            for s in range(steps):  # the round's exchanges, each a barrier (messages tagged round k * steps + s)
                b.s = s
                size = None if b.sizes is None else b.sizes[0]
                rnd = b.k * steps + s
                route = kernel.routes(b, p)
                yield agent.broadcast(b.out[0], tag=self.tag, round=rnd, size=size,
                                      to=None if route is None else route[0])
                got = yield agent.gather(tag=self.tag, round=rnd, timeout=p.round_timeout,
                                         senders=None if route is None else route[1])
                kernel.combine(b, p, [got])
            k += 1

    # the windowed driver ------------------------------------------------------------------------------
    def refusal(self, sim, kernel) -> str | None:
        """Why the rounds of this built simulation are not exact windows for this driver (None: they are)."""
        sc, p = sim.world.scenario, sim.params
        lat = sc.network.latency
        if lat.kind != "constant":
            return "links do not have one constant latency (the barrier orders agents by arrival)"
        state = kernel.state_of(sim.loop.agents[0], p)
        if any(kernel.gradient(p, state, a.id) is None for a in sim.loop.agents) and not _local_steps(kernel):
            return f"{sc.algorithm.name} takes no gradients with these parameters (its rounds have no compute phase)"
        why = kernel.refusal(sim, p)
        if why is not None:
            return why
        if sc.agents.compute_time.value + lat.value >= p.round_timeout:
            return "a round's messages can miss the barrier's timeout"
        if sc.network.loss:
            if kernel.exchanges(p, state) > 1:
                return ("several exchanges a round with lossy links: the barriers of one exchange would time out at "
                        "different times")
            return _round_times(sc, p.round_timeout)
        return None

    @staticmethod
    def _start(a, now: list, n: int, row) -> None:
        """Agent ``a``'s gradient request as ``Agent.gradient`` makes it (compute time, ``compute_start`` row), its
        clock moved to the completion."""
        ct = a._compute() * a.compute_scale
        row((now[n], "compute_start", a.id, -1, -1, 0, ct, -1, ""))
        now[n] = now[n] + ct

    def play(self, sim, kernel, rounds) -> None:
        """Play the run round by round (see the module docstring), from round 0 or from where a restored
        checkpoint stands (``rounds``: windowed.Rounds)."""
        import torch

        from netsim.trace.events import Finish, Timeout
        from netsim.trace.events import row as event_row

        p, agents, writer = sim.params, sim.loop.agents, sim.recorder.writer
        net, svc = sim.world.network, sim.world.gradients
        state = kernel.state_of(agents[0], p)
        limit = sim.world.scenario.run.rounds
        expect = [len(a.in_neighbors) for a in agents]
        outs: list[list | None] = [None] * len(agents)  # agent: [(out-neighbour, link)] (the topology is static)
        now0 = float(sim.loop.env.now)
        start = rounds.begin(Between(0, [(a.id, now0) for a in agents], now0))
        k, order = start.k, start.order  # order: (agent, when it called wake)
        mid = net.next_id
        tag = self.tag
        while True:
            rows: list[tuple] = []
            row = rows.append
            acts = rounds.wake(order)
            ids = [i for _, _, i, _ in acts]
            X = sim.world.bank.W  # each agent's params as the engine snapshots them at its activation
            x = X.index_select(0, torch.tensor(ids, device=X.device))
            now = [t for t, *_ in acts]  # each agent's clock where its program runs on
            hook = [kernel.gradient(p, state, i) for i in ids]  # the gradient asked for before ``local``
            if any(r is None for r in hook) and not all(r is None for r in hook):
                raise ValueError("windowed rounds need every agent to ask for the round's first gradient, or none")
            hook = hook if hook[0] is not None else None
            released: dict[int, list[tuple]] = {}  # agent n's rows made inside ``local`` (its releases)
            pending: set[int] = set()  # agents whose gradient is out: their compute_end row is due
            xs = x.unbind(0)  # the rows of x: one unbind, no indexing per agent
            g = None
            if hook is not None:  # activate, then the gradient request
                asks = []
                for n, ((t_act, _, i, at_tick), req) in enumerate(zip(acts, hook, strict=True)):
                    a = agents[i]
                    row((t_act, "activate", i, -1, -1, 0, at_tick, a.round, ""))
                    self._start(a, now, n, row)
                    asks.append(a.sample_rows(req.batch))
                g = _evaluate(svc, ids, x, asks, hook)  # every request in one batched call (the first completion)
                pending = set(range(len(acts)))

            def at(n: int, now=now, released=released):  # the agent's clock when its program runs on, its rows
                return now[n], released.setdefault(n, [])

            b = Batch([agents[i] for i in ids], k, x, g, state, at, rows=(xs, None))
            sim.loop.env.advance_to(acts[0][0])  # local starts at the activation (every agent's: one tick)
            local = kernel.local(b, p)
            if local is not None:
                try:
                    w = next(local)
                    while True:  # a wave: per agent, its compute_end (or activation), its releases, its request
                        for n in range(len(acts)):
                            i = ids[n]
                            if n in pending:
                                row((now[n], "compute_end", i, -1, -1, 0, 0.0, -1, ""))
                            elif hook is None:  # the first wave: the activation that led to it
                                t_act, _, _, at_tick = acts[n]
                                row((t_act, "activate", i, -1, -1, 0, at_tick, agents[i].round, ""))
                            rows += released.pop(n, ())
                            self._start(agents[i], now, n, row)
                        pending = set(range(len(acts)))
                        w = local.send(_evaluate(svc, ids, w.at, w.rows, [w] * len(ids)))
                except StopIteration:
                    pass
            if hook is None and not pending:
                raise ValueError("windowed rounds need a compute phase (a gradient) every round")
            done_at = now
            steps = kernel.exchanges(p, state)
            ready = [(n, t) for n, t in enumerate(done_at)]  # (batch position, when it sends), in the engine's order
            for s in range(steps):  # the round's exchanges; after the first, each agent sends when its barrier is done
                rnd = b.k * steps + s
                sends = []
                for n, t_done in ready:  # compute_end and releases (first exchange), the sends
                    i = ids[n]
                    if s == 0:
                        if n in pending:
                            row((t_done, "compute_end", i, -1, -1, 0, 0.0, -1, ""))
                        if released:
                            rows += released.pop(n, ())
                    size = payload_size(b.out[n]) if b.sizes is None else b.sizes[n]
                    out = outs[i]
                    if out is None:  # the agent's links, made at its first send as the engine makes them
                        out = outs[i] = [(j, net.links.get((i, j)) or net.link(i, j)) for j in agents[i].neighbors]
                    for j, link in out:
                        delay = t_done - t_done + link.latency()
                        row((t_done, "send", i, j, mid, size, delay, rnd, tag))
                        if link.lost is not None and link.lost() < net.p_loss:
                            row((t_done, "drop", i, j, mid, size, delay, rnd, "loss"))
                        else:
                            sends.append((t_done + delay, n, j, mid, size, t_done))
                        mid += 1
                got: list[dict] = [{} for _ in agents]
                done = []
                for t_arr, n, j, m, size, sent in sends:  # deliveries in send order; a barrier completes on its last
                    i = ids[n]
                    row((t_arr, "deliver", j, i, m, size, t_arr - sent, rnd, tag))
                    gj = got[j]
                    gj[i] = b.out[n]
                    if len(gj) == expect[j]:
                        done.append((j, t_arr))
                complete = {j for j, _ in done}
                late = []  # the barriers that time out, in the order their timers were set (the gathers' order)
                for n, t_done in ready:
                    i = ids[n]
                    if i not in complete:
                        t_out = t_done + p.round_timeout
                        late.append((i, t_out))
                        row(event_row(Timeout(t_out, i, rnd, float(expect[i] - len(got[i])))))
                order = done + late  # who goes on first: the barriers done at the last arrival, then the timed-out
                b.s = s
                if s + 1 < steps:
                    kernel.combine(b, p, [got[i] for i in ids])
                    pos = {i: n for n, i in enumerate(ids)}
                    ready = [(pos[i], t) for i, t in order]
            end = order[-1][1]
            last = agents[order[0][0]].round >= limit  # every agent is at the limit together
            if last:  # waking, each finishes: those done at the last arrival before the timeouts fire
                cut = len(rows) - len(late)
                rows[cut:cut] = [event_row(Finish(w, i, agents[i].round)) for i, w in done]
                rows += [event_row(Finish(w, i, agents[i].round)) for i, w in late]
                for i, _ in order:
                    agents[i].finished = True
                    sim.agent_finished()
            writer.emit_rows(rows)
            kernel.combine(b, p, [got[i] for i in ids])
            if last:
                break
            k += 1
            net.next_id = mid
            if rounds.between(Between(k, order, end)):  # interrupted: the run stops here, between two rounds
                return
            if sim.recorder.progress is not None:
                sim.recorder.progress(end)
        net.next_id = mid
        sim.loop.env.advance_to(end)  # the engine's clock where its last event happened (the run's end)


def _evaluate(svc, ids: list[int], at: torch.Tensor, rows: list, reqs: list) -> torch.Tensor:
    """The gradients of a batch's requests (agent n's at ``at[n]`` on ``rows[n]``, as asked by ``reqs[n]``), as the
    events engine's one flush of them computes them: one block where they share a length and a clipping, else
    request by request (the service groups them as it grouped the engine's)."""
    r0 = reqs[0]
    m = len(rows[0])
    if all(r.clip == r0.clip and r.clip_kind == r0.clip_kind for r in reqs) and all(len(r) == m for r in rows):
        blk = svc.submit_block(ids, at, rows, r0.clip, r0.clip_kind)
        svc.flush()
        return blk.result
    tickets = [svc.submit(i, a, r, q.clip, q.clip_kind) for i, a, r, q in zip(ids, at.unbind(0), rows, reqs,
                                                                              strict=True)]
    svc.flush()
    import torch

    return torch.stack([t.result for t in tickets])


def _round_times(sc, timeout: float) -> str | None:
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
    for r in range(sc.run.rounds):
        at_d, at_t = from_d.next(0.0 + 1.0 * d), from_t.next(0.0 + 1.0 * t)
        a_d, a_t = d + max(0.0, (at_d - 0.0) / 1.0 - d), t + max(0.0, (at_t - 0.0) / 1.0 - t)
        if at_d != at_t or a_d != a_t:
            return (f"round {r + 1}: agents woken by their last message and by the barrier's timeout would "
                    f"activate at different float times ({a_d!r} / {a_t!r})")
        c = a_d + ct
        d, t = c + ((c - c) + lat), c + timeout
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
            b = Batch([first], k, x.unsqueeze(0), ev.ticket.result.unsqueeze(0), self.state)
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
            self.done[a.id] = (b.row(n), rows[n])
