"""Agents folded into channels (compute/folded.py): the plain gradient of conv models on CPU equals the
per-agent path to float round-off; models whose forward is not channel-wise are caught and looped."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import grad

from netsim.compute import folded
from netsim.compute.models import TorchModel, small_cnn, vgg11


def narrow_net() -> nn.Sequential:
    """Every folded layer kind: padding (zeros and reflect), stride, a bias-free conv, GroupNorm with and without
    affine parameters, LayerNorm over (C, H, W) and over features, Linear with and without bias."""
    return nn.Sequential(nn.Conv2d(2, 6, 3, padding=1, stride=2), nn.GroupNorm(3, 6), nn.ReLU(),
                         nn.Conv2d(6, 4, 3, padding=1, padding_mode="reflect", bias=False),
                         nn.GroupNorm(2, 4, affine=False), nn.LayerNorm([4, 6, 6]), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(36, 8, bias=False), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 5))


class Residual(nn.Module):
    """A forward of its own (a residual sum, functional ReLU and pooling): channel-wise, so folded."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 2, 3, padding=1)
        self.head = nn.Linear(2, 5)

    def forward(self, x):
        x = torch.relu(self.c1(x)) + x
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Mixing(nn.Module):
    """Not channel-wise: a softmax across channels mixes the agents' blocks when folded."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 3, 3)
        self.head = nn.Linear(3 * 10 * 10, 5)

    def forward(self, x):
        return self.head(torch.softmax(self.c1(x), 1).flatten(1))


def setup(make, shape, R=5, B=6, dtype=torch.float64, classes=5):
    m = TorchModel(make().to(dtype), shape)
    g = torch.Generator().manual_seed(1)
    W = m.init(R, dtype, torch.device("cpu"), 1) + 0.1 * torch.randn(R, m.size, generator=g).to(dtype)
    X = torch.randn(R, B, shape[0] * shape[1] * shape[2], generator=g).to(dtype)
    return m, W, X, torch.randint(0, classes, (R, B), generator=g)


def per_agent(m, W, X, y):
    return torch.stack([grad(m.loss)(W[r], X[r], y[r]) for r in range(W.shape[0])])


@pytest.mark.parametrize(("make", "shape", "classes"), [(narrow_net, (2, 12, 12), 5), (Residual, (2, 6, 6), 5),
                                                        (small_cnn, (1, 28, 28), 10)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_folded_gradient_equals_the_per_agent_path(make, shape, classes, dtype):
    m, W, X, y = setup(make, shape, dtype=dtype, classes=classes)
    ref = per_agent(m, W, X, y)
    got = m.grad(W, X, y)
    assert m.fold is True
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol * ref.abs().max().item())
    torch.testing.assert_close(folded.logits(m, W, X), torch.stack([m.logits(W[r], X[r]) for r in range(5)]),
                               rtol=tol, atol=tol)
    assert torch.equal(got, m.grad(W, X, y))  # deterministic


def test_a_forward_mixing_channels_is_caught_and_looped():
    m, W, X, y = setup(Mixing, (2, 12, 12))
    assert folded.foldable(m.module)  # its layers alone would fold...
    got = m.grad(W, X, y)
    assert m.fold is False  # ...but its forward is not channel-wise
    assert torch.equal(got, per_agent(m, W, X, y))


def test_wide_or_unknown_layers_are_not_folded():
    assert not folded.foldable(vgg11())  # 64-512 channels: measured slower folded
    assert not folded.foldable(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Bilinear(2, 2, 3)))
    m, W, X, y = setup(lambda: nn.Sequential(nn.Conv2d(2, 33, 3), nn.Flatten(), nn.Linear(33 * 16, 5)), (2, 6, 6))
    assert torch.equal(m.grad(W, X, y), per_agent(m, W, X, y)) and m.fold is False
