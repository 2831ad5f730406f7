"""Batched evaluation of all agents' models at once (no per-agent loop)."""

from __future__ import annotations

import math

import torch

from netsim.compute.exact import row_mean, row_sum

# the largest (test rows x agents) block one per-agent evaluation computes at once: 2^26 elements (0.5 GiB in
# float64 per temporary); beyond it the agents are evaluated in slices (10^5 agents on 10^5 test rows would
# need a 75 GiB logits matrix). Smaller runs take one call, as they always did, so their metrics keep their bits.
BLOCK = 2**26


def evaluate_rows(model, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.evaluate`` of every row of W on (X, y), in slices of agents when one block would be too large."""
    step = max(1, BLOCK // max(1, len(X)))
    if len(W) <= step:
        return model.evaluate(W, X, y)
    parts = [model.evaluate(W[i:i + step], X, y) for i in range(0, len(W), step)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def evaluate_bank(model, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor, metrics: tuple[str, ...],
                  train: tuple[torch.Tensor, torch.Tensor] | None = None, f_star: float | None = None,
                  per_agent: dict | None = None) -> dict:
    """Test loss/accuracy of the average model, mean per-agent accuracy, consensus distance; with
    ``train`` rows the training objective f(x̄) and, with ``f_star``, the suboptimality f(x̄) - f*. With
    ``per_agent`` (a dict) and "agent_accuracy", every row's own test loss and accuracy go into it as
    numpy arrays (one batched evaluation of all rows). Every sum over agents or test rows has a fixed order
    (``compute.exact``): the figures are the same bits at any thread count."""
    out: dict[str, float] = {}
    avg = row_mean(W, 0).unsqueeze(0)
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
        loss, acc = evaluate_rows(model, W, X, y)
        if per_agent is not None:
            per_agent["loss"] = loss.detach().double().cpu().numpy()
            per_agent["accuracy"] = acc.detach().double().cpu().numpy()
        out["agent_accuracy_mean"] = float(row_mean(acc, 0))
        out["agent_accuracy_min"] = float(acc.min())
    if "consensus" in metrics:
        out["consensus"] = float(row_mean(row_sum((W - avg) ** 2, 1), 0))
    return out


#: the metrics whose value is a function of the models alone: not finite means the models diverged (tracking
#: metrics are NaN by design before any data streamed)
MODEL_METRICS = ("loss", "accuracy", "train_loss", "suboptimality", "agent_accuracy_mean", "agent_accuracy_min",
                 "consensus")


def divergence(W: torch.Tensor, row: dict) -> dict | None:
    """Whether the bank's models have diverged, from what an evaluation already has (None: they have not).
    One reduction over the bank (its sum is finite unless some parameter is nan or inf, or they are too large
    to add up); only when it is not, the rows are looked at: ``agent`` (a bank row: the first whose parameters
    are not finite, else the one of largest magnitude), ``agents`` (how many rows are not finite) and
    ``what``. A metric of ``row`` (``MODEL_METRICS``) that is not finite counts too."""
    if bool(torch.isfinite(W.sum())):
        bad = [k for k in MODEL_METRICS if k in row and not math.isfinite(row[k])]
        if not bad:
            return None
        big = W.abs().amax(1)
        i = int(big.argmax())
        return {"agent": i, "agents": 0, "what": f"{bad[0]} = {row[bad[0]]} (model parameters finite, the "
                                                  f"largest here: |x| = {float(big[i]):.3g})"}
    rows = (~torch.isfinite(W)).any(1).nonzero().flatten()
    if len(rows):
        return {"agent": int(rows[0]), "agents": len(rows), "what": "model parameters not finite (nan or inf)"}
    big = W.abs().amax(1)
    i = int(big.argmax())
    return {"agent": i, "agents": 0, "what": f"model parameters too large to add up (the largest here: "
                                             f"|x| = {float(big[i]):.3g})"}
