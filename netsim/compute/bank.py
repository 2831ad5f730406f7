"""All agents' parameters stacked in one (agents x P) tensor on the device (principle 5)."""

from __future__ import annotations

import torch


class ParameterBank:
    def __init__(self, W: torch.Tensor):
        self.W = W

    def get(self, i: int) -> torch.Tensor:
        """A copy of agent i's row: later writes to the bank do not change it."""
        return self.W[i].clone()

    def set(self, i: int, value: torch.Tensor) -> None:
        self.W[i] = value

    def mean(self) -> torch.Tensor:
        return self.W.mean(0)
