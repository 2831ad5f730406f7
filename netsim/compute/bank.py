"""All agents' parameters stacked in one (agents x P) tensor on the device, plus named
per-agent state (momentum, SAM perturbation, gradient tables, push-sum weights, ...) stacked the same
way, so that everything an algorithm keeps between activations lives outside its generator
(a checkpoint is ``state_dict()``)."""

from __future__ import annotations

import torch


class ParameterBank:
    def __init__(self, W: torch.Tensor):
        self.W = W
        self.states: dict[str, torch.Tensor] = {}

    def get(self, i: int) -> torch.Tensor:
        """A copy of agent i's row: later writes to the bank do not change it."""
        return self.W[i].clone()

    def set(self, i: int, value: torch.Tensor) -> None:
        self.W[i] = value

    def mean(self) -> torch.Tensor:
        return self.W.mean(0)

    def state(self, name: str, shape: tuple[int, ...] | None = None, fill: float = 0.0) -> torch.Tensor:
        """The (agents, *shape) tensor ``name`` (default shape: a parameter row), created on first use
        filled with ``fill`` on the bank's device and dtype. Agent i's state is ``state(name)[i]`` (a view:
        writes go to the bank)."""
        s = self.states.get(name)
        if s is None:
            shape = tuple(self.W.shape[1:]) if shape is None else tuple(shape)
            s = self.states[name] = torch.full((self.W.shape[0], *shape), fill, dtype=self.W.dtype,
                                               device=self.W.device)
        elif shape is not None and tuple(s.shape[1:]) != tuple(shape):
            raise ValueError(f"bank state {name!r} has shape {tuple(s.shape[1:])}, asked for {tuple(shape)}")
        return s

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"W": self.W, **{f"state.{k}": v for k, v in self.states.items()}}

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        self.W.copy_(d["W"])
        self.states = {k[len("state."):]: v.to(self.W.device).clone() for k, v in d.items() if k != "W"}
