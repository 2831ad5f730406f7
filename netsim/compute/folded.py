"""Many agents' copies of one network in one pass, agents folded into channels (the CPU path of conv models).

The activations of R agents' copies are held as one tensor (B, R·C, ...): agent r's channels are the r-th
block, so every convolution of all agents is one grouped convolution (groups R·g, the agents' kernels stacked;
channels-last, which the CPU kernels run fastest), GroupNorm one group_norm of R·G groups, LayerNorm a view
(B, R, ...) and Linear one batched product over agents. Parameter-free modules and a forward's own code run
unchanged: they must act on each channel block alone (ReLU, pooling, a residual sum, Flatten — which keeps
agent r's features in the r-th block). That is checked once per model against the per-agent path on two
different agents (``fits``); a model that fails it, or holds a layer type ``FOLDERS`` does not know, is not
folded. Values equal the per-agent path's to float round-off (another summation order in the kernels, which
also depends on how many agents share the call).

Measured on CPU against a loop over agents (2 cores): the small CNN (16 and 32 channels), 64 agents, batch 32,
1.8x faster; VGG-11 (64–512 channels), 8 agents, batch 4, 2x *slower* (grouped convolutions of wide layers:
their backward alone took longer than the loop). Hence only networks whose convolutions have at most
``MAX_CHANNELS`` output channels are folded.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

MAX_CHANNELS = 32  # the widest convolution measured faster folded than looped

Folder = Callable[[nn.Module, dict[str, torch.Tensor], int, torch.Tensor], torch.Tensor]


def _conv2d(m: nn.Conv2d, p: dict[str, torch.Tensor], R: int, x: torch.Tensor) -> torch.Tensor:
    w = p["weight"].flatten(0, 1).contiguous(memory_format=torch.channels_last)
    b = p["bias"].flatten() if "bias" in p else None
    if m.padding_mode != "zeros":
        x = F.pad(x, m._reversed_padding_repeated_twice, mode=m.padding_mode)
        return F.conv2d(x, w, b, m.stride, 0, m.dilation, m.groups * R)
    return F.conv2d(x, w, b, m.stride, m.padding, m.dilation, m.groups * R)


def _linear(m: nn.Linear, p: dict[str, torch.Tensor], R: int, x: torch.Tensor) -> torch.Tensor:
    B = x.shape[0]
    xr = x.reshape(B, R, -1).transpose(0, 1)  # (R, B, in)
    z = torch.bmm(xr, p["weight"].mT) if "bias" not in p else torch.baddbmm(p["bias"].unsqueeze(1), xr,
                                                                             p["weight"].mT)
    return z.transpose(0, 1).reshape(B, -1)


def _group_norm(m: nn.GroupNorm, p: dict[str, torch.Tensor], R: int, x: torch.Tensor) -> torch.Tensor:
    w, b = p.get("weight"), p.get("bias")
    return F.group_norm(x, m.num_groups * R, None if w is None else w.flatten(),
                        None if b is None else b.flatten(), m.eps)


def _layer_norm(m: nn.LayerNorm, p: dict[str, torch.Tensor], R: int, x: torch.Tensor) -> torch.Tensor:
    shape = tuple(m.normalized_shape)
    z = F.layer_norm(x.reshape(x.shape[0], R, *shape), shape, eps=m.eps)
    if "weight" in p:
        z = z * p["weight"]
    if "bias" in p:
        z = z + p["bias"]
    return z.reshape(x.shape)


FOLDERS: dict[type, Folder] = {nn.Conv2d: _conv2d, nn.Linear: _linear, nn.GroupNorm: _group_norm,
                               nn.LayerNorm: _layer_norm}


def foldable(module: nn.Module) -> bool:
    """Every module owning parameters is of a type ``FOLDERS`` knows and owns them directly (a leaf), and no
    convolution is wider than ``MAX_CHANNELS``."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d) and m.out_channels > MAX_CHANNELS:
            return False
        if any(True for _ in m.parameters(recurse=False)) and (
                type(m) not in FOLDERS or any(True for _ in m.children())):
            return False
    return True


@contextmanager
def _folded_forwards(module: nn.Module, params: dict[str, torch.Tensor], R: int):
    """Every module of a ``FOLDERS`` type runs its folded form with the agents' stacked parameters."""
    swapped = []
    try:
        for name, m in module.named_modules():
            fold = FOLDERS.get(type(m))
            if fold is None:
                continue
            pre = f"{name}." if name else ""
            own = {k: params[pre + k] for k, _ in m.named_parameters(recurse=False)}
            m.forward = (lambda f, mm, p: lambda x: f(mm, p, R, x))(fold, m, own)
            swapped.append(m)
        yield
    finally:
        for m in swapped:
            del m.forward


def logits(model, W: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """(R, B, classes): every agent's logits, W (R, P), X (R, B, d), through the folded forward."""
    R, B = X.shape[:2]
    shape = model.shape or (X.shape[2],)
    params = {n: t.view(R, *s) for n, t, s in zip(model.names, torch.split(W, model.numels, dim=1), model.shapes,
                                                  strict=True)}
    x = X.view(R, B, *shape).transpose(0, 1).reshape(B, R * shape[0], *shape[1:])
    if x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    with _folded_forwards(model.module, params, R):
        z = model.module(x)
    return z.reshape(B, R, -1).transpose(0, 1)


def grad(model, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(R, P): each agent's mean cross-entropy gradient over its batch, one backward for all agents."""
    Wg = W.detach().requires_grad_(True)
    z = logits(model, Wg, X)
    loss = F.cross_entropy(z.flatten(0, 1), y.flatten(), reduction="sum") / X.shape[1]
    return torch.autograd.grad(loss, Wg)[0]


def fits(model, W: torch.Tensor, X: torch.Tensor) -> bool:
    """Whether the folded forward gives the per-agent logits, checked on two different agents (the first row
    and a perturbed copy, the first samples and the same reversed) to float round-off."""
    if not foldable(model.module) or X.shape[1] < 1:
        return False
    g = torch.Generator().manual_seed(0)
    w = W[0].detach()
    W2 = torch.stack([w, w + 0.1 * w.abs().mean() * torch.randn(w.shape, generator=g).to(w)])
    x = X[0, :4].detach()
    X2 = torch.stack([x, x.flip(0)])
    try:
        with torch.no_grad():
            got = logits(model, W2, X2)
            ref = torch.stack([model.logits(W2[r], X2[r]) for r in range(2)])
    except (RuntimeError, ValueError, IndexError, TypeError):
        return False
    tol = 1e-4 if W.dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-9
    return got.shape == ref.shape and bool(torch.allclose(got, ref, rtol=tol, atol=tol * ref.abs().max().item()))
