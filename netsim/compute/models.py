"""Models with batched (agents x ...) forward, loss and gradient.

A model sees parameters as a flat row per agent, ``W: (agents, P)``; it never knows about agents,
time or events (compute is a service).
"""

from __future__ import annotations

import torch


class LogisticRegression:
    """Binary logistic regression, parameters ``[w (d), b]``; gradient in closed form, batched.

    loss_i = mean_b log(1 + exp(-s_b z_b)) + l2/2 ||w||^2 with z = x.w + b and s = 2y - 1.
    """

    def __init__(self, features: int, l2: float = 0.0):
        self.d = features
        self.l2 = l2
        self.size = features + 1

    def init(self, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.zeros(n, self.size, dtype=dtype, device=device)

    def logits(self, W: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """W: (R, P); X: (R, B, d) -> (R, B)."""
        return torch.baddbmm(W[:, -1:].unsqueeze(-1), X, W[:, :-1].unsqueeze(-1)).squeeze(-1)

    def grad(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean gradient over each row's batch: W (R, P), X (R, B, d), y (R, B) in {0, 1} -> (R, P)."""
        r = torch.sigmoid(self.logits(W, X)) - y  # dloss/dz
        g = torch.empty_like(W)
        g[:, :-1] = torch.bmm(r.unsqueeze(1), X).squeeze(1) / X.shape[1] + self.l2 * W[:, :-1]
        g[:, -1] = r.mean(dim=1)
        return g

    def evaluate(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss and accuracy of every row of W on one shared set X (n, d): -> (R,), (R,)."""
        z = X @ W[:, :-1].T + W[:, -1]  # (n, R)
        s = (2 * y - 1).unsqueeze(1).to(z.dtype)
        loss = torch.nn.functional.softplus(-s * z).mean(0) + self.l2 / 2 * (W[:, :-1] ** 2).sum(1)
        acc = ((z > 0).to(y.dtype) == y.unsqueeze(1)).to(z.dtype).mean(0)
        return loss, acc


def build_model(kind: str, features: int, classes: int, l2: float):
    if kind == "logistic":
        if classes > 2:
            from netsim.errors import InputError

            raise InputError("model.kind", f"'logistic' is binary; the data has {classes} classes")
        return LogisticRegression(features, l2)
    raise ValueError(f"unknown model {kind!r}")
