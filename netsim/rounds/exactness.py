"""The exactness rule of a round kernel, checked by running it: every row gets the same bits in any batch.

Both engines run a kernel's tensor hooks (``local``, ``combine``, ``update``, ``merge``, ``push``, ...) over batches:
the events engine over batches of one (or the agents done at one instant), the windowed drivers over every agent of
a round or a window's step. Their traces, metrics and models are byte-identical only if a row's result never
depends on the other rows of its batch, and a kernel's declared ``reads`` are the Params fields it reads.

``check`` builds two identical small simulations of the kernel (a ring of a few agents, synthetic data, a logistic
model: P = features + 1) with the bank's rows and named states drawn from a seeded stream, then plays the hooks as
the kernel's pattern calls them (two rounds or activations): in one simulation on one batch of B rows, as a
windowed driver does, in the other on B batches of one, as the events engine does, with the same drawn gradients,
payloads and arrivals. After each hook it compares bits: the rows the hook made (``b.x``, payloads, returned rows,
the kernel's own values on the batch) and the run's state (bank rows, named states, the kernel's state). Params are
handed over as a recording copy, so every field a hook reads is compared with ``reads`` (and the pattern's).
A violation is one line naming the kernel and the hook, the row and what differs (``Outcome.violation``).

It compares bits and forbids no operation: a library reduction over a row (``x.norm(dim=1)``) passes where its bits
do not depend on the batch on this machine; ``netsim.compute.exact.row_sum`` is one whose bits never do. Passing is
evidence, not proof: other inputs, sizes or CPUs may still show a difference the draws did not.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

import attrs
import numpy as np

from netsim.rounds.kernel import LOOKAHEAD, ROUNDS, AnyRound, Arrivals, Batch, Requests, RoundKernel, RowViews
from netsim.sim.network import payload_size


@attrs.frozen
class Probe:
    """One probe configuration: the parameters' dtype, the agents (a ring), the data's features (P = features + 1)
    and the batch size B (a barrier pattern batches every agent of a round: B = agents there)."""

    dtype: str
    agents: int
    features: int
    batch: int


# ``netsim check``: both dtypes, small and odd row widths, full and partial batches
CHECK = (Probe("float64", 5, 3, 5), Probe("float32", 5, 3, 4), Probe("float32", 4, 40, 3),
         Probe("float64", 4, 40, 4))
ACTIVATIONS = 2  # rounds (or activations) played per probe


class Violation(Exception):
    """A hook that breaks the rule (``hook``: ``Class.method``), and what it did."""

    def __init__(self, hook: str, what: str):
        super().__init__(hook, what)
        self.hook, self.what = hook, what


@attrs.frozen
class Outcome:
    """What ``check`` found: the hooks it ran, the Params fields they read, what it cost, and the violation line
    (None: none found)."""

    name: str
    kernel: str
    hooks: tuple[str, ...]
    compared: tuple[str, ...]
    probes: tuple[Probe, ...]
    read: tuple[str, ...]
    declared: tuple[str, ...]
    pattern_reads: tuple[str, ...]
    ms: float
    violation: str | None

    def summary(self) -> str:
        """One paragraph of what was checked (success), or the violation line."""
        if self.violation is not None:
            return self.violation
        sizes = sorted({p.batch for p in self.probes}, reverse=True)
        dtypes = sorted({p.dtype for p in self.probes})
        widths = sorted({p.features + 1 for p in self.probes})
        unread = sorted(set(self.declared) - set(self.read) - set(self.pattern_reads))
        hooks = [h.split(".", 1)[1] for h in self.hooks]
        return (f"ok: {self.name} ({self.kernel}): {', '.join(self.compared)} give every row the same bits in a "
                f"batch of {_ors(sizes)} rows as in batches of one ({' and '.join(dtypes)}; P = {_ors(widths)}; "
                f"{ACTIVATIONS} rounds each); params read by {', '.join(hooks)}: {', '.join(self.read) or 'none'}, "
                "all declared" + (f" (declared, not read with these values: {', '.join(unread)})" if unread else "")
                + f"; {self.ms:.0f} ms")


def _said(e: Exception) -> str:
    """An exception in one line: its type and its message's first line."""
    lines = str(e).splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def _ors(v: Sequence) -> str:
    return ", ".join(map(str, v[:-1])) + (" and " if len(v) > 1 else "") + str(v[-1])


def check(name: str, kernel: RoundKernel, params: Any, probes: Sequence[Probe] = CHECK, seed: int = 0) -> Outcome:
    """Check kernel ``kernel`` (registered as ``name``) with ``params`` on each probe (module docstring)."""
    t0 = time.perf_counter()
    rec = Recording(params)
    hooks: list[str] = []
    compared: list[str] = []  # the hooks whose rows were compared
    declared = set(kernel.reads) | set(getattr(kernel.pattern, "reads", ()))
    line, played = None, []
    try:
        _unknown(kernel, params, declared)
        for pr in probes:
            played.append(_compare(name, kernel, rec, pr, seed, hooks, compared))
        _undeclared(kernel, rec, declared)
        _unused(kernel, params, declared)
    except Violation as v:
        line = f"{name} ({v.hook}): {v.what}"
    except Exception as e:  # the kernel does what this check cannot play (its line says what)
        line = f"{name} ({type(kernel).__name__}): netsim check could not play it: {_said(e)}"
    return Outcome(name, type(kernel).__name__, tuple(hooks), tuple(compared), tuple(played), tuple(sorted(rec.log)),
                   tuple(sorted(declared)), tuple(sorted(getattr(kernel.pattern, "reads", ()))),
                   (time.perf_counter() - t0) * 1e3, line)


def refusal(sim) -> str | None:
    """Before a windowed run of a plugin kernel (not one of netsim's own, which the test suite checks): the check
    on one small probe at the run's dtype and parameters; its violation line, or None."""
    kernel = sim.program
    if not isinstance(kernel, RoundKernel) or type(kernel).__module__.startswith("netsim."):
        return None
    dtype, name = str(sim.dtype).removeprefix("torch."), sim.scenario.algorithm.name
    n = 4
    out = check(name, kernel, sim.params, (Probe(dtype, n, 3, n - 1),))
    if out.violation is None:
        return None
    return f"the kernel fails netsim check: {out.violation} — fix the hook it names (netsim check {name} --plugin FILE)"


# Params, recorded ----------------------------------------------------------------------------------------------
class Recording:
    """A copy of a Params record (an instance of a subclass of its class) that notes each field a hook reads:
    ``log`` maps the field to the first hook that read it; ``hook`` is the hook running now."""

    def __init__(self, params: Any):
        self.log: dict[str, str] = {}
        self.hook = "check"
        self.on = True
        cls = type(params)
        fields = frozenset(f.name for f in attrs.fields(cls))
        rec = self

        def get(obj, attr):
            if attr in fields and rec.on:
                rec.log.setdefault(attr, rec.hook)
            return object.__getattribute__(obj, attr)

        def quiet(method):  # hashing, equality and repr read every field: not the kernel's reads
            def call(obj, *args):
                rec.on, was = False, rec.on
                try:
                    return method(obj, *args)
                finally:
                    rec.on = was
            return call

        sub = type(cls.__name__, (cls,), {"__getattribute__": get,
                                          "__hash__": cls.__hash__ and quiet(cls.__hash__),
                                          "__eq__": quiet(cls.__eq__), "__repr__": quiet(cls.__repr__),
                                          "__module__": cls.__module__,
                                          **({"__slots__": ()} if hasattr(cls, "__slots__") else {})})
        self.params = object.__new__(sub)
        for f in fields:
            object.__setattr__(self.params, f, getattr(params, f))


def _unknown(kernel, params, declared: set) -> None:
    """``reads`` and the pattern's name fields of the Params class."""
    cls = type(params)
    fields = {f.name for f in attrs.fields(cls)}
    unknown = sorted(declared - fields)
    if unknown:
        raise Violation(f"{type(kernel).__name__}.reads", f"declares {', '.join(unknown)}, not fields of "
                                                          f"{cls.__name__} (its fields: {', '.join(sorted(fields))})")


def _unused(kernel, params, declared: set) -> None:
    """Every Params field is declared by the kernel or its pattern: one nobody reads is ignored unnoticed."""
    cls = type(params)
    missed = sorted({f.name for f in attrs.fields(cls)} - declared)
    if missed:
        raise Violation(f"{type(kernel).__name__}.reads", f"{cls.__name__}.{missed[0]} is neither in reads nor the "
                                                          "pattern's: a value set for it would be ignored unnoticed "
                                                          "(declare it in reads, or drop the field)")


def _undeclared(kernel, rec: Recording, declared: set) -> None:
    for f, hook in sorted(rec.log.items()):
        if f not in declared:
            own = ", ".join(sorted(kernel.reads)) or "none"
            pat = ", ".join(sorted(getattr(kernel.pattern, "reads", ()))) or "none"
            raise Violation(hook, f"reads params.{f}, which reads does not declare (reads: {own}; the "
                                  f"pattern's: {pat})")


# the two simulations ---------------------------------------------------------------------------------------------
def _scenario(name: str, pr: Probe) -> dict:
    return {"name": "exactness", "run": {"seed": 1, "rounds": 2, "until": 1.0e6},
            "agents": {"count": pr.agents, "compute_time": {"kind": "constant", "value": 0.01},
                       "activation": {"kind": "periodic", "period": 0.1}},
            "topology": {"kind": "ring"}, "network": {"latency": {"kind": "constant", "value": 0.005}},
            "data": {"kind": "synthetic", "samples": 12 * pr.agents, "features": pr.features, "partition": "iid",
                     "validation": 2},  # (a validation set for the methods that read one: PDSL's coalition values)
            "model": {"kind": "logistic", "dtype": pr.dtype}, "algorithm": {"name": name},
            "evaluation": {"every": 1.0e6, "metrics": ["loss"]}}


class Side:
    """One of the two probe simulations: ``batched`` plays each hook on one batch of the probe's rows (a windowed
    driver's call), else on batches of one (the events engine's)."""

    def __init__(self, name: str, kernel, rec: Recording, pr: Probe, seed: int, batched: bool, hooks: list[str]):
        from netsim.privacy.ledger import new_ledger
        from netsim.scenario import scenario_from_dict
        from netsim.sim.kernel import Simulation

        self.kernel, self.rec, self.p, self.pr, self.seed, self.batched = kernel, rec, rec.params, pr, seed, batched
        self.hooks = hooks
        rec.hook = f"{type(kernel).__name__}.check"
        try:
            self.sim = Simulation(scenario_from_dict(_scenario(name, pr)), kernel, rec.params, ledger=new_ledger)
        except Exception as e:
            raise Violation(rec.hook, f"refuses the check's probe ({pr.agents} agents on a ring, synthetic data, a "
                                      f"logistic model, {pr.dtype}): {_said(e)}") from e
        self.agents = self.sim.agents
        self.bank = self.sim.bank
        self.bank.W.copy_(self.drawn("x", 0, shape=self.bank.W.shape))
        self.state = self.call("init", kernel.state_of, self.agents[0], rec.params)
        for s, (_, t) in enumerate(sorted(self.bank.states.items())):  # the kernel's named rows, drawn
            if t.is_floating_point():
                t.copy_(self.drawn("state", s, shape=t.shape))
        self.own: list = []  # a broadcast kernel's control values per agent (``start``)

    def call(self, hook: str, fn: Callable, *args) -> Any:
        """``fn(*args)``, noted as ``Class.hook``: the hook that reads params now, or raises."""
        label = f"{type(self.kernel).__name__}.{hook}"
        if label not in self.hooks:
            self.hooks.append(label)
        self.rec.hook = label
        try:
            return fn(*args)
        except Violation:
            raise
        except Exception as e:
            pr = self.pr
            rows = f"a batch of {pr.batch} rows" if self.batched else "a batch of one"
            raise Violation(label, f"raised {_said(e)} (in {rows}, {pr.dtype}, P = {pr.features + 1}, on drawn "
                                   "inputs)") from e

    def where(self) -> str:
        pr = self.pr
        return f"between a batch of {pr.batch} rows and batches of one ({pr.dtype}, P = {pr.features + 1})"

    def drawn(self, *key, shape) -> Any:
        """A standard normal tensor of the probe's dtype from the stream (seed, key): the same on both sides."""
        import torch

        rng = np.random.default_rng([self.seed, *(sum(map(ord, k)) if isinstance(k, str) else k for k in key)])
        return torch.from_numpy(rng.standard_normal(tuple(shape))).to(getattr(torch, self.pr.dtype))

    def rng(self, *key) -> np.random.Generator:
        return np.random.default_rng([self.seed, 7, *key])


def _compare(name: str, kernel, rec: Recording, pr: Probe, seed: int, hooks: list[str], compared: list[str]) -> Probe:
    """Play the kernel's pattern on both sides, step by step, and raise at the first step whose rows or state
    differ; the probe as played."""
    from netsim.rounds.broadcast import BroadcastKernel
    from netsim.rounds.pairwise import PairwiseKernel
    from netsim.rounds.push import PushKernel
    from netsim.rounds.sync import SyncKernel
    from netsim.rounds.ticks import TickKernel
    from netsim.rounds.triggered import TriggeredKernel

    sides = [Side(name, kernel, rec, pr, seed, batched, hooks) for batched in (True, False)]
    if isinstance(kernel, SyncKernel):
        play = _sync
        pr = attrs.evolve(pr, batch=pr.agents)
    elif isinstance(kernel, PushKernel):
        play = _push
    elif isinstance(kernel, (PairwiseKernel, TriggeredKernel)):
        play = _updates
    elif isinstance(kernel, BroadcastKernel):
        play = _broadcast
    elif isinstance(kernel, TickKernel):
        play = _ticks
    else:
        raise Violation(f"{type(kernel).__name__}.pattern", f"{type(kernel.pattern).__name__} is not a pattern "
                                                            "this check plays")
    for s in sides:
        s.pr = pr
    who = [int(i) for i in sides[0].rng(0).permutation(pr.agents)[:pr.batch]]
    runs = [play(s, kernel, s.p, who) for s in sides]
    while True:
        steps = [next(r, None) for r in runs]
        if steps[0] is None or steps[1] is None:
            if steps[0] is not steps[1]:
                raise Violation(f"{type(kernel).__name__}.{(steps[0] or steps[1])[0]}",
                                "runs in one engine's calls and not the other's")
            return pr
        (hook, rows_b), (hook_1, rows_1) = steps
        label = f"{type(kernel).__name__}.{hook}"
        ids_b, ids_1 = ([r["agent"] for r in rows] for rows in (rows_b, rows_1))
        if hook != hook_1 or ids_b != ids_1:
            raise Violation(label, f"the calls part {sides[0].where()}: here {hook} of agents {ids_b}, against "
                                   f"{hook_1} of {ids_1}")
        if hook.split(" ")[0] not in compared:
            compared.append(hook.split(" ")[0])
        for n, (rb, r1) in enumerate(zip(rows_b, rows_1, strict=True)):
            for key in dict.fromkeys([*rb, *r1]):
                d = _diff(rb.get(key, _MISSING), r1.get(key, _MISSING), key)
                if d is not None and key.startswith("b.") and key[2:] not in ("x", "g", "k", *kernel.per_row):
                    raise Violation(label, f"{key}, kept on the batch, differs {sides[0].where()} ({d}): a value with "
                                           f"one row per agent must be named in {type(kernel).__name__}.per_row "
                                           "(Batch.row cuts those to an agent's row; anything else is shared by the "
                                           "batch's rows)")
                if d is not None:
                    raise Violation(label, f"{d} of agent {rb['agent']} (row {n}) differs {sides[0].where()}: a row's "
                                           "bits must not depend on the other rows")
        d = _state_diff(sides[0], sides[1])
        if d is not None:
            raise Violation(label, f"{d} differs {sides[0].where()}: a row's bits must not depend on the other rows")


# what each pattern calls, on either side ----------------------------------------------------------------------------
Rows = list  # per batch position: {what: value}


def _one_rows(kernel, b: Batch, n: int, into: dict) -> dict:
    """Row n of batch b: its x, g, payload and the kernel's own values kept on it (those it declares ``per_row`` cut
    to row n, as ``Batch.row`` cuts them; anything else as it is)."""
    into["agent"] = b.agents[n].id
    into["b.x"] = b.x[n]
    if b.g is not None:
        into["b.g"] = b.g[n]
    if b.out is not None:
        into["the payload"] = b.out[n]
        into["the payload's size"] = b.sizes[n] if b.sizes is not None else payload_size(b.out[n])
    into["b.k"] = b.k
    for name, v in b.kept().items():
        try:
            cut = b.cut(name, v, n, kernel.per_row)
            into[f"b.{name}"] = cut[0] if name in kernel.per_row and cut is not None else cut  # agent n's item
        except TypeError as e:
            raise Violation(f"{type(kernel).__name__}.per_row", str(e)) from e
    return into


def _rows(kernel, groups: list[Batch]) -> Rows:
    """Every row of a side's batches (one batch of B, or B of one), in batch order."""
    return [_one_rows(kernel, b, n, {}) for b in groups for n in range(len(b))]


def _sync(side: Side, kernel, p, who: list[int]) -> Generator:
    """``SyncRounds``: per round, the gradient request, ``local`` (its waves of gradients answered with drawn rows),
    then each exchange's ``combine`` over drawn arrivals of what the in-neighbours sent (some lost)."""
    import torch

    agents = [side.agents[i] for i in who]
    pos = {i: n for n, i in enumerate(who)}
    side.call("refusal", kernel.refusal, side.sim, ROUNDS)
    # a kernel whose hooks read no b.k (``any_round``): the batch's b.k raises when read, as a driver's batch of agents
    # at different rounds (set to k again for the comparisons)
    declares = type(kernel).any_round is not RoundKernel.any_round
    unread = AnyRound(type(kernel).__name__) if declares and side.call("any_round", kernel.any_round, p) else None
    for k in range(ACTIVATIONS):
        st = side.state
        reqs = [side.call("gradient", kernel.asks, p, st, i, k) for i in who]
        if any(r is None for r in reqs) and not all(r is None for r in reqs):
            raise Violation(f"{type(kernel).__name__}.gradient", "some agents of a round ask for its first gradient "
                                                                 "and others do not (the windowed driver needs all)")
        G = None if reqs[0] is None else side.drawn("g", k, shape=side.bank.W.shape)
        if side.batched:
            idx = torch.tensor(who)
            x = side.bank.W.index_select(0, idx)
            groups = [Batch(agents, k if unread is None else unread, x, None if G is None else G.index_select(0, idx),
                            st, rows=(RowViews(x), None))]
        else:
            groups = []
            for a in agents:
                x = a.params
                g1 = None if G is None else G[a.id].clone()
                groups.append(Batch([a], k, x.unsqueeze(0), None if g1 is None else g1.unsqueeze(0), st,
                                    rows=((x,), None if g1 is None else (g1,))))
        points: list[list] = [[] for _ in who]
        for b in groups:
            local = side.call("local", kernel.local, b, p)
            w, wave = None if local is None else side.call("local", next, local, None), 0
            while w is not None:
                at = [int(a.id) for a in b.agents]
                for n, i in enumerate(at):
                    points[pos[i]].append((w.at[n], np.asarray(w.rows[n])))
                g = side.drawn("wave", k, wave, shape=side.bank.W.shape).index_select(0, torch.tensor(at))
                w, wave = side.call("local", _send, local, g), wave + 1
            if b.k is unread is not None:
                b.k = k
        rows = _rows(kernel, groups)
        for n, r in enumerate(rows):
            r["each local gradient's point and rows"] = points[n]
        yield "local", rows
        if any(b.out is None for b in groups):
            raise Violation(f"{type(kernel).__name__}.local", "sends nothing (b.send) for the round's exchange")
        steps = side.call("exchanges", kernel.exchanges, p, st)
        for s in range(steps):
            got = _arrivals(side, groups, who, pos, k, s)
            after: list[list] = [[] for _ in who]  # a combine's gradients after the exchange: their points, rows
            for b, g in zip(groups, got, strict=True):
                b.s = s
                if unread is not None and side.batched and b.k is k:
                    b.k = unread
                comb = side.call("combine", kernel.combine, b, p, g)
                w, wave = None if comb is None else side.call("combine", next, comb, None), 0
                while w is not None:
                    if type(w) is Requests:  # a lookahead service's values: each agent's request valued alone
                        w = side.call("combine", _send, comb, [None if it is None else w.service.value([it])[0]
                                                               for it in w.items])
                        continue
                    at = [int(a.id) for a in b.agents]
                    for n, i in enumerate(at):
                        if w.rows[n] is not None:  # (None: this agent asks for no gradient)
                            after[pos[i]].append((w.at[n], np.asarray(w.rows[n])))
                    g = side.drawn("after", k, s, wave, shape=side.bank.W.shape).index_select(0, torch.tensor(at))
                    w, wave = side.call("combine", _send, comb, g), wave + 1
                if b.k is unread is not None:
                    b.k = k
            rows = _rows(kernel, groups)
            for n, r in enumerate(rows):
                r["each gradient's point and rows after the exchange"] = after[n]
            yield "combine" if steps == 1 else f"combine (exchange {s} of {steps})", rows


def _send(gen: Generator, value: Any) -> Any:
    try:
        return gen.send(value)
    except StopIteration:
        return None


def _arrivals(side: Side, groups: list[Batch], who: list[int], pos: dict, k: int, s: int) -> list:
    """What reached each agent of exchange s: a drawn subset of its in-neighbours' payloads (the others lost) in a
    drawn arrival order; for the batched side as a windowed driver hands it over (``Arrivals``)."""
    rng = side.rng(1, k, s)
    pairs = [(pos[j], pos[i]) for i in who for j in side.agents[i].in_neighbors if j in pos]
    pairs = [pairs[e] for e in rng.permutation(len(pairs)) if rng.random() < 0.75]  # (sender, receiver) positions
    several = bool(getattr(side.kernel.pattern, "more", ()))  # one ``got`` per message of the exchange
    each = isinstance(groups[0].out[0], dict)  # one payload per out-neighbour (``Agent.send_each``)
    if each:
        outs = [o for b in groups for o in b.out]
        pairs = [(snd, r) for snd, r in pairs if who[r] in outs[snd]]
    w = np.array([side.agents[who[r]].weights.get(who[snd], np.nan) for snd, r in pairs], np.float64)
    recv = np.array([r for _, r in pairs], np.int64)
    if each:
        per = [outs[snd][who[r]] for snd, r in pairs]
        if side.batched:
            return [Arrivals([who[snd] for snd, _ in pairs], per, None, recv, np.arange(len(pairs)), w,
                             receivers=len(who))]
        got1: list[dict] = [{} for _ in who]
        for (snd, r), x in zip(pairs, per, strict=True):
            got1[r][who[snd]] = x
        return [[g] for g in got1]
    if side.batched:
        b = groups[0]
        send = np.array([snd for snd, _ in pairs], np.int64)
        got_b = [Arrivals(list(who), out, b.sent if m == 0 else None, recv, send, w)
                 for m, (out, _) in enumerate([(b.out, None), *(b.more or ())])]
        return [tuple(got_b) if several else got_b[0]]
    outs = [[(b.out[0], *(o[0] for o, _ in (b.more or ())))] for b in groups]
    got: list[list[dict]] = [[{} for _ in outs[0][0]] for _ in who]
    for snd, r in pairs:
        for m, payload in enumerate(outs[snd][0]):
            got[r][m][who[snd]] = payload
    return [tuple([g] for g in gs) if several else [gs[0]] for gs in got]


def _push(side: Side, kernel, p, who: list[int]) -> Generator:
    """``PushGossip``: per activation, each received model merged (``combine``, one receipt after the other) with
    an ``update`` after each receipt ``update_after`` names; the windowed driver batches every agent's n-th receipt
    and keeps ``b.x``, the events engine keeps one batch of one over the activation and the row it was made from."""
    import torch

    st, agents = side.state, [side.agents[i] for i in who]
    for k in range(ACTIVATIONS):
        counts = [int(c) for c in side.rng(2, k).integers(1, 3, len(who))]
        P = side.drawn("payloads", k, shape=(2, *side.bank.W.shape))
        G = side.drawn("g", k, shape=(2, *side.bank.W.shape))
        if side.batched:
            X = side.bank.W.clone()
        else:
            xs = [a.params for a in agents]
            bs = [Batch([a], a.round, x.unsqueeze(0), None, st) for a, x in zip(agents, xs, strict=True)]
        for m in range(1, 3):
            at = [n for n in range(len(who)) if counts[n] >= m]
            if not at:
                continue
            reqs = [side.call("update_after", kernel.update_after, p, m, counts[n]) for n in at]
            ups = [n for n, r in zip(at, reqs, strict=True) if r is not None]
            for hook, ns, rows_of in (("combine", at, P[m - 1]), ("update", ups, G[m - 1])):
                if not ns:
                    continue
                ids = [who[n] for n in ns]
                fn = kernel.combine if hook == "combine" else kernel.update
                if side.batched:
                    idx = torch.tensor(ids)
                    b = Batch([side.agents[i] for i in ids], side.agents[ids[0]].round, X.index_select(0, idx), None,
                              st)
                    side.call(hook, fn, b, p, rows_of.index_select(0, idx))
                    X.index_copy_(0, idx, b.x)
                    rows = [{"agent": i, "the row kept": X[i].clone()} for i in ids]
                else:
                    rows = []
                    for n in ns:
                        side.call(hook, fn, bs[n], p, rows_of[who[n]].unsqueeze(0))
                        rows.append({"agent": who[n], "the row kept": xs[n].clone()})
                yield f"{hook} (receipt {m})", rows
        if side.batched:  # agent.params = x, for every agent that merged
            idx = torch.tensor(who)
            side.bank.W.index_copy_(0, idx, X.index_select(0, idx))
        else:
            for a, x in zip(agents, xs, strict=True):
                a.params = x


def _broadcast(side: Side, kernel, p, who: list[int]) -> Generator:
    """``Broadcast``: per activation, ``choose`` over drawn arrivals, then ``merge``, ``gradient_at``, ``update``,
    ``params`` and ``push`` (merge first with ``merge_first``), ``pushed``; the windowed driver makes each operation's
    batch from its rows and stores ``b.x`` and the extra rows back, the events engine keeps one batch of one."""
    play = _Activations(side, kernel, p, who)
    everyone = list(range(len(who)))
    for k in range(ACTIVATIONS):
        play.activate(k)
        if kernel.merge_first:
            yield from play.merge(k)
        if play.req is not None:
            yield "gradient_at", play.kept(everyone, play.gradient_at())
        if not kernel.merge_first:
            yield from play.merge(k)
        if play.req is not None:
            play.update(side.drawn("g", k, shape=play.X.shape))
            yield "update", play.kept(everyone)
        yield "params", play.kept(everyone, play.params())
        yield "push", play.kept(everyone, play.push())


class _Activations:
    """One side's broadcast activations: ``X`` and ``extra`` are the rows between activations (the windowed driver's
    arrays); the events engine's side makes ``ones``, each agent's batch of one, at each activation."""

    def __init__(self, side: Side, kernel, p, who: list[int]):
        self.side, self.kernel, self.p, self.who = side, kernel, p, who
        self.agents = [side.agents[i] for i in who]
        side.own = [side.call("start", kernel.start, a, p) for a in self.agents]
        self.req = side.call("request", kernel.request, p)
        self.X = side.bank.W.clone()
        self.extra = {name: side.drawn("extra", e, shape=self.X.shape) for e, name in enumerate(kernel.extra_rows)}
        self.sent: dict = {}  # the drawn payloads of each activation: a windowed handle is (activation, agent, m)
        self.ones: list[Batch] = []

    def activate(self, k: int) -> None:
        if self.side.batched:
            return
        self.ones = []
        for a in self.agents:
            b = Batch([a], a.round, self.X[a.id].clone().unsqueeze(0), None, self.side.state)
            b.rows = {name: m[a.id].clone().unsqueeze(0) for name, m in self.extra.items()}
            self.ones.append(b)

    def batch(self, ns: list[int], scalars: bool = False) -> tuple[Batch, Any]:
        """The windowed driver's batch of rows ``ns`` (``broadcast_windows``)."""
        import torch

        idx = torch.tensor([self.who[n] for n in ns])
        b = Batch([self.agents[n] for n in ns], self.agents[ns[0]].round, self.X.index_select(0, idx), None,
                  self.side.state)
        b.rows = {name: m.index_select(0, idx) for name, m in self.extra.items()}
        b.scalars = [self.kernel.scalars(self.side.own[n]) for n in ns] if scalars else None
        return b, idx

    def store(self, b: Batch, idx) -> None:
        self.X.index_copy_(0, idx, b.x)
        for name, m in self.extra.items():
            m.index_copy_(0, idx, b.rows[name])

    def one(self, n: int) -> Batch:
        """Agent n's batch of one, its scalars as they are now."""
        b = self.ones[n]
        b.scalars = [self.kernel.scalars(self.side.own[n])]
        return b

    def kept(self, ns: list[int], out: dict | None = None) -> Rows:
        """Rows ``ns`` as the side keeps them (and ``out``, what the step returned)."""
        rows = []
        for n in ns:
            i = self.who[n]
            r = {"agent": i, "b.x": self.X[i].clone() if self.side.batched else self.ones[n].x[0]}
            for name, m in self.extra.items():
                r[f"b.rows[{name!r}]"] = m[i].clone() if self.side.batched else self.ones[n].rows[name][0]
            rows.append({**r, **(out or {}).get(n, {})})
        return rows

    def merge(self, k: int) -> Generator:
        import torch

        from netsim.rounds.broadcast import Incoming

        side, kernel, who = self.side, self.kernel, self.who
        P = self.sent[k] = side.drawn("payloads", k, shape=(2, *self.X.shape))
        scal = side.rng(3, k).uniform(0.5, 2.0, (len(who), 2))
        counts = side.rng(4, k).integers(0, 3, len(who))
        takes: dict[int, list] = {}
        for n, a in enumerate(self.agents):
            nb = sorted(a.in_neighbors)
            got = []
            for m in range(int(counts[n])):
                row, scalar = kernel.incoming(kernel.payload(P[m, a.id].clone(), float(scal[n, m])))
                got.append(Incoming(nb[m % len(nb)], k, scalar, (k, n, m) if side.batched else row))
            if got:
                t = side.call("choose", kernel.choose, side.own[n], a, self.p, got)
                if t:
                    takes[n] = t
        ns = sorted(takes)
        if not ns:
            return
        if side.batched:
            b, idx = self.batch(ns, True)
            side.call("merge", kernel.merge, b, self.p, [takes[n] for n in ns],
                      lambda hs: torch.stack([self.sent[c][m, who[n]] for c, n, m in hs]))
            self.store(b, idx)
        else:
            for n in ns:
                side.call("merge", kernel.merge, self.one(n), self.p, [takes[n]], torch.stack)
        yield "merge", self.kept(ns)

    def gradient_at(self) -> dict:
        side, kernel, ns = self.side, self.kernel, range(len(self.who))
        if side.batched:
            at = side.call("gradient_at", kernel.gradient_at, self.batch(list(ns), True)[0], self.p)
            return {n: {"the gradient's point": at[n]} for n in ns}
        return {n: {"the gradient's point": side.call("gradient_at", kernel.gradient_at, self.one(n), self.p)[0]}
                for n in ns}

    def update(self, G) -> None:
        side, ns = self.side, list(range(len(self.who)))
        if side.batched:
            b, idx = self.batch(ns)
            side.call("update", self.kernel.update, b, self.p, G.index_select(0, idx))
            self.store(b, idx)
        else:
            for n in ns:
                side.call("update", self.kernel.update, self.ones[n], self.p, G[self.who[n]].unsqueeze(0))

    def params(self) -> dict:
        """``agent.params = params(b)``; the windowed driver's batch is kept for ``push`` (one batch for both)."""
        side, ns = self.side, list(range(len(self.who)))
        if side.batched:
            self.last = b, idx = self.batch(ns, True)
            side.bank.W.index_copy_(0, idx, side.call("params", self.kernel.params, b, self.p))
            return {n: {"b.x": b.x[n]} for n in ns}
        for n in ns:
            self.agents[n].params = side.call("params", self.kernel.params, self.one(n), self.p)[0]
        return {}

    def push(self) -> dict:
        side, kernel, ns = self.side, self.kernel, list(range(len(self.who)))
        if side.batched:
            b, idx = self.last
            pushed = side.call("push", kernel.push, b, self.p)
            self.store(b, idx)
            out = {n: {"the pushed row": pushed[n]} for n in ns}
        else:
            out = {n: {"the pushed row": side.call("push", kernel.push, self.one(n), self.p)[0]} for n in ns}
            for n, b in enumerate(self.ones):  # the events engine's rows between activations
                self.X[self.who[n]] = b.x[0]
                for name, m in self.extra.items():
                    m[self.who[n]] = b.rows[name][0]
        for n in ns:
            out[n]["the pushed scalar"] = side.call("pushed", kernel.pushed, side.own[n], self.agents[n], self.p)
        return out


def _updates(side: Side, kernel, p, who: list[int]) -> Generator:
    """``Triggered``, ``TriggeredDeltas`` and ``Pairwise`` kernels: the step ``update`` with each agent's gradient,
    if ``gradient`` asks for one, and a pull's ``combine`` with drawn replies (the mixing, triggers and exchanges are
    the pattern's own)."""
    import torch

    from netsim.rounds.pairwise import PairwiseKernel
    from netsim.rounds.triggered import TriggeredDeltas

    agents = [side.agents[i] for i in who]
    if isinstance(kernel, PairwiseKernel):
        side.call("exchange", kernel.exchange, p)
        for i in who:
            side.call("initiates", kernel.initiates, side.state, i)
    else:
        side.call("trigger", kernel.trigger, p)
        side.call("refusal", kernel.refusal, side.sim, LOOKAHEAD)
    deltas = isinstance(kernel.pattern, TriggeredDeltas)  # the events engine's update sees no state there
    pull = getattr(kernel.pattern, "pull", False)  # a pull's replies merged by ``combine``
    for k in range(ACTIVATIONS):
        reqs = [side.call("gradient", kernel.gradient, p, None if deltas else side.state, i) for i in who]
        asked = [n for n, r in enumerate(reqs) if r is not None]
        for hook, ns in (("update", asked), ("combine", list(range(len(who))) if pull else [])):
            if not ns:
                continue
            G, fn = side.drawn("g" if hook == "update" else "r", k, shape=side.bank.W.shape), getattr(kernel, hook)
            if side.batched:
                idx = torch.tensor([who[n] for n in ns])
                W = side.bank.W
                b = Batch([agents[n] for n in ns], k, W.index_select(0, idx), None, side.state)
                if not isinstance(kernel, PairwiseKernel):
                    b.rows, b.scalars = {}, None
                side.call(hook, fn, b, p, G.index_select(0, idx))
                W.index_copy_(0, idx, b.x)
            else:
                for n in ns:
                    a = agents[n]
                    b = Batch([a], k, a.params.unsqueeze(0), None, None if deltas else side.state)
                    side.call(hook, fn, b, p, G[a.id].unsqueeze(0))
                    a.params = b.x[0]
            yield hook, [{"agent": who[n], "the row after it": side.bank.W[who[n]].clone()} for n in ns]


def _ticks(side: Side, kernel, p, who: list[int]) -> Generator:
    """``TickKernel``s: rounds slept through (``sleep``) and active rounds (``step``, with drawn noisy gradients), on
    one batch of the rows or one agent at a time (the arrivals, releases and sends are the pattern's own)."""
    import torch

    agents = [side.agents[i] for i in who]
    side.call("request", kernel.request, side.state, p)
    side.call("horizon", kernel.horizon, p)
    W, idx = side.bank.W, torch.tensor(who)
    for k in range(ACTIVATIONS):
        for hook in ("sleep", "step"):
            G = side.drawn("g", k, shape=W.shape)
            sent = []
            if side.batched:
                b = Batch(agents, k, W.index_select(0, idx), None, side.state)
                noisy = () if hook == "sleep" else (G.index_select(0, idx),)
                out = side.call(hook, getattr(kernel, hook), b, p, *noisy)
                W.index_copy_(0, idx, b.x)
                sent = [] if out is None else list(out[0].unbind(0))
            else:
                for a in agents:
                    b = Batch([a], k, a.params.unsqueeze(0), None, side.state)
                    out = side.call(hook, getattr(kernel, hook), b, p, *(() if hook == "sleep" else (G[a.id][None],)))
                    a.params = b.x[0]
                    if out is not None:
                        sent.append(out[0][0])
            yield hook, [{"agent": i, "the row after it": W[i].clone(),
                          **({"the differences": sent[n]} if sent else {})} for n, i in enumerate(who)]


# bits ---------------------------------------------------------------------------------------------------------------
_MISSING = object()


def _state_diff(a: Side, b: Side) -> str | None:
    """Where the two sides' run state differs: bank rows, named states, the kernel's state, agents' own values."""
    n = len(a.agents)
    d = _diff(a.bank.W, b.bank.W, "the bank's parameter rows", n)
    for name in dict.fromkeys([*a.bank.states, *b.bank.states]):
        d = d or _diff(a.bank.states.get(name, _MISSING), b.bank.states.get(name, _MISSING),
                       f"the bank's state {name!r}", n)
    d = d or _diff(a.state, b.state, "the kernel's state", n)
    own = [[a.kernel.scalars(o) for o in side.own] for side in (a, b)]  # (its handles are each engine's own)
    return d or _diff(*own, "the agents' scalars (start, choose, pushed)")


def _diff(x: Any, y: Any, path: str, agents: int | None = None, depth: int = 0) -> str | None:
    """The first place where x and y differ in bits (a path naming it), or None. ``agents``: a leading dimension of
    this length is the agents' (named in the path)."""
    import torch

    if x is _MISSING or y is _MISSING:
        return f"{path} (made on one side only)"
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            return f"{path} (a tensor on one side only)"
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"{path} ({x.dtype} {tuple(x.shape)} against {y.dtype} {tuple(y.shape)})"
        bx, by = _bytes(x), _bytes(y)
        if bx == by:
            return None
        if agents is not None and x.dim() > 0 and x.shape[0] == agents:
            i = next(i for i in range(agents) if _bytes(x[i]) != _bytes(y[i]))
            return f"{path}, agent {i}'s row"
        return path
    if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
        return None if x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes() else path
    if isinstance(x, float) and isinstance(y, float):
        return None if struct.pack("<d", x) == struct.pack("<d", y) else f"{path} ({x!r} against {y!r})"
    if isinstance(x, (int, str, bool, type(None), float, np.generic)):  # (x a float here: y is not one)
        return None if type(x) is type(y) and x == y else f"{path} ({x!r} against {y!r})"
    if type(x) is not type(y):
        return f"{path} ({type(x).__name__} against {type(y).__name__})"
    if depth > 4:
        return None
    if isinstance(x, (list, tuple, RowViews)):
        if len(x) != len(y):
            return f"{path} (length {len(x)} against {len(y)})"
        per = agents is not None and len(x) == agents
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            d = _diff(u, v, f"{path}, agent {i}'s item" if per else f"{path}[{i}]", agents, depth + 1)
            if d is not None:
                return d
        return None
    if isinstance(x, dict):
        if list(x) != list(y):
            return f"{path} (keys {sorted(map(repr, x))[:6]} against {sorted(map(repr, y))[:6]})"
        for key in x:
            d = _diff(x[key], y[key], f"{path}[{key!r}]", agents, depth + 1)
            if d is not None:
                return d
        return None
    if isinstance(x, (set, frozenset)):
        return None if x == y else path
    if isinstance(x, np.random.Generator):
        return None if x.bit_generator.state == y.bit_generator.state else f"{path} (a random stream's position)"
    own = _fields(x)
    if own is None:
        return None  # an object this check does not read (its effects show in the rows)
    return _diff(own, _fields(y), path, agents, depth + 1)


def _fields(v: Any) -> dict | None:
    if attrs.has(type(v)):
        return {f.name: getattr(v, f.name) for f in attrs.fields(type(v))}
    if hasattr(v, "_asdict"):
        return dict(v._asdict())
    d = getattr(v, "__dict__", None)
    if d is None or type(v).__module__.startswith("netsim.sim"):  # an agent, the simulation: not the kernel's
        return None
    return {k: x for k, x in d.items() if not callable(x)}


def _bytes(t) -> bytes:
    return t.detach().contiguous().cpu().reshape(-1).view(-1).numpy().tobytes() if t.numel() else b""
