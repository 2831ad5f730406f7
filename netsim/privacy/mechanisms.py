"""Noise mechanisms and clipping, on the tensor's own device.

Noise comes from one ``torch.Generator`` per agent, created once from the run's stream tree
(``Streams.seed_for("noise", agent)``) and consumed in event order, so a run's noise is a function
of the scenario and seed alone; the global torch/numpy state is never touched.

Gaussian mechanism (Dwork & Roth 2014, Def. 3.4 / Thm A.1): release x + N(0, sigma^2 I).
Laplace mechanism (Dwork & Roth 2014, Def. 3.3): release x + Lap(b)^d, drawn as b (E1 - E2) with
E1, E2 ~ Exp(1) independent (the difference of two unit exponentials is a standard Laplace).
"""

from __future__ import annotations

import math

import torch

from netsim.compute.noise import gaussian_noise, laplace_noise, noise_generator

MECHANISMS = ("gaussian", "laplace")


class PrivacyError(ValueError):
    """A privacy parameter outside its domain (negative noise, delta >= 1, ...)."""


def check_release_args(mechanism: str, scale: float, sensitivity: float, q: float, p: float = 1.0) -> None:
    """Fail loudly on parameters no mechanism or accountant can honour."""
    if mechanism not in MECHANISMS:
        raise PrivacyError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale >= 0):
        raise PrivacyError(f"noise scale (sigma) must be a finite number >= 0, got {scale!r}")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise PrivacyError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")
    if not 0 < q <= 1:
        raise PrivacyError(f"sampling probability q must be in (0, 1], got {q!r}")
    if not 0 < p <= 1:
        raise PrivacyError(f"activation probability p must be in (0, 1], got {p!r}")


def clip_l2(x: torch.Tensor, bound: float) -> torch.Tensor:
    """x scaled to L2 norm <= bound (the whole tensor; Abadi et al. 2016, Alg. 1 line 'clip')."""
    if bound <= 0:
        raise PrivacyError(f"clip bound must be > 0, got {bound!r}")
    norm = torch.linalg.vector_norm(x)
    return x * (bound / norm.clamp_min(bound))


def clip_coordinate(x: torch.Tensor, bound: float) -> torch.Tensor:
    """Each coordinate clamped to [-bound, bound] (Huo et al., DO-ADP, Assumption 2: |g_j| <= G / sqrt(d))."""
    if bound <= 0:
        raise PrivacyError(f"clip bound must be > 0, got {bound!r}")
    return x.clamp(-bound, bound)


def clip(x: torch.Tensor, bound: float, kind: str = "l2") -> torch.Tensor:
    if kind == "l2":
        return clip_l2(x, bound)
    if kind == "coordinate":
        return clip_coordinate(x, bound)
    raise PrivacyError(f"clip kind must be 'l2' or 'coordinate', got {kind!r}")


class NoiseSource:
    """One agent's noise generator on ``device`` (created once, consumed in event order); the draws
    are netsim.compute.noise's device-side helpers."""

    def __init__(self, seed: int, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.generator = noise_generator(seed, self.device)

    def gaussian(self, shape: torch.Size | tuple[int, ...], sigma: float,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return gaussian_noise(shape, sigma, self.generator, dtype)

    def laplace(self, shape: torch.Size | tuple[int, ...], b: float,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return laplace_noise(shape, b, self.generator, dtype)

    def noise(self, mechanism: str, like: torch.Tensor, scale: float) -> torch.Tensor:
        """Noise shaped like ``like`` (same dtype; on this source's device)."""
        draw = self.gaussian if mechanism == "gaussian" else self.laplace
        return draw(like.shape, scale, like.dtype)

    def add(self, mechanism: str, x: torch.Tensor, scale: float) -> torch.Tensor:
        """x + noise (a new tensor; x is not modified)."""
        return x + self.noise(mechanism, x, scale).to(x.device)
