"""Batched evaluation of all agents' models at once (no per-agent loop)."""

from __future__ import annotations

import torch


def evaluate_bank(model, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor, metrics: tuple[str, ...],
                  train: tuple[torch.Tensor, torch.Tensor] | None = None, f_star: float | None = None) -> dict:
    """Test loss/accuracy of the average model, mean per-agent accuracy, consensus distance; with
    ``train`` rows the training objective f(x̄) and, with ``f_star``, the suboptimality f(x̄) - f*."""
    out: dict[str, float] = {}
    avg = W.mean(0, keepdim=True)
    if train is not None and ("train_loss" in metrics or "suboptimality" in metrics):
        f = float(model.evaluate(avg, *train)[0][0])
        if "train_loss" in metrics:
            out["train_loss"] = f
        if f_star is not None:
            out["suboptimality"] = f - f_star
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
