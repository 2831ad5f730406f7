"""Batched evaluation of all agents' models at once (no per-agent loop)."""

from __future__ import annotations

import torch


def evaluate_bank(model, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor, metrics: tuple[str, ...]) -> dict:
    """Test loss/accuracy of the average model, mean per-agent accuracy, consensus distance."""
    out: dict[str, float] = {}
    avg = W.mean(0, keepdim=True)
    if "loss" in metrics or "accuracy" in metrics:
        loss, acc = model.evaluate(avg, X, y)
        out["loss"] = float(loss[0])
        out["accuracy"] = float(acc[0])
    if "agent_accuracy" in metrics:
        _, acc = model.evaluate(W, X, y)
        out["agent_accuracy_mean"] = float(acc.mean())
        out["agent_accuracy_min"] = float(acc.min())
    if "consensus" in metrics:
        out["consensus"] = float(((W - avg) ** 2).sum(1).mean())
    return out
