"""The batched gradient service: the seam between agents' requests and one batched evaluation.

``submit`` records a request (a snapshot of the agent's parameters, its batch rows and, for DP, a
per-sample clipping norm) and returns a ``Ticket``; ``flush`` evaluates every pending request in one
batched call per (batch size, clipping) group and fills the tickets. The kernel decides *when* to
flush (when simulated time reaches the earliest pending completion); this module knows nothing of
time, agents or events. Asynchronous runs often flush a single request, so that path skips the
grouping and stacking.
"""

from __future__ import annotations

from operator import attrgetter, methodcaller

import numpy as np
import torch

from netsim.compute import tune_cpu_allocator
from netsim.compute.mixing import joined
from netsim.compute.models import CLIP_KINDS, as_copied

# requests per model call in a flush: bounds the gathered rows and the model's temporaries at 10^5-10^6 agents. A
# power of two, so every chunk starts where a kernel's vector loop over the requests would (a multiple of any vector
# width): the built-in models' rows come out with the bits of one call over every request (tests/test_scale_memory.py
# with chunks of 64; bench_scale at 70,000 agents, two chunks, byte-identical to the code before chunking)
CHUNK = 1 << 16
# rows gathered at least, for numpy's ``take`` (``GradientService._features``): below, its checks cost what it saves
TAKE_ROWS = 1 << 10


def _check_clip(clip: float | None, clip_kind: str) -> None:
    if clip is not None:
        if not clip > 0:
            raise ValueError(f"clip must be > 0, got {clip}")
        if clip_kind not in CLIP_KINDS:
            raise ValueError(f"clip_kind must be one of {CLIP_KINDS}, got {clip_kind!r}")


class Ticket:
    __slots__ = ("agent", "params", "rows", "clip", "clip_kind", "result")

    def __init__(self, agent: int, params: torch.Tensor, rows: np.ndarray, clip: float | None = None,
                 clip_kind: str = "l2"):
        self.agent = agent
        self.params = params
        self.rows = rows
        self.clip = clip
        self.clip_kind = clip_kind
        self.result: torch.Tensor | None = None


class Block:
    """Requests of several agents at once (the windowed drivers'): ``params`` is a (B, P) tensor, ``rows`` a
    list of B row arrays of one length; ``result`` the (B, P) gradients. Evaluated as B ``Ticket``s in the
    same position of the same batched call would be (the same bits), with no per-row tensors made."""

    __slots__ = ("agents", "params", "rows", "clip", "clip_kind", "result")

    def __init__(self, agents: list[int], params: torch.Tensor, rows: list, clip: float | None = None,
                 clip_kind: str = "l2"):
        self.agents, self.params, self.rows = agents, params, rows
        self.clip, self.clip_kind = clip, clip_kind
        self.result: torch.Tensor | None = None


class GradientService:
    """Gradients of ``model`` on the training set ``X (n, d)``, ``y (n,)`` (integer labels), on X's device."""

    def __init__(self, model, X: torch.Tensor, y: torch.Tensor):
        self.model = model
        self.X = X
        self.y = y.long()
        self.device = X.device
        self._cpu = X.device.type == "cpu"
        if self._cpu:
            tune_cpu_allocator()
        self.pending: list[Ticket] = []
        self.calls = 0
        self.evaluated = 0
        self._kept: dict[int, tuple[np.ndarray, torch.Tensor, torch.Tensor]] = {}  # keep_rows

    def keep_rows(self, rows: np.ndarray) -> None:
        """Gather the training rows ``rows`` (an array asked for again and again, such as an agent's whole part)
        once: requests with this very array copy them from here instead of indexing the training set each time
        (the same values in the same layout, so the same bits)."""
        idx = self._index(rows)
        self._kept[id(rows)] = (rows, self.X.index_select(0, idx), self.y.index_select(0, idx))

    def _gather(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        kept = self._kept.get(id(rows))
        if kept is not None and kept[0] is rows:
            return kept[1], kept[2]
        idx = self._index(rows)
        return self.X.index_select(0, idx), self.y.index_select(0, idx)

    def submit(self, agent: int, params: torch.Tensor, rows: np.ndarray, clip: float | None = None,
               clip_kind: str = "l2") -> Ticket:
        """Queue one request; with ``clip`` the result is the mean of per-sample gradients clipped to
        L2 norm ``clip`` (``clip_kind="l2"``) or to [-clip, clip] per coordinate (``"coordinate"``)."""
        if clip is not None:  # (one request per gradient: no call when there is nothing to check)
            _check_clip(clip, clip_kind)
        t = Ticket(agent, params, rows, clip, clip_kind)
        self.pending.append(t)
        return t

    def submit_block(self, agents: list[int], params: torch.Tensor, rows: list, clip: float | None = None,
                     clip_kind: str = "l2") -> Block:
        """Queue the requests of ``agents`` (one mini-batch length) as one ``Block``."""
        _check_clip(clip, clip_kind)
        b = Block(agents, params, rows, clip, clip_kind)
        self.pending.append(b)
        return b

    def _index(self, rows: np.ndarray) -> torch.Tensor:
        idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        return idx if self._cpu else idx.to(self.device, non_blocking=True)

    def _features(self, rows: np.ndarray, idx: torch.Tensor) -> torch.Tensor:
        """The rows ``rows`` (``idx`` as an index tensor) of X: a copy of the same values, by ``index_select`` (6x
        faster than ``X[idx]``), or on the CPU by numpy's ``take`` (~2x faster again for the scattered rows of many
        agents' mini-batches) into a tensor of the CPU allocator's (aligned as ``index_select``'s result: the model's
        vector loops and GEMMs meet every row as they would there)."""
        X = self.X
        fast = self._cpu and len(rows) >= TAKE_ROWS and X.dtype in (torch.float32, torch.float64) and X.is_contiguous()
        if not fast or int(rows.min()) < 0 or int(rows.max()) >= len(X):  # (out of range: index_select says which)
            return X.index_select(0, idx)
        out = torch.empty((len(rows), *X.shape[1:]), dtype=X.dtype)
        np.take(X.numpy(), rows, axis=0, out=out.numpy(), mode="clip")  # ("clip": no copy through a buffer)
        return out

    def _grad_rows(self, W: torch.Tensor, rows: np.ndarray, m: int, clip: float | None, kind: str) -> torch.Tensor:
        """The gradients of the R = len(W) requests whose ``m`` rows each are ``rows`` laid end to end: one model call
        over at most ``CHUNK`` requests at a time, so the gathered rows and the model's temporaries stay bounded
        (10^6 agents at batch 16: 1.3 GB of gathered features, as much again in each temporary). A chunk is a
        power of two (``CHUNK``)."""
        R = W.shape[0]
        out = []
        for s in range(0, R, CHUNK):
            e = min(R, s + CHUNK)
            idx = self._index(rows[s * m:e * m])
            X, y = self._features(rows[s * m:e * m], idx), self.y.index_select(0, idx)
            out.append(self.model.grad(W[s:e], X.view(e - s, m, -1), y.view(e - s, m), clip, kind))
            del X, y, idx
        return out[0] if len(out) == 1 else torch.cat(out)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        if len(pending) == 1 and type(pending[0]) is Ticket:  # the lean path
            t = pending[0]
            X, y = self._gather(t.rows)
            row = t.params.dim() == 2  # a (1, P) row asks for a (1, P) result
            G = self.model.grad(t.params if row else t.params.unsqueeze(0), X.unsqueeze(0), y.unsqueeze(0), t.clip,
                                t.clip_kind)
            t.result = G if row else G[0]
            self.calls += 1
            self.evaluated += 1
            return
        groups: dict[tuple, list[Ticket | Block]] = {}
        for t in pending:
            groups.setdefault((len(t.rows[0]) if type(t) is Block else len(t.rows), t.clip, t.clip_kind),
                              []).append(t)
        for (m, clip, kind), group in groups.items():
            blocks = Block in set(map(type, group))
            if blocks and len(group) == 1 and as_copied(group[0].params):  # one block: its rows as they stand
                W, rows = group[0].params, _flat(group[0].rows)
            elif blocks:  # their rows where their requests would stand (one cat, no per-row tensors)
                W = torch.cat([t.params if t.params.dim() == 2 else t.params.unsqueeze(0) for t in group])
                rows = np.concatenate([_flat(t.rows) if type(t) is Block else t.rows for t in group])
            else:
                W = joined([t.params for t in group])  # ((1, P) rows, a batch of one's, joined: the same W)
                rows = None if self._kept else np.concatenate([t.rows for t in group])
            if rows is None:  # the rows kept (``keep_rows``) or gathered, one request after the other
                got = [self._gather(t.rows) for t in group]
                X, y = torch.cat([g[0] for g in got]), torch.cat([g[1] for g in got])
                shape = (W.shape[0], m)
                G = self.model.grad(W, X.view(*shape, -1), y.view(shape), clip, kind)
            else:
                G = self._grad_rows(W, rows, m, clip, kind)
            if not blocks:  # each ticket's row: (1, P) where its params were (a batch of one's), with no view made
                split = group[0].params.dim() == 2
                for t, g in zip(group, G.split(1) if split else G.unbind(0), strict=True):
                    t.result = g
                if len(set(map(_DIM, map(_PARAMS, group)))) > 1:  # 1-D and (1, P) requests: each its own shape
                    for t in group:
                        if t.result.dim() != t.params.dim():
                            t.result = t.result[0] if split else t.result[None]
            else:
                at = 0
                for t in group:
                    if type(t) is Block:
                        t.result = G[at:at + len(t.agents)]
                        at += len(t.agents)
                    else:
                        t.result = G[at:at + 1] if t.params.dim() == 2 else G[at]
                        at += 1
            self.calls += 1
            self.evaluated += W.shape[0]


_DIM, _PARAMS = methodcaller("dim"), attrgetter("params")


def _flat(rows) -> np.ndarray:
    """A block's rows laid end to end: an (agents, batch) array's as one reshape, not one view per agent."""
    return rows.reshape(-1) if isinstance(rows, np.ndarray) else np.concatenate(rows)
