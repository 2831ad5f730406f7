"""The batched gradient service: the seam between agents' requests and one batched evaluation.

``submit`` records a request (a snapshot of the agent's parameters and its batch rows) and returns a
``Ticket``; ``flush`` evaluates every pending request in one batched call per batch size and fills
the tickets. The kernel decides *when* to flush (when simulated time reaches the earliest pending
completion); this module knows nothing of time, agents or events.
"""

from __future__ import annotations

import numpy as np
import torch


class Ticket:
    __slots__ = ("agent", "params", "rows", "result")

    def __init__(self, agent: int, params: torch.Tensor, rows: np.ndarray):
        self.agent = agent
        self.params = params
        self.rows = rows
        self.result: torch.Tensor | None = None


class GradientService:
    def __init__(self, model, X: torch.Tensor, y: torch.Tensor):
        self.model = model
        self.X = X
        self.y = y.to(X.dtype)
        self.pending: list[Ticket] = []
        self.calls = 0
        self.evaluated = 0

    def submit(self, agent: int, params: torch.Tensor, rows: np.ndarray) -> Ticket:
        t = Ticket(agent, params, rows)
        self.pending.append(t)
        return t

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        by_size: dict[int, list[Ticket]] = {}
        for t in pending:
            by_size.setdefault(len(t.rows), []).append(t)
        for group in by_size.values():
            W = torch.stack([t.params for t in group])
            idx = torch.from_numpy(np.stack([t.rows for t in group])).to(self.X.device)
            G = self.model.grad(W, self.X[idx], self.y[idx])
            for t, g in zip(group, G):
                t.result = g
            self.calls += 1
            self.evaluated += len(group)
