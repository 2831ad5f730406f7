"""Resume without recomputing: a windowed run's checkpoint put back into a freshly built simulation.

Lookahead windows (rounds/lookahead.py) are cut the same way, between two windows, once their tensor work is done:
their ``Between`` holds the driver's whole state (its event queue, payloads in flight, gradients waiting, each
agent's place in its activation, the trace rows not yet written), and this module adds where each agent's
Poisson gaps and clock jitter stand and each link's transmission queue.

Between two rounds of a windowed driver (netsim/rounds/) the run's whole state is data: the parameter bank,
every stream's position and the blocks drawn ahead from them (a link's latency and loss draws, an agent's
mini-batches), the links made so far and the next message id, the agents' rounds and schedules, the privacy
ledgers (releases, noise generators), the kernel's state (``RoundKernel.save_state``), the gradient and
communication counters, the recorder (trace position, the rows not yet in a batch, event counts, metrics rows)
and the driver's own ``Between``. ``capture`` adds to a checkpoint what sim/checkpoint.py's capture does not hold;
``restore`` puts it all into a simulation built from the same scenario, whose driver then plays on from the next
round. The restored simulation is captured again and compared with the checkpoint before it goes on (api.resume),
so a piece this module missed is refused in one line, never continued wrongly.

A coroutine program's state is its generator frames, which cannot be rebuilt: the events engine's checkpoints are
resumed by re-executing the run up to them (docs/checkpoints.md).
"""

from __future__ import annotations

import base64
import gc
import json
import math
import operator
from array import array
from collections import Counter, deque
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
import torch

from netsim.sim.loop import Between, Order
from netsim.sim.streams import BLOCK, Draws, DrawsAhead, block_rows

# the typecodes of a ReleaseLog's columns (sim/checkpoint.py stores them as numpy arrays)
_LOG = {"t": "d", "round": "i", "to": "i", "skipped": "i", "run_start": "q", "run_spec": "i"}


def under(arrays: dict, prefix: str) -> dict:
    """The arrays a checkpoint keeps under ``prefix``'s name ("bank", "mixing", a driver's "own"), the prefix taken
    off."""
    at = len(prefix) + 1
    return {k[at:]: v for k, v in arrays.items() if k.startswith(prefix + ".")}


def _pos(draws: Any) -> list[int] | None:
    return draws.position() if isinstance(draws, Draws) else None


def _ahead(ahead: DrawsAhead | None) -> list[int] | None:
    """An agent's mini-batches drawn ahead: [stream state before the block, has_uint32, uinteger, used, batch], and
    the block's mini-batches where they are not ``block_rows`` (the windows' larger blocks)."""
    if ahead is None:
        return None
    if ahead.rows == block_rows(ahead.batch):
        return [*ahead.state, ahead.pos, ahead.batch]
    return [*ahead.state, ahead.pos, ahead.batch, ahead.rows]


def _full_rows(net) -> list[list]:
    """Every composed-model link as a checkpoint keeps it: [src, dst, latency draws' position, loss draws' position,
    burst: None or [in its bad state, its draws' position], busy_until], the restored ones not made yet as the
    checkpoint gave them (``Network.full_link`` makes them); sorted by (src, dst)."""
    rows = [lk if type(lk) is list else [s, d, _pos(lk.latency), _pos(lk.u_loss),
                                         None if lk.burst is None else [lk.burst.bad, _pos(lk.burst.u)], lk.busy_until]
            for (s, d), lk in net.full_links.items()]
    return sorted(rows, key=itemgetter(0, 1))


def capture(sim, arrays: dict) -> dict[str, Any]:
    """The windowed part of a checkpoint's state (tensors go to ``arrays``)."""
    from netsim.sim.checkpoint import _flat

    world, loop, rec = sim.world, sim.loop, sim.recorder
    b, marks = loop.programs.between, loop.marks
    for n, (_, loss, acc) in enumerate(rec.agent_metrics):
        arrays[f"agent_metrics.{n}.loss"], arrays[f"agent_metrics.{n}.accuracy"] = np.asarray(loss), np.asarray(acc)
    for a in loop.agents:
        led = a.existing_ledger
        if led is not None and led.rdp is not None:
            arrays[f"ledger.{a.id}.rdp"] = np.asarray(led.rdp.rdp)
    kernel = sim.program
    out = {
        "round": b.k, "order": [list(o) for o in b.order], "end": b.end, "held": _flat(b.held, "held", arrays),
        "kernel": kernel.save_state(kernel.state_of(loop.agents[0], sim.params)),
        "marks": [marks.activations, marks.mark, marks.round_mark],
        "links": [*([s, d, _pos(lk.latency), _pos(lk.lost)] for (s, d), lk in world.network.links.items()),
                  *map(itemgetter(0), world.network.restored.values())],  # (the checkpoint's rows, not made yet)
        # (a restored agent's as the checkpoint gave them, while nothing has drawn from them: ``Agent.draws_saved``)
        "agents": [s if (s := a.draws_saved) is not None else [_ahead(a.batches_ahead), _pos(a.compute_sampler)]
                   for a in loop.agents],
        "pending": [[v.item() if isinstance(v, np.generic) else v for v in r] for r in rec.writer.buffer],
        # the composed models' links (bursts, outages, per-link settings, link traces) and the uplinks' queues
        "full_links": _full_rows(world.network),
        "uplinks": sorted([s, b] for s, b in world.network.uplink_busy.items()),
        "churn": None if world.churn is None else world.churn.held(),  # (the random churn drawn so far)
        # a time-varying topology: the epoch whose links each agent holds (taken at its last activation)
        "dynamic": None if world.network.dynamic is None else list(world.network.dynamic.adopted),
        "agent_metrics": [t for t, *_ in rec.agent_metrics],
    }
    log = rec.mixing_log  # privacy.record: the mixing steps recorded so far (a windowed run's records are written at
    if log is not None:  # each work's end, so none is pending between two)
        steps, cols = log.held()
        out["mixing"] = steps
        arrays.update({f"mixing.{c}": v for c, v in cols.items()})
        if log.views is not None:  # privacy.record = "payloads": the deliveries and releases kept so far
            plain, rows = log.views.held()
            out["payloads"] = plain
            arrays.update({f"payloads.{k}": v for k, v in rows.items()})
    if b.windows:  # lookahead windows: agents on their own clocks (Poisson gaps drawn ahead, jitter)
        moves = world.activation_moves
        jitter = None if moves is None else moves.jitter
        out["windows"] = {"gaps": [_pos(getattr(a.schedule, "gap", None)) for a in loop.agents],
                          "jitter": None if jitter is None else [_pos(d) for d in jitter]}
    return out


def _unflat(x: Any, arrays: dict, tensor) -> Any:
    """sim/checkpoint.py's ``_flat`` skeleton back as values (its tensors through ``tensor``)."""
    if not isinstance(x, dict):
        return x
    if "@" in x:
        return tensor(arrays[x["@"]])
    if "list" in x:
        return [_unflat(v, arrays, tensor) for v in x["list"]]
    if "dict" in x:
        return {_unflat(k, arrays, tensor): _unflat(v, arrays, tensor) for k, v in x["dict"]}
    raise ValueError(f"a driver's state holds a {x.get('type', 'value')!r}, which cannot be restored")


def _int(v: Any, low: int = 0, high: float = math.inf) -> bool:
    return type(v) is int and low <= v < high


def _number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _ints(col: Any, low: int = 0, high: float = math.inf) -> bool:
    """``_int`` of every value of ``col`` (a sequence), at C speed."""
    return not col or (set(map(type, col)) == {int} and low <= min(col) and max(col) < high)


def _lists(col: Any, length: int) -> bool:
    """Every value of ``col`` a list of ``length`` values."""
    return not col or (set(map(type, col)) == {list} and set(map(len, col)) == {length})


def _cols(rows: list, width: int) -> list[list]:
    """The columns of ``rows``, each a list of ``width`` values (``_lists``): ``zip(*rows)`` costs ~10x as much over
    many rows (20,000 links: 25 ms)."""
    return [list(map(itemgetter(i), rows)) for i in range(width)]


def _positions(col: list, used: int | list[int] = BLOCK) -> bool:
    """Whether every value of ``col`` is a draws position (``Draws.position``, or an agent's mini-batches with ``used``
    their block's length) or None (``used``: one bound for all, or each one's), checked column by column."""
    given = [p for p in col if p is not None]
    if not given:
        return True
    if not _lists(given, 4):
        return False
    return _position_columns(*_cols(given, 4), used)


def _position_columns(state: Any, has: Any, u: Any, k: Any, used: int | list[int]) -> bool:
    """``_positions`` of positions given as their four columns."""
    return (_ints(state, 0, 2**128) and all(map((0, 1).__contains__, has)) and _ints(u, 0, 2**32)
            and (_ints(k, 0, used + 1) if isinstance(used, int) else _ints(k) and all(map(operator.le, k, used))))


def _full_links(rows: Any, nbrs: list, n: int, changing: bool, burst: bool) -> bool:
    """``_full_rows``' rows: distinct links of the graph, where their draws stand, each burst chain's state
    (present exactly where the scenario has bursts) and the end of each link's transmissions."""
    if not (isinstance(rows, list) and _lists(rows, 6)):
        return False
    if not rows:
        return True
    src, dst, lat, lost, chain, busy = _cols(rows, 6)
    if not (_ints(src, 0, n) and _ints(dst, 0, n) and len(set(zip(src, dst))) == len(rows) and _positions(lat)
            and _positions(lost) and _numbers(busy) and (changing or all(map(operator.contains,
                                                                         map(nbrs.__getitem__, src), dst)))):
        return False
    if not burst:
        return all(c is None for c in chain)
    return _lists(chain, 2) and all(type(c[0]) is bool for c in chain) and _positions([c[1] for c in chain])


def _numbers(col: Any) -> bool:
    """``_number`` of every value of ``col``, at C speed."""
    return set(map(type, col)) <= {int, float} and all(map(math.isfinite, col))


# the checks of a value's kind and range that a lookahead driver's own ``check_own`` makes too
int_in, ints_in, number, numbers = _int, _ints, _number, _numbers


def peers(sim, out: bool = False):
    """``i -> the agents i may have heard from`` (``out``: sent to), for a lookahead driver's ``check_own``: its
    in-neighbours (out-neighbours), or every agent under a time-varying topology (a message or a copy may come from
    an epoch other than the one the agent holds)."""
    agents = sim.loop.agents
    if sim.world.network.dynamic is not None:
        every = range(len(agents))
        return lambda i: every
    return (lambda i: agents[i].neighbors) if out else (lambda i: agents[i].in_neighbors)


def _keys(col: Any) -> bool:
    """Every value of ``col`` a driver's key: an int or a str (hashable, as JSON gives them back)."""
    return set(map(type, col)) <= {int, str}


def _strs(col: Any) -> bool:
    return set(map(type, col)) <= {str}


def _ids(col: Any) -> bool:
    return _ints(col, -1)  # -1: none (no peer, no message)


# the trace's columns (trace/events.py COLUMNS): a number, a string or an int each, checked a column at a time
_COLUMNS = (_numbers, _strs, _ids, _ids, _ids, _ids, _numbers, _ids, _strs)


def trace_rows(rows: Any) -> bool:
    """Rows of the trace's columns, as a checkpoint keeps the rows not yet written (checked a column at a time)."""
    return isinstance(rows, list) and _lists(rows, len(_COLUMNS)) and all(
        f(col) for f, col in zip(_COLUMNS, _cols(rows, len(_COLUMNS)), strict=True))


def _check(sim, st: dict, w: dict) -> None:
    """What a restore reads must be what a run between two rounds (or two lookahead windows) holds (a state.json
    whose checksums were fixed up after an edit is refused here, in one line, rather than crash the run);
    ValueError names the key. Lists of an entry per agent or link are checked column by column."""
    loop = sim.loop
    n, agents = len(loop.agents), loop.agents
    k = w.get("round")
    changing = sim.world.network.dynamic is not None  # links of every epoch so far, not only the current graph's
    links, each, plain = w.get("links"), w.get("agents"), st.get("agents")
    links_ok = each_ok = plain_ok = order_ok = False
    if isinstance(links, list) and _lists(links, 4):
        src, dst, lat, lost = _cols(links, 4)
        nbrs = [a.neighbors for a in agents]
        links_ok = _ints(src, 0, n) and _ints(dst, 0, n) and (changing or all(
            map(operator.contains, map(nbrs.__getitem__, src), dst))) and _positions(lat) and _positions(lost)
    if isinstance(each, list) and len(each) == n and _lists(each, 2):
        aheads, computes = _cols(each, 2)
        raw = [x for x in aheads if x is not None]
        # (a sixth value: the block's mini-batches, where the windows drew larger blocks)
        sized = [x for x in raw if type(x) is list and len(x) == 6]
        if sized and set(map(type, raw)) == {list} and set(map(len, raw)) <= {5, 6} \
                and _ints(_cols(sized, 6)[5], 1, 2**20):
            aheads = [x[:5] for x in raw]
        else:
            aheads, sized = raw, []
        if _lists(aheads, 5):
            state, has, u, taken, batch = _cols(aheads, 5)
            used = None
            if _ints(batch, 1, 2**31):  # a block's rows: one bound where all blocks are alike
                used = [x[5] if len(x) == 6 else block_rows(x[4]) for x in raw] if sized else \
                    list(map(block_rows, batch))
                used = used[0] if len(set(used)) == 1 else used
            each_ok = used is not None and _position_columns(state, has, u, taken, used) and _positions(computes)
    if isinstance(plain, list) and len(plain) == n and set(map(type, plain)) == {dict}:
        rounds, finished, schedules = (list(map(dict.get, plain, repeat(key)))
                                        for key in ("round", "finished", "schedule"))
        plain_ok = set(map(type, schedules)) == {dict}
    checks = {
        "links": links_ok,
        "full_links": _full_links(w.get("full_links", []), [a.neighbors for a in agents], n, changing,
                                  sim.world.scenario.network.burst is not None),
        "uplinks": isinstance(up := w.get("uplinks", []), list) and _lists(up, 2)
        and _ints((c := _cols(up, 2))[0], 0, n) and len(set(c[0])) == len(up) and _numbers(c[1]),
        "agents": each_ok,
        "pending": trace_rows(w.get("pending")),
        "agent_metrics": isinstance(w.get("agent_metrics"), list) and all(map(_number, w["agent_metrics"])),
        "end": _number(w.get("end")),
        "state.gradients": isinstance(st.get("gradients"), dict)
        and all(_int(st["gradients"].get(c)) for c in ("calls", "evaluated")),
        "state.events": isinstance(st.get("events"), dict) and _int(st["events"].get("bytes_sent"))
        and isinstance(st["events"].get("kinds"), dict) and all(map(_int, st["events"]["kinds"].values())),
        "state.rng": isinstance(st.get("rng"), list) and all(map(isinstance, st["rng"], repeat(str))),
    }
    win = w.get("windows")
    if win is None:  # between two synchronous rounds: every agent woke k times, none finished
        order = w.get("order")
        if isinstance(order, list) and len(order) == n and _lists(order, 2):
            ids, times = _cols(order, 2)
            order_ok = _ints(ids, 0, n) and _numbers(times) and len(set(ids)) == n
        checks.update({
            "round": _int(k, 1, sim.world.scenario.run.rounds or math.inf) and st["step"] == k,
            "order": order_ok,
            "marks": isinstance(w.get("marks"), list) and len(w["marks"]) == 3 and w["marks"][0] == n * k
            and all(type(m) in (int, float) for m in w["marks"][1:]),
            "state.agents": plain_ok and rounds.count(k) == n and all(map(operator.is_, finished, repeat(False))),
            "state.finished": st.get("finished") == 0 and st.get("stop_reason") == "",
        })
    else:  # between two lookahead windows: each agent on its own clock
        checks.update({
            "round": _int(k, 1) and st["step"] == k,
            "order": w.get("order") == [],
            "marks": isinstance(w.get("marks"), list) and len(w["marks"]) == 3 and _int(w["marks"][0])
            and all(type(m) in (int, float) for m in w["marks"][1:]),
            "state.agents": plain_ok and _ints(rounds) and set(map(type, finished)) == {bool},
            "state.finished": _int(st.get("finished"), 0, n) and st.get("stop_reason") == "",
            "windows": isinstance(win, dict) and isinstance(win.get("gaps"), list) and len(win["gaps"]) == n
            and _positions(win["gaps"]) and (win.get("jitter") is None or (
                isinstance(win["jitter"], list) and len(win["jitter"]) == n and _positions(win["jitter"]))),
        })
    bad = [key for key, ok in checks.items() if not ok]
    if bad:
        raise ValueError(f"{bad[0]} is not what a windowed run holds between two "
                         f"{'rounds' if win is None else 'windows'}")


def _assign(obj: Any, values: dict, where: str, skip: str = "") -> None:
    """``obj``'s attributes from a checkpoint's plain values (but ``skip``): each one ``obj`` has, of the type it
    has."""
    for k, v in values.items():
        if k == skip:
            continue
        if not hasattr(obj, k) or type(getattr(obj, k)) is not type(v):
            raise ValueError(f"{where}.{k} is not a {type(getattr(obj, k, None)).__name__}")
        setattr(obj, k, v)


def _same(new: list, mine: list, kind: type) -> bool:
    """Whether two columns of one type hold the very values (floats bit for bit: -0.0 is not 0.0 here)."""
    return array("d", new).tobytes() == array("d", mine).tobytes() if kind is float else new == mine


def _assign_all(objs: list, values: list, where: str, skip: str = "") -> dict[str, tuple[type, list]] | None:
    """``_assign`` of each of ``objs`` (one class) its dict of ``values`` (``where`` formatted with its index names
    it), column by column where every dict has the names of the first, each name's values are of one type in the
    checkpoint and the same one in the objects, and the class lets their dicts take them (a run's agents, their
    schedules): one type check per name, not per object, and a name written only where its values differ from the
    objects' (most of an agent's stand as the fresh build made them); otherwise object by object, as ``_assign``.
    Returns the values' columns read so ({name: (its type, its values)}, but ``skip``), else None."""
    if len(objs) > 1 and len(values) == len(objs) and set(map(type, values)) == {dict} \
            and len(set(map(type, objs))) == 1:
        cls, names = type(objs[0]), tuple(values[0])
        keep = tuple(k for k in names if k != skip)
        try:
            # (a name its class keeps outside the dicts, ``CHECKPOINTED``, is read and set as an attribute)
            outside = set(getattr(cls, "CHECKPOINTED", ()))
            if keep and set(map(len, values)) == {len(names)} \
                    and all(k in outside or not hasattr(type(getattr(cls, k, None)), "__set__") for k in keep):
                dicts = [o.__dict__ for o in objs]
                cols = []
                for k in keep:  # every column checked before any is written
                    get = itemgetter(k)
                    new = list(map(get, values))  # KeyError: a name missing somewhere
                    mine = list(map(attrgetter(k), objs) if k in outside else map(get, dicts))
                    kinds = set(map(type, new))
                    if len(kinds) != 1 or set(map(type, mine)) != kinds:
                        raise KeyError(k)  # (object by object: the first that differs is named)
                    cols.append((k, new, mine, kinds.pop()))
                for k, new, mine, kind in cols:
                    if not _same(new, mine, kind):
                        deque(map(setattr, objs, repeat(k), new) if k in outside else
                              map(dict.__setitem__, dicts, repeat(k), new), maxlen=0)
                return {k: (kind, new) for k, new, _, kind in cols}
        except (KeyError, AttributeError):
            pass
    for i, (obj, v) in enumerate(zip(objs, values, strict=True)):
        if not isinstance(v, dict):
            raise ValueError(f"{where.format(i)} is not an object")
        _assign(obj, v, where.format(i), skip)
    return None


def _known(n: int, cols: dict[str, tuple[type, list]], nested: dict | None = None):
    """``_assign_all``'s columns of a checkpoint's values as ``Columns`` (``mismatch``'s ``known``)."""
    from netsim.sim.checkpoint import Columns

    names = tuple(sorted(cols))
    return Columns(n, names, [cols[k][1] for k in names], [{cols[k][0]} for k in names], nested or {})


def restore(sim, ckpt) -> dict:
    """Put a windowed checkpoint's state into ``sim``: built from the same scenario and started (``Simulation.start``),
    its windowed runner chosen; the trace file itself is reopened by the caller. ValueError (or KeyError, TypeError)
    says what in the checkpoint a run between two rounds cannot hold. Returns the checkpoint's agents as the restore
    read them, as ``Columns`` (``checkpoint.mismatch``'s ``known``; {} where it read them object by object)."""
    enabled = gc.isenabled()
    gc.disable()  # it makes a stream per link (acyclic): collections would rescan the whole simulation each time
    try:
        return _restore(sim, ckpt)
    finally:
        if enabled:
            gc.enable()


def _restore(sim, ckpt) -> dict:
    st, arrays = ckpt.meta["state"], ckpt.arrays
    w = st.get("windowed")
    if not isinstance(w, dict):
        raise ValueError("state.windowed is missing")
    _check(sim, st, w)
    world, loop, rec = sim.world, sim.loop, sim.recorder
    bank = world.bank
    dtype, device = bank.W.dtype, bank.W.device

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(a)).to(device=device, dtype=dtype)

    bank.load_state_dict({k: tensor(v) for k, v in under(arrays, "bank").items()})
    net = world.network
    _assign(net, {k: v for k, v in st["network"].items() if k != "links"}, "state.network")
    busy = {(s, d): b for s, d, b in st["network"]["links"]}  # each link's transmission queue (bandwidth)
    if len(busy) != len(w["links"]):
        raise ValueError("state.network.links are not the links of state.windowed.links")
    # each link is made when the run next uses it (``Network.link``), standing where its draws stood, in the order
    # the run made them (a stream per link: made now they would cost more than the rest of the restore)
    net.restored = {k: (r, busy[k]) for r, k in zip(w["links"], map(itemgetter(0, 1), w["links"]))}
    net.full_links.update({(r[0], r[1]): r for r in w.get("full_links", [])})  # (made when next used, as lean links)
    net.uplink_busy = {s: b for s, b in w.get("uplinks", [])}
    if world.churn is not None and "churn" in w:  # (absent from an earlier netsim's checkpoint: the churn as built)
        world.churn.take(w["churn"])
    log = rec.mixing_log
    if log is not None:
        log.take(w.get("mixing"), under(arrays, "mixing"))
        if log.views is not None:
            log.views.take(w.get("payloads"), under(arrays, "payloads"))
    if net.dynamic is not None and "dynamic" in w:  # (a checkpoint of an earlier netsim: the epochs as built)
        net.dynamic.readopt(w["dynamic"])
    agents = _assign_all(loop.agents, st["agents"], "state.agents[{}]", skip="schedule")
    schedules = _assign_all([a.schedule for a in loop.agents], [p["schedule"] for p in st["agents"]],
                            "state.agents[{}].schedule")
    for a, (ahead, compute) in zip(loop.agents, w["agents"], strict=True):
        a.resume_draws(ahead, compute)
    win = w.get("windows")
    if win is not None:  # lookahead windows: where each agent's Poisson gaps and clock jitter stand
        for a, gap in zip(loop.agents, win["gaps"], strict=True):
            if gap is not None:
                a.schedule.gap.resume(gap, later=True)
        if win["jitter"] is not None:
            for d, pos in zip(world.activation_moves.jitter, win["jitter"], strict=True):
                d.resume(pos, later=True)
    for key, saved in st["ledgers"].items():
        _ledger(loop.agents[int(key)], saved, arrays, key)
    kernel = sim.program
    kernel.load_state(kernel.state_of(loop.agents[0], sim.params), w["kernel"])
    # every stream's position last: the draws above were taken from their streams
    world.streams.restore(st["rng"], arrays["streams"])
    g = world.gradients
    g.calls, g.evaluated = st["gradients"]["calls"], st["gradients"]["evaluated"]
    if st["comm"] is not None:
        from netsim.sim.services import CommStats

        stats = sim.services.get(CommStats)
        stats.counts = Counter(st["comm"]["counts"])
        stats.samples = {k: list(v) for k, v in st["comm"]["samples"].items()}
    # the recorder: metrics rows, each agent's own, the trace's rows not yet in a batch and its counts
    rec.metrics = [dict(r) for r in ckpt.meta["metrics"]]
    rec.agent_metrics = [(t, arrays[f"agent_metrics.{n}.loss"], arrays[f"agent_metrics.{n}.accuracy"])
                         for n, t in enumerate(w["agent_metrics"])]
    rec.diverged = st.get("diverged") if isinstance(st.get("diverged"), dict) else None
    rec.writer.buffer = [tuple(r) for r in w["pending"]]
    rec.writer.count = ckpt.meta["trace"]["events"]
    ev = st["events"]
    if rec.counts is not None and ev["kinds"] is not None:
        rec.counts.kinds = Counter(ev["kinds"])
        rec.counts.bytes_sent = ev["bytes_sent"]
    # the loop and the driver
    marks = loop.marks
    marks.activations, marks.mark, marks.round_mark = w["marks"]
    marks.next_boundary = marks.mark
    loop.steps, loop.finished, loop.stop_reason = st["step"], st["finished"], st["stop_reason"]
    loop.env.advance_to(st["time"])
    held = _unflat(w["held"], arrays, tensor)
    plain = _driver_state(held, len(loop.agents)) if win is not None else None
    loop.programs.between = Between(w["round"], Order.of(w["order"]), w["end"], held, windows=win is not None,
                                    plain=plain)
    if agents is None or schedules is None:
        return {}
    return {"agents": _known(len(loop.agents), agents, {"schedule": _known(len(loop.agents), schedules)})}


def _driver_state(held: Any, n: int) -> dict:
    """A lookahead driver's state (``WindowDriver.held``) as its ``take`` reads it: the JSON text of a dict of its
    keys, each of its kind, and the tensors beside it; returns that dict, read once. ValueError names the first key
    that is not (a resume refuses it before the run goes on, rather than fail in it); the driver's own part is its
    driver's to check (``WindowDriver.check_own``)."""
    where = "state.windowed.held"
    try:
        plain = json.loads(held["json"]) if isinstance(held, dict) and isinstance(held.get("json"), str) else None
    except RecursionError:
        plain = None
    if not isinstance(plain, dict):
        raise ValueError(f"{where} is not a lookahead driver's state")
    seq, events, tickets, stats, holds = (plain.get(k) for k in ("seq", "events", "tickets", "stats", "holds"))
    lists = {k: isinstance(plain.get(k), list) for k in ("payloads", "grads", "at", "words")}
    events_ok = tickets_ok = held_ok = False
    if isinstance(holds, list) and _lists(holds, 2) and lists["payloads"] and _keys(plain["payloads"]):
        pids, counts = _cols(holds, 2)  # (each payload held and how many times: a held payload is kept)
        held_ok = _ints(counts, 1) and _keys(pids) and set(pids) <= set(plain["payloads"])
    if isinstance(events, list) and _lists(events, 5) and _int(seq):
        t, at, kind, who, _ = _cols(events, 5)
        # (a time may be infinite: never; the insertion numbers are the counter's, taken before it stood at ``seq``)
        events_ok = set(map(type, t)) <= {int, float} and not any(map(math.isnan, t)) and _ints(at, 0, seq) \
            and len(set(at)) == len(at) and _ints(kind) and _ints(who, -1, n)
    if isinstance(tickets, list) and len(tickets) == 3 and _int(tickets[0]) and _int(tickets[1], 0, tickets[0] + 1) \
            and isinstance(tickets[2], list) and tickets[1] + len(tickets[2]) == tickets[0] and _lists(tickets[2], 3):
        who, rows, kinds = _cols(tickets[2], 3)
        tickets_ok = _ints(who, 0, n) and all(r is None or (isinstance(r, list) and _ints(r)) for r in rows) \
            and all(map(_row_dtype, kinds, rows))
    checks = {
        "now": _number(plain.get("now")),
        "seq": _int(seq),
        "events": events_ok,
        "pending_lo": tickets_ok and _int(plain.get("pending_lo"), 0, tickets[0] + 1),
        "tickets": tickets_ok,
        "stats": isinstance(stats, list) and len(stats) == 3 and _ints(stats),
        "shipped": isinstance(plain.get("shipped"), str),
        "own": isinstance(plain.get("own"), dict),
        "driver": isinstance(plain.get("driver"), str),
        "payloads": lists["payloads"] and _keys(plain["payloads"]),  # (the driver's keys)
        "grads": lists["grads"] and _ints(plain["grads"]),
        "at": lists["at"] and _ints(plain["at"]),
        "words": lists["words"] and _strs(plain["words"]),
        "holds": held_ok,
        "next_pid": _int(plain.get("next_pid")),
        "tensors": all(isinstance(held.get(k), torch.Tensor) and held[k].dim() >= 1
                       for k in ("payloads", "grads", "at"))
        and all(isinstance(v, torch.Tensor) and v.dim() >= 1 for k, v in held.items() if k.startswith("own."))
        and all(len(plain[k]) == len(held[k]) and _keys(plain[k])  # (a row a key)
                and len(set(plain[k])) == len(plain[k]) for k in ("payloads", "grads", "at") if lists[k]),
    }
    bad = [key for key, ok in checks.items() if not ok]
    if bad:
        raise ValueError(f"{where}.{bad[0]} is not what a lookahead driver holds between two windows")
    try:
        shipped = base64.b64decode(plain["shipped"], validate=True)
    except ValueError:  # (binascii.Error)
        raise ValueError(f"{where}.shipped is not base64 text") from None
    _shipped(shipped, len(plain["words"]))
    return plain


def _shipped(data: bytes, words: int) -> None:
    """The driver's trace rows not yet written (``PackedRows``' bytes): whole rows whose strings are its words;
    ValueError where they are not."""
    from netsim.trace.io import RECORD, SCHEMA, packed_columns

    if len(data) % RECORD.size:
        raise ValueError("state.windowed.held.shipped is not whole rows of the trace")
    cols = dict(zip((f.name for f in SCHEMA), packed_columns(data), strict=True))
    if len(data) and not all(0 <= cols[k].min() and cols[k].max() < words for k in ("kind", "tag")):
        raise ValueError("state.windowed.held.shipped holds a string that is not one of the driver's words")


def _row_dtype(kind: Any, rows: Any) -> bool:
    """A ticket's rows' dtype (``WindowDriver.held``: ``rows.dtype.str``, "" where it has none): an integer one."""
    if rows is None:
        return kind == ""
    try:
        return isinstance(kind, str) and np.dtype(kind).kind in "iu"
    except (TypeError, ValueError, SyntaxError):
        return False


def _ledger(agent, saved: dict, arrays: dict, key: str) -> None:
    """An agent's privacy ledger as it stood: its totals, its release log's columns, its noise generator."""
    led = agent.ledger  # made now, with the scenario's settings, as the run made it
    _assign(led, {k: v for k, v in saved.items() if k not in ("releases", "to0", "specs")}, f"state.ledgers.{key}")
    log = led.releases
    for name, code in _LOG.items():
        col = arrays.get(f"ledger.{key}.{name}")
        if col is not None:
            setattr(log, name, array(code, col.tobytes()))
    log.to0 = saved["to0"]
    log.load_specs([tuple(s) for s in saved["specs"]])
    noise = arrays.get(f"ledger.{key}.noise")
    if noise is not None:
        led.noise.generator.set_state(torch.from_numpy(np.array(noise)))
    rdp = arrays.get(f"ledger.{key}.rdp")
    if rdp is not None:
        led.load_rdp(np.array(rdp))
