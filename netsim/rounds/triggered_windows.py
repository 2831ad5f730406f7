"""Event-triggered sends (rounds/triggered.py) as conservative lookahead windows: ``--engine windowed`` for
event-triggered D-PSGD and SPARQ-SGD, byte for byte the events engine's trace, metrics and models.

The lookahead is push gossip's (rounds/lookahead.py): a message sent at t lands no earlier than t + L, so what an
activation of [T, T + L) absorbs was sent before T. What is new is that whether a message goes out depends on the
model. So the control plays the window's events with each activation's sends left undecided: a placeholder among
the window's rows, the simpy insertion numbers its messages' arrivals would take (one per out-neighbour, in
neighbour order: an unused one only leaves a gap, and the order of the others is the engine's) and the payload's
handle. The tensor work then runs every activation's operations in lock step (the gradient at the model as
activated; once it is back, the mix with the neighbour copies in ``compute.mixing``'s float operations, the
kernel's update; the send), and decides each (agent, out-neighbour) send by the trigger: the norms of a lock step
in one batched call, and every one within a relative 1e-3 of its threshold again by the engine's own call on the
two rows (``comm.triggers.Rule``), so no decision can differ from the engine's. After the tensor work the window's
decided sends are played in processing order (``decide``): message ids, the links' outcomes from their streams in
send order, the ``send``/``drop`` rows in the placeholders' places, the arrivals (all in later windows) and the
trigger counts of the summary. A send takes no time (links with bandwidth are refused), so when anything happens
never depends on a decision.

Event-triggered D-PSGD: payload rows are counted by who holds them: messages in flight, receivers' copies and
senders' last-sent references (``EventTrigger``'s); each agent's initial model is kept under the handle -1 - i (the
copies of neighbours that never sent, the last-sent reference before the first send). A private kernel's release
(``TriggeredKernel.noise``, DP-SGD's) is recorded by the control at the gradient's completion, as the engine's update
makes it: its ledger entry and row right after ``compute_end`` (``AgentLedger.record`` with ``at``; a budget cap's
refusal traced there, and the agent asks for no gradient from then on); the kernel's ``b.privatize`` in the tensor
work then only draws the noise, each agent's from its own generator in its order (``Batch.recorded``). An update's
batch gives each agent's activation count at its completion (``Batch.counts``: LAG's decaying threshold).
SPARQ-SGD: its copies are the run's ``PublicCopyRows`` (sums of the q's received, in arrival order), a q's row is
held by its messages until added; an agent's operations (receive, gradient, step, receive, push) run one per lock
step (``in_order``), the push deciding the trigger on ||x - xhat_i||, compressing where it fires (each agent's own
stream) and taking the consensus step for all.
"""

from __future__ import annotations

import torch

from netsim.comm.triggers import Rule
from netsim.compute.mixing import mix_rows
from netsim.rounds.broadcast_windows import ASK, MERGE, PUSH, UPDATE
from netsim.rounds.broadcast_windows import _Driver as BroadcastDriver
from netsim.rounds.lookahead import ARR, WindowDriver, per_agent
from netsim.rounds.triggered import TriggeredDeltas
from netsim.trace.io import RECORD, PackedRows

_UNDECIDED = bytes(RECORD.size)  # a placeholder row (replaced before the rows are written)
_CLOSE = 1e-3  # a batched norm this close (relative) to its threshold is decided again by the engine's call


def play(pattern, sim, kernel) -> bool:
    """Play a started run to its end window by window (see the module docstring); True when an interrupt stopped it
    between two windows."""
    return (_DeltasDriver if isinstance(pattern, TriggeredDeltas) else _Driver)(pattern, sim, kernel).run()


class _Sends(BroadcastDriver):
    """What both event-triggered drivers share: sends left undecided by the control (``send``), decided by the
    tensor work (``fires``) and played after it (``decide``)."""

    gathers = 1  # (each window's sends decided before the next window's control)

    def __init__(self, pattern, sim, kernel):
        super().__init__(pattern, sim, kernel)
        p, n = self.ctx.p, len(self.ctx.agents)
        self.grad.first = kernel.gradient(p, self.ctx.state, 0)  # one for all (the windows refuse LAG)
        self.rule = Rule(*kernel.trigger(p))
        self.k = [0] * n  # each agent's activations so far (the trigger's k, its messages' round)
        self.undecided: list[list] = []  # the window's sends, in processing order

    def send(self, i: int, now: float) -> None:
        """``EventTrigger.send`` (or a broadcast that may not happen), undecided: its place among the rows, its
        arrivals' insertion numbers."""
        js = self.ctx.agents[i].neighbors  # this activation's (a time-varying topology changes them)
        pid, k, seq = self.payloads.new(), self.k[i], self.events.seq
        self.undecided.append([len(self.rows), now, i, js, [next(seq) for _ in js], pid, k, None])
        self.rows.put(_UNDECIDED)
        self.op(i, PUSH, pid, len(self.undecided) - 1, k)
        self.k[i] = k + 1
        self.wake(i, now)

    def decide(self) -> None:
        """The window's sends as decided by its tensor work, in processing order (module docstring)."""
        if not self.undecided:
            return
        rows, out, prev, r = self.rows.buf, PackedRows(self.rows.words), 0, RECORD.size
        size, tag, stats, enqueue = self.size, self.ctx.tag, self.ctx.agents[0].stats, self.events.numbered
        for pos, now, i, js, seqs, pid, k, fired in self.undecided:
            out.put(rows[prev * r:pos * r])
            prev = pos + 1
            skipped = len(js) - len(fired)
            stats.add("trigger_sent", len(fired))
            if skipped:
                stats.add("trigger_skipped", skipped)
                stats.add("trigger_bytes_saved", skipped * size)
            for n in fired:
                mid, at, _ = self.message(i, js[n], now, size, k, tag, out)
                if at is None:
                    self.payloads.release(pid)
                else:
                    enqueue(at, seqs[n], ARR, js[n], (mid, i, size, now, k, 0.0, pid))
        out.put(rows[prev * r:])
        rows[:] = out.buf
        self.undecided.clear()

    def hold(self) -> tuple[object, dict[str, torch.Tensor]]:
        """The broadcast driver's state between two windows (``WindowDriver.held``) and each agent's count."""
        own, tensors = super().hold()
        return {**own, "k": self.k}, tensors

    OWN = (*BroadcastDriver.OWN, "k")

    @classmethod
    def held_by(cls, sim, plain: dict) -> list | str:
        """(``BroadcastDriver.check_own``) each agent's count of activations."""
        from netsim.sim.restore import ints_in

        k = plain["own"]["k"]
        return [] if isinstance(k, list) and len(k) == len(sim.loop.agents) and ints_in(k, 0, 2**31) else "own.k"

    def take_hold(self, own, tensors: dict[str, torch.Tensor]) -> None:
        super().take_hold(own, tensors)
        per_agent(own, ("k",), len(self.ctx.agents))
        self.k[:] = own["k"]

    def fires(self, x: torch.Tensor, ref: torch.Tensor, ks: list[int]) -> list[bool]:
        """The trigger of each row of ``x`` against the same row of ``ref`` at activation count ``ks``: one batched
        norm, and the engine's own call on the two rows where it is within ``_CLOSE`` of the threshold."""
        rule = self.rule
        if rule.kind == "always":
            return [True] * len(ks)
        norm = torch.linalg.vector_norm(x - ref, dim=1).double()
        if rule.kind == "relative":
            tau = rule.threshold * torch.linalg.vector_norm(ref, dim=1).double()
        elif rule.kind == "decaying":
            tau = torch.tensor([rule.threshold * rule.decay ** k for k in ks], dtype=torch.float64, device=norm.device)
        else:
            tau = torch.full_like(norm, rule.threshold)
        fire = (norm > tau).tolist()
        close = ((norm - tau).abs() <= _CLOSE * torch.maximum(norm.abs(), tau.abs())).nonzero().flatten().tolist()
        for m in close:  # the engine's own call on the two rows
            fire[m] = rule.fires(x[m], ref[m], ks[m])
        return fire


class _Driver(_Sends):
    """The event-triggered pattern's control and tensor work (the module docstring)."""

    def __init__(self, pattern, sim, kernel):
        super().__init__(pattern, sim, kernel)
        agents = self.ctx.agents
        self.copies = _Copies(agents, self.ctx.dynamic)
        self.payloads.put([-1 - i for i in range(len(agents))], self.X)  # the initial models
        self.releases = _Releases([kernel.noise(self.ctx.state, a, self.ctx.p) for a in agents])

    # the control flow -------------------------------------------------------------------------------------
    def activated(self, i: int, now: float, _at: float) -> None:
        if self.grad.first is not None and i not in self.releases.spent:
            self.ask(i, now)
            return
        self.mix(i, MERGE)
        self.send(i, now)

    def completed(self, i: int, now: float, tk: int) -> None:
        self.releases.record(self.ctx.agents[i], tk, self.X.shape[1], at=(now, self.rows))
        self.releases.count_of[tk] = self.k[i] + 1
        self.mix(i, UPDATE, tk)
        self.send(i, now)

    def mix(self, i: int, kind: int, *tk) -> None:
        """What arrived, absorbed into the copies; then the mix's weights and copies."""
        got = self.inbox[i]
        if got:
            self.inbox[i] = []
        a = self.ctx.agents[i]
        self.op(i, kind, *tk, a.self_weight, *self.copies.absorb(a, got))

    # checkpoints: the sends' state, and the copies', the last-sent references' and the releases' ------------------
    def hold(self) -> tuple[object, dict[str, torch.Tensor]]:
        own, tensors = super().hold()
        return {**own, **self.copies.held(), **self.releases.held()}, tensors

    OWN = (*_Sends.OWN, "copy", "copy_round", "last", "recorded", "count_of", "spent")

    @classmethod
    def held_by(cls, sim, plain: dict) -> list | str:
        """(``BroadcastDriver.check_own``) the copies (of in-neighbours, by handle) and their rounds, the last-sent
        references (to out-neighbours), the releases of tickets and the agents a cap refused; the copies and the
        references hold their payloads."""
        from netsim.sim.restore import int_in, ints_in, peers

        more = super().held_by(sim, plain)
        if isinstance(more, str):
            return more
        own, agents = plain["own"], sim.loop.agents
        n, kept, top = len(agents), set(plain["payloads"]), plain["tickets"][0]
        pairs = lambda v, keys, ok: isinstance(v, list) and len(v) == n and all(  # noqa: E731  ([key, value] each)
            isinstance(d, list) and all(isinstance(e, list) and len(e) == 2 and int_in(e[0]) and e[0] in keys(i)
                                        and ok(e[1]) for e in d) and len({e[0] for e in d}) == len(d)
            for i, d in enumerate(v))
        held = lambda h: int_in(h) and h in kept  # noqa: E731  (a message's payload: an initial model is not held)
        heard, told = peers(sim), peers(sim, out=True)
        if not pairs(own["copy"], heard, held):
            return "own.copy"
        if not (pairs(own["copy_round"], heard, lambda r: int_in(r, 0, 2**31)) and all(
                {j for j, _ in c} == {j for j, _ in r} for c, r in zip(own["copy"], own["copy_round"]))):
            return "own.copy_round"
        if not pairs(own["last"], told, held):
            return "own.last"
        tickets = lambda v, ok: isinstance(v, list) and all(  # noqa: E731
            isinstance(e, list) and len(e) == 2 and int_in(e[0], 0, top) and ok(e[1]) for e in v) \
            and len({e[0] for e in v}) == len(v)
        if not tickets(own["recorded"], lambda ok: type(ok) is bool):
            return "own.recorded"
        if not tickets(own["count_of"], lambda c: int_in(c, 0, 2**31)):
            return "own.count_of"
        spent = own["spent"]
        if not (isinstance(spent, list) and ints_in(spent, 0, n) and len(set(spent)) == len(spent)):
            return "own.spent"
        return more + [h for k in ("copy", "last") for d in own[k] for _, h in d]

    def take_hold(self, own, tensors: dict[str, torch.Tensor]) -> None:
        super().take_hold(own, tensors)
        self.copies.load(own)
        self.releases.load(own)

    # the tensor work --------------------------------------------------------------------------------------
    def mixed(self, step: list, at: int):
        """The mix of a step's agents (``NeighborCopies.mix``'s float operations, ``compute.mixing.mix_rows``):
        a batch whose x are the mixed rows; the ops' weights and copies at ``at``, ``at + 1``."""
        who = [i for i, _ in step]
        b, idx = self.batch(who)
        mixes = [o[at + 1] for _, o in step]
        groups = []
        for s in range(max(len(m) for m in mixes)):  # slot s: each agent's s-th in-neighbour (sorted)
            by: dict[float, tuple[list[int], list[int]]] = {}
            for n, m in enumerate(mixes):
                if len(m) > s:
                    w, h = m[s]
                    g = by.get(w)
                    if g is None:
                        by[w] = ([n], [h])
                    else:
                        g[0].append(n)
                        g[1].append(h)
            groups.append([(w, ks, lambda hs=hs: self.payloads.peek(hs)) for w, (ks, hs) in by.items()])
        keep = torch.tensor([o[at] for _, o in step], dtype=torch.float64)
        b.x = mix_rows(b.x, keep, groups, {}, b.x.dtype)
        return b, idx

    def settle(self, step: list, at: int) -> None:
        """The holds the step's absorbs took and gave up (after its mix has read the rows)."""
        hold, release = self.payloads.hold, self.payloads.release
        for _, o in step:
            for h in o[at]:
                hold(h)
        for _, o in step:
            for h in o[at + 1]:
                release(h)

    def merges(self, step: list) -> None:  # no gradient: the mix alone
        b, idx = self.mixed(step, 2)
        self.store(b, idx)
        self.settle(step, 4)

    def updates(self, step: list) -> None:
        b, idx = self.mixed(step, 3)
        rel = self.releases
        if rel.recorded:  # the releases recorded at their completions: the kernel's ``b.privatize`` draws the noise
            b.recorded = [rel.recorded.pop(o[2]) for _, o in step]
        b.counts = [rel.count_of.pop(o[2]) for _, o in step]
        self.ctx.kernel.update(b, self.ctx.p, self.grad.evaluated.take([o[2] for _, o in step]))
        self.store(b, idx)
        self.settle(step, 5)

    def pushes(self, step: list) -> None:
        """``agent.params = x``, then each (agent, out-neighbour) send decided (module docstring)."""
        who = [i for i, _ in step]
        idx = torch.tensor(who, device=self.X.device)
        rows = self.X.index_select(0, idx)
        self.ctx.bank.W.index_copy_(0, idx, rows)
        at, refs, ks = [], [], []  # per (agent, out-neighbour) pair: the row of the batch, its last-sent handle, k
        for n, (i, o) in enumerate(step):
            last = self.copies.last[i]
            for j in self.undecided[o[3]][3]:
                at.append(n)
                refs.append(last.get(j, -1 - i))
                ks.append(o[4])
        fire = self.fires(rows.index_select(0, torch.tensor(at, device=rows.device)), self.payloads.peek(refs), ks) \
            if at else []
        keep, kept, holds, old = [], [], [], []
        m = 0
        for n, (i, o) in enumerate(step):
            u = self.undecided[o[3]]
            js, pid, last = u[3], o[2], self.copies.last[i]
            fired = [q for q in range(len(js)) if fire[m + q]]
            m += len(js)
            u[7] = fired
            if fired:  # held by each last-sent reference and, until ``decide`` knows which are dropped, each message
                keep.append(pid)
                kept.append(n)
                holds.append(2 * len(fired))
                for q in fired:
                    h = last.get(js[q])
                    if h is not None:
                        old.append(h)
                    last[js[q]] = pid
        if keep:
            self.payloads.keep(keep, rows, kept, holds)
        for h in old:
            self.payloads.release(h)


class _Copies:
    """Each receiver's copies of its in-neighbours' models (``NeighborCopies``: the latest round per sender wins) and
    each sender's last-sent references (``EventTrigger``'s), as payload handles (an initial model's: -1 - agent)."""

    __slots__ = ("copy", "copy_round", "last", "start_in", "in_w")
    KEYED = ("copy", "copy_round", "last")  # per agent: {neighbour: value}

    def __init__(self, agents: list, dynamic):
        n = len(agents)
        self.copy: list[dict[int, int]] = [{} for _ in range(n)]  # receiver: sender -> the handle of its copy
        self.copy_round: list[dict[int, int]] = [{} for _ in range(n)]
        self.last: list[dict[int, int]] = [{} for _ in range(n)]  # sender: out-neighbour -> what it last sent it
        self.start_in = [frozenset(a.weights) for a in agents]  # copies made at the start (NeighborCopies)
        # each agent's in-neighbours and weights in the mix's order (sorted), read at each mix when the graph changes
        self.in_w = None if dynamic is not None else [sorted(a.weights.items()) for a in agents]

    def absorb(self, a, got: list) -> tuple[list, list, list]:
        """``NeighborCopies.absorb`` of what agent ``a`` got: the mix's (weight, copy) pairs, the handles a copy now
        holds and the holds given up (after the mix has read them)."""
        i = a.id
        copy = self.copy[i]
        take, drop = [], []
        if got:
            rounds = self.copy_round[i]
            for m in got:
                drop.append(m.handle)  # the message's own hold
                if m.round >= rounds.get(m.src, -1):
                    rounds[m.src] = m.round
                    old = copy.get(m.src)
                    copy[m.src] = m.handle
                    take.append(m.handle)
                    if old is not None and old >= 0:
                        drop.append(old)
        start = self.start_in[i]
        in_w = sorted(a.weights.items()) if self.in_w is None else self.in_w[i]
        return [(w, copy.get(j, -1 - j if j in start else -1 - i)) for j, w in in_w], take, drop

    def held(self) -> dict:
        return {k: [list(d.items()) for d in getattr(self, k)] for k in self.KEYED}

    def load(self, own: dict) -> None:
        per_agent(own, self.KEYED, len(self.start_in))
        for k in self.KEYED:
            getattr(self, k)[:] = [{j: v for j, v in d} for d in own[k]]


class _Releases:
    """A private kernel's releases, recorded by the control at each gradient's completion (module docstring): each
    agent's noise (None: none), each ticket's release made (False: a budget cap refused it) and its agent's
    activation count (``Batch.counts``), the agents a cap refused (no gradient from then on)."""

    __slots__ = ("noise", "recorded", "count_of", "spent")

    def __init__(self, noise: list):
        self.noise = noise
        self.recorded: dict[int, bool] = {}
        self.count_of: dict[int, int] = {}
        self.spent: set[int] = set()

    def record(self, a, tk: int, dim: int, at: tuple) -> None:
        """Agent ``a``'s release for ticket ``tk``, as the engine's update makes it: its row right after
        ``compute_end`` (``at``)."""
        noise = self.noise[a.id]
        if noise is not None:
            sigma, sens, q = noise
            ok = self.recorded[tk] = a.ledger.record(dim, sigma, sens, q=q, what="gradient", at=at)
            if not ok:
                self.spent.add(a.id)

    def held(self) -> dict:
        return {"recorded": list(self.recorded.items()), "count_of": list(self.count_of.items()),
                "spent": sorted(self.spent)}

    def load(self, own: dict) -> None:
        self.recorded = {tk: ok for tk, ok in own["recorded"]}
        self.count_of = {tk: c for tk, c in own["count_of"]}
        self.spent = set(own["spent"])


class _DeltasDriver(_Sends):
    """The event-triggered deltas pattern's control and tensor work (SPARQ-SGD; rounds/triggered.py): each agent's
    receives, gradient, step, receives again and push (the trigger, its compressed delta, the consensus step) in
    its order, one per lock step (``in_order``), on the run's ``PublicCopyRows``."""

    def __init__(self, pattern, sim, kernel):
        super().__init__(pattern, sim, kernel)
        self.pc = self.ctx.state
        self.size = self.pc.comps[0].encoded_size(self.X.shape[1], self.X.element_size())  # every q's bytes

    op = WindowDriver.op  # unranked: one operation per lock step (``in_order``)

    # the control flow -------------------------------------------------------------------------------------
    def activated(self, i: int, now: float, _at: float) -> None:
        self.receive(i)
        if self.grad.first is not None:
            self.ask(i, now)
            return
        self.send(i, now)

    def completed(self, i: int, now: float, tk: int) -> None:
        self.op(i, UPDATE, tk)
        self.receive(i)
        self.send(i, now)

    def receive(self, i: int) -> None:
        """(a): what arrived, for its sender's copy (by slot), in arrival order."""
        got = self.inbox[i]
        if got:
            self.inbox[i] = []
            slot = self.pc.slot[i]
            self.op(i, MERGE, [(slot[m.src], m.handle) for m in got])

    # the tensor work --------------------------------------------------------------------------------------
    def tensor_work(self, first_ticket: int) -> None:
        self.in_order(first_ticket, (self.receives, self.asks, self.updates, self.pushes), ASK, UPDATE)

    def receives(self, step: list) -> None:
        """xhat_j += q_j (``Payloads.add_into``)."""
        self.payloads.add_into(self.pc.copies, step)

    def asks(self, step: list) -> None:
        self.grad.asked_at(step, self.X)

    def updates(self, step: list) -> None:
        b, idx = self.batch([i for i, _ in step])
        self.ctx.kernel.update(b, self.ctx.p, self.grad.evaluated.take([o[1] for _, o in step]))
        self.store(b, idx)

    def pushes(self, step: list) -> None:
        """(c) decided and, where it fires, the compressed delta (kept as the payload); (d) for every agent."""
        from netsim.compute.mixing import evaluate

        pc, dev = self.pc, self.X.device
        who = [i for i, _ in step]
        agents = [self.ctx.agents[i] for i in who]
        idx = torch.tensor(who, device=dev)
        x = self.X.index_select(0, idx)
        fire = self.fires(x, pc.own.index_select(0, idx), [o[3] for _, o in step])
        sel = [n for n, f in enumerate(fire) if f]
        for n, (_, o) in enumerate(step):
            u = self.undecided[o[2]]
            u[7] = list(range(len(u[3]))) if fire[n] else []
        if sel:
            xs = x if len(sel) == len(who) else x.index_select(0, torch.tensor(sel, device=dev))
            q, _ = pc.delta([agents[n] for n in sel], xs)
            kept = [m for m, n in enumerate(sel) if self.undecided[step[n][1][2]][3]]
            if kept:  # held by each message until ``decide`` knows which are dropped
                self.payloads.keep([step[sel[m]][1][1] for m in kept], q, kept,
                                   [len(self.undecided[step[sel[m]][1][2]][3]) for m in kept])
        rows, values = evaluate(pc.consensus(agents, x), x.dtype)
        self.X.index_copy_(0, rows, values)
        self.ctx.bank.W.index_copy_(0, rows, values)  # agent.params = ...
