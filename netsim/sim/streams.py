"""Named random streams: one independent generator per (purpose, key...) from the run's seed.

Streams are addressed, not spawned in order (``SeedSequence(seed, spawn_key=(code, *key))``), so
creating a stream never shifts another: a different algorithm, or a different number of messages on
one link, leaves every other stream's draws unchanged.

A *purpose* is a name (``"latency"``, ``"noise"``...) registered once with ``register_purpose``; its
integer ``code`` is what enters the spawn key. The core's purposes keep the codes they always had, so
a seed gives the same draws as before; a purpose registered without a code (a plugin's) gets one
derived from its name (``name_code``: a hash, stable across runs, machines and import orders). A module
registers the purposes it needs where it is defined (PDSL registers ``"shapley"``); two names may not
share a code, nor one name two codes.
"""

from __future__ import annotations

import functools
import hashlib
import re
from array import array
from collections.abc import Callable
from itertools import groupby, islice, repeat

import numpy as np

_CODES: dict[str, int] = {}  # name -> code
_NAMES: dict[int, str] = {}  # code -> name
NAME_CODE_BASE = 1 << 16  # derived codes live above every explicit one


def name_code(name: str) -> int:
    """The code a purpose registered without one gets: 32 bits of the name's blake2b, above 2**16."""
    h = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "big")
    return NAME_CODE_BASE + h


def register_purpose(name: str, code: int | None = None) -> int:
    """Register a stream purpose; returns its code. Registering the same (name, code) again is a
    no-op (a module imported twice); a name already bound to another code, or a code already used by
    another name, raises ``ValueError`` naming both."""
    if not isinstance(name, str) or not name or not name.isidentifier():
        raise ValueError(f"stream purpose must be a non-empty identifier, got {name!r}")
    if code is None:
        code = _CODES.get(name, name_code(name))
    code = int(code)
    if code < 0:
        raise ValueError(f"stream purpose {name!r}: code must be >= 0, got {code}")
    have = _CODES.get(name)
    if have is not None and have != code:
        raise ValueError(f"stream purpose {name!r} is already registered with code {have}, not {code}")
    other = _NAMES.get(code)
    if other is not None and other != name:
        raise ValueError(f"stream purpose {name!r}: code {code} is already used by {other!r}")
    _CODES[name] = code
    _NAMES[code] = name
    return code


def purpose_code(name: str) -> int:
    """The code of a registered purpose; ``KeyError`` with the registered names otherwise."""
    try:
        return _CODES[name]
    except KeyError:
        raise KeyError(f"unknown stream purpose {name!r} (register it with netsim.sim.streams.register_purpose; "
                       f"registered: {', '.join(sorted(_CODES))})") from None


def purposes() -> dict[str, int]:
    """Every registered purpose and its code (a copy)."""
    return dict(_CODES)


# the core's purposes and their historical codes (changing a code changes every run's draws)
for _name, _code in {
    "topology": 1, "clock": 2, "activation": 3, "compute": 4, "latency": 5, "loss": 6, "data": 7,
    "partition": 8, "batch": 9, "init": 10, "noise": 11, "algorithm": 12,
    # link and agent models
    "burst": 40, "churn": 41, "jitter": 42, "topology_schedule": 43,
    # compression (rand-k seeds, QSGD rounding)
    "compress": 60,
    # data options: held-out validation rows, per-agent subsampling
    "validation": 80, "subsample": 90,
}.items():
    register_purpose(_name, _code)
BLOCK = 256
FIRST_BLOCK = 32  # a stream's first block (``Draws``)


# numpy's SeedSequence constants (numpy/random/bit_generator.pyx): ``seed_states`` computes its words for many keys
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _U32, _U64 = 0xCA01F9DD, 0x4973F715, 0xFFFFFFFF, (1 << 64) - 1


def seed_states(seed: int, keys: np.ndarray) -> np.ndarray:
    """``SeedSequence(seed, spawn_key=key).generate_state(4, np.uint64)`` (what ``PCG64`` seeds itself from) for
    every row of ``keys`` (non-negative integers below 2**32) at once, as (rows, 4) uint64: numpy's hashing of the
    entropy into a pool of four words and out again, in uint32 arithmetic over the rows (tests/test_streams.py
    holds it to numpy's, key by key). Seeding a generator this way costs ~2 µs, numpy's own way ~19 µs: a run at
    scale seeds two streams per link it uses."""
    words = []
    x = int(seed)
    while x:
        words.append(x & _U32)
        x >>= 32
    words = (words or [0]) + [0] * max(0, 4 - len(words or [0]))  # a spawn key pads the run's entropy to the pool
    n = len(keys)
    entropy = [np.full(n, w, np.uint32) for w in words] + [keys[:, c].astype(np.uint32) for c in range(keys.shape[1])]
    h = _INIT_A

    def hashmix(v: np.ndarray) -> np.ndarray:
        nonlocal h
        v = v ^ np.uint32(h)
        h = (h * _MULT_A) & _U32
        v = v * np.uint32(h)
        return v ^ (v >> np.uint32(16))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        r = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
        return r ^ (r >> np.uint32(16))

    pool = [hashmix(entropy[i]) for i in range(4)]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(4, len(entropy)):
        for dst in range(4):
            pool[dst] = mix(pool[dst], hashmix(entropy[src]))
    out = np.empty((n, 8), np.uint32)
    h = _INIT_B
    for k in range(8):
        v = pool[k % 4] ^ np.uint32(h)
        h = (h * _MULT_B) & _U32
        v = v * np.uint32(h)
        out[:, k] = v ^ (v >> np.uint32(16))
    return out.view("<u8")


class _SeedState(np.random.bit_generator.ISeedSequence):
    """A seed sequence whose state words are already known (``seed_states``): what ``PCG64`` asks of one."""

    __slots__ = ("words",)

    def __init__(self, words: np.ndarray):
        self.words = words

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        return self.words


class Streams:
    """The stream tree of one run."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._cache: dict[tuple[int, ...], np.random.Generator] = {}
        self._ahead: dict[tuple[int, ...], np.ndarray] = {}  # spawn key -> its seed state, computed in bulk
        # a restored stream not made yet, by its name -> its row of ``_rows`` (``restore``: the checkpoint's rows and
        # names, kept as they are: parsing 40,000 names into keys costs more than the rest of ``restore``)
        self._pending: dict[str, int] = {}
        self._rows, self._names = np.zeros((0, 6), np.uint64), []
        self._put: dict[str, int] = {}  # the streams ``restore`` put in place, by name -> their row, until ``rows``

    def rng(self, purpose: str, *key: int) -> np.random.Generator:
        k = (purpose_code(purpose), *map(int, key))
        g = self._cache.get(k)
        if g is None:
            words = self._ahead.pop(k, None)
            g = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=k) if words is None
                                                    else _SeedState(words)))
            self._cache[k] = g
            if self._pending:
                i = self._pending.pop(_name(k), None)
                if i is not None:
                    _put(g, self._rows[i].tolist())
        return g

    def seed_ahead(self, purposes: tuple[str, ...], keys: np.ndarray) -> None:
        """The seed states of the streams ``(purpose, *row)`` for every purpose and row of ``keys`` (int arrays),
        computed at once (``seed_states``), for ``rng`` to make the generators from when they are first asked for:
        the same generators, made ~10x faster (a link's streams, at scale)."""
        keys = np.asarray(keys, np.int64)
        if not len(keys) or keys.min() < 0 or keys.max() > _U32:
            return
        for purpose in purposes:
            code = purpose_code(purpose)
            states = seed_states(self.seed, np.column_stack([np.full(len(keys), code, np.int64), keys]))
            for row, st in zip(keys.tolist(), states, strict=True):
                k = (code, *row)
                if k not in self._cache:
                    self._ahead[k] = st

    def seed_sequence(self, purpose: str, *key: int) -> np.random.SeedSequence:
        """The stream's seed sequence itself (uncached): for code that builds its own generator."""
        return np.random.SeedSequence(self.seed, spawn_key=(purpose_code(purpose), *map(int, key)))

    def rows(self, restored: bool = False) -> tuple[list[str], np.ndarray]:
        """Every stream so far, sorted by spawn key: their names ("code,key...") and their states as rows of 6
        uint64 (state and increment as 128-bit halves, has_uint32, uinteger): what a checkpoint saves. Those made,
        and those a restore has not made yet (their names and rows as the checkpoint gave them). ``restored``: called
        right after ``restore``, nothing drawn since: the streams it put in place are the rows it put (a restore's
        check compares which streams there are, not their states read back: ~5 us a stream), and where those and the
        ones not made yet are all there are, the names and rows are the restore's, in its order."""
        keys, made = [], []
        put, self._put = (self._put if restored else {}), {}  # (for this one call: a name per stream)
        for k, g in self._cache.items():
            if put and _name(k) in put:
                continue
            st = g.bit_generator.state
            s, inc = st["state"]["state"], st["state"]["inc"]
            keys.append(k)
            made.append((s >> 64, s & _U64, inc >> 64, inc & _U64, st["has_uint32"], st["uinteger"]))
        pending = self._pending
        if restored and not made and len(put) + len(pending) == len(self._names):
            return list(self._names), self._rows
        names = list(map(_name, keys))
        kept = [*put, *pending]
        at = np.fromiter([*put.values(), *pending.values()], np.intp, len(kept))
        keys += _keys(kept)
        names += kept
        rows = np.concatenate([np.array(made, dtype=np.uint64).reshape(-1, 6), self._rows[at]])
        order = sorted(range(len(keys)), key=keys.__getitem__)
        return [names[i] for i in order], rows[order]

    def restore(self, names: list[str], rows: np.ndarray) -> None:
        """Put every stream of ``names`` (``rows``' format) at its row of ``rows``: a stream made already in place
        (whoever holds its generator keeps it), any other when it is first asked for (a restored run makes a
        link's streams when the link is next used, as the run made them). ValueError: not such names and rows."""
        if not (isinstance(rows, np.ndarray) and rows.dtype == np.uint64 and rows.ndim == 2 and rows.shape[1] == 6):
            raise ValueError("the streams' states are not rows of 6 uint64")
        if len(names) != len(rows):
            raise ValueError(f"{len(names)} streams' names for {len(rows)} states")
        if not _names(names):  # (a name ``rng`` would never ask for: that stream made afresh)
            raise ValueError("a stream's name is not its spawn key's integers")
        cache, pending = self._cache, self._pending
        if pending:  # (restored twice: the rows not made yet are kept with the new ones)
            self._rows, self._names = np.concatenate([self._rows, rows]), [*self._names, *names]
            base = len(self._rows) - len(rows)
        else:
            self._rows, self._names, base = rows, list(names), 0
        pending.update(zip(names, range(base, base + len(names))))
        made = [(n, g) for n, g in zip(map(_name, cache), cache.values()) if n in pending]
        self._put = {n: pending.pop(n) for n, _ in made}  # (``rows(restored=True)``)
        for (_, g), row in zip(made, self._rows[list(self._put.values())].tolist()):
            _put(g, row)  # (the rows as Python ints at once)

    def seed_for(self, purpose: str, *key: int) -> int:
        """A 63-bit integer seed (for torch generators and networkx) from the named stream."""
        return int(self.rng(purpose, *key).integers(2**63 - 1))


class Draws:
    """Scalar draws from a stream, generated in blocks (one numpy call per BLOCK draws; the first block is
    FIRST_BLOCK long).

    Consumption order is the only thing that matters for determinism, and it is the event order. Where the
    blocks end does not change the values: each is the stream's next values (a float64 draw of ``random``,
    ``uniform``, ``exponential``, ``normal`` or ``lognormal`` reads the stream value by value, and nothing is
    kept between calls). A block is held as ``array('d')``, not a list of Python floats (a quarter of the
    memory): a link keeps one block per stream it draws from, and a large run has hundreds of thousands of
    links, most of which draw a few dozen values in all (10,000 agents x 100 s of gossip: ~25 a link), hence
    the short first block (at 100,000 agents, 1.6 GB of blocks would be 0.2 GB). Iterating an array yields the
    same float64 values as ``tolist()``, as fast (measured).

    With its ``rng`` given, it remembers the stream's state before the current block (one tuple per
    block), so a checkpoint can store where it stands (``position``) and a restored run draw the same
    values again from there and go on from the same value (``resume``). With ``make`` instead (() -> (fill, rng)),
    the stream is made when first drawn from: a restore then keeps its state as its row until then
    (``Streams.restore``), rather than make it and put it back (an agent's compute times: 10,000 agents' cost 0.1 s).
    """

    __slots__ = ("_fill", "_it", "_rng", "_from", "_size", "_used", "_make")

    def __init__(self, fill: Callable[[int], np.ndarray] | None, rng: np.random.Generator | None = None,
                 make: Callable[[], tuple[Callable[[int], np.ndarray], np.random.Generator]] | None = None):
        self._fill = fill
        self._it = iter(())
        self._rng = rng
        self._make = make
        self._from: tuple[int, int, int] | None = None  # the stream's (state, has_uint32, uinteger) before the block
        self._size = 0  # the current block's length (0: none drawn yet)
        self._used: int | None = None  # resumed (``resume``): the values of the block used, the block not drawn yet

    def __call__(self) -> float:
        try:
            return next(self._it)
        except StopIteration:
            if self._make is not None:
                self._made()
            if self._used is not None:  # resumed: the block it stood in, drawn again where it is first needed
                self._redraw()
                return self()
            if self._rng is not None:
                self._from = state_of(self._rng)
            self._refill()
            return next(self._it)

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` values as an array: the values of ``n`` calls (a block's end changes no value), copied out of
        the block's buffer a run at a time, the block's iterator moved past them (where ``position`` reads it)."""
        out, k = np.empty(n, np.float64), 0
        while k < n:
            it = self._it
            red = it.__reduce__()  # (iter, (block,), index), or (iter, ((),)) once the block is used up
            if len(red) == 3 and red[2] < len(red[1][0]):
                block, i = red[1][0], red[2]
                m = min(n - k, len(block) - i)
                out[k:k + m] = np.frombuffer(block, np.float64, m, 8 * i)
                it.__setstate__(i + m)
                k += m
            else:
                out[k] = self()  # (the next block: ``__call__``'s refill)
                k += 1
        return out

    def _made(self) -> None:
        self._fill, self._rng = self._make()
        self._make = None

    def _refill(self, size: int | None = None) -> None:
        if size is None:
            size = BLOCK if self._size else FIRST_BLOCK
        block = array("d")
        block.frombytes(np.ascontiguousarray(self._fill(size), dtype=np.float64).tobytes())
        self._it = iter(block)
        self._size = size

    def position(self) -> list[int] | None:
        """[state, has_uint32, uinteger, values used] of the current block (None: nothing drawn yet)."""
        if self._from is None:
            return None
        if self._used is not None:
            return [*self._from, self._used]
        red = self._it.__reduce__()  # (iter, (block,), index), or (iter, ((),)) once the block is used up
        return [*self._from, red[2] if len(red) == 3 else self._size]

    def resume(self, pos: list[int] | None, keep_stream: bool = False, later: bool = False) -> None:
        """Stand where ``position`` said: the same block drawn again from the stream, ``pos[3]`` values used
        (``keep_stream``: the stream is then put back where it stands now, already restored; ``later``: the block
        drawn at the next draw, the stream put back where it stands then: a restore of many agents' samplers,
        which sets every stream's position after them, draws no block before it is used)."""
        if pos is None:
            return
        if self._rng is None and self._make is None:
            raise ValueError("a Draws without its stream cannot be restored")
        self._from, self._used, self._it = tuple(pos[:3]), pos[3], iter(())
        if later:
            return
        if self._make is not None:
            self._made()
        if keep_stream:
            self._redraw()
            return
        set_state(self._rng, self._from)
        self._refill(BLOCK)  # the same values as the block it stood in, however long that was
        self._it.__setstate__(self._used)
        self._used = None

    def _redraw(self) -> None:
        """The block ``resume`` stands in, drawn again from the stream, ``_used`` values used, and the stream put back
        where it stands: the block as long as it was (the one that took the stream there; a first block is
        shorter, and a longer one would hand out again the values drawn after it)."""
        rng = self._rng
        now = state_of(rng)
        set_state(rng, self._from)
        self._refill(FIRST_BLOCK if self._used <= FIRST_BLOCK else BLOCK)
        if self._size == FIRST_BLOCK and state_of(rng) != now:  # (a full block all the same)
            set_state(rng, self._from)
            self._refill(BLOCK)
        self._it.__setstate__(self._used)
        self._used = None
        set_state(rng, now)


class Ahead:
    """Where each of ``n`` keys stands in its block of values drawn ahead ``cols`` at a time (a planned run's draws:
    each key's next values taken at once from its own streams, the values of one draw at a time in the same order;
    no position is kept for a checkpoint). ``next(ids, refill)``: each key's column, ``refill(i)`` called first for
    the keys whose block is used up or not drawn yet."""

    __slots__ = ("cols", "col")

    def __init__(self, n: int, cols: int):
        self.cols, self.col = cols, np.full(n, cols)

    def next(self, ids: np.ndarray, refill: Callable[[int], None]) -> np.ndarray:
        for i in ids[self.col[ids] == self.cols].tolist():
            refill(i)
            self.col[i] = 0
        col = self.col[ids]
        self.col[ids] = col + 1
        return col


class FirstDrawn(Draws):
    """``Draws`` whose first block was drawn already (``first_doubles``: the first values of many streams at once)
    and whose stream is made only if more are drawn (``more()``: the sampler of the stream moved past that block).
    The same values as ``Draws`` of the stream; no position is kept (a run no checkpoint cuts)."""

    __slots__ = ("_more",)

    def __init__(self, block: bytes, more: Callable[[], Callable[[int], np.ndarray]]):
        super().__init__(_unused)
        self._more = more
        first = array("d")
        first.frombytes(block)  # (float64 values as bytes: a slice of a chunk's, no array per link)
        self._it = iter(first)
        self._size = len(first)

    def _refill(self, size: int | None = None) -> None:
        if self._more is not None:
            self._fill, self._more = self._more(), None
        super()._refill(size)


def _unused(n: int) -> np.ndarray:
    raise AssertionError("a FirstDrawn block refilled before its stream was made")


# PCG64 (numpy's bit generator: O'Neill, "PCG: A family of simple fast space-efficient statistically good algorithms
# for random number generation", 2014, the 128-bit LCG with the XSL-RR output) over many streams at once, in 32-bit
# limbs of uint64 arrays (numpy has no 128-bit integers)
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645
_LIMB = np.uint64(0xFFFFFFFF)
_MULT_LIMBS = [np.uint64((_PCG_MULT >> (32 * k)) & 0xFFFFFFFF) for k in range(4)]


def _carry(acc: list[np.ndarray]) -> list[np.ndarray]:
    for k in range(3):
        acc[k + 1] += acc[k] >> np.uint64(32)
        acc[k] &= _LIMB
    acc[3] &= _LIMB
    return acc


def _step(state: list[np.ndarray], inc: list[np.ndarray]) -> list[np.ndarray]:
    """state * multiplier + inc (mod 2^128), limb by limb (each partial product < 2^64, each sum of halves too)."""
    acc = [c.copy() for c in inc]
    for i in range(4):
        for j in range(4 - i):
            prod = state[i] * _MULT_LIMBS[j]
            acc[i + j] += prod & _LIMB
            if i + j < 3:
                acc[i + j + 1] += prod >> np.uint64(32)
    return _carry(acc)


def first_doubles(states: np.ndarray, n: int) -> np.ndarray:
    """``Generator(PCG64(seed)).random(n)`` for the stream of each row of ``states`` (``seed_states``' rows: what
    PCG64 seeds itself from), as (rows, n) float64, computed for all rows together: numpy's seeding (state 0, the
    increment 2 * seq + 1, a step, the state added, a step), then per value a step and the XSL-RR output's top 53
    bits over 2^53. ~2 us a stream of 32 values where making its generator and drawing cost ~8 us (a large run makes
    two streams per link). ``first_doubles_exact`` holds it to numpy."""
    w = np.asarray(states, dtype=np.uint64)
    halves = lambda x: [x & _LIMB, x >> np.uint64(32)]  # noqa: E731
    seed = halves(w[:, 1]) + halves(w[:, 0])  # (high word first in numpy's seed words)
    one = np.uint64(1)
    inc = halves((w[:, 3] << one) | one) + halves((w[:, 2] << one) | (w[:, 3] >> np.uint64(63)))  # 2 * seq + 1
    state = _step([np.zeros(len(w), np.uint64) for _ in range(4)], inc)
    state = _step(_carry([a + b for a, b in zip(state, seed, strict=True)]), inc)
    out = np.empty((len(w), n))
    for k in range(n):
        state = _step(state, inc)
        hi, lo = state[2] | (state[3] << np.uint64(32)), state[0] | (state[1] << np.uint64(32))
        x, rot = hi ^ lo, hi >> np.uint64(58)
        x = (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))
        out[:, k] = (x >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    return out


def first_doubles_exact(states: np.ndarray, low: float, high: float) -> bool:
    """Whether ``first_doubles`` gives numpy's ``random`` and ``uniform(low, high)`` (low + (high - low) u) for the
    streams of ``states``' first rows (checked where it is used: a numpy that draws otherwise keeps the per-stream
    path)."""
    rows = states[:2]
    ours = first_doubles(rows, FIRST_BLOCK)
    for st, u in zip(rows, ours, strict=True):
        a, b = (np.random.Generator(np.random.PCG64(_SeedState(st))) for _ in range(2))
        if not (np.array_equal(a.random(FIRST_BLOCK), u)
                and np.array_equal(b.uniform(low, high, FIRST_BLOCK), low + (high - low) * u)):
            return False
    return True


# in streams' names each between newlines: an empty number or name, a number with a leading zero
_NOT_NAMES = re.compile(rb"[,\n][,\n]|[,\n]0[0-9]")


def _names(names: list[str]) -> bool:
    """Whether each of ``names`` is a stream's name as ``rows`` writes it (the integers of its spawn key, each
    written as ``str`` writes it, joined by commas): all of them in one pass (a regex match a name: ~5x as long)."""
    text = ("\n" + "\n".join(names) + "\n").encode()
    return not names or (not text.translate(None, b"0123456789,\n") and text.count(b"\n") == len(names) + 1
                         and _NOT_NAMES.search(text) is None)


def _name(key: tuple[int, ...]) -> str:
    """A stream's name: its spawn key's integers ("code,key...")."""
    return ",".join(map(str, key))


def _keys(names: list[str]) -> list[tuple[int, ...]]:
    """Streams' spawn keys from their names (``_name``'s, as ``Streams.restore`` checks them), parsed all at once:
    each run of names with as many numbers is one zip over the numbers."""
    if not names:
        return []
    numbers = iter(map(int, ",".join(names).split(",")))
    keys: list[tuple[int, ...]] = []
    for commas, run in groupby(map(str.count, names, repeat(","))):
        keys += islice(zip(*[numbers] * (commas + 1)), len(list(run)))
    return keys


def _put(g: np.random.Generator, row: list[int]) -> None:
    """Put a PCG64 stream at a row of ``Streams.rows`` (state and increment as 128-bit halves, has_uint32,
    uinteger; Python ints)."""
    sh, sl, ih, il, has, u = row
    g.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": sh << 64 | sl, "inc": ih << 64 | il},
                             "has_uint32": has, "uinteger": u}


def state_of(rng: np.random.Generator) -> tuple[int, int, int]:
    """A PCG64 stream's position: (128-bit state, has_uint32, uinteger); its increment is fixed by its key."""
    st = rng.bit_generator.state
    return st["state"]["state"], st["has_uint32"], st["uinteger"]


def set_state(rng: np.random.Generator, pos) -> None:
    """Put a PCG64 stream at ``state_of``'s position."""
    st = rng.bit_generator.state
    st["state"]["state"], st["has_uint32"], st["uinteger"] = int(pos[0]), int(pos[1]), int(pos[2])
    rng.bit_generator.state = st


@functools.cache
def _spent(rows: int, batch: int) -> np.ndarray:
    """A block handed out in full, never read again (``DrawsAhead.restored``): one read-only array of each shape."""
    return np.broadcast_to(np.zeros((), np.int64), (rows, batch))


def block_rows(batch: int) -> int:
    """The mini-batches in a ``DrawsAhead`` block of batches of ``batch`` rows (a checkpoint's positions lie in
    one)."""
    return max(1, 256 // batch)


class DrawsAhead:
    """Mini-batch draws ``integers(0, n, batch)`` taken from a stream several at a time.

    numpy's ``Generator.integers`` costs ~4 µs a call, most of it argument handling; one call for ``k`` rows
    of a batch gives the very values (and leaves the stream in the very state) of ``k`` calls, because the
    bit generator itself buffers the 32-bit halves it hands out. That is checked once per process
    (``exact``); where it fails, nothing is drawn ahead. Drawing ahead moves the stream's state early, so
    ``rewind`` puts it back to just after the rows handed out, before anyone else draws from it."""

    __slots__ = ("rng", "n", "batch", "rows", "state", "block", "_pos", "pos_in")
    _exact: bool | None = None

    def __init__(self, rng: np.random.Generator, n: int, batch: int, rows: int | None = None):
        self.rng, self.n, self.batch, self._pos, self.pos_in = rng, n, batch, 0, None
        self.rows = block_rows(batch) if rows is None else rows  # (the block's mini-batches: any, the same values)
        self.state = state_of(rng)  # (state, has_uint32, uinteger) before the block: ~110 B, not a ~460 B dict
        self.block = self._draw(rng)

    @property
    def pos(self) -> int:
        """The mini-batches handed out of the block: kept here, or at ``pos_in`` ((an array, a slot): a driver that
        hands out many agents' mini-batches at once keeps their positions in one array, ``RowsAhead``)."""
        at = self.pos_in
        return self._pos if at is None else at[0][at[1]]

    @pos.setter
    def pos(self, k: int) -> None:
        at = self.pos_in
        if at is None:
            self._pos = k
        else:
            at[0][at[1]] = k

    @classmethod
    def restored(cls, rng: Callable[[], np.random.Generator], n: int, saved: list) -> DrawsAhead:
        """Where a checkpoint saved it (``saved``: the stream's state before the block, has_uint32, uinteger, the
        rows handed out, batch, and the block's mini-batches where not ``block_rows``): the block drawn again from
        there when first read (``RedrawnAhead``; ``rng()`` makes the stream then), so a restore of many agents draws
        no block and makes no stream. A block handed out in full is not drawn: it is never read again (the next
        ``take`` draws the next block from where the stream then stands) and it leaves the stream where the
        checkpoint puts it anyway."""
        state, has, u, used, batch = saved[:5]
        if n < 1:
            raise ValueError("mini-batches drawn ahead from no rows")
        rows = saved[5] if len(saved) > 5 else block_rows(batch)
        kind = RedrawnAhead if used < rows else cls
        ahead = kind.__new__(kind)
        # (the stream's maker in place of the stream: a block handed out in full never draws from it)
        ahead.rng, ahead.n, ahead.batch, ahead.rows, ahead.state = rng, n, batch, rows, (int(state), int(has), int(u))
        if used >= rows:
            ahead.block = _spent(rows, batch)  # (its length: the rows handed out)
        ahead._pos, ahead.pos_in = used, None
        return ahead

    @classmethod
    def start(cls, rng: np.random.Generator, n: int, batch: int, old: DrawsAhead | None,
              rows: int | None = None) -> DrawsAhead | None:
        """A fresh block of ``rows`` mini-batches (None: ``block_rows``), after rewinding ``old``; None where drawing
        ahead would not be exact."""
        if old is not None:
            old.rewind()
        if cls._exact is None:
            cls._exact = cls.exact()
        return cls(rng, n, batch, rows) if cls._exact else None

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        """A block: ``rows`` mini-batches from ``rng`` as it stands."""
        return rng.integers(0, self.n, (self.rows, self.batch))

    def left(self) -> bool:
        return self.pos < len(self.block)

    def take(self) -> np.ndarray:
        self.pos += 1
        return self.block[self.pos - 1]

    def rewind(self) -> None:
        """Leave the stream where ``pos`` single calls would have left it."""
        if self.pos < len(self.block):
            set_state(self.rng, self.state)
            self.rng.integers(0, self.n, (self.pos, self.batch))

    @staticmethod
    def exact() -> bool:
        """Whether this numpy gives one call's rows exactly as single calls, stream state included."""
        for n, b in ((7, 3), (2**31 + 3, 5), (50, 16)):
            one, many = (np.random.Generator(np.random.PCG64(11)) for _ in range(2))
            rows = [one.integers(0, n, b) for _ in range(9)]
            if not (np.array_equal(np.stack(rows), many.integers(0, n, (9, b)))
                    and one.bit_generator.state == many.bit_generator.state):
                return False
        return True


class RedrawnAhead(DrawsAhead):
    """A restored ``DrawsAhead`` (``restored``) until its block is first read: then its stream is made (``rng``
    holds its maker until then), the block drawn again from where it started, the stream put back where it stood,
    and the object is a plain ``DrawsAhead`` (the same slots)."""

    __slots__ = ()

    @property
    def block(self) -> np.ndarray:
        rng = self.rng = self.rng()
        now = state_of(rng)
        set_state(rng, self.state)
        block = self._draw(rng)
        set_state(rng, now)
        self.__class__ = DrawsAhead
        self.block = block
        return block
