"""Checkpoints: the data state of a run at one event boundary, written atomically, never pickled.

A checkpoint is a folder ``checkpoints/ckpt-<step>/`` in the run folder holding

* ``arrays.npz`` - tensors (parameter bank and named per-agent state such as momentum, payloads of
  messages in flight and waiting in inboxes, the ledgers' releases and noise-generator states, tensors
  held by the agents' programs),
  loaded with ``allow_pickle=False``;
* ``state.json`` - plain data: format version, scenario sha256, event step and simulated time,
  every random stream's bit-generator state, the pending-event queue (timers, deliveries, gradient
  completions), agents' plain attributes (rounds, activation schedules, algorithm counters), where each
  agent's program is suspended with its locals (per-agent algorithm state: counters, a gradient taken
  before a barrier, a PushSum's sums), ledger
  totals, comm and event counters, the metrics rows so far and the trace position (events, bytes and
  sha256 at the last batch boundary, events buffered since);
* ``SHA256SUMS`` - checksums of both, so a torn or corrupted checkpoint is detected and skipped.

It is written into a hidden temporary folder, fsynced, then renamed (atomic on POSIX).

How resume gets back to a checkpoint (docs/checkpoints.md): a windowed run's checkpoint, taken between two rounds
where a round kernel's state is explicit, is restored into a freshly built simulation (sim/restore.py), without
recomputing anything. An events run's agents are Python generators that read like the paper's pseudo-code;
their locals (a gradient computed before a barrier, a half-gathered round) cannot be serialized, so ``netsim
resume`` rebuilds the run deterministically, without trace output or evaluation, up to the checkpoint's event
step. Either way it checks that the state reached equals the checkpoint *exactly* (every tensor, stream state,
pending event and message), cuts the trace at the checkpoint's byte offset, and continues writing. Everything
after the checkpoint is then identical to the uninterrupted run.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import re
import shutil
import time
import zipfile
from collections.abc import Callable
from itertools import repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from netsim.errors import InputError

FORMAT = 4  # 2: mini-batch streams are saved as drawn ahead (DrawsAhead), agent state formats of the Agent API;
# 3: a program's local that is a whole bank tensor (Agent.shared_state) is stored as a reference to it;
# 4: "engine"; a windowed run's checkpoint holds its explicit state between rounds (sim/restore.py)
READS = (3, 4)  # a format-3 checkpoint is an events engine's: resumed by re-execution, as before
FOLDER = "checkpoints"
_NAME = re.compile(r"^ckpt-(\d{12})$")
_PLAIN = (bool, int, float, str)


# plain data + tensors --------------------------------------------------------------------------------
def _array(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.cpu().numpy().copy()
    return np.asarray(x)


class Arrays(dict):
    """The checkpoint's arrays by key, and the bank's tensors by identity: a program local that *is* one of
    them (every agent's ``Agent.shared_state``) is stored once, as the bank's, and referenced by name, so a
    checkpoint grows as O(agents x parameters), not with a copy of the bank per agent."""

    def __init__(self, bank: dict[str, torch.Tensor] | None = None):
        super().__init__()
        self.shared = {id(t): name for name, t in (bank or {}).items()}


def _flat(obj: Any, key: str, arrays: Arrays) -> Any:
    """A JSON skeleton of ``obj``; its tensors go to ``arrays`` under keys derived from ``key``."""
    if obj is None or isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        name = arrays.shared.get(id(obj))
        if name is not None:
            return {"bank": name}
        arrays[key] = _array(obj)
        return {"@": key}
    if isinstance(obj, dict):
        return {"dict": [[_flat(k, f"{key}.k{i}", arrays), _flat(v, f"{key}.{i}", arrays)]
                         for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, (list, tuple)):
        return {"list": [_flat(v, f"{key}.{i}", arrays) for i, v in enumerate(obj)]}
    if attrs.has(type(obj)):
        return {"type": type(obj).__name__,
                **{f.name: _flat(getattr(obj, f.name), f"{key}.{f.name}", arrays) for f in attrs.fields(type(obj))}}
    return {"type": type(obj).__name__}


def _message(m: Any, key: str, arrays: Arrays) -> dict[str, Any]:
    return {"id": m.id, "src": m.src, "dst": m.dst, "tag": m.tag, "round": m.round, "size": m.size,
            "sent": m.sent, "payload": _flat(m.payload, key, arrays)}


def _local(obj: Any, key: str, arrays: Arrays, depth: int = 0) -> Any:
    """A generator local: as ``_flat``, and netsim's own helper objects (a PushSum, an ErrorFeedback)
    by their attributes, one level deep (an Agent or the Simulation by type only)."""
    cls = type(obj)
    if depth == 0 and hasattr(obj, "__dict__") and not attrs.has(cls) and cls.__module__.startswith("netsim.") \
            and cls.__name__ not in ("Agent", "Simulation", "Network", "ParameterBank", "GradientService"):
        return {"type": cls.__name__, "vars": {k: _local(v, f"{key}.{k}", arrays, 1)
                                               for k, v in sorted(vars(obj).items())}}
    return _flat(obj, key, arrays)


def _program(proc, key: str, arrays: Arrays) -> list[Any]:
    """Where an agent's program (and each generator it delegates to) is suspended, and its locals: not
    restorable (Python cannot serialise a generator), but stored and compared on resume."""
    out, gen, depth = [], getattr(proc, "_generator", None), 0
    while gen is not None and getattr(gen, "gi_frame", None) is not None:
        frame = gen.gi_frame
        k = f"{key}.{depth}"
        out.append([gen.gi_code.co_name, frame.f_lineno,
                    {name: _local(v, f"{k}.{name}", arrays) for name, v in sorted(frame.f_locals.items())}])
        gen, depth = gen.gi_yieldfrom, depth + 1
    return out


def _plain_vars(obj: Any) -> dict[str, Any]:
    """``obj``'s values of a plain type: its dict's, and those its class keeps elsewhere (``CHECKPOINTED``: an agent's
    round, in the run's array of rounds)."""
    held = {k: getattr(obj, k) for k in getattr(type(obj), "CHECKPOINTED", ())}
    return {k: v for k, v in sorted((vars(obj) | held).items()) if type(v) in _PLAIN}


class Columns:
    """Many objects' plain values (``_plain_vars`` of each, and ``nested`` ones under a key of each: an agent's
    schedule) held as columns: what a restored run's capture compares with the checkpoint's list of dicts
    (``equals``, ``mismatch``) without making a dict per object; ``dicts`` makes them."""

    __slots__ = ("n", "names", "cols", "kinds", "nested")

    def __init__(self, n: int, names: tuple[str, ...], cols: list, kinds: list, nested: dict[str, Columns]):
        self.n, self.names, self.cols, self.kinds, self.nested = n, names, cols, kinds, nested

    def dicts(self) -> list[dict[str, Any]]:
        out = list(map(dict, map(zip, repeat(self.names), zip(*self.cols)))) if self.names else \
            [{} for _ in range(self.n)]
        for key, sub in self.nested.items():
            for d, v in zip(out, sub.dicts(), strict=True):
                d[key] = v
        return out

    def equals(self, ref: Any) -> bool:
        """Whether ``ref`` is a list of these dicts: as many, each of these names (and nested keys) only, each name's
        values equal to these and all of this column's one type. False where it is not, or cannot say so at once
        (several types in a column): the caller then compares the dicts themselves. ``ref`` may be such values as
        ``Columns`` too (``mismatch``'s ``known``)."""
        if type(ref) is Columns:  # (a checkpoint's own values as a restore read them: ``mismatch``'s ``known``)
            return (ref.n, ref.names, ref.kinds, ref.cols, list(ref.nested)) == \
                (self.n, self.names, self.kinds, self.cols, list(self.nested)) \
                and all(sub.equals(ref.nested[k]) for k, sub in self.nested.items())
        keys = (*self.names, *self.nested)
        if not (isinstance(ref, list) and len(ref) == self.n and (not ref or (
                set(map(type, ref)) == {dict} and set(map(len, ref)) == {len(keys)}))):
            return False
        if not ref or not keys:
            return True
        try:  # (a list per key, no tuple per object: nothing here for the cyclic GC to count)
            theirs = [list(map(itemgetter(k), ref)) for k in keys]
        except KeyError:
            return False
        for mine, kinds, col in zip(self.cols, self.kinds, theirs):
            if len(kinds) != 1 or set(map(type, col)) != kinds or col != mine:
                return False
        return all(sub.equals(col) for sub, col in zip(self.nested.values(), theirs[len(self.names):]))


def _columns(objs: list, nested: dict[str, Columns] | None = None) -> Columns | None:
    """``_plain_vars`` of each of ``objs`` as ``Columns``, where they all have the names of the first and each
    name's values are all of a plain type or all of none (a run's agents, their schedules): one type check per
    name and kind, not per object; None otherwise."""
    dicts = list(map(vars, objs))
    names = tuple(dicts[0]) if dicts else ()
    if set(map(len, dicts)) != {len(names)}:
        return None
    plain = {}
    for name in names:
        try:  # (each name's types first: most of an agent's values are objects, their column never kept)
            kinds = set(map(type, map(itemgetter(name), dicts)))
        except KeyError:  # a name the first has and another has not
            return None
        if kinds.isdisjoint(_PLAIN):
            continue
        if not kinds.issubset(_PLAIN):  # plain in some objects, not in others
            return None
        plain[name] = (list(map(itemgetter(name), dicts)), kinds)
    for name in getattr(type(objs[0]), "CHECKPOINTED", ()) if objs else ():
        col = list(map(attrgetter(name), objs))
        kinds = set(map(type, col))
        if not kinds.issubset(_PLAIN):
            return None
        plain[name] = (col, kinds)
    keep = tuple(sorted(plain))
    return Columns(len(dicts), keep, [plain[k][0] for k in keep], [plain[k][1] for k in keep], nested or {})


def _agents(agents: list, columns: bool) -> list[dict[str, Any]] | Columns:
    """The agents' plain values, each with its schedule's: as ``Columns`` where ``columns`` and they can be."""
    schedules = [a.schedule for a in agents]
    got = _columns(schedules) if len(agents) > 1 else None
    got = _columns(agents, {"schedule": got}) if got is not None else None
    if got is not None:
        return got if columns else got.dicts()
    return [{**_plain_vars(a), "schedule": _plain_vars(s)} for a, s in zip(agents, schedules, strict=True)]


def _streams(streams, arrays: Arrays, restored: bool = False) -> list[str]:
    """Every stream's PCG64 state as rows of 6 uint64 (state and increment as 128-bit halves, the
    buffered 32-bit draw); returns the streams' keys (as "purpose,key..."), in the rows' order."""
    names, arrays["streams"] = streams.rows(restored)
    return names


def capture(sim, normalise: bool = True, columns: bool = False,
            restored: bool = False) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The run's state as (plain data, arrays): what a checkpoint stores and what resume compares (``normalise``:
    as JSON reads it back, tuples as lists and keys as strings; a writer that dumps it as JSON needs not;
    ``columns``: the agents' plain values and their inboxes as ``Columns`` where they can be, for ``mismatch``;
    ``restored``: right after sim/restore.py put a checkpoint's state back, the streams' rows as it put them)."""
    enabled = gc.isenabled()
    gc.disable()  # it allocates only acyclic data; collections would rescan the whole simulation (10k agents: 2x)
    try:
        state, arrays = _capture(sim, columns and not normalise, restored)
        return json.loads(json.dumps(state)) if normalise else state, arrays
    finally:
        if enabled:
            gc.enable()


def _capture(sim, columns: bool = False, restored: bool = False) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from netsim.sim.network import Message
    world, loop, rec = sim.world, sim.loop, sim.recorder

    bank = world.bank.state_dict()
    arrays = Arrays(bank)
    for k, v in bank.items():
        arrays[f"bank.{k}"] = _array(v)
    queue = []  # a windowed driver plays the rounds itself: the queue's events (the programs' starts) never happen
    for t, prio, eid, ev in sorted(loop.env.queue if loop.runner is None else (), key=lambda e: e[:3]):
        value = getattr(ev, "_value", None)
        queue.append([t, prio, eid, type(ev).__name__,
                      _message(value, f"queue.{eid}", arrays) if isinstance(value, Message)
                      else value if type(value) in _PLAIN else None])
    inboxes, ledgers = [], {}
    agents = _agents(loop.agents, columns)
    n = len(loop.agents)
    empty = columns and n > 1 and not any(a.inbox.queues or a.inbox.waiters for a in loop.agents)
    if empty:  # every inbox empty (between two rounds): compared as columns, not made per agent
        none = [{}] * n
        inboxes = Columns(n, ("queued", "waiting"), [none, none], [{dict}, {dict}], {})
    for a in loop.agents:
        box = a.inbox
        if not empty:
            inboxes.append({
                "queued": {tag: [_message(m, f"inbox.{a.id}.{m.id}", arrays) for m in q]
                           for tag, q in sorted(box.queues.items()) if q},
                "waiting": {tag: [type(w).__name__, w.round, sorted(getattr(w, "got", {}))]
                            for tag, w in sorted(box.waiters.items())},
            } if box.queues or box.waiters else {"queued": {}, "waiting": {}})  # (most agents between two rounds)
        led = a.existing_ledger
        if led is not None:
            log = led.releases  # a ReleaseLog: its typed columns, no record per release
            for name in ("t", "round", "to", "skipped", "run_start", "run_spec"):
                col = getattr(log, name)
                if col is not None:
                    arrays[f"ledger.{a.id}.{name}"] = np.frombuffer(col, dtype=col.typecode).copy()
            noise = getattr(led, "_noise", None)
            if noise is not None:
                arrays[f"ledger.{a.id}.noise"] = _array(noise.generator.get_state())
            ledgers[str(a.id)] = {**_plain_vars(led), "releases": len(log), "to0": log.to0, "specs": log.specs}
    counts = rec.counts
    from netsim.sim.services import CommStats

    stats = sim.services.find(CommStats)
    g = world.gradients
    state = {
        "time": loop.env.now, "step": loop.steps, "finished": loop.finished, "stop_reason": loop.stop_reason,
        "rng": _streams(world.streams, arrays, restored),
        "queue": queue, "agents": agents, "inboxes": inboxes, "ledgers": ledgers,
        # a windowed driver plays the rounds itself: the programs never start (their frames say nothing)
        "programs": [] if loop.runner is not None else
        [[i, _program(proc, f"program.{n}", arrays)] for n, (i, proc) in enumerate(loop.programs.running)],
        # (each link's (src, dst) its own: sorted by them as one int, ~3x faster than by the lists)
        "network": {**_plain_vars(world.network),
                    "links": sorted([*([s, d, lk.busy_until] for (s, d), lk in world.network.links.items()),
                                     *([s, d, r[1]] for (s, d), r in world.network.restored.items())],
                                    key=lambda r: r[0] * n + r[1])},
        "gradients": {"calls": g.calls, "evaluated": g.evaluated, "pending": len(g.pending)},
        "events": {"emitted": rec.events_emitted,
                   "kinds": dict(sorted(counts.kinds.items())) if counts is not None else None,
                   "bytes_sent": counts.bytes_sent if counts is not None else None},
        "comm": None if stats is None else {"counts": dict(sorted(stats.counts.items())),
                                            "samples": dict(sorted(stats.samples.items()))},
    }
    if rec.diverged is not None:  # kept only when found: other runs' checkpoints are as they were
        state["diverged"] = rec.diverged
    if loop.programs.between is not None:  # a windowed driver between two rounds: its explicit state, to restore
        from netsim.sim import restore

        state["windowed"] = restore.capture(sim, arrays)
    return state, dict(arrays)


# writing ------------------------------------------------------------------------------------------------
def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoints(folder: Path) -> list[Path]:
    """The run folder's complete checkpoints, oldest first."""
    root = Path(folder) / FOLDER
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _NAME.match(p.name) and p.is_dir())


def write(sim, folder: Path, keep: int, kind: str, header: dict[str, Any]) -> Path:
    """Write the run's checkpoint at the current event boundary; keep the newest ``keep``."""
    writer = sim.recorder.writer
    # The trace position is the last regular batch boundary; events buffered since (an interrupt falls
    # between boundaries) are written too, so the stopped run's trace is complete, but a resumed run cuts
    # them and writes them again in the uninterrupted run's batches: the files end up byte-identical.
    # A windowed run's checkpoint keeps those buffered rows itself and leaves them buffered: the run's batches,
    # and so its trace, are then the same bytes with checkpoints as without.
    trace = {"events": writer.count, "bytes": writer.bytes, "sha256": writer.sha.hexdigest(),
             "pending": len(writer.buffer), "file": writer.path is not None}
    state, arrays = capture(sim, normalise=False)
    writer.sync(buffered="windowed" not in state)
    meta = {
        **header, "format": FORMAT, "kind": kind, "engine": sim.loop.engine, "step": sim.loop.steps,
        "time": sim.loop.env.now,
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "trace": trace,
        "metrics": sim.recorder.metrics, "state": state,
    }
    tracking = sim.recorder.tracking_held(sim.services)  # the ``tracking`` metric's warm start: not in ``state``, which
    if tracking is not None:  # a re-executed run compares at the checkpoint, before it is put back
        meta["tracking"] = tracking
    refused = sim.services.find("windowed_refused")  # --engine auto on the events engine: the resumed run says so too
    if refused is not None:
        meta["windowed_refused"] = refused
    root = Path(folder) / FOLDER
    root.mkdir(exist_ok=True)
    for stale in root.glob(".ckpt-*.tmp"):  # left by a run killed while writing one
        shutil.rmtree(stale, ignore_errors=True)
    name = f"ckpt-{sim.loop.steps:012d}"
    tmp = root / f".{name}.tmp"
    tmp.mkdir()
    packed, meta["pooled"] = _pack(arrays)
    with open(tmp / "arrays.npz", "wb") as f:
        np.savez(f, **packed)
        f.flush()
        os.fsync(f.fileno())
    _write_synced(tmp / "state.json", json.dumps(meta).encode())
    sums = {n: _sha(tmp / n) for n in ("arrays.npz", "state.json")}
    _write_synced(tmp / "SHA256SUMS", json.dumps(sums, indent=1).encode())
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    for old in checkpoints(folder)[:-keep]:  # renamed first: a kill inside rmtree leaves no half checkpoint
        doomed = root / f".{old.name}.tmp"
        os.rename(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return final


def _pack(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, list]]:
    """Stack small arrays of one dtype and shape (each agent's gradient, each message's payload) into one
    ``pool.<n>`` entry: an npz of 10,000 agents' locals is then a few entries, not 50,000 (5x faster)."""
    groups: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for k, v in arrays.items():
        if v.size <= 1 << 16:
            groups.setdefault((v.dtype.str, v.shape), []).append(k)
    packed, index = dict(arrays), {}
    for n, keys in enumerate(g for g in groups.values() if len(g) > 1):
        packed[f"pool.{n}"] = np.stack([packed.pop(k) for k in keys])
        index.update({k: [f"pool.{n}", j] for j, k in enumerate(keys)})
    return packed, index


def _unpack(arrays: dict[str, np.ndarray], index: Any) -> dict[str, np.ndarray]:
    if not isinstance(index, dict):
        raise CorruptCheckpoint("state.json: 'pooled' is not an object")
    out = {k: v for k, v in arrays.items() if not k.startswith("pool.")}
    for k, ref in index.items():
        ok = isinstance(ref, list) and len(ref) == 2 and ref[0] in arrays and isinstance(ref[1], int) \
            and 0 <= ref[1] < len(arrays[ref[0]])
        if not ok:
            raise CorruptCheckpoint(f"state.json: pooled array {k!r} points nowhere")
        out[k] = arrays[ref[0]][ref[1]]
    return out


# reading ------------------------------------------------------------------------------------------------
@attrs.frozen
class Checkpoint:
    path: Path
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]

    @property
    def step(self) -> int:
        return self.meta["step"]


class CorruptCheckpoint(Exception):
    pass


def load(path: Path) -> Checkpoint:
    """Read and verify one checkpoint folder; ``CorruptCheckpoint`` says what is wrong."""
    try:
        sums = json.loads((path / "SHA256SUMS").read_text())
        if not isinstance(sums, dict) or set(sums) != {"arrays.npz", "state.json"}:
            raise CorruptCheckpoint("SHA256SUMS does not list arrays.npz and state.json")
        for n, h in sums.items():
            if _sha(path / n) != h:
                raise CorruptCheckpoint(f"{n} does not match its sha256 (corrupted or torn)")
        text = (path / "state.json").read_text()
        enabled = gc.isenabled()
        gc.disable()  # acyclic data: collections while it is made would rescan whatever the process holds
        try:
            meta = json.loads(text)
        finally:
            if enabled:
                gc.enable()
        if not isinstance(meta, dict):
            raise CorruptCheckpoint("state.json is not an object")
        if meta.get("format") not in READS:
            raise CorruptCheckpoint(f"checkpoint format {meta.get('format')!r}; this netsim reads "
                                    f"{', '.join(map(str, READS))}")
        _check_meta(meta)
        with np.load(path / "arrays.npz", allow_pickle=False) as z:
            arrays = _unpack({k: z[k] for k in z.files}, meta.get("pooled", {}))
    except CorruptCheckpoint:
        raise
    except (OSError, ValueError, UnicodeDecodeError, zipfile.BadZipFile, EOFError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"unreadable ({type(e).__name__}: {e})") from None
    return Checkpoint(path, meta, arrays)


_META = {"step": int, "time": float, "trace": dict, "metrics": list, "state": dict, "scenario_sha256": str}
_TRACE = {"events": int, "bytes": int, "sha256": str, "pending": int, "file": bool}


def _check_meta(meta: dict[str, Any]) -> None:
    """Types of what resume reads from state.json (the rest is compared, not read)."""
    for fields, where in ((_META, meta), (_TRACE, meta.get("trace"))):
        for k, t in fields.items():
            v = where.get(k) if isinstance(where, dict) else None
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) if t is float else \
                isinstance(v, t) and (t is not int or (not isinstance(v, bool) and v >= 0))
            if not ok:
                raise CorruptCheckpoint(f"state.json: {k!r} is not a {'non-negative int' if t is int else t.__name__}")
    if not all(isinstance(r, dict) and type(r.get("time")) in (int, float)
               and all(v is None or type(v) in (int, float) for v in r.values()) for r in meta["metrics"]):
        raise CorruptCheckpoint("state.json: 'metrics' is not a list of rows of numbers, each with its 'time'")
    tracking = meta.get("tracking")  # (absent: no ``tracking`` metric, or none evaluated before the checkpoint)
    if tracking is not None and not (
            isinstance(tracking, dict) and set(tracking) == {"theta", "newton_steps"}
            and isinstance(theta := tracking["theta"], list)
            and all(type(v) is float and math.isfinite(v) for v in theta)
            and type(tracking["newton_steps"]) is int and tracking["newton_steps"] >= 0):
        raise CorruptCheckpoint("state.json: 'tracking' is not a warm start (finite numbers) and a step count")


def latest(folder: Path, warn: Callable[[str], None]) -> Checkpoint:
    """The newest checkpoint that verifies; each one rejected on the way is reported through ``warn``."""
    found = checkpoints(folder)
    if not found:
        raise InputError("", f"no checkpoint in {FOLDER}/ (set run.checkpoint_every, or stop a run with "
                             "Ctrl-C, to get one); start it again with netsim run", str(folder))
    for path in reversed(found):
        try:
            return load(path)
        except CorruptCheckpoint as e:
            warn(f"{path}: rejected: {e}; trying the previous checkpoint")
    raise InputError("", f"every checkpoint in {FOLDER}/ is corrupted ({len(found)} rejected); "
                         "start the run again with netsim run", str(folder))


# comparing ----------------------------------------------------------------------------------------------
def _diff(a: Any, b: Any, path: str) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}"
            d = _diff(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path} (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b)):
            d = _diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    return None if a == b and type(a) is type(b) else path


def mismatch(ckpt: Checkpoint, state: dict[str, Any], arrays: dict[str, np.ndarray],
             restored: bool = False, known: dict[str, Columns] | None = None) -> str | None:
    """The first place where a rebuilt run differs from the checkpoint (None: identical). ``state`` may be
    ``capture``'s without normalising: both are compared as the JSON text they make (the same text, in the same
    key order, when they hold the same values), and only a difference is looked for key by key. ``restored``: the
    state was put back from this very checkpoint (sim/restore.py, which checks each value's type as it puts it
    back), so equal values (``==``, one comparison in C) need no JSON text. ``known``: some of the checkpoint's
    values as ``Columns`` (``restore.restore`` read them so): compared as they are, not read from it again."""
    lazy = [k for k, v in state.items() if type(v) is Columns]
    if lazy:  # (capture's ``columns``) each the checkpoint's own where they are equal, else made to be compared
        ref, known = ckpt.meta["state"], known or {}
        same = all(state[k].equals(known[k] if k in known else ref.get(k)) for k in lazy)
        state = {**state, **{k: ref[k] if same else state[k].dicts() for k in lazy}}
    if not (restored and state == ckpt.meta["state"]) and json.dumps(state) != json.dumps(ckpt.meta["state"]):
        d = _diff(ckpt.meta["state"], json.loads(json.dumps(state)), "state")
        if d:  # None: the same values written otherwise (0.0 and -0.0); the arrays are still compared
            return d
    if set(ckpt.arrays) != set(arrays):
        return f"arrays {sorted(set(ckpt.arrays) ^ set(arrays))[:3]}"
    for k, v in ckpt.arrays.items():
        w = arrays[k]
        if v.shape != w.shape or v.dtype != w.dtype:
            return f"arrays[{k}] shape/dtype"
        if not np.array_equal(v, w, equal_nan=v.dtype.kind in "fc"):
            return f"arrays[{k}]"
    return None
