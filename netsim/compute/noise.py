"""Device-side noise for DP mechanisms, drawn from ``torch.Generator``s seeded from the run's stream
tree (``Streams.seed_for("noise", agent)``), never from torch's global state. Draws happen in the
deterministic event order, so the same scenario and seed give the same noise."""

from __future__ import annotations

import torch


def noise_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded with ``seed`` (e.g. ``streams.seed_for("noise", i)``)."""
    return torch.Generator(device=device).manual_seed(int(seed))


def gaussian_noise(shape, sigma: float, generator: torch.Generator,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """N(0, sigma^2) i.i.d., on the generator's device."""
    return torch.randn(shape, generator=generator, dtype=dtype, device=generator.device).mul_(sigma)


def gaussian_noise_rows(shape, sigmas: list[float], generators: list[torch.Generator],
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Row k is ``gaussian_noise(shape, sigmas[k], generators[k], dtype)``, bit for bit: each row drawn from its
    own generator, then all scaled in one operation (many agents' releases noised as one batch)."""
    device = generators[0].device
    z = torch.empty((len(generators), *torch.Size(shape)), dtype=dtype, device=device)
    for row, gen in zip(z.unbind(0), generators, strict=True):
        row.normal_(generator=gen)  # randn's own draw (randn is empty().normal_()), with less call overhead
    return z.mul_(torch.tensor(sigmas, dtype=dtype, device=device).view(-1, *([1] * len(z.shape[1:]))))


def laplace_noise(shape, scale: float, generator: torch.Generator,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Laplace(0, scale) i.i.d. (density exp(-|x|/scale) / (2 scale)): the difference of two
    independent Exp(1) draws, times ``scale``."""
    e = torch.empty((2, *torch.Size(shape)), dtype=dtype, device=generator.device)
    e.exponential_(generator=generator)
    return (e[0] - e[1]).mul_(scale)


def laplace_noise_rows(shape, scales: list[float], generators: list[torch.Generator],
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Row k is ``laplace_noise(shape, scales[k], generators[k], dtype)``, bit for bit: each row's pair of Exp(1)
    draws from its own generator, then every difference scaled in one operation."""
    device = generators[0].device
    e = torch.empty((len(generators), 2, *torch.Size(shape)), dtype=dtype, device=device)
    for row, gen in zip(e.unbind(0), generators, strict=True):
        row.exponential_(generator=gen)
    return (e[:, 0] - e[:, 1]).mul_(torch.tensor(scales, dtype=dtype, device=device).view(-1, *([1] * len(shape))))


def noise_rows(mechanism: str, shape, scales: list[float], generators: list[torch.Generator],
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The noise rows of an additive mechanism (``gaussian``: std ``scales[k]``; ``laplace``: scale ``scales[k]``),
    row k from ``generators[k]``, bit for bit the draws of one release at a time."""
    if mechanism == "gaussian":
        return gaussian_noise_rows(shape, scales, generators, dtype)
    if mechanism == "laplace":
        return laplace_noise_rows(shape, scales, generators, dtype)
    raise ValueError(f"mechanism {mechanism!r}: no batched noise rows (gaussian, laplace)")
