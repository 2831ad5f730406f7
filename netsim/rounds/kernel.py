"""Round kernels: an algorithm written once, as its per-round math over a batch of agents.

A round-structured method (D-PSGD and its private and compressed variants, gossip learning) is a
``RoundKernel`` of its pattern's class (``Pattern.kernel``: barrier rounds call a ``SyncKernel``'s ``local``, what
each agent of a batch sends after the gradient it asked for with ``gradient``, and ``combine``, what it does with
what arrived; push gossip a ``PushKernel``'s ``combine`` and ``update``; ...); ``pattern`` names the exchange, and the
pattern owns everything else (waking, links, barriers, timeouts, the trace). In the events
engine the pattern runs each agent as a generator over a batch of one; in the windowed engine its driver
plays every agent of a round as one batch, with the events engine's exact trace. Because a batch's rows are
computed by the same float operations whatever the batch (everything a kernel does goes through ``Batch``,
whose operations are row-wise or per agent in the agent's own order), both engines give the same bits.

A kernel is stateless: what outlives a round lives in the run's state (``init``: tensors of all agents,
e.g. in ``Batch.state_rows``, which the parameter bank keeps and checkpoints) or in the agents' streams.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs
import numpy as np

from netsim.sim.network import payload_size

if TYPE_CHECKING:  # torch is imported where it is used: a kernel's module (its Params) loads without it
    import torch


@attrs.frozen
class GradientRequest:
    """What a kernel's agent asks the gradient service for before ``local``: a mini-batch of ``batch`` rows
    (0: all local data), optionally the mean of per-example gradients clipped to ``clip``. ``GradientRequest.of``
    gives the one shared record of each request (a kernel asks for one per agent and round)."""

    batch: int
    clip: float | None = None
    clip_kind: str = "l2"

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def of(batch: int, clip: float | None = None, clip_kind: str = "l2") -> GradientRequest:
        return GradientRequest(batch, clip, clip_kind)


@attrs.frozen(eq=False)
class Wave:
    """A local step's gradients, one per agent of a batch: at the rows ``at``, on each agent's ``rows`` (a kernel's
    ``local`` yields it and receives the gradient rows; agents of a batch ask at the same time, so the gradient
    service evaluates a wave in one batched call in both engines). After the exchange (``combine``) an agent may ask
    for none (its ``rows`` None: its answer row is zeros), and then for none in a later wave of the round either."""

    at: torch.Tensor
    rows: list
    clip: float | None = None
    clip_kind: str = "l2"


@attrs.frozen(eq=False)
class Requests:
    """A timed request of each agent of a batch to a lookahead service (``Agent.lookahead``): agent n's ``items[n]``
    (None: no request), answered after compute time ``ct[n]`` (``compute_start`` / ``compute_end`` rows, as a
    gradient's); every request of a wave is valued in one call of the service's ``evaluate``, in both engines. A
    kernel yields it (``Batch.requests``) where it yields a ``Wave`` and receives each agent's result (None where it
    asked none)."""

    service: Any
    items: list
    ct: list


def drive(agent, local) -> Generator:
    """Run a kernel's local generator for one agent (a batch of one): each ``Wave`` is a gradient request of the
    agent, each ``Requests`` its request to a lookahead service; returns the generator's value. Coroutine programs use
    it to share a kernel's local step."""
    try:
        w = next(local)
        while True:
            if type(w) is Requests:
                got = None if w.items[0] is None else (yield w.service.request(agent.id, w.items[0], w.ct[0]))
                w = local.send([got])
                continue
            if w.rows[0] is None:  # this agent asks for no gradient
                w = local.send(w.at.new_zeros(w.at.shape))
                continue
            # (at its (1, P) row: the gradient comes back as one)
            w = local.send((yield agent.gradient(params=w.at, rows=w.rows[0], clip=w.clip, clip_kind=w.clip_kind)))
    except StopIteration as done:
        return done.value


def updated(kernel, agent, p: Any, state: Any, k: int, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``kernel.update`` of one agent's row ``x`` with its gradient ``g`` (a batch of one, round ``k``): the row after
    it. The events engine's programs of the asynchronous patterns use it, so no batch outlives the call."""
    b = Batch([agent], k, x.unsqueeze(0), None, state)
    kernel.update(b, p, g.unsqueeze(0))
    return b.x[0]


def as_index(values: Sequence[int], device) -> torch.Tensor:
    """A list of ints as an int64 index tensor on ``device`` (the values of ``torch.tensor(values)``, made through
    numpy: 7-13x faster for the hundreds of indices a batched step gathers)."""
    import torch

    return torch.from_numpy(np.array(values, np.int64)).to(device)


_ID = attrgetter("id")


class AgentsOf(Sequence):
    """The agents ``agents[i]`` for i in ``ids``, looked up when read: a windowed batch's ``agents`` where its kernel
    may need only their ids (``Batch.ids``), with no list of thousands of agents made a step."""

    __slots__ = ("of", "ids")

    def __init__(self, of: Sequence, ids: list[int]):
        self.of, self.ids = of, ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, n):
        if isinstance(n, slice):
            return list(map(self.of.__getitem__, self.ids[n]))
        return self.of[self.ids[n]]

    def __iter__(self):
        return map(self.of.__getitem__, self.ids)


class Batch:
    """Agents at the same step of round ``k``: one agent in the events engine, all those a round activates
    in the windowed driver, in the engine's order. ``x``: their parameter rows at activation (a (B, P) copy),
    ``g``: their gradients (rows, or None for an agent that asked for none), ``state``: the run's kernel state
    (``RoundKernel.init``). A kernel may keep its own values on the batch between ``local`` and ``combine``."""

    # the batch's own attributes, as slots (compact and quick: the events engine renews one batch per agent each
    # round); its ``__dict__`` holds only the kernel's kept values and what a pattern sets
    __slots__ = ("agents", "k", "x", "g", "state", "_rows", "out", "_sent", "s", "sizes", "more", "_at", "_mixes",
                 "__dict__")

    def __init__(self, agents: Sequence, k: int, x: torch.Tensor, g: torch.Tensor | None, state: Any,
                 at: Callable[[int], tuple[float, list]] | None = None, rows: tuple | None = None):
        self.agents, self.k, self.x, self.g, self.state = agents, k, x, g, state
        # (x, its rows, g, its rows): the row tensors the batch was made from (the agent's own 1-D tensors, the
        # gradient service's results), what it hands over where a kernel passes its x or g unchanged, with no views
        # to make (a flat tuple: a batch of one finds its row in two comparisons)
        self._rows = None if rows is None else (x, rows[0], g, rows[1])
        self.out: list | None = None
        self._sent: torch.Tensor | None = None  # the payloads of ``send`` when they are one tensor's rows
        self.s = 0  # the exchange of the round (``RoundKernel.exchanges``)
        self.sizes: list[int] | None = None
        self.more: list[tuple[list, list[int] | None]] | None = None  # ``send``'s further messages (``message`` >= 1)
        self._at = at  # the drivers' hook: agent n's clock and the list its trace rows go to (its releases)
        self._mixes: list[tuple[Sequence[dict], list[float]]] = []  # mixing steps to record (``take_mix_rows``)

    # the batch's own attributes and those a pattern sets (a broadcast batch's extra rows and scalars): not the kernel's
    _OWN = frozenset({"agents", "k", "x", "g", "state", "out", "sizes", "more", "s", "_at", "_rows", "_sent", "_mixes",
                      "rows", "scalars", "recorded", "counts", "held", "order"})
    # a lookahead-window driver's batch: each agent's release already recorded by the ledger where the engine makes
    # it (its completion: time, row, a cap's refusal; False: refused), so ``privatize`` only draws the noise
    recorded: Sequence[bool] | None = None
    counts: Sequence[int] | None = None  # ... and each agent's activation count there (``rounds``)
    # a lookahead-window driver's batch with privacy records (``privacy.record``): its agents have moved on by its
    # tensor work, so the driver writes the records in the engine's order: the mixing steps as a batch's, even of one
    # agent (``take_mix_rows``), and each release's value before and after its noise, (batch position, clean, value)
    # here
    held: list | None = None
    order: np.ndarray | None = None  # a windowed driver's batch: its agents' ids as an array (``index`` lists none)

    def renew(self, k: int, x: torch.Tensor, g: torch.Tensor | None, xm: torch.Tensor | None = None) -> None:
        """This batch of one as the next round's, made from its agent's row ``x`` (1-D; ``xm``: it as (1, P), when
        the caller made that already) and gradient ``g`` (a (1, P) row, the gradient service's answer to a request
        at ``xm``, or a 1-D one; None: no gradient): what the last round left (the kernel's kept values, payloads,
        exchange) dropped. The events engine keeps one batch per agent, so a round allocates no batch, and a
        gradient comes as the (1, P) row ``b.g`` is, with no view made (its 1-D row is made only if asked for)."""
        d = self.__dict__
        if d:  # the kernel's kept values of the last round
            for name in [name for name in d if name not in self._OWN]:
                del d[name]
        self.k = k
        self.x = xm = x[None] if xm is None else xm  # [None]: unsqueeze(0), cheaper
        if g is None or g.dim() == 2:
            self.g = g
            self._rows = (xm, (x,), g, None)
        else:
            self.g = gm = g[None]
            self._rows = (xm, (x,), gm, (g,))
        self.out = self._sent = self.sizes = self.more = None
        self.s = 0

    def row(self, n: int, per_row: frozenset[str] = frozenset()) -> Batch:
        """Agent n's part of this batch as a batch of one: its rows, its payload, and the kernel's own values kept on
        the batch: those its kernel declares ``per_row`` cut to agent n's row (a tensor's row n, a sequence's item n;
        None stays None), anything else shared as it is."""
        one = Batch([self.agents[n]], self.k, self.x[n:n + 1], None if self.g is None else self.g[n:n + 1],
                    self.state)
        one.s = self.s
        if self.out is not None:
            one.out = [self.out[n]]
            one.sizes = None if self.sizes is None else [self.sizes[n]]
        if self.more is not None:
            one.more = [([out[n]], None if sizes is None else [sizes[n]]) for out, sizes in self.more]
        for name, v in self.kept().items():
            setattr(one, name, self.cut(name, v, n, per_row))
        return one

    def cut(self, name: str, v: Any, n: int, per_row: frozenset[str]) -> Any:
        """Kept value ``name`` of agent n: row n of a value declared ``per_row`` (kept as a batch of one's: a (1, ...)
        tensor, a one-item list), else ``v`` itself. TypeError for a declared value with no row per agent."""
        if name not in per_row or v is None:
            return v
        import torch

        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == len(self):
            return v[n:n + 1]
        if isinstance(v, (list, tuple, RowViews, Arrivals)) and len(v) == len(self):
            return [v[n]]
        shape = getattr(v, "shape", None)
        what = f"a {type(v).__name__}" + ("" if shape is None else f" of shape {tuple(shape)}")
        raise TypeError(f"b.{name} is declared per_row but holds {what}, not one row per agent of a batch of "
                        f"{len(self)}")

    def part(self, ns: Sequence[int]) -> Batch:
        """The agents at batch positions ``ns`` as a batch of their own (their rows, round and exchange; a driver's
        clock and rows of each agent kept): for what only some agents do, e.g. the releases of those sampled."""
        import torch

        if len(ns) == len(self) and list(ns) == list(range(len(self))):
            return self
        at = self._at
        idx = torch.tensor(list(ns), dtype=torch.long, device=self.x.device)
        sub = Batch([self.agents[n] for n in ns], self.k, self.x.index_select(0, idx),
                    None if self.g is None else self.g.index_select(0, idx), self.state,
                    None if at is None else (lambda m: at(ns[m])))
        sub.s = self.s
        return sub

    def kept(self) -> dict[str, Any]:
        """The kernel's own values kept on the batch between its hooks (``b.y = ...``)."""
        return {name: v for name, v in vars(self).items() if name not in self._OWN}

    def rounds(self) -> list[int]:
        """Each agent's activations so far, this one included (``Agent.round``): an asynchronous pattern's batch holds
        agents at different counts, where ``k`` is the first agent's; a lookahead window's, the counts where its
        control made each operation (its agents have moved on by its tensor work)."""
        return [a.round for a in self.agents] if self.counts is None else list(self.counts)

    @property
    def sent(self) -> torch.Tensor | None:
        """The payloads of ``send`` when they are one tensor's rows (else None)."""
        return self._sent

    @property
    def ids(self) -> list[int]:
        agents = self.agents
        if type(agents) is AgentsOf:
            return agents.ids
        return list(map(_ID, agents))  # (an attrgetter's map: a C loop over a windowed batch's agents)

    def __len__(self) -> int:
        return len(self.agents)

    def index(self) -> torch.Tensor:
        """The batch's agent ids as an index tensor on the bank's device (for ``state`` rows)."""
        return as_index(self.ids if self.order is None else self.order, self.x.device)

    def _rowlist(self, t: torch.Tensor) -> Sequence[torch.Tensor]:
        """The rows of one of the batch's tensors: those it was made from when ``t`` is its x or g, else views, made
        when first read (``RowViews``: a windowed driver often hands the payloads on as the tensor itself)."""
        made = self._rows
        if made is not None:
            if t is made[0] and made[1] is not None:
                return made[1]
            if t is made[2] and made[3] is not None:
                return made[3]
        return RowViews(t)

    def _row(self, t: torch.Tensor) -> torch.Tensor:
        """Row 0 of a batch of one's tensor."""
        made = self._rows
        if made is not None:  # its x or g: the row it was made from (the common case)
            if t is made[0] and made[1] is not None:
                return made[1][0]
            if t is made[2] and made[3] is not None:
                return made[3][0]
        return t[0]

    # what a kernel does ---------------------------------------------------------------------------------
    def gradients(self, at: torch.Tensor, rows: list, clip: float | None = None, clip_kind: str = "l2") -> Wave:
        """A wave of gradients to yield from ``local``: ``g = yield b.gradients(y, rows)``."""
        return Wave(at, rows, clip, clip_kind)

    def requests(self, service: Any, items: list, ct: Sequence[float]) -> Requests:
        """A wave of timed requests to a lookahead service to yield: ``results = yield b.requests(svc, items, ct)``."""
        return Requests(service, items, list(ct))

    def now(self, n: int) -> float:
        """Agent n's clock where its program runs (a driver's, else the engine's)."""
        return self.agents[n].env.now if self._at is None else self._at(n)[0]

    def emit(self, n: int, event: Any) -> None:
        """Trace agent n's event record where its program makes it (``Agent.emit``; a driver's rows of the agent)."""
        if self._at is None:
            self.agents[n].emit(event)
            return
        from netsim.trace.events import row

        self._at(n)[1].append(row(event))

    def sample_rows(self, batch: int | None) -> list:
        """Each agent's mini-batch (``Agent.sample_rows``, its own stream)."""
        return [a.sample_rows(batch) for a in self.agents]

    def send(self, payloads: torch.Tensor | Sequence, sizes: Sequence[int] | None = None, message: int = 0) -> None:
        """Send row (or payload) n to agent n's out-neighbours, as the pattern sends (``sizes``: the bytes on
        the wire when a payload is carried decoded, e.g. a compressed vector). ``message``: which of the exchange's
        messages (a pattern whose exchange carries several, each its own tag: ``SyncRounds.more``), sent after
        message 0 in this order; a payload None: the agent sends nothing (the events engine's budget cap)."""
        if message:
            more = self.more = self.more or []
            if len(more) != message - 1:
                raise ValueError(f"Batch.send: message {message} sent before message {len(more) + 1}")
            rows = list(payloads) if isinstance(payloads, (list, tuple)) else self._rowlist(payloads)
            more.append((rows, None if sizes is None else list(sizes)))
            return
        if len(self.agents) == 1 and hasattr(payloads, "unbind"):  # (a tensor, not a list or tuple of payloads)
            self._sent = payloads  # a batch of one's row: no sequence of views to make
            self.out = [self._row(payloads)]  # (its x: the row it was made from, the common case)
            self.sizes = None if sizes is None else list(sizes)
            return
        import torch

        if isinstance(payloads, torch.Tensor):
            self._sent = payloads
            rows = self._rowlist(payloads)
            self.out = rows if type(rows) is RowViews else list(rows)  # (type: an ABC's isinstance costs ~1 µs)
            if sizes is None and len(self.agents) > 1:  # rows of one tensor: one size (``payload_size``'s)
                sizes = [payload_size(payloads[0])] * len(self.agents)
        else:
            self._sent = None
            self.out = list(payloads)
        self.sizes = None if sizes is None else list(sizes)

    def mix(self, own: torch.Tensor, got: Sequence[dict]) -> torch.Tensor:
        """Each agent's sum_j W_ij x_j over what arrived, now (``Agent.mix``: a missing neighbour's weight stays
        on the agent's own row), as rows."""
        if len(self.agents) == 1 and self.held is None:
            return self.agents[0].mix(self._row(own), got[0]).unsqueeze(0)
        if self.agents[0].mixing_record is not None:
            self._mixes.append((got, [0.0] * len(self.agents)))
        return self._mixed(own, got, {})  # Agent.mix's float operations, every agent at once

    def _mixed(self, own: torch.Tensor, got: Sequence[dict], steps: dict) -> torch.Tensor:
        """``compute.mixing.combine`` of what arrived: from a windowed driver's arrays (``Arrivals.groups``) where
        it can, else from each agent's dict (``Agent.mix``'s weights of the senders in arrival order, the rest kept on
        the agent's own row); the same operations on the same rows either way."""
        from netsim.compute.mixing import combine, mix_rows

        groups = got.groups() if isinstance(got, Arrivals) else None
        if groups is not None:
            return mix_rows(own, *groups, steps, own.dtype)
        ws = [[a.weights[j] for j in g] for a, g in zip(self.agents, got, strict=True)]
        return combine(own, [1.0 - sum(w) for w in ws], ws, [list(g.values()) for g in got], steps, own.dtype)

    def mix_into_params(self, own: torch.Tensor, got: Sequence[dict], step: torch.Tensor | Sequence | None = None,
                        lr: float = 1.0) -> None:
        """Each agent's ``params = mix(own, received) - lr * step`` (``Agent.mix_into_params``: deferred to the
        bank, which computes every waiting update in one batched call)."""
        if len(self.agents) == 1 and self.held is None:  # the events engine's batch of one (a step row as (1, P))
            self.agents[0].mix_into_params(self._row(own), got[0], step[0] if isinstance(step, (list, tuple)) else
                                           step, lr)
            return
        import torch

        agents = self.agents
        if step is None:
            by = {}
        elif isinstance(step, torch.Tensor):
            by = {lr: (list(range(len(agents))), step)}
        else:  # rows, None for an agent that takes no step
            ks = [n for n, s in enumerate(step) if s is not None]
            by = {lr: (ks, torch.stack([step[n] for n in ks]))} if ks else {}
        # Agent.mix_into_params's float operations for every agent in one call (compute.mixing), written at once
        values = self._mixed(own, got, by)
        bank = agents[0].sim.world.bank
        bank.W.index_copy_(0, self.index(), values)
        if agents[0].mixing_record is not None:  # the mixing record (pairwise privacy) of each agent's update
            self._mixes.append((got, [lr if step is not None and (isinstance(step, torch.Tensor) or step[n] is not None)
                                      else 0.0 for n in range(len(agents))]))

    def record_mixes(self, ids: np.ndarray, t: np.ndarray) -> None:
        """Write the mixing steps this batch made since the last call (``mix``, ``mix_into_params`` of a windowed
        batch) into the mixing record (``privacy.record``), as the events engine's agents make them: agent ``ids[m]``
        at its time ``t[m]`` (a windowed driver's: when its barrier completed, in that order), each agent's steps in
        the order it made them. Every agent's releases come before its steps (the patterns release in ``local``)."""
        if not self._mixes:
            return
        place = {i: m for m, i in enumerate(ids.tolist())}
        order = np.array([place.get(a.id, -1) for a in self.agents], np.int64)  # (-1: not written)
        self.agents[0].mixing_record.mix_batches(self.take_mix_rows(None, order, np.asarray(t, np.float64)[order]))

    def take_mix_rows(self, got, order: np.ndarray, t: np.ndarray) -> list[tuple]:
        """The mixing steps this batch made since the last call (``mix``, ``mix_into_params``) as
        ``MixingLog.mix_batches``' tuples, one a call: agent n's steps after its place ``order[n]`` in the engine's
        order, then the call, at time ``t[n]`` with the releases it has made now; where a call mixed ``got``
        (``Arrivals``), each agent's senders and weights in arrival order read from its arrays, else from the dicts
        (``Agent.record_mix``'s)."""
        mixes, self._mixes = self._mixes, []
        agents = np.array([a.id for a in self.agents], np.int64)
        released = np.array([a.releases_made for a in self.agents], np.int64)
        out = []
        for c, (mixed, lrs) in enumerate(mixes):
            if mixed is got and isinstance(got, Arrivals):
                by = np.argsort(got.recv, kind="stable")  # (each receiver's deliveries, in arrival order)
                counts = np.bincount(got.recv, minlength=len(agents))
                src, w = np.asarray(got.ids, np.int64)[got.send[by]], got.w[by]
            else:
                keys = [list(m) for m in mixed]
                counts = np.array([len(k) for k in keys], np.int64)
                src = np.array([j for k in keys for j in k], np.int64)
                w = np.array([a.weights[j] for a, k in zip(self.agents, keys) for j in k], np.float64)
            ws, ends = w.tolist(), np.cumsum(counts).tolist()
            keep = np.array([1.0 - sum(ws[e - m:e]) for e, m in zip(ends, counts.tolist())], np.float64)  # (as
            # ``Agent.record_mix`` sums them)
            out.append((order, np.full(len(agents), c), agents, t, released, keep, counts, src, w,
                        np.asarray(lrs, np.float64)))
        return out

    def step(self, g: torch.Tensor, lrs: Sequence[float]) -> None:
        """x_n -= lrs[n] * g_n for each row, in place (``sub_`` with each distinct step size over its rows)."""
        import torch

        if len(self) == 1 or lrs.count(lrs[0]) == len(lrs):  # one step size for every row
            self.x.sub_(g, alpha=lrs[0])
            return
        by: dict[float, list[int]] = {}
        for n, lr in enumerate(lrs):
            by.setdefault(lr, []).append(n)
        for lr, ns in by.items():
            if len(ns) == len(self):
                self.x.sub_(g, alpha=lr)
            else:
                idx = torch.tensor(ns, device=self.x.device)
                self.x.index_copy_(0, idx, self.x.index_select(0, idx).sub_(g.index_select(0, idx), alpha=lr))

    def set_params(self, rows: torch.Tensor) -> None:
        """Each agent's parameters := its row."""
        bank = self.agents[0].sim.world.bank
        if len(self) == 1:
            bank.set(self.agents[0].id, rows[0])
        else:
            bank.W.index_copy_(0, self.index(), rows)

    def defer(self, updates: Sequence) -> None:
        """Hand ``compute.mixing.MixUpdate``'s to the bank (computed with every other waiting one)."""
        bank = self.agents[0].sim.world.bank
        for u in updates:
            bank.defer(u)

    def clip(self, g: torch.Tensor, bound: float, kind: str = "l2") -> torch.Tensor:
        """Each row clipped as one vector (``privacy.mechanisms.clip``: L2 norm or coordinates), each with the bits of
        its own clip (``clip_l2_rows``)."""
        import torch

        from netsim.privacy.mechanisms import clip, clip_l2_rows

        if kind == "l2":
            return clip_l2_rows(g, bound)
        return torch.stack([clip(r, bound, kind) for r in g.unbind(0)])

    def privatize(self, g: torch.Tensor, sigma: Sequence[float], sensitivity: Sequence[float],
                  q: Sequence[float], what: str = "gradient", mechanism: str = "gaussian",
                  to: Sequence[int] | None = None) -> list[torch.Tensor | None]:
        """Row n plus noise of scale ``sigma[n]`` (Gaussian std, or ``mechanism = "laplace"``'s scale) from agent n's
        own noise generator, each release accounted and traced by the agent's ledger (``Agent.privatize``: public, or
        to agent ``to[n]``); None for an agent whose budget cap is reached (rows as one (B, P) tensor when every agent
        released with noise). The noise of the batch is drawn in one call (the same bits as one release at a time)."""
        if len(self.agents) == 1 and self._at is None and self.recorded is None:  # the ledger's own release
            return [self.agents[0].ledger.release(g[0], sigma[0], sensitivity[0], mechanism, q=q[0], what=what,
                                                  to=-1 if to is None else to[0])]
        mixing = self.agents[0].mixing_record
        views = None if mixing is None else mixing.views  # privacy.record = "payloads" (privacy/payloads.py)
        if views is None:
            return self._privatize_rows(g, sigma, sensitivity, q, what, mechanism, to)
        import torch

        g = torch.stack([views.before_noise(a.id, r, s)  # an audit's gradient canaries, before the noise
                         for a, r, s in zip(self.agents, g.unbind(0), sensitivity, strict=True)])
        out = self._privatize_rows(g, sigma, sensitivity, q, what, mechanism, to)
        for n, a in enumerate(self.agents):
            if out[n] is not None:
                if self.held is None:
                    views.released(a.id, a.round, g[n], out[n])
                else:  # (the driver's, written in the engine's order)
                    self.held.append((n, g[n], out[n]))
        return out

    def _privatize_rows(self, g: torch.Tensor, sigma: Sequence[float], sensitivity: Sequence[float],
                        q: Sequence[float], what: str, mechanism: str = "gaussian",
                        to: Sequence[int] | None = None) -> list[torch.Tensor | None]:
        from netsim.compute.noise import noise_rows

        size, at = g.shape[1], self._at
        ok = self.recorded
        if ok is None:  # (with ``at``: the release at the agent's own clock, its row where its program makes it)
            ok = [a.ledger.record(size, sigma[n], sensitivity[n], mechanism, q=q[n], what=what,
                                  to=-1 if to is None else to[n], at=None if at is None else at(n))
                  for n, a in enumerate(self.agents)]
        noised = [n for n, s in enumerate(sigma) if s and ok[n]]
        if len(noised) == len(self):  # every agent released with noise: the rows as one tensor
            return noise_rows(mechanism, g.shape[1:], list(sigma), [a.ledger.noise.generator for a in self.agents],
                              g.dtype).add_(g)  # z + g: g + z's bits, without a second (B, P) tensor
        out: list[torch.Tensor | None] = [None if not ok[n] else g[n] if sigma[n] else g[n].clone()
                                          for n in range(len(self))]
        if noised:
            z = noise_rows(mechanism, g.shape[1:], [sigma[n] for n in noised],
                           [self.agents[n].ledger.noise.generator for n in noised], g.dtype)
            for n, r in zip(noised, (g[noised] + z).unbind(0), strict=True):
                out[n] = r
        return out

    def add_noise(self, x: torch.Tensor, scales: Sequence[float], mechanism: str = "gaussian") -> torch.Tensor:
        """Row n plus noise of scale ``scales[n]`` from agent n's own noise generator, recorded nowhere
        (``Agent.add_noise``: only for values that depend on no private data, e.g. an initial state), as rows."""
        if len(self.agents) == 1:
            return self.agents[0].add_noise(self._row(x), scales[0], mechanism).unsqueeze(0)
        from netsim.compute.noise import noise_rows

        return x + noise_rows(mechanism, x.shape[1:], list(scales), [a.ledger.noise.generator for a in self.agents],
                              x.dtype)

    @staticmethod
    def stack(rows: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """Rows (``privatize``'s: a tensor, or a list of row tensors) as one (B, P) tensor."""
        import torch

        return rows if isinstance(rows, torch.Tensor) else torch.stack(list(rows))

    def refused(self, released: torch.Tensor | Sequence) -> list[int]:
        """The agents (ids) whose release ``privatize`` refused (their budget cap reached)."""
        import torch

        if isinstance(released, torch.Tensor):
            return []
        return [a.id for a, r in zip(self.agents, released, strict=True) if r is None]


class AnyRound:
    """``b.k`` of a batch that joins agents at different rounds (its kernel's ``any_round`` said no hook reads it):
    reading it raises, so a kernel that declares wrongly fails in one line (``netsim check`` names it) instead of
    computing with one round."""

    __slots__ = ("kernel",)

    def __init__(self, kernel: str):
        self.kernel = kernel

    def _read(self, *_):
        raise RuntimeError(f"{self.kernel}.any_round says no hook reads b.k, and one read it (its batch joins agents "
                           "at different rounds: read each agent's from b.rounds(), or declare any_round False)")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __int__ = __index__ = __float__ = __hash__ = _read
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _read
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __str__ = __format__ = _read

    def __repr__(self) -> str:
        return "<b.k of agents at different rounds>"


class RowViews(Sequence):
    """The rows of a (B, ...) tensor as a sequence, unbound on first use: a view per row costs ~1 µs, and a windowed
    batch's rows are often never read one by one (its payloads go to ``Arrivals`` as one tensor)."""

    def __init__(self, t: torch.Tensor):
        self.t = t
        self._rows: Sequence | None = None

    def _made(self) -> Sequence:
        if self._rows is None:
            self._rows = self.t.unbind(0)
        return self._rows

    def __getitem__(self, n):
        return self._made()[n]

    def __len__(self) -> int:
        return self.t.shape[0]

    def __iter__(self):
        return iter(self._made())


class Picked(Sequence):
    """Items of other sequences, ``(sequence, index)`` each, read when asked for: a joined batch's payloads, the rows of
    its parts' ``RowViews`` made only where a hook reads them."""

    __slots__ = ("picks",)

    def __init__(self, picks: list[tuple[Sequence, int]]):
        self.picks = picks

    def __getitem__(self, n):
        if isinstance(n, slice):
            return [seq[i] for seq, i in self.picks[n]]
        seq, i = self.picks[n]
        return seq[i]

    def __len__(self) -> int:
        return len(self.picks)


# Python's float ``sum`` adds one term after the other before 3.12, and compensates the rounding from 3.12 on
_PLAIN_SUM = sum([1e16, 1.0, -1e16]) == 0.0


class Arrivals(Sequence):
    """``combine``'s ``got`` as a windowed driver hands it over: ``got[n]`` = {sender: payload} of what reached
    batch agent n in the exchange, in arrival order, made on first use. The deliveries themselves, in arrival
    order, as arrays: ``recv`` and ``send`` (batch positions of receiver and sender) and ``w`` (the receiver's
    weight of the sender, ``Agent.weights``; NaN where it has none), which ``Batch.mix`` and
    ``mix_into_params`` read without a dict per agent (``groups``). ``sent``: the payloads as one tensor's rows
    (``Batch.send`` of a tensor), else None. ``receivers``: the batch's agents, where the senders are not the batch
    (``send`` then indexes ``ids``, ``out`` and ``sent``, the payloads delivered; default: the senders are)."""

    def __init__(self, ids: list[int], out: list, sent: torch.Tensor | None, recv: np.ndarray, send: np.ndarray,
                 w: np.ndarray, receivers: int | None = None):
        self.ids, self.out, self.sent, self.recv, self.send, self.w = ids, out, sent, recv, send, w
        self.n = len(ids) if receivers is None else receivers
        self._got: list[dict] | None = None

    def _made(self) -> list[dict]:
        if self._got is None:
            got: list[dict] = [{} for _ in range(self.n)]
            ids, out = self.ids, self.out
            for r, s in zip(self.recv.tolist(), self.send.tolist(), strict=True):
                got[r][ids[s]] = out[s]
            self._got = got
        return self._got

    def __getitem__(self, n):
        return self._made()[n]

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(self._made())

    def payloads(self) -> torch.Tensor | list:
        """Each delivery's payload, in arrival order: rows of one tensor where the payloads are (``sent``), else a
        list."""

        if self.sent is not None:
            return self.sent.index_select(0, as_index(self.send, self.sent.device))  # (a read-only plan's array)
        return [self.out[s] for s in self.send.tolist()]

    def groups(self) -> tuple[torch.Tensor, list] | None:
        """``compute.mixing.mix_rows``'s (keep, groups) for these arrivals, as ``combine`` forms them from the
        dicts: each agent keeps ``1.0 - sum(its weights in arrival order)``; slot s groups the agents whose s-th
        arrival has the same weight, their s-th models being the senders' rows of ``sent``. None where it cannot
        (the payloads are not one tensor, a weight is missing, or Python's ``sum`` is not a plain running sum)."""
        import torch

        if self.sent is None or not _PLAIN_SUM or np.isnan(self.w).any():
            return None
        n = self.n
        by = np.argsort(self.recv, kind="stable")  # by receiver, each one's arrivals in arrival order
        recv, send, w = self.recv[by], self.send[by], self.w[by]
        counts = np.bincount(recv, minlength=n)
        slot = np.arange(len(recv)) - (np.cumsum(counts) - counts)[recv]
        acc = np.zeros(n)
        groups = []
        dev = self.sent.device
        for s in range(int(counts.max(initial=0))):
            at = slot == s
            r, snd, ws = recv[at], send[at], w[at]
            acc[r] += ws  # the running sum, one term per slot (each receiver appears once in a slot)
            values, first = np.unique(ws, return_index=True)
            slot_groups = []
            for v in values[np.argsort(first)].tolist():  # in order of first appearance, as the dicts' groups
                sel = ws == v
                slot_groups.append((v, torch.from_numpy(r[sel]), (self.sent, torch.from_numpy(snd[sel]).to(dev))))
            groups.append(slot_groups)
        return torch.from_numpy(1.0 - acc), groups


# the windowed engine's two ways of playing a run, which a kernel's or pattern's ``refusal`` answers for
Path = Literal["rounds", "lookahead"]
ROUNDS: Path = "rounds"  # synchronous windows, round by round (``Pattern.play``)
LOOKAHEAD: Path = "lookahead"  # conservative lookahead windows on the agents' own clocks (``Pattern.play_lookahead``)

_OLD_REFUSALS = ("needs", "windows_refusal", "lookahead_refusal")


class Pattern:
    """A communication pattern: how a round (or an activation) of a kernel exchanges messages. A pattern is a frozen
    attrs record (its tags) whose class names ``kernel``, the kernel class whose hooks its program and drivers call
    (a kernel of the pattern derives from it), and says ``lookahead``: whether it plays runs on the agents' own clocks
    as lookahead windows, and ``curves``: whether its synchronous windows evaluate at the evaluator's times inside the
    run (learning curves). ``reads``: the Params fields the pattern itself reads (e.g. ``round_timeout``); ``records``:
    the paths whose driver writes the privacy records (``privacy.record``: the mixing record and the payloads, as
    the events engine's agents write them; ``Batch.record_mixes``, ``ViewLog.deliver_rows``)."""

    kernel: ClassVar[type]
    lookahead: ClassVar[bool] = False
    curves: ClassVar[bool] = False
    until: ClassVar[bool] = False  # its synchronous windows stop at run.until (no run.rounds), where its refusal says
    dynamic: ClassVar[bool] = False  # its synchronous windows play a time-varying topology (``topology.dynamic``)
    records: ClassVar[frozenset[str]] = frozenset()

    def program(self, kernel: Any, agent: Any, p: Any) -> Generator:
        """The events engine's program of one agent: the kernel's hooks on batches of one."""
        raise NotImplementedError

    def refusal(self, sim: Any, path: Path) -> str | None:
        """Why the windowed engine cannot play this built simulation (kernel: ``sim.program``, its parameters:
        ``sim.params``) on ``path`` with the events engine's exact trace (None: it can). One line: the rule, then
        after " — " what to change. The default is the kernel's own ``refusal``; a pattern adds its conditions."""
        return sim.program.refusal(sim, path)

    def play(self, sim: Any, kernel: Any, rounds: Any) -> None:
        """The synchronous windows' driver (``ROUNDS``), where ``refusal`` said none."""
        raise NotImplementedError

    def play_lookahead(self, sim: Any, kernel: Any) -> None:
        """The lookahead windows' driver (``LOOKAHEAD``, for a pattern with ``lookahead``), where ``refusal`` said
        none."""
        raise NotImplementedError


class RoundKernel:
    """An algorithm's per-round math over a batch of agents (see the module docstring): the hooks every pattern
    calls. A kernel derives from its pattern's kernel class (``SyncKernel``, ``PushKernel``, ``BroadcastKernel``,
    ``TriggeredKernel``, ``DeltasKernel``, ``PairwiseKernel``), which adds the hooks that pattern calls, and sets

    - ``pattern``: how a round exchanges messages (an instance of a ``Pattern``);
    - ``reads``: the Params fields the kernel itself reads (the pattern reads its own; ``netsim check`` compares);
    - ``per_row``: the names of the values it keeps on a batch between hooks (``b.y = ...``) that hold one row (or
      item) per agent of the batch: ``Batch.row`` cuts those to an agent's part, anything else kept is shared;
    - ``refusal(sim, path)``: why the windowed engine cannot play it exactly with the run's parameters.

    Registered with ``@register(name, Params)`` on the class; the registry keeps an instance, which is the
    program the events engine runs for every agent (``kernel(agent, params)``)."""

    pattern: ClassVar[Any]
    reads: ClassVar[frozenset[str]] = frozenset()
    per_row: ClassVar[frozenset[str]] = frozenset()
    # its programs are the pattern's generators: nothing runs when one is made, so they are made at start
    # (``Programs``), and never where a windowed driver plays the rounds
    made_at_start: ClassVar[bool] = True

    def __init_subclass__(cls, **kw: Any) -> None:
        """A kernel speaks its pattern's protocol, and refuses the windows through ``refusal`` alone."""
        super().__init_subclass__(**kw)
        old = [name for name in _OLD_REFUSALS if name in vars(cls)]
        if old:
            raise TypeError(f"{cls.__name__}.{old[0]}: a kernel says why the windowed engine cannot play it in one "
                            "hook, refusal(self, sim, path) -> str | None (path: 'rounds' or 'lookahead'; its "
                            "parameters: sim.params)")
        pattern = vars(cls).get("pattern")
        want = getattr(type(pattern), "kernel", None)
        if want is not None and not issubclass(cls, want):
            raise TypeError(f"{cls.__name__}: its pattern {type(pattern).__name__} calls the hooks of a "
                            f"{want.__name__} — derive it from {want.__module__}.{want.__name__}")
        if isinstance(cls.per_row, str) or not all(isinstance(n, str) for n in cls.per_row):
            raise TypeError(f"{cls.__name__}.per_row: a set of names, e.g. frozenset({{'y'}})")

    def gradient(self, p: Any, state: Any, i: int) -> GradientRequest | None:
        """What agent ``i`` asks the gradient service for this round or activation (None: no gradient)."""
        return None

    def refusal(self, sim: Any, path: Path) -> str | None:
        """Why the windowed engine cannot play this kernel exactly on ``path`` (``ROUNDS`` or ``LOOKAHEAD``) with the
        run's parameters (``sim.params``), in one line: the rule, then after " — " what to change (None: it can)."""
        return None

    def any_round(self, p: Any) -> bool:
        """Whether, with parameters ``p``, no hook reads a batch's round index ``b.k`` (per-agent counts, if needed,
        from ``b.rounds()``): a lookahead window's driver may then join agents at different rounds in one call, whose
        ``b.k`` raises when read (default: False, one call per round index)."""
        return False

    def init(self, agents: Sequence, p: Any) -> Any:
        """The run's state, made once before the first round (default: none)."""
        return None

    def check(self, sim: Any, p: Any) -> None:
        """Checks that need the built simulation (agent count, graph), before the run."""

    def save_state(self, state: Any) -> Any:
        """What a windowed checkpoint keeps of the run's state (``init``'s value), as JSON data: its plain values
        (dicts, lists, tuples and sets of numbers and strings). Tensors and other objects are not kept here:
        their state must live in the bank or the streams, which the checkpoint keeps (a kernel is stateless).
        Override this and ``load_state`` for a state of another kind."""
        return _plain(state)

    def load_state(self, state: Any, saved: Any) -> None:
        """Put ``save_state``'s data back into a freshly made state (``init``'s), in place."""
        _restored(saved, state)

    def state_of(self, agent: Any, p: Any) -> Any:
        """The run's state (``init``), made on first use and shared by every agent of the run."""
        return agent.service((type(self), "state"), lambda: self.init(agent.sim.loop.agents, p))

    def __call__(self, agent: Any, p: Any):
        """The events engine's program for ``agent``: the pattern's generator over a batch of one."""
        return self.pattern.program(self, agent, p)

    @property
    def __name__(self) -> str:  # the registry's and the CLI's name for a program
        return type(self).__name__


def _plain(v: Any) -> Any:
    """``save_state``'s JSON form of a kernel's state: containers tagged by kind (so keys keep their types),
    anything not plain as ``{"kept": type}`` (its state is the bank's or a stream's)."""
    if v is None or isinstance(v, (bool, int, float, str, np.generic)):
        return v.item() if isinstance(v, np.generic) else v
    if isinstance(v, dict):
        return {"dict": [[_plain(k), _plain(x)] for k, x in v.items()]}
    if isinstance(v, (list, tuple)):
        return {"list" if isinstance(v, list) else "tuple": [_plain(x) for x in v]}
    if isinstance(v, (set, frozenset)):
        return {"set": sorted((_plain(x) for x in v), key=repr)}
    return {"kept": type(v).__name__}


def _restored(saved: Any, have: Any) -> Any:
    """The value ``saved`` (``_plain``'s) stands for, written into ``have`` (the fresh state's value there, None where
    the run added it) where it is the same kind of container. What ``have`` shows must match: a container of its
    kind holding at least its keys (a list: its length), a value of its type; ValueError otherwise."""
    def want(ok: bool) -> None:
        if not ok:
            raise ValueError(f"the kernel's state holds {str(saved)[:60]} where a fresh one holds {str(have)[:60]}")

    if not isinstance(saved, dict):
        want(have is None or type(saved) is type(have))
        return saved
    if "kept" in saved:
        want(have is not None and type(have).__name__ == saved["kept"])
        return have
    if "tuple" in saved:
        want(isinstance(saved["tuple"], list) and (have is None or isinstance(have, tuple) and len(have) == len(
            saved["tuple"])))
        return tuple(_restored(x, None if have is None else have[n]) for n, x in enumerate(saved["tuple"]))
    if "set" in saved:
        want(isinstance(saved["set"], list) and (have is None or isinstance(have, set)))
        out = have if isinstance(have, set) else set()
        items = [_restored(x, None) for x in saved["set"]]
        out.clear()
        out.update(items)
        return out
    if "list" in saved:
        want(isinstance(saved["list"], list) and (have is None or isinstance(have, list) and (
            not have or len(have) == len(saved["list"]))))
        out = have if isinstance(have, list) else []
        old = list(out)
        out[:] = [_restored(x, old[n] if n < len(old) else None) for n, x in enumerate(saved["list"])]
        return out
    want("dict" in saved and isinstance(saved["dict"], list) and (have is None or isinstance(have, dict))
         and all(isinstance(p, list) and len(p) == 2 for p in saved["dict"]))
    pairs = [(_restored(k, None), x) for k, x in saved["dict"]]
    want(all(isinstance(k, (int, float, str, bool, tuple)) or k is None for k, _ in pairs)
         and (have is None or set(have) <= {k for k, _ in pairs}))
    out = have if isinstance(have, dict) else {}
    old = dict(out)
    values = {k: _restored(x, old.get(k)) for k, x in pairs}
    out.clear()
    out.update(values)
    return out
