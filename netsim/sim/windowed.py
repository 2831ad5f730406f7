"""Window-synchronous execution: rounds run as a few batched steps, with the engine's exact trace.

The engine (kernel.py) runs every message as its own event: exact, and ~6 µs of Python per event. When no
agent's activation can affect another's inside a window of simulated time, the window's outcome is known
without simulating its events one by one. This module does it for D-PSGD (Lian et al., "Can Decentralized
Algorithms Outperform Centralized Algorithms?", Algorithm 1) when every round is such a window: every
agent wakes at the same tick (periodic activation, identical clocks), computes for the same constant time,
and links of one constant latency deliver every message that is not lost (Bernoulli loss) before the round's
barrier times out. A lost message leaves its receiver's barrier to time out: those agents wake after the
others, at the timeout, and with a periodic clock every agent still activates at the same next tick. It
does it too for gossip learning (Ormándi, Hegedűs, Jelasity, "Gossip learning with linear models on fully
distributed data", Algorithm 1 with merge-then-update: ``algorithms/push_gossip.py``) when every push of a
round lands after the round's gradients and before the next tick (``_push_gossip``), and for DP-D-PSGD
(Abadi et al.'s clipping and Gaussian noise in D-PSGD: ``algorithms/dp_dpsgd.py``) as for D-PSGD, each
agent's release drawn from its own noise generator and traced where the engine traces it (no budget cap: an
agent out of budget would leave the round's order), and for CHOCO-SGD (Koloskova, Stich, Jaggi, "Decentralized
Stochastic Optimization and Gossip Algorithms with Compressed Communication", Algorithm 2:
``algorithms/choco.py``), whose rounds have D-PSGD's events, the compression, public copies and consensus
of all agents batched (``_Choco``).

``run(sim)`` (``netsim run --engine windowed``) then plays the run round by round, emitting exactly the
rows the engine would, in its order: simpy orders simultaneous events by insertion, so round k's agents
are activated in the order in which their barriers completed in round k-1 (the order of the delivery that
completed each, then the timed-out ones in the order their timers were set), their gradients and sends
follow that order, deliveries follow the sends, loss is drawn from each link's own stream in send order. Gradients go
through the gradient service in one batched call (as the engine's first completion does), mini-batches are
drawn from each agent's own stream, and the models are updated through ``Agent.mix_into_params`` with each
agent's models in arrival order: the run's trace, metrics and final models are byte-identical to the
engine's (tests/test_windowed.py compares them). ``unsupported`` names what keeps a scenario out.
"""

from __future__ import annotations

import torch

from netsim.comm.compression import Compressor
from netsim.compute.mixing import MixUpdate, evaluate
from netsim.compute.noise import gaussian_noise_rows
from netsim.scenario.schema import Scenario
from netsim.sim.activation import Periodic
from netsim.sim.network import payload_size
from netsim.trace.events import Finish, Timeout
from netsim.trace.events import row as event_row


def unsupported(sc: Scenario) -> str | None:
    """Why this scenario's rounds are not independent windows (None: they are)."""
    ag, net, alg = sc.agents, sc.network, sc.algorithm
    if alg.name not in RUNNERS:
        return f"algorithm {alg.name!r}: only {' and '.join(RUNNERS)}"
    if ag.activation.kind != "periodic":
        return f"activation {ag.activation.kind!r}: only periodic (simultaneous activations)"
    same_clocks = all(d.kind == "constant" and d.value == 0.0 for d in (ag.clock_offset, ag.clock_drift))
    if not same_clocks or ag.clock_jitter is not None:
        return "clock offsets, drift or jitter: activations are not simultaneous"
    if ag.compute_time.kind != "constant" or ag.stragglers:
        return "compute times differ between agents"
    if getattr(sc, "privacy", None) is not None and sc.privacy.record is not None:
        return "privacy.record: the mixing record is written by the event engine's agents"
    if ag.offline or ag.churn or ag.availability:
        return "agents go offline"
    if net.burst or net.outages or net.links or net.trace:
        return "links are not Bernoulli-lossy with one latency distribution (bursts, outages, per-link settings)"
    if net.bandwidth is not None or net.uplink is not None:
        return "bandwidth-limited links (transmission times) are not modelled here"
    if alg.name == "choco" and not float(alg.params.get("lr", 0.1)) > 0:
        return "choco with lr = 0 takes no gradients (its rounds have no compute phase)"
    if alg.name in ("dpsgd", "dp_dpsgd", "choco"):
        if alg.name == "dp_dpsgd" and getattr(sc, "privacy", None) is not None and sc.privacy.epsilon_cap is not None:
            return "privacy.epsilon_cap: an agent out of budget skips its gradient and leaves the round's order"
        if net.latency.kind != "constant":
            return "links do not have one constant latency (D-PSGD's barrier orders agents by arrival)"
        if ag.compute_time.value + net.latency.value >= float(alg.params.get("round_timeout", 1.0)):
            return "a round's messages can miss the barrier's timeout"
    else:  # push gossip: every message of a round must land before the next tick
        low, top = {"constant": (net.latency.value, net.latency.value),
                    "uniform": (net.latency.low, net.latency.high)}.get(net.latency.kind, (None, None))
        if top is None:
            return f"latency {net.latency.kind!r} has no upper bound: a message could land in a later round"
        if ag.compute_time.value + top >= ag.activation.period:
            return "a message can land after the next activation"
        if low <= ag.compute_time.value:
            return "a message can land before the round's gradients are back (latency <= compute time)"
    if sc.topology.dynamic is not None:
        return "the topology changes over time"
    return None


def unsupported_run(sim) -> str | None:
    """Why this built simulation cannot run window by window with the engine's exact trace (None: it can)."""
    sc = sim.scenario
    why = unsupported(sc)
    if why is not None:
        return why
    r = sc.run
    if r.rounds is None:
        return "run.rounds is not set (the windows stop at a round limit)"
    if r.checkpoint_every is not None or r.checkpoint_every_rounds is not None:
        return "checkpoints cut the run between events"
    end = (r.rounds + 1) * sc.agents.activation.period  # the run is over before this
    if r.until is not None and r.until <= end:
        return f"run.until = {r.until} may stop the run inside a round (give more than {end:g} s)"
    if sc.evaluation.every <= end:
        return (f"evaluations inside the run (evaluation.every = {sc.evaluation.every}; windows need more than "
                f"{end:g} s: the start and the end are evaluated anyway)")
    if sim.network.model is not None or sim.network.wake_hook is not None:
        return "a link model or an activation hook is installed"
    for a in sim.agents:
        if type(a.schedule) is not Periodic or a._listeners or a.offset != 0.0 or a.rate != 1.0:
            return f"agent {a.id} has its own activation schedule or listeners"
        if not a.neighbors or not a.in_neighbors:
            return f"agent {a.id} has no out- or in-neighbours"
    if getattr(sim.program, "__name__", "") != sc.algorithm.name:
        return f"the algorithm's program is not {sc.algorithm.name}'s"
    if sc.algorithm.name == "push_gossip" and sim.params.update == "per_receipt" and sim.params.lr > 0:
        # one gradient per receipt, and an agent receives at most one push per in-neighbour a round
        chain = max(len(a.in_neighbors) for a in sim.agents) * sc.agents.compute_time.value
        net = sc.network.latency
        low, top = (net.value, net.value) if net.kind == "constant" else (net.low, net.high)
        if chain + top >= sc.agents.activation.period or low <= chain:
            return (f"an agent's gradients (one per receipt, up to {chain:g} s a round) and the pushes "
                    f"(latency {low:g} to {top:g} s) can interleave or cross a tick")
    if sc.network.loss and sc.algorithm.name in ("dpsgd", "dp_dpsgd", "choco"):
        return _round_times(sc)
    return None


def _round_times(sc) -> str | None:
    """With lossy links an agent wakes from its barrier either when its last message arrives (D) or when the
    barrier times out (T); the engine orders the next round by time first, so both must give the very same
    float activation time in every round (and so the same compute end, arrivals and timeout). Checked on
    the scalar times before the run: None if they do. (They do whenever the next tick is within twice the
    wake time, by Sterbenz's lemma: ``w + (tick - w)`` is then exactly ``tick``; the check costs nothing.)"""
    ag, alg = sc.agents, sc.algorithm
    period, ct = ag.activation.period, float(ag.compute_time.value) * 1.0
    lat, timeout = float(sc.network.latency.value), float(alg.params.get("round_timeout", 1.0))
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


def run(sim) -> None:
    """Play a started simulation to its end window by window (see the module docstring); ``sim.finish``
    then evaluates and closes the trace as after the engine."""
    why = unsupported_run(sim)
    if why is not None:
        raise ValueError(f"not a window-synchronous run: {why}")
    RUNNERS[sim.scenario.algorithm.name](sim)


def _wake(sim, order: list[tuple[int, float]]) -> list[tuple[float, int, int, float]]:
    """Each agent of ``order`` ((agent, when it called wake), in call order) woken as ``Agent.wake`` does (its
    round counted): (activation time, call order, agent, local tick time), sorted as simpy fires them: by
    time, then by the order the activations were set."""
    acts = []
    for seq, (i, w) in enumerate(order):
        a = sim.agents[i]
        at = a.schedule.next(a.local_time(w))
        acts.append((w + max(0.0, a.global_time(at) - w), seq, i, at))
        a.round += 1
    sim.activations += len(acts)
    acts.sort()
    return acts


def _dpsgd(sim) -> None:
    """D-PSGD (``algorithms/dpsgd.py``) and DP-D-PSGD (``algorithms/dp_dpsgd.py``: the gradient clipped, per
    example or as a whole, then noised through ``Agent.privatize``, which traces the release), round by round."""
    p, agents, writer, net = sim.params, sim.agents, sim.writer, sim.network
    private = sim.scenario.algorithm.name == "dp_dpsgd"
    if private:
        from netsim.privacy.mechanisms import clip

        release_scale = sim.program.release_scale  # (sensitivity, sigma) as the program computes them

        per_example = p.clip_mode == "per_example"
        sigmas: dict[int, tuple[float, float]] = {}  # agent: (sensitivity, sigma), set at its first release
    choco = _Choco(sim) if sim.scenario.algorithm.name == "choco" else None
    svc, bank = sim.gradients, sim.bank
    limit = sim.scenario.run.rounds
    expect = [len(a.in_neighbors) for a in agents]
    mid = net.next_id
    order = [(a.id, float(sim.env.now)) for a in agents]  # (agent, when it called wake): agent order at first
    k = 0  # the program's round counter
    while True:
        rows: list[tuple] = []
        row = rows.append
        # each agent's params: one copy of the bank (its rows are the snapshots the engine takes one by one)
        params = bank.W.clone().unbind(0)
        tickets = []
        for t_act, _, i, at in _wake(sim, order):  # Activate; the program up to its gradient request
            a = agents[i]
            row((t_act, "activate", i, -1, -1, 0, at, a.round, ""))
            ct = a._compute() * a.compute_scale
            row((t_act, "compute_start", i, -1, -1, 0, ct, -1, ""))
            x = params[i]
            rows_i = a.sample_rows(p.batch)
            ticket = svc.submit(i, x, rows_i, p.clip, p.clip_kind) if private and per_example else \
                svc.submit(i, x, rows_i)
            tickets.append((i, t_act + ct, x, ticket))
        svc.flush()  # the first completion evaluates every pending request in one batched call
        sizes = choco.compress(tickets) if choco is not None else None  # CHOCO's q_i's bytes, in the same order
        sends = []
        steps = {}
        noised = []  # (agent, clipped gradient, sigma, its noise generator): the round's releases
        for n, (i, t_done, x, ticket) in enumerate(tickets):  # compute_end, the broadcast (a lost one: dropped)
            row((t_done, "compute_end", i, -1, -1, 0, 0.0, -1, ""))
            g = ticket.result
            if private:  # clip (as a whole), noise: the release is traced now, after the rows so far
                if not per_example:
                    g = clip(g, p.clip, p.clip_kind)
                if i not in sigmas:
                    sigmas[i] = release_scale(agents[i], p, g.numel())
                writer.emit_rows(rows)
                rows.clear()
                sim.env._now = t_done
                sens, sigma = sigmas[i]
                led = agents[i].ledger  # traced and accounted now, noised below with the round's others
                led.record(g.numel(), sigma, sens, q=min(1.0, p.batch / len(agents[i].rows)), what="gradient")
                if sigma:
                    noised.append((i, g, sigma, led.noise.generator))
                else:
                    g = g.clone()
            steps[i] = g
            size = payload_size(x) if sizes is None else sizes[n]
            for j in agents[i].neighbors:
                link = net.links.get((i, j)) or net.link(i, j)
                delay = t_done - t_done + link.latency()
                row((t_done, "send", i, j, mid, size, delay, k, "model"))
                if link.lost is not None and link.lost() < net.p_loss:
                    row((t_done, "drop", i, j, mid, size, delay, k, "loss"))
                else:
                    sends.append((t_done + delay, i, j, mid, size, t_done))
                mid += 1
        got: list[dict] = [{} for _ in agents]
        done = []
        for t_arr, i, j, m, size, sent in sends:  # deliveries in send order; barriers complete on the last
            row((t_arr, "deliver", j, i, m, size, t_arr - sent, k, "model"))
            g = got[j]
            g[i] = params[i]
            if len(g) == expect[j]:
                done.append((j, t_arr))
        complete = {j for j, _ in done}
        late = []  # the barriers that time out, in the order their timers were set (the gathers' order)
        for i, t_done, _x, _ticket in tickets:
            if i not in complete:
                t_out = t_done + p.round_timeout
                late.append((i, t_out))
                row(event_row(Timeout(t_out, i, k, float(expect[i] - len(got[i])))))
        order = done + late  # who wakes first: the barriers done at the last arrival, then the timed-out ones
        end = order[-1][1]
        last = agents[order[0][0]].round >= limit  # every agent is at the limit together
        if last:  # waking, each finishes: those done at the last arrival before the timeouts fire
            at = len(rows) - len(late)
            rows[at:at] = [event_row(Finish(w, i, agents[i].round)) for i, w in done]
            rows += [event_row(Finish(w, i, agents[i].round)) for i, w in late]
            for i, _ in order:
                agents[i].finished = True
                sim.agent_finished()
        writer.emit_rows(rows)
        if noised:
            steps.update(zip((i for i, *_ in noised), _gaussian_releases(noised), strict=True))
        if choco is not None:
            choco.update(got)
        else:
            lr = p.lr / (1.0 + p.lr_decay * k)
            for i, _, x, _ticket in tickets:  # the update of each: order does not matter (the bank batches it)
                agents[i].mix_into_params(x, got[i], step=steps[i], lr=lr)
        if last:
            break
        k += 1
        if sim.progress is not None:
            sim.progress(end)
    net.next_id = mid
    sim.env._now = end  # the engine's clock where its last event happened (the run's end)


class _Choco:
    """CHOCO-SGD's public copies (``algorithms/choco.py``, Koloskova et al., Algorithm 2) of every agent at once:
    own copies as rows, neighbours' copies in slots (each agent's in-neighbours in ascending order, the order of
    its consensus sum). Each step is the program's own float operation on every row together: (a)
    ``x - lr * g``, (b) ``C(x - xhat_i)`` by each agent's own compressor (its own stream), ``xhat_i + decode(q)``,
    (d) ``xhat_j + decode(q_j)`` for each delivered q, (e) the consensus sum slot by slot
    (``compute.mixing.evaluate``, which adds with the same scalars in the same order)."""

    def __init__(self, sim):
        p, W = sim.params, sim.bank.W
        self.p, self.bank = p, sim.bank
        self.comps = [Compressor(p.compressor, p.ratio, p.unbiased, p.bits, rng=a.rng("compress"))
                      for a in sim.agents]
        self.nbrs = [sorted(a.weights) for a in sim.agents]
        self.alphas = [[p.gamma * a.weights[j] for j in nb] for a, nb in zip(sim.agents, self.nbrs, strict=True)]
        self.slot = [{j: s for s, j in enumerate(nb)} for nb in self.nbrs]
        self.own = torch.zeros_like(W)
        self.copies = W.new_zeros((W.shape[0], max(map(len, self.nbrs)), W.shape[1]))

    def compress(self, tickets: list) -> list:
        """(a), (b) for the round's agents (``tickets``: (agent, time, x, gradient ticket)): their q's sizes."""
        self.ids = [i for i, *_ in tickets]
        idx = torch.tensor(self.ids, device=self.own.device)
        x = torch.stack([x for _, _, x, _ in tickets])
        g = torch.stack([t.result for *_, t in tickets])
        self.x = x - self.p.lr * g  # (a)
        d = self.x - self.own.index_select(0, idx)
        if self.p.compressor == "topk":  # no stream: every row in one call
            comp = self.comps[0]
            self.dense = comp.topk_rows(d)
            sizes = [comp.encoded_size(d.shape[1], d.element_size())] * len(self.ids)
        else:  # rand-k and QSGD draw from each agent's stream: one agent at a time, in the round's order
            qs = [self.comps[i](v) for i, v in zip(self.ids, d.unbind(0), strict=True)]  # (b)
            self.dense, sizes = torch.stack([q.decode() for q in qs]), [payload_size(q) for q in qs]
        self.own.index_copy_(0, idx, self.own.index_select(0, idx) + self.dense)
        return sizes

    def update(self, got: list[dict]) -> None:
        """(d) for every q delivered (``got[j]``: the senders whose q reached j), then (e) into the bank."""
        pos = {i: n for n, i in enumerate(self.ids)}
        pairs = [(j, self.slot[j][i], pos[i]) for j, g in enumerate(got) for i in g]
        if pairs:
            jj, ss, kk = (torch.tensor(c, device=self.own.device) for c in zip(*pairs, strict=True))
            self.copies[jj, ss] = self.copies[jj, ss] + self.dense[kk]
        diffs = self.copies - self.own.unsqueeze(1)  # xhat_j - xhat_i, every slot of every agent
        ups = [MixUpdate(i, self.x[n], 1.0, self.alphas[i], list(diffs[i, :len(self.nbrs[i])].unbind(0)), 0.0, None)
               for n, i in enumerate(self.ids)]
        rows, values = evaluate(ups, self.bank.W.dtype)
        self.bank.W.index_copy_(0, rows, values)


def _gaussian_releases(noised: list) -> list:
    """g + N(0, sigma^2 I) for each (agent, g, sigma, generator) of ``noised``, added as one batch."""
    g = torch.stack([x for _, x, _, _ in noised])
    z = gaussian_noise_rows(g.shape[1:], [s for *_, s, _ in noised], [gen for *_, gen in noised], g.dtype)
    return list((g + z).unbind(0))


def _push_gossip(sim) -> None:
    """Gossip learning (``algorithms/push_gossip.py``), round by round. Within a tick: each agent in wake order
    is activated, takes what arrived since its last activation (in arrival order) and, if anything arrived,
    asks for its gradient after the first merge (``per_receipt``) or the last (``per_round``), else pushes its
    model at once and waits for the next tick; the gradients come back after the compute time, in the order
    they were asked for, and each agent then merges and asks again or, done, pushes; every push lands after
    the last gradient and before the next tick (``unsupported_run`` checks the latency's bounds against the
    longest chain of gradients), in the order of (arrival time, send). The tensor work is batched over the
    round's agents with the program's own operations, element by element the same: merges
    ``(x + x_j) * 0.5`` and updates ``x.sub_(g, alpha)`` slot by slot (one gradient batch per slot)."""
    p, agents, writer, net, bank = sim.params, sim.agents, sim.writer, sim.network, sim.bank
    limit = sim.scenario.run.rounds
    mid = net.next_id
    rngs = [a.rng() for a in agents]  # the program's own stream, as the program takes it first
    picks: list[list[int]] = [[] for _ in agents]
    updates = [0] * len(agents)
    inbox: list[list] = [[] for _ in agents]  # payloads in arrival order since the last activation
    order = [(a.id, float(sim.env.now)) for a in agents]

    def push(i: int, x, now: float, rows: list, arrivals: list, a) -> None:
        nonlocal mid
        nb = a.neighbors
        if not picks[i]:
            picks[i] = rngs[i].integers(len(nb), size=256).tolist()[::-1]
        j = nb[picks[i].pop()]
        link = net.links.get((i, j)) or net.link(i, j)
        size = payload_size(x)
        delay = now - now + link.latency()
        rows.append((now, "send", i, j, mid, size, delay, a.round, "gossip"))
        if link.lost is not None and link.lost() < net.p_loss:
            rows.append((now, "drop", i, j, mid, size, delay, a.round, "loss"))
        else:
            arrivals.append((now + delay, mid, i, j, size, now, a.round, x))
        mid += 1

    def finish(i: int, t: float, rows: list) -> None:
        agents[i].finished = True
        rows.append(event_row(Finish(t, i, agents[i].round)))
        sim.agent_finished()

    each = p.update == "per_receipt"
    while True:
        rows: list[tuple] = []
        arrivals: list = []
        woke: list = []  # (agent, when it calls wake): in the engine's order
        X = bank.W.clone()  # this round's x of every agent (each program's ``agent.params``)
        xs = X.unbind(0)
        merged, ends = [], []  # ends: (agent, when its first gradient is back) in request order
        for t_act, _, i, at in _wake(sim, order):
            a = agents[i]
            rows.append((t_act, "activate", i, -1, -1, 0, at, a.round, ""))
            got, inbox[i] = inbox[i], []
            if got:
                merged.append((i, got))  # merged below, before anything reads x (the gradient, a receiver)
                if p.lr > 0:
                    ct = a._compute() * a.compute_scale
                    rows.append((t_act, "compute_start", i, -1, -1, 0, ct, -1, ""))
                    ends.append((i, t_act + ct))
                    continue
            push(i, xs[i], t_act, rows, arrivals, a)  # x as it will be once merged: payloads are read later
            woke.append((i, t_act))
            if a.round >= limit:
                finish(i, t_act, rows)
        # the tensor work, slot by slot: merge the s-th received model, x.add_(x_j).mul_(0.5), then update
        # (per_receipt: one gradient batch per slot, as the engine's; per_round: one batch after all merges)
        for s in range(max((len(g) for _, g in merged), default=0)):
            ks = [(i, g[s]) for i, g in merged if len(g) > s]
            idx = torch.tensor([i for i, _ in ks], device=X.device)
            X.index_copy_(0, idx, X.index_select(0, idx).add_(torch.stack([m for _, m in ks])).mul_(0.5))
            if p.lr > 0 and each:
                _updates(sim, X, xs, [i for i, g in merged if len(g) > s], updates)
        if p.lr > 0 and not each and merged:
            _updates(sim, X, xs, [i for i, _ in merged], updates)
        if merged:  # agent.params = x, for every agent that merged
            idx = torch.tensor([i for i, _ in merged], device=X.device)
            bank.W.index_copy_(0, idx, X.index_select(0, idx))
        # the rows of the gradients' completions in time order (ties: the order they were requested), each
        # followed by the agent's next gradient request (one per further receipt) or its push
        left = {i: len(g) - 1 if each else 0 for i, g in merged}
        while ends:
            ends.sort(key=lambda e: e[1])  # stable: ties in request order
            nxt = []
            for i, t_done in ends:
                a = agents[i]
                rows.append((t_done, "compute_end", i, -1, -1, 0, 0.0, -1, ""))
                if left[i]:
                    left[i] -= 1
                    ct = a._compute() * a.compute_scale
                    rows.append((t_done, "compute_start", i, -1, -1, 0, ct, -1, ""))
                    nxt.append((i, t_done + ct))
                    continue
                push(i, xs[i], t_done, rows, arrivals, a)
                woke.append((i, t_done))
                if a.round >= limit:
                    finish(i, t_done, rows)
            ends = nxt
        end = max(t for _, t in woke)
        if agents[woke[0][0]].round >= limit:  # the run stops at the last finish: nothing after it happens
            writer.emit_rows(rows)
            break
        arrivals.sort(key=lambda e: (e[0], e[1]))  # by time, ties in send order
        for t_arr, m, i, j, size, sent, rnd, x in arrivals:
            rows.append((t_arr, "deliver", j, i, m, size, t_arr - sent, rnd, "gossip"))
            inbox[j].append(x)
        writer.emit_rows(rows)
        order = woke
        if sim.progress is not None:
            sim.progress(end)
    net.next_id = mid
    sim.env._now = end


def _updates(sim, X, xs, who: list[int], updates: list[int]) -> None:
    """x.sub_(g, alpha=gamma_k) for each agent of ``who``, its gradient at its current x (one batched call)."""
    p, svc, agents = sim.params, sim.gradients, sim.agents
    tickets = [(i, svc.submit(i, xs[i], agents[i].sample_rows(p.batch))) for i in who]
    svc.flush()
    steps: dict[float, list] = {}
    for i, ticket in tickets:
        steps.setdefault(p.lr / (1.0 + p.lr_decay * updates[i]), []).append((i, ticket.result))
        updates[i] += 1
    for alpha, ks in steps.items():
        idx = torch.tensor([i for i, _ in ks], device=X.device)
        X.index_copy_(0, idx, X.index_select(0, idx).sub_(torch.stack([g for _, g in ks]), alpha=alpha))


RUNNERS = {"dpsgd": _dpsgd, "dp_dpsgd": _dpsgd, "choco": _dpsgd, "push_gossip": _push_gossip}
