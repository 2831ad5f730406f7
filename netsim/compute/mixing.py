"""Gossip averaging of many agents at once, bit for bit what each agent's own arithmetic would give.

An agent's update ``x_i <- own * (1 - sum_j w_ij) + sum_j w_ij x_j - lr * step`` (``Agent.mix`` then a
step; the sum over the models that arrived, in arrival order) is a handful of tiny tensor operations,
~2 µs of overhead each: at 10,000 agents most of a round. ``MixUpdate`` records one agent's update;
``evaluate`` computes a list of them with one operation per distinct (slot, weight) and per distinct step
size, over all the rows at once. Each element goes through the same float operations in the same order as
the per-agent code (a scale by the same scalar, ``add_`` with the same scalar ``alpha``, a product with the
same scalar step size, a difference), so the results are identical: tests/test_batched_mixing.py checks
them against the per-agent code in float32 and float64.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, is_not, itemgetter, methodcaller

import numpy as np
import torch


class MixUpdate:
    """``own * keep + sum_s weights[s] * models[s] (in this order) - lr * step`` for one bank row."""

    __slots__ = ("row", "own", "keep", "weights", "models", "lr", "step")

    def __init__(self, row: int, own: torch.Tensor, keep: float, weights: list[float],
                 models: list[torch.Tensor], lr: float, step: torch.Tensor | None):
        self.row, self.own, self.keep, self.weights, self.models = row, own, keep, weights, models
        self.lr, self.step = lr, step


def evaluate(updates: Sequence[MixUpdate], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, values): the updated rows' indices and new values; a row updated twice takes the last."""
    rows = list(map(_ROW, updates))  # (attrgetter maps: C loops over the round's thousands of updates)
    if len(set(rows)) == len(rows):
        us = list(updates)
    else:
        last = {u.row: u for u in updates}
        us = list(last.values())
        rows = list(last)
    lrs, stepped = list(map(_LR, us)), list(map(_STEP, us))
    # every update a step of one size: one group
    if lrs and all(map(is_not, stepped, repeat(None))) and lrs.count(lrs[0]) == len(lrs):
        steps = {lrs[0]: list(range(len(us)))}
    else:
        steps = {}
        for k, u in enumerate(us):
            if u.step is not None:
                steps.setdefault(u.lr, []).append(k)
    by = {lr: (ks, joined([stepped[k] for k in ks]) if len(ks) > 1 else stepped[ks[0]].reshape(1, -1))
          for lr, ks in steps.items()}
    out = combine(torch.stack(list(map(_OWN, us))), list(map(_KEEP, us)), list(map(_WEIGHTS, us)),
                  list(map(_MODELS, us)), by, dtype)
    return torch.tensor(rows, dtype=torch.long, device=out.device), out


def joined(rows: list[torch.Tensor]) -> torch.Tensor:
    """Rows as one new (R, P) tensor: 1-D rows stacked, (1, P) rows (a batch of one's, e.g. its gradient) joined; the
    same values either way."""
    dims = set(map(_DIM, rows))
    if dims == {1}:
        return torch.stack(rows)
    return torch.cat(rows if dims == {2} else [r if r.dim() == 2 else r.unsqueeze(0) for r in rows])


_DIM = methodcaller("dim")
_ROW, _LR, _STEP, _OWN, _KEEP, _WEIGHTS, _MODELS = map(attrgetter, ("row", "lr", "step", "own", "keep", "weights",
                                                                   "models"))


def combine(own: torch.Tensor, keep: Sequence[float], weights: Sequence[Sequence[float]],
            models: Sequence[Sequence[torch.Tensor]], steps: dict[float, tuple[list[int], torch.Tensor]],
            dtype: torch.dtype) -> torch.Tensor:
    """The updates of ``evaluate`` as rows: row k is ``own[k] * keep[k] + sum_s weights[k][s] * models[k][s]``,
    then ``- lr * g`` for the rows ``ks`` of each ``steps[lr] = (ks, g)`` (g: their step rows)."""
    us = range(len(keep))
    keep_t = torch.tensor(keep, dtype=torch.float64)
    slots = max(map(len, weights))
    groups = []
    for s in range(slots):
        at = itemgetter(s)
        try:
            col = list(map(at, weights))  # every row's s-th weight (IndexError: a row has fewer arrivals)
        except IndexError:
            col = None
        if col is not None and col.count(col[0]) == len(col):  # one weight: one group of every row (the common case)
            groups.append([(col[0], list(us), list(map(at, models)))])
            continue
        by: dict[float, list[int]] = {}
        for k in us:
            ws = weights[k]
            if len(ws) > s:
                by.setdefault(ws[s], []).append(k)
        groups.append([(w, ks, [models[k][s] for k in ks]) for w, ks in by.items()])
    return mix_rows(own, keep_t, groups, steps, dtype)


def mix_rows(own: torch.Tensor, keep: torch.Tensor, groups: Sequence[Sequence[tuple]],
             steps: dict[float, tuple[list[int], torch.Tensor]], dtype: torch.dtype) -> torch.Tensor:
    """``combine``'s float operations: ``own * keep`` (keep: float64, rounded to ``dtype`` as a Python float
    is), then for each slot s, in order, each group ``(w, ks, xs)`` of ``groups[s]`` (rows ``ks``, ascending, whose s-th
    arrival has weight w; their s-th models as rows: ``xs()``, or ``xs = (t, at)`` for ``t``'s rows ``at``, or a
    list of row tensors) added with ``alpha=w``, then the steps.

    Every operation is element by element, so the rows can be done a block at a time: where the rows are big
    (a large model at many agents), blocks of ``BLOCK_BYTES`` keep the temporaries (the gathered neighbours'
    rows, the step products) in cache and out of fresh memory pages, with each element's operations the same."""
    n = own.shape[0]
    keep = keep.to(dtype=dtype, device=own.device).unsqueeze(1)
    per = max(1, BLOCK_BYTES // max(1, own[0].numel() * own.element_size())) if n else 1
    if per >= n:  # one block: the whole tensors
        out = own * keep
        for slot in groups:
            for w, ks, xs in slot:
                _apply(out, ks, n, lambda o, xs=_rows(xs), w=w: o.add_(xs, alpha=w))
        for lr, (ks, g) in steps.items():
            _apply(out, ks, n, lambda o, g=g, lr=lr: o - lr * g)
        return out
    out = _result(own, torch.promote_types(own.dtype, dtype))
    plan = [[(w, _ascending(ks), xs() if callable(xs) else _source(*xs) if isinstance(xs, tuple) else xs)
             for w, ks, xs in slot] for slot in groups]
    stepped = [(lr, _ascending(ks), g) for lr, (ks, g) in steps.items()]
    # small rows (or a GPU, where each add is a kernel launch): a block's separate row tensors stacked, one add;
    # a big row's own add costs more than the call, and stacking it would copy it once more
    stacked = own.is_cuda or own[0].numel() * own.element_size() <= STACK_ROW_BYTES
    for a in range(0, n, per):
        b = min(n, a + per)
        o = out[a:b]
        torch.mul(own[a:b], keep[a:b], out=o)
        for slot in plan:
            for w, ks, xs in slot:
                at = _within(ks, a, b)
                if at is None:
                    continue
                rows, pos = at
                if type(xs) is list and not stacked:  # big row tensors: each added to its row where it is
                    for r, x in zip(rows, xs[pos], strict=True):
                        o[r].add_(x, alpha=w)
                else:
                    _apply(o, rows, b - a, lambda o, xs=_part(xs, pos), w=w: o.add_(xs, alpha=w))
        for lr, ks, g in stepped:
            at = _within(ks, a, b)
            if at is not None:
                rows, pos = at
                _apply(o, rows, b - a, lambda o, g=_part(g, pos), lr=lr: o - lr * g)
    return out


BLOCK_BYTES = 1 << 21  # the rows of one block of ``mix_rows`` (2 MiB: the cache, not fresh pages, holds them)
STACK_ROW_BYTES = 1 << 12  # ``mix_rows``: rows up to 4 KiB are stacked a block at a time, not added one by one
# Results of ``mix_rows`` past the C library's mmap threshold (32 MiB): each fresh one costs a page fault per 4 KiB
# written and an munmap when dropped, more than the mixing itself at 1,000 agents of a 50,890-parameter model. The
# last few are kept and written over by a later result of their shape once nothing else holds them (their Python
# object and their storage referenced from here only: no caller, view or payload can read them any more).
POOLED_BYTES = 1 << 25
_SPARE: list[torch.Tensor] = []
_SPARES = 3


def _result(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor of ``like``'s shape: a spare one no longer used, or a new one (kept as a spare)."""
    if like.numel() * like.element_size() < POOLED_BYTES:
        return torch.empty_like(like, dtype=dtype)
    for n in range(len(_SPARE)):
        t = _SPARE[n]
        if t.shape == like.shape and t.dtype == dtype and t.device == like.device and unused(t):
            return t
    t = torch.empty_like(like, dtype=dtype)
    _SPARE.append(t)
    if len(_SPARE) > _SPARES:
        del _SPARE[0]
    return t


def unused(t: torch.Tensor) -> bool:
    """Whether a kept spare tensor ``t`` (``_SPARE``'s item, or a caller's own) is held by nothing else: references
    from where it is kept, the caller's name and this call's argument only, and no other tensor (a view) on its
    storage: it may then be written over."""
    if sys.getrefcount(t) != 4:
        return False
    count = getattr(torch._C, "_storage_Use_Count", None)
    return count is not None and count(t.untyped_storage()._cdata) == 2  # t's and the storage object's own


def _rows(xs) -> torch.Tensor:
    """A group's models as one tensor of rows (``mix_rows``' three forms)."""
    if callable(xs):
        return xs()
    if isinstance(xs, tuple):
        return xs[0].index_select(0, xs[1])
    return torch.stack(list(xs))


def _ascending(ks) -> np.ndarray:
    """A group's rows (ascending, as every caller forms them) as an array."""
    return ks.numpy() if isinstance(ks, torch.Tensor) else np.asarray(ks, dtype=np.int64)


def _within(ks: np.ndarray, a: int, b: int):
    """The group's rows in block [a, b) (relative to a, as a list) and their positions in the group (a slice);
    None where it has none."""
    lo, hi = np.searchsorted(ks, (a, b)).tolist()
    if lo == hi:
        return None
    rows = (ks[lo:hi] - a).tolist() if hi - lo < b - a else range(b - a)
    return rows, slice(lo, hi)


def _source(t: torch.Tensor, at: torch.Tensor) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """A group's models as t's rows ``at``: (t, at, where a run of consecutive rows of ``at`` breaks)."""
    at = at.cpu().numpy()
    return t, at, np.flatnonzero(np.diff(at) != 1)


def _part(xs, pos: slice) -> torch.Tensor:
    """The group's models (``mix_rows``' forms, a callable already called, ``_source``'s) at ``pos``, as rows."""
    if isinstance(xs, tuple):  # t's rows at: a slice of t where they are consecutive (read in place), else gathered
        t, at, breaks = xs
        lo, hi = pos.start, pos.stop
        if np.searchsorted(breaks, lo) == np.searchsorted(breaks, hi - 1):  # no break in at[lo:hi]
            return t[int(at[lo]):int(at[hi - 1]) + 1]
        return t.index_select(0, torch.from_numpy(at[lo:hi]).to(t.device))
    return xs[pos] if isinstance(xs, torch.Tensor) else torch.stack(xs[pos])


def _apply(out: torch.Tensor, ks: Sequence[int] | torch.Tensor, n: int, op) -> None:
    """out[ks] = op(out[ks]), in place when ks is every row (ks: a list, or an index tensor)."""
    if len(ks) == n:
        got = op(out)
        if got is not out:
            out.copy_(got)
        return
    idx = ks.to(out.device) if isinstance(ks, torch.Tensor) else torch.tensor(ks, dtype=torch.long, device=out.device)
    out.index_copy_(0, idx, op(out.index_select(0, idx)))
