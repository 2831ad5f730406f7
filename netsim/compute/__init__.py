"""Compute service: parameter bank, models, batched gradients, datasets. Knows no agents or events."""

from __future__ import annotations


def resolve_device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from netsim.errors import InputError

        raise InputError("run.device", "'cuda' requested but torch sees no CUDA device; use 'auto' or 'cpu'")
    return torch.device(name)
