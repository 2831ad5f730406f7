"""Noise mechanisms (an open registry) and clipping, on the tensor's own device.

Noise comes from one ``torch.Generator`` per agent, created once from the run's stream tree
(``Streams.seed_for("noise", agent)``) and consumed in event order, so a run's noise is a function
of the scenario and seed alone; the global torch/numpy state is never touched.

Gaussian mechanism (Dwork & Roth 2014, Def. 3.4 / Thm A.1): release x + N(0, sigma^2 I).
Laplace mechanism (Dwork & Roth 2014, Def. 3.3): release x + Lap(b)^d, drawn as b (E1 - E2) with
E1, E2 ~ Exp(1) independent (the difference of two unit exponentials is a standard Laplace).

Each mechanism is a ``Mechanism`` registered by name (``register_mechanism``; a ``--plugin`` file can add
one): how it releases a tensor from the agent's generator, and the dp-accounting ``DpEvent`` of one release
(before any sampling), so the accountants compose each mechanism as what it is, never as another.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import torch

from netsim.compute.noise import gaussian_noise, laplace_noise, noise_generator
from netsim.errors import claim


class PrivacyError(ValueError):
    """A privacy parameter outside its domain (negative noise, delta >= 1, ...)."""


@attrs.frozen
class Mechanism:
    """A noise mechanism. ``release(generator, x, scale)`` is the released tensor (x itself is not changed);
    ``event(scale, sensitivity)`` the dp-accounting ``DpEvent`` of one release of it, before sampling (the
    accountants wrap it for the sampling rate q); ``check(scale, sensitivity)`` an extra domain check of the
    mechanism's own (a message, or None); ``additive``: the release is x + noise(x's shape), so a runner may
    draw the noise alone (``NoiseSource.noise``)."""

    name: str
    release: Callable[[torch.Generator, torch.Tensor, float], torch.Tensor]
    event: Callable[[float, float], Any]
    doc: str = ""
    check: Callable[[float, float], str | None] | None = None
    additive: bool = False


#: mechanisms by name (``register_mechanism``)
MECHANISMS: dict[str, Mechanism] = {}


def register_mechanism(mechanism: Mechanism) -> Mechanism:
    """Make ``mechanism`` available to ``Agent.privatize(..., mechanism=name)`` and to the accountants; the same
    object again is a no-op, another under a taken name raises."""
    claim(MECHANISMS, "mechanism", mechanism.name, mechanism)
    return mechanism


def get_mechanism(name: str) -> Mechanism:
    """The mechanism registered as ``name``; PrivacyError naming the registered ones otherwise."""
    m = MECHANISMS.get(name)
    if m is None:
        raise PrivacyError(f"mechanism must be one of {', '.join(MECHANISMS)} (a plugin's needs --plugin), "
                           f"got {name!r}")
    return m


def _multiplier_event(kind: str) -> Callable[[float, float], Any]:
    def event(scale: float, sensitivity: float):
        import dp_accounting

        z = scale / sensitivity
        if z <= 1e-100:  # no noise; and below ~1e-162 dp-accounting divides by sigma**2 == 0.0
            return dp_accounting.NonPrivateDpEvent()
        return dp_accounting.GaussianDpEvent(z) if kind == "gaussian" else dp_accounting.LaplaceDpEvent(z)

    event.__qualname__ = f"{kind}_event"
    return event


register_mechanism(Mechanism(
    "gaussian", lambda g, x, scale: x + gaussian_noise(x.shape, scale, g, x.dtype).to(x.device),
    _multiplier_event("gaussian"), "x + N(0, scale^2 I); L2 sensitivity (Dwork & Roth, Thm A.1)", additive=True))
register_mechanism(Mechanism(
    "laplace", lambda g, x, scale: x + laplace_noise(x.shape, scale, g, x.dtype).to(x.device),
    _multiplier_event("laplace"), "x + Lap(scale)^d; L1 sensitivity (Dwork & Roth, Def. 3.3)", additive=True))


def check_release_args(mechanism_name: str, scale: float, sensitivity: float, q: float, p: float = 1.0) -> None:
    """Fail loudly on parameters no mechanism or accountant can honour."""
    mech = get_mechanism(mechanism_name)
    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale >= 0):
        raise PrivacyError(f"noise scale (sigma) must be a finite number >= 0, got {scale!r}")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise PrivacyError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")
    if not 0 < q <= 1:
        raise PrivacyError(f"sampling probability q must be in (0, 1], got {q!r}")
    if not 0 < p <= 1:
        raise PrivacyError(f"activation probability p must be in (0, 1], got {p!r}")
    if mech.check is not None:
        msg = mech.check(scale, sensitivity)
        if msg:
            raise PrivacyError(f"{mech.name}: {msg}")


def clip_l2(x: torch.Tensor, bound: float) -> torch.Tensor:
    """x scaled to L2 norm <= bound (the whole tensor; Abadi et al. 2016, Alg. 1 line 'clip')."""
    if bound <= 0:
        raise PrivacyError(f"clip bound must be > 0, got {bound!r}")
    norm = torch.linalg.vector_norm(x)
    return x * (bound / norm.clamp_min(bound))


def clip_l2_rows(x: torch.Tensor, bound: float) -> torch.Tensor:
    """``clip_l2`` of each row of ``x``, each row's bits those of ``clip_l2`` on that row alone (a windowed batch's, the
    events engine's one agent): the norms as each row's own (``compute.exact.row_norms``), the rest element by
    element as ``clip_l2`` does it."""
    from netsim.compute.exact import row_norms

    if bound <= 0:
        raise PrivacyError(f"clip bound must be > 0, got {bound!r}")
    return x * (bound / row_norms(x).clamp_min(bound)).unsqueeze(1)


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
        """Noise shaped like ``like`` (same dtype; on this source's device), of an additive mechanism."""
        if mechanism == "gaussian":
            return self.gaussian(like.shape, scale, like.dtype)
        if mechanism == "laplace":
            return self.laplace(like.shape, scale, like.dtype)
        raise PrivacyError(f"mechanism {mechanism!r} is not additive: its release is not x + noise")

    def add(self, mechanism: str, x: torch.Tensor, scale: float) -> torch.Tensor:
        """The mechanism's release of x (x + noise for the additive ones; a new tensor, x is not modified)."""
        if mechanism in ("gaussian", "laplace"):
            return x + self.noise(mechanism, x, scale).to(x.device)
        return get_mechanism(mechanism).release(self.generator, x, scale)
