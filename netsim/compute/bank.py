"""All agents' parameters stacked in one (agents x P) tensor on the device, plus named
per-agent state (momentum, SAM perturbation, gradient tables, push-sum weights, ...) stacked the same
way, so that everything an algorithm keeps between activations lives outside its generator
(a checkpoint is ``state_dict()``)."""

from __future__ import annotations

import torch

from netsim.compute.mixing import MixUpdate, evaluate


class ParameterBank:
    """The parameter rows, with writes that may wait: ``defer`` records a gossip update (MixUpdate) and any
    read or write of the bank first computes every waiting update in one batched call. The values are
    those of doing each update when it was recorded (it holds its own inputs), so when they are computed
    changes nothing but the cost."""

    def __init__(self, W: torch.Tensor):
        self._W = W
        self.states: dict[str, torch.Tensor] = {}
        self._waiting: list[MixUpdate] = []
        self._row_views: list = [None] * W.shape[0]  # row i's view of W, made once: ``get`` copies it (~2 µs less)

    @property
    def W(self) -> torch.Tensor:
        """All rows (agents x P), every waiting update applied."""
        if self._waiting:
            self.apply_waiting()
        return self._W

    @W.setter
    def W(self, value: torch.Tensor) -> None:
        self._waiting = []
        self._W = value
        self._row_views = [None] * value.shape[0]

    def get(self, i: int) -> torch.Tensor:
        """A copy of agent i's row: later writes to the bank do not change it."""
        if self._waiting:
            self.apply_waiting()
        row = self._row_views[i]
        if row is None:
            row = self._row_views[i] = self._W[i]
        return row.clone()

    def set(self, i: int, value: torch.Tensor) -> None:
        if self._waiting:
            self.apply_waiting()
        self._W[i] = value

    def defer(self, update: MixUpdate) -> None:
        """Set row ``update.row`` to the update's value, computed with the others at the next read."""
        self._waiting.append(update)

    def apply_waiting(self) -> None:
        """Compute the waiting updates (one batched call) and write them."""
        waiting, self._waiting = self._waiting, []
        rows, values = evaluate(waiting, self._W.dtype)
        self._W.index_copy_(0, rows, values)

    def mean(self) -> torch.Tensor:
        return self.W.mean(0)

    def state(self, name: str, shape: tuple[int, ...] | None = None, fill: float = 0.0) -> torch.Tensor:
        """The (agents, *shape) tensor ``name`` (default shape: a parameter row), created on first use
        filled with ``fill`` on the bank's device and dtype. Agent i's state is ``state(name)[i]`` (a view:
        writes go to the bank)."""
        s = self.states.get(name)
        if s is None:
            W = self._W  # its shape, dtype and device: no need to apply waiting updates
            shape = tuple(W.shape[1:]) if shape is None else tuple(shape)
            s = self.states[name] = torch.full((W.shape[0], *shape), fill, dtype=W.dtype, device=W.device)
        elif shape is not None and tuple(s.shape[1:]) != tuple(shape):
            raise ValueError(f"bank state {name!r} has shape {tuple(s.shape[1:])}, asked for {tuple(shape)}")
        return s

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"W": self.W, **{f"state.{k}": v for k, v in self.states.items()}}

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        """Take ``state_dict``'s tensors; a state tensor the bank already holds is written in place, so whoever
        holds it (a round kernel's state, made before a checkpoint is restored) keeps reading the bank's."""
        self._waiting = []
        self._W.copy_(d["W"])
        states = {}
        for k, v in d.items():
            if k != "W":
                name = k[len("state."):]
                have = self.states.get(name)
                if have is not None and have.shape == v.shape:
                    states[name] = have.copy_(v)
                else:
                    states[name] = v.to(self._W.device).clone()
        self.states = states
