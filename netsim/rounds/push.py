"""Push to one peer: each activation, merge every model that arrived since the last one (in arrival order), with
an update after each merge the kernel asks for one, then push the model to one random out-neighbour and go on
(Ormándi, Hegedűs, Jelasity, "Gossip learning with linear models on fully distributed data", 2013,
Algorithm 1's skeleton). Nothing waits, so there are no timeouts.

``program`` is the events engine's generator for one agent; ``play`` the windowed driver of synchronous ticks,
``play_lookahead`` that of agents on their own clocks (rounds/lookahead.py). ``play``'s ordering rules
(docs/architecture.md, "Round kernels"), within a tick: each agent in wake order is activated and takes what
arrived; an agent with nothing to merge pushes at once; the others ask for their first gradient
(``compute_start``); the gradients come back after the compute time in the order they were asked for, each
followed by the agent's next request or, done, its push; the peer is drawn from the agent's own stream
(256 at a time) and each push draws its link's latency and loss in push order; every push lands after the
last gradient and before the next tick, delivered in (arrival time, send) order. The tensor work is batched
slot by slot: every agent's s-th merge in one call, then their s-th update's gradients in one batch.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from netsim.comm.patterns import drain
from netsim.rounds.kernel import LOOKAHEAD, Batch, GradientRequest, Path, Pattern, RoundKernel
from netsim.sim import rows as shapes
from netsim.sim.loop import Between, Order
from netsim.sim.network import payload_size

if TYPE_CHECKING:  # torch is imported where it is used: an algorithm's module (its Params) loads without it
    import torch


class Peers:
    """An agent's random out-neighbours, from its own stream (``agent.rng()``), as both engines draw them: on a
    fixed topology 256 indices at a time against its degree (one call, not 256); when a time-varying topology
    changes the links at activations (``agent.links_change``), one index per push against that push's
    neighbours. ``held``: the indices drawn ahead, next last (a windowed checkpoint keeps them)."""

    __slots__ = ("rng", "fixed", "held")

    def __init__(self, rng, fixed: bool, held: list[int] | None = None):
        self.rng, self.fixed = rng, fixed
        self.held: list[int] = [] if held is None else held

    def __call__(self, nb: list[int]) -> int:
        return nb[self.slot(len(nb))]

    def slot(self, n: int) -> int:
        """The next peer's place among the ``n`` neighbours."""
        if not self.fixed:
            return int(self.rng.integers(n))
        held = self.held
        if not held:
            held.extend(self.rng.integers(n, size=256).tolist()[::-1])
        return held.pop()


class PushKernel(RoundKernel):
    """An algorithm of push gossip (``PushGossip``): per activation and received model, ``combine`` merges the model
    into each row (``received``: the (B, P) rows of the models, row n agent n's), and ``update_after`` says whether a
    gradient step follows receipt ``n`` of ``received``; ``update`` applies it (``g``: the (B, P) gradients at the
    rows as they were asked for). Both work on ``b.x`` in place or by assigning it; a batch's agents may be at
    different activations (``b.rounds()``)."""

    def update_after(self, p: Any, n: int, received: int) -> GradientRequest | None:
        """The gradient to take after merging receipt ``n`` (1-based) of the ``received`` models of an activation
        (None: no update then)."""
        return None

    def combine(self, b: Batch, p: Any, received: torch.Tensor) -> None:
        """Merge one received model into each row of ``b.x``."""
        raise NotImplementedError

    def update(self, b: Batch, p: Any, g: torch.Tensor) -> None:
        """The gradient step of each row of ``b.x``."""
        raise NotImplementedError


@attrs.frozen
class PushGossip(Pattern):
    """The pattern: models tagged ``tag``; the kernel's ``combine`` merges one received model into each row,
    ``update_after`` says after which receipts an update (a gradient, then ``update``) follows."""

    kernel: ClassVar[type] = PushKernel
    lookahead: ClassVar[bool] = True
    tag: str = "gossip"
    reads: frozenset[str] = frozenset()
    restores: ClassVar[bool] = True  # its lookahead windows' checkpoints are restored (rounds/lookahead.py)

    def program(self, kernel, agent, p) -> Generator:
        state = kernel.state_of(agent, p)
        peer = Peers(agent.rng(), not agent.links_change)
        one = [agent]
        while True:
            yield agent.wake()
            got = drain(agent, self.tag)
            x = agent.params  # a copy: the batch's row is a view of it, updated in place
            if got:
                b = Batch(one, agent.round, x.unsqueeze(0), None, state)
                for n, m in enumerate(got, 1):
                    kernel.combine(b, p, m.payload.unsqueeze(0))
                    req = kernel.update_after(p, n, len(got))
                    if req is not None:
                        g = yield agent.gradient(batch=req.batch, params=x)  # x is not written until g is back
                        kernel.update(b, p, g.unsqueeze(0))
                agent.params = x
            nb = agent.neighbors  # this activation's (a time-varying topology changes them)
            if nb:  # x is never written again: it can travel as the payload without a copy
                agent.send(peer(nb), x, tag=self.tag)

    # the windowed driver ------------------------------------------------------------------------------
    def refusal(self, sim, path: Path) -> str | None:
        """Why the run is not exact synchronous ticks for ``play`` (``ROUNDS``) or lookahead windows
        (``LOOKAHEAD``: rounds/lookahead.py); then the kernel's own reason."""
        from netsim.rounds import lookahead

        kernel = sim.program
        if path == LOOKAHEAD:  # (any latency: the tensor work is in dependency order)
            return lookahead.refusal(sim, kernel, bound=False) or kernel.refusal(sim, path)
        sc, p = sim.world.scenario, sim.params
        ag, lat = sc.agents, sc.network.latency
        low, top = {"constant": (lat.value, lat.value),
                    "uniform": (lat.low, lat.high)}.get(lat.kind, (None, None))
        if top is None:
            return (f"latency {lat.kind!r} has no upper bound: a message could land in a later round — use a uniform "
                    "or constant latency")
        ct = ag.compute_time.value
        if ct + top >= ag.activation.period:
            return ("a message can land after the next activation — make compute time + the largest latency "
                    "shorter than agents.activation.period")
        if low <= ct:
            return ("a message can land before the round's gradients are back (latency <= compute time) — make the "
                    "smallest latency longer than agents.compute_time")
        most = max(len(a.in_neighbors) for a in sim.loop.agents)  # at most one push per in-neighbour a round
        chain = sum(kernel.update_after(p, n, most) is not None for n in range(1, most + 1)) * ct
        if chain > ct and (chain + top >= ag.activation.period or low <= chain):
            return (f"an agent's gradients (one per receipt, up to {chain:g} s a round) and the pushes "
                    f"(latency {low:g} to {top:g} s) can interleave or cross a tick — lengthen "
                    "agents.activation.period or shorten agents.compute_time")
        return kernel.refusal(sim, path)

    def play_lookahead(self, sim, kernel) -> bool:
        """Asynchronous runs (Poisson, Bernoulli, drifting clocks): conservative lookahead windows."""
        from netsim.rounds import lookahead

        return lookahead.play(self, sim, kernel)

    def play(self, sim, kernel, rounds) -> None:
        """Play the run round by round, from round 0 or from where a restored checkpoint stands (``rounds``:
        windowed.Rounds; its ``held`` are the peers drawn ahead and the models that arrived)."""
        import torch

        world = sim.world
        p, agents, writer, net, bank, svc = (sim.params, sim.loop.agents, sim.recorder.writer, world.network,
                                             world.bank, world.gradients)
        state = kernel.state_of(agents[0], p)
        limit = sim.world.scenario.run.rounds
        outcome = net.lean().outcome  # the lean path (the windows refuse link models): latency, loss, in send order
        tag = self.tag
        rngs = [a.rng() for a in agents]  # the program's own stream, as the program takes it first
        now0 = float(sim.loop.env.now)
        start = rounds.begin(Between(0, Order.of((a.id, now0) for a in agents), now0,
                                     {"picks": [[] for _ in agents], "inbox": [[] for _ in agents]}))
        k, order = start.k, start.order
        peers = [Peers(r, not a.links_change, held) for r, a, held in zip(rngs, agents, start.held["picks"],
                                                                            strict=True)]
        inbox: list[list] = start.held["inbox"]  # payloads in arrival order since the last activation

        def push(i: int, x, now: float, rows: list, arrivals: list, a) -> None:
            """Agent i pushes and calls wake (at the round limit: finishes)."""
            j = peers[i](a.neighbors)
            size = payload_size(x)
            _, delay, reason = outcome(i, j, now, size)
            mid = net.take_ids(1)
            rows.append(shapes.send(now, i, j, mid, size, delay, a.round, tag))
            if reason:
                rows.append(shapes.drop(now, i, j, mid, size, delay, a.round, reason))
            else:
                arrivals.append((now + delay, mid, i, j, size, now, a.round, x))
            woke.append((i, now))
            if a.round >= limit and a.mark_finished():
                rows.append(shapes.finish(now, i, a.round))

        def batch(who: list[int], X: torch.Tensor) -> tuple[Batch, torch.Tensor]:
            idx = torch.tensor(who, device=X.device)
            return Batch([agents[i] for i in who], agents[who[0]].round, X.index_select(0, idx), None, state), idx

        while True:
            rows: list[tuple] = []
            arrivals: list = []
            woke: list = []  # (agent, when it calls wake): in the engine's order
            X = bank.W.clone()  # this round's x of every agent (each program's ``agent.params``)
            xs = X.unbind(0)
            merged, ends = [], []  # ends: (agent, when its first gradient is back) in request order
            asks: dict[int, int] = {}  # agent: gradients it asks for this round
            t_acts, ids, ats, _ = rounds.wake_all(order.who, order.when)
            for t_act, i, at in zip(t_acts.tolist(), ids.tolist(), ats.tolist(), strict=True):
                a = agents[i]
                rows.append(shapes.activate(t_act, i, at, a.round))
                got, inbox[i] = inbox[i], []
                if got:
                    merged.append((i, got))  # merged below, before anything reads x (the gradient, a receiver)
                    asks[i] = sum(kernel.update_after(p, n, len(got)) is not None for n in range(1, len(got) + 1))
                    if asks[i]:
                        ct = a.compute_time(t_act)
                        rows.append(shapes.compute_start(t_act, i, ct))
                        ends.append((i, t_act + ct))
                        continue
                push(i, xs[i], t_act, rows, arrivals, a)  # x as it will be once merged: payloads are read later
            # the tensor work in the engine's batches: wave q is every agent's q-th gradient (asked for at the same
            # time, so evaluated in one batch), after the merges before it; then the merges after the last update
            ups = {i: [n for n in range(1, len(g) + 1) if kernel.update_after(p, n, len(g)) is not None]
                   for i, g in merged}
            done = dict.fromkeys(ups, 0)  # receipts merged so far
            inbox_got = dict(merged)

            def merge_to(target: dict[int, int], X=X, done=done, inbox_got=inbox_got, merged=merged) -> None:
                _merge_to(kernel, p, batch, merged, inbox_got, done, target, X)

            for q in range(max((len(u) for u in ups.values()), default=0)):
                wave = [i for i, _ in merged if len(ups[i]) > q]
                merge_to({i: ups[i][q] for i in wave})
                b, idx = batch(wave, X)
                tickets = [svc.submit(i, xs[i], agents[i].sample_rows(kernel.update_after(
                    p, ups[i][q], len(inbox_got[i])).batch)) for i in wave]
                svc.flush()
                kernel.update(b, p, torch.stack([t.result for t in tickets]))
                X.index_copy_(0, idx, b.x)
            merge_to({i: len(g) for i, g in merged})
            if merged:  # agent.params = x, for every agent that merged
                idx = torch.tensor([i for i, _ in merged], device=X.device)
                bank.W.index_copy_(0, idx, X.index_select(0, idx))
            # the rows of the gradients' completions in time order (ties: the order they were requested), each
            # followed by the agent's next gradient request or its push
            left = {i: n - 1 for i, n in asks.items() if n}
            while ends:
                ends.sort(key=lambda e: e[1])  # stable: ties in request order
                nxt = []
                for i, t_done in ends:
                    a = agents[i]
                    rows.append(shapes.compute_end(t_done, i))
                    if left[i]:
                        left[i] -= 1
                        ct = a.compute_time(t_done)
                        rows.append(shapes.compute_start(t_done, i, ct))
                        nxt.append((i, t_done + ct))
                        continue
                    push(i, xs[i], t_done, rows, arrivals, a)
                ends = nxt
            end = max(t for _, t in woke)
            if agents[woke[0][0]].round >= limit:  # the run stops at the last finish: nothing after it happens
                writer.emit_rows(rows)
                break
            arrivals.sort(key=lambda e: (e[0], e[1]))  # by time, ties in send order
            for t_arr, m, i, j, size, sent, rnd, x in arrivals:
                rows.append(shapes.deliver(t_arr, j, i, m, size, sent, rnd, tag))
                inbox[j].append(x)
            writer.emit_rows(rows)
            order = Order.of(woke)
            k += 1
            held = {"picks": [pk.held for pk in peers], "inbox": inbox}
            if rounds.between(Between(k, order, end, held)):  # interrupted
                return
            if sim.recorder.progress is not None:
                sim.recorder.progress(end)
        sim.loop.env.advance_to(end)


def _merge_to(kernel, p, batch, merged: list, got: dict, done: dict, target: dict, X: torch.Tensor) -> None:
    """Merge each agent's next receipts until ``done[i]`` reaches ``target[i]``: one batch per step, in the order
    of ``merged`` (rows are independent, so agents at different receipts share a batch)."""
    import torch

    while True:
        who = [i for i, _ in merged if done[i] < target.get(i, 0)]
        if not who:
            return
        b, idx = batch(who, X)
        kernel.combine(b, p, torch.stack([got[i][done[i]] for i in who]))
        X.index_copy_(0, idx, b.x)
        for i in who:
            done[i] += 1
