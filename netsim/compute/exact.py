"""Reductions whose bits are a function of the row alone: the same on any batch, thread count or CPU.

A library reduction (``sum``, ``bmm``, a BLAS product) chooses its order of additions by the tensor's shape,
the number of threads, the vector width of the CPU it runs on and, for BLAS, the blocking its library picks
for the whole batch: a row's sum can round differently alone than inside a batch (seen with MKL's batched
``bmm`` on AVX-512 CPUs). ``row_sum`` fixes the order by construction: it folds the reduced dimension in
halves with elementwise additions, each correctly rounded (IEEE 754), so every row's result depends only on
its own values and the dimension's length, never on the other rows, the batch's size or the kernel a CPU
dispatches to. It costs a few more passes over memory than ``sum`` (docs/performance.md).
"""

from __future__ import annotations

import torch


def row_sum(t: torch.Tensor, dim: int, *, inplace: bool = False) -> torch.Tensor:
    """Sum of ``t`` over ``dim`` (removed) in a fixed pairwise order: at each level element ``i`` of the first
    half gets element ``n - h + i`` of the second added (h = n // 2); an odd length's middle element is then
    added to element 0. Only elementwise additions, so the order is the same on every CPU and batch.
    ``inplace``: fold ``t`` itself (its values are lost) and return a view of it, with no new memory."""
    n = t.shape[dim]
    if n == 0:
        return torch.zeros(_drop(t.shape, dim), dtype=t.dtype, device=t.device)
    first = not inplace
    while n > 1:
        h = n // 2
        head, tail = t.narrow(dim, 0, h), t.narrow(dim, n - h, h)
        s = head + tail if first else head.add_(tail)
        if n % 2:
            s.narrow(dim, 0, 1).add_(t.narrow(dim, h, 1))
        t, n, first = s, h, False
    return t.squeeze(dim)


def fold_plan(t: torch.Tensor, dim: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """``row_sum(t, dim, inplace=True)`` planned once for a buffer ``t`` that is filled again and again: its
    additions as (into, added) views of ``t`` in ``row_sum``'s order, and the view that holds the sum after them
    (``fold``). The same additions, so the same bits; only the views are made once, not at every call (a small
    call's cost is its ~3 Python calls a level)."""
    n, adds = t.shape[dim], []
    while n > 1:
        h = n // 2
        head = t.narrow(dim, 0, h)
        adds.append((head, t.narrow(dim, n - h, h)))
        if n % 2:
            adds.append((head.narrow(dim, 0, 1), t.narrow(dim, h, 1)))
        t, n = head, h
    return adds, t.squeeze(dim)


def fold(plan: tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]) -> torch.Tensor:
    """Run a ``fold_plan`` over its buffer's current values (lost): the row sums, a view of the buffer."""
    adds, out = plan
    for into, added in adds:
        into.add_(added)
    return out


def row_mean(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``row_sum(t, dim) / n``: the mean in the same fixed order."""
    return row_sum(t, dim) / t.shape[dim]


def row_norms(t: torch.Tensor) -> torch.Tensor:
    """Each row's ``linalg.vector_norm``, with the bits of that call on the row alone: on the CPU in one call
    (``_foreach_norm``, which there makes that call for each tensor it is given), elsewhere row by row."""
    rows = list(t.unbind(0))
    if t.device.type == "cpu":
        return torch.stack(torch._foreach_norm(rows))
    return torch.stack([torch.linalg.vector_norm(r) for r in rows])


def _drop(shape: torch.Size, dim: int) -> torch.Size:
    dims = list(shape)
    del dims[dim]
    return torch.Size(dims)
