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

from collections.abc import Sequence

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
    last = {u.row: u for u in updates}
    us = list(last.values())
    steps: dict[float, list[int]] = {}
    for k, u in enumerate(us):
        if u.step is not None:
            steps.setdefault(u.lr, []).append(k)
    by = {lr: (ks, torch.stack([us[k].step for k in ks]) if len(ks) > 1 else us[ks[0]].step.unsqueeze(0))
          for lr, ks in steps.items()}
    out = combine(torch.stack([u.own for u in us]), [u.keep for u in us], [u.weights for u in us],
                  [u.models for u in us], by, dtype)
    rows = torch.tensor([u.row for u in us], dtype=torch.long, device=out.device)
    return rows, out


def combine(own: torch.Tensor, keep: Sequence[float], weights: Sequence[Sequence[float]],
            models: Sequence[Sequence[torch.Tensor]], steps: dict[float, tuple[list[int], torch.Tensor]],
            dtype: torch.dtype) -> torch.Tensor:
    """The updates of ``evaluate`` as rows: row k is ``own[k] * keep[k] + sum_s weights[k][s] * models[k][s]``,
    then ``- lr * g`` for the rows ``ks`` of each ``steps[lr] = (ks, g)`` (g: their step rows)."""
    us = range(len(keep))
    keep_t = torch.tensor(keep, dtype=torch.float64)
    slots = max(len(w) for w in weights)
    groups = []
    for s in range(slots):
        by: dict[float, list[int]] = {}
        for k in us:
            ws = weights[k]
            if len(ws) > s:
                by.setdefault(ws[s], []).append(k)
        groups.append([(w, ks, lambda ks=ks, s=s: torch.stack([models[k][s] for k in ks])) for w, ks in by.items()])
    return mix_rows(own, keep_t, groups, steps, dtype)


def mix_rows(own: torch.Tensor, keep: torch.Tensor, groups: Sequence[Sequence[tuple]],
             steps: dict[float, tuple[list[int], torch.Tensor]], dtype: torch.dtype) -> torch.Tensor:
    """``combine``'s float operations: ``own * keep`` (keep: float64, rounded to ``dtype`` as a Python float
    is), then for each slot s, in order, each group ``(w, ks, xs)`` of ``groups[s]`` (rows ``ks`` whose s-th
    arrival has weight w; ``xs()`` their s-th models as rows) added with ``alpha=w``, then the steps."""
    n = own.shape[0]
    out = own * keep.to(dtype=dtype, device=own.device).unsqueeze(1)
    for slot in groups:
        for w, ks, xs in slot:
            _apply(out, ks, n, lambda o, xs=xs(), w=w: o.add_(xs, alpha=w))
    for lr, (ks, g) in steps.items():
        _apply(out, ks, n, lambda o, g=g, lr=lr: o - lr * g)
    return out


def _apply(out: torch.Tensor, ks: Sequence[int] | torch.Tensor, n: int, op) -> None:
    """out[ks] = op(out[ks]), in place when ks is every row (ks: a list, or an index tensor)."""
    if len(ks) == n:
        got = op(out)
        if got is not out:
            out.copy_(got)
        return
    idx = ks.to(out.device) if isinstance(ks, torch.Tensor) else torch.tensor(ks, dtype=torch.long, device=out.device)
    out.index_copy_(0, idx, op(out.index_select(0, idx)))
