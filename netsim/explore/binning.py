"""Binning a window of rows into a (lanes, width) grid of the most important kind per cell: instants
mark the (cell, kind) pairs that occur in one fancy assignment (no ``ufunc.at``, which is slow), spans are
covered by difference arrays; the lowest kind code (the most important) wins a cell."""

from __future__ import annotations

import numpy as np


class Binner:
    """Accumulates rows into a (lanes, width) grid of the most important kind per cell (see ``cells``)."""

    def __init__(self, n_lanes: int, t0: float, t1: float, width: int, nk: int, span_codes: list[int]):
        self.n_lanes, self.t0, self.t1, self.width, self.nk = n_lanes, t0, t1, width, nk
        self.scale = width / (t1 - t0)
        self.span_codes = span_codes
        self.is_span = np.zeros(nk, dtype=bool)
        self.is_span[span_codes] = True
        self.seen = np.zeros(n_lanes * width * nk, dtype=bool)  # (cell, kind) pairs that occur
        self.diff = {c: np.zeros(n_lanes * (width + 1), dtype=np.int64) for c in span_codes}

    def add(self, T: np.ndarray, K: np.ndarray, V: np.ndarray, lane: np.ndarray) -> None:
        """Rows of shown and hidden lanes (lane -1); rows before t0 count only as spans reaching in."""
        t0, width = self.t0, self.width
        keep = lane >= 0
        span = self.is_span[K]
        if len(T) and T[0] < t0:
            keep &= (T >= t0) | (span & (T + V >= t0))
        if not keep.all():
            T, K, V, lane, span = T[keep], K[keep], V[keep], lane[keep], span[keep]
        if not len(T):
            return
        col = np.clip(((T - t0) * self.scale).astype(np.int32), 0, width - 1)
        inst = ~span
        self.seen[((lane[inst].astype(np.int64) * width + col[inst]) * self.nk + K[inst])] = True
        if inst.all():
            return
        size = self.n_lanes * (width + 1)
        for c in self.span_codes:
            m = K == c
            if not m.any():
                continue
            ts = T[m]
            end = ts + V[m]
            lo_c = np.clip(((np.maximum(ts, t0) - t0) * self.scale).astype(np.int64), 0, width - 1)
            hi_c = np.clip(((np.minimum(end, self.t1) - t0) * self.scale).astype(np.int64), 0, width - 1)
            base = lane[m].astype(np.int64) * (width + 1)
            self.diff[c] += np.bincount(base + lo_c, minlength=size) - np.bincount(base + hi_c + 1, minlength=size)

    def grid(self) -> np.ndarray:
        n_lanes, width = self.n_lanes, self.width
        seen = self.seen.reshape(n_lanes * width, self.nk)
        grid = np.where(seen.any(axis=1), seen.argmax(axis=1), -1).astype(np.int16).reshape(n_lanes, width)
        for c in sorted(self.span_codes, reverse=True):
            if not self.diff[c].any():
                continue
            cover = np.cumsum(self.diff[c].reshape(n_lanes, width + 1), axis=1)[:, :width] > 0
            grid[cover & ((grid < 0) | (grid > c))] = c
        return grid
