"""Book-keeping per-sample clipping (compute/ghost.py) against the materialised per-sample gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from netsim.compute import ghost
from netsim.compute.models import TorchModel, clip_per_sample, mlp_module, small_cnn


def odd_cnn() -> nn.Sequential:
    """Padding, stride, dilation, a bias-free conv and a bias-free linear on a 2-D input."""
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1, stride=2), nn.ReLU(),
                         nn.Conv2d(4, 3, 3, dilation=2, bias=False), nn.ReLU(), nn.Flatten(),
                         nn.Linear(3 * 2 * 2, 5, bias=False))


CASES = [("small_cnn", small_cnn, (1, 28, 28), 10), ("mlp", lambda: mlp_module([20, 8, 6, 3]), None, 3),
         ("odd_cnn", odd_cnn, (2, 12, 12), 5)]


def setup(make, shape, classes, R=3, B=7, seed=0):
    m = TorchModel(make().double(), shape)  # its rows come from TorchModel.init (seeded), not the module's own
    g = torch.Generator().manual_seed(seed)
    W = m.init(R, torch.float64, torch.device("cpu"), seed) + 0.05 * torch.randn(R, m.size, dtype=torch.float64,
                                                                                 generator=g)
    d = 1
    for s in shape or (m.module[0].in_features,):
        d *= s
    X = torch.randn(R, B, d, dtype=torch.float64, generator=g)
    y = torch.randint(0, classes, (R, B), generator=g)
    return m, W, X, y


@pytest.mark.parametrize(("name", "make", "shape", "classes"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("clip", [1e-3, 0.3, 1e3])  # every sample clipped / some / none
def test_equals_the_materialised_per_sample_path(name, make, shape, classes, clip):
    m, W, X, y = setup(make, shape, classes)
    assert m.ghost_clipping
    ref = clip_per_sample(m.per_sample_grads(W, X, y), clip, "l2")
    got = m.grad(W, X, y, clip=clip)
    assert torch.allclose(got, ref, rtol=1e-10, atol=1e-14)
    assert torch.equal(got, m.grad(W, X, y, clip=clip))  # deterministic


def test_unsupported_layers_and_coordinate_clipping_take_the_materialised_path(monkeypatch):
    m, W, X, y = setup(lambda: nn.Sequential(nn.Linear(20, 8), nn.GroupNorm(2, 8), nn.Linear(8, 3)), None, 3)
    assert not m.ghost_clipping
    called = []
    monkeypatch.setattr(ghost, "clipped_mean", lambda *a: called.append(1))
    assert torch.equal(m.grad(W, X, y, clip=0.3), clip_per_sample(m.per_sample_grads(W, X, y), 0.3, "l2"))
    m, W, X, y = setup(small_cnn, (1, 28, 28), 10)
    assert torch.equal(m.grad(W, X, y, clip=0.01, clip_kind="coordinate"),
                       clip_per_sample(m.per_sample_grads(W, X, y), 0.01, "coordinate"))
    assert not called


def test_a_layer_too_large_for_its_per_sample_products_falls_back(monkeypatch):
    m, W, X, y = setup(small_cnn, (1, 28, 28), 10)
    monkeypatch.setattr(ghost, "MAX_LAYER_ENTRIES", 100)
    assert ghost.clipped_mean(m, W, X, y, 0.3) is None
    assert torch.allclose(m.grad(W, X, y, clip=0.3), clip_per_sample(m.per_sample_grads(W, X, y), 0.3, "l2"),
                          rtol=1e-12, atol=1e-15)
