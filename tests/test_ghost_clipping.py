"""Book-keeping per-sample clipping (compute/ghost.py) against autograd's per-sample gradients: one test per
layer type (Linear, Conv2d, GroupNorm, LayerNorm, a plugin-registered layer, an unknown layer on the generic
path), the registry's rules, and the cases that send the whole model to nested vmap."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from netsim.compute import ghost
from netsim.compute.models import ResNet18, TorchModel, clip_factors, clip_per_sample, mlp_module, small_cnn, vgg11

D = torch.float64


def odd_cnn() -> nn.Sequential:
    """Padding, stride, dilation, a bias-free conv and a bias-free linear on a 2-D input."""
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1, stride=2), nn.ReLU(),
                         nn.Conv2d(4, 3, 3, dilation=2, bias=False), nn.ReLU(), nn.Flatten(),
                         nn.Linear(3 * 2 * 2, 5, bias=False))


def wide_conv() -> nn.Sequential:
    """Few positions, many channels: the Gram-matrix (ghost norm) branch, T (d + p) < d p."""
    return nn.Sequential(nn.Conv2d(3, 40, 3), nn.ReLU(), nn.Conv2d(40, 40, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(160, 4))


def group_norm_net() -> nn.Sequential:
    """GroupNorm on feature maps (VGG's use) and on flat features, one without affine parameters."""
    return nn.Sequential(nn.Conv2d(2, 6, 3), nn.GroupNorm(3, 6), nn.ReLU(), nn.Conv2d(6, 4, 3, bias=False),
                         nn.GroupNorm(2, 4, affine=False), nn.Flatten(), nn.Linear(4 * 4 * 4, 8),
                         nn.GroupNorm(4, 8), nn.Linear(8, 5))


def layer_norm_net() -> nn.Sequential:
    """LayerNorm over the last dimension, over (C, H, W), and without a bias."""
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.LayerNorm([3, 6, 6]), nn.ReLU(), nn.Flatten(),
                         nn.Linear(108, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 6), nn.LayerNorm(6, bias=False),
                         nn.Linear(6, 5))


class Scale(nn.Module):
    """A plugin's layer: y = x * s per channel."""

    def __init__(self, c: int):
        super().__init__()
        self.s = nn.Parameter(torch.ones(c))

    def forward(self, x):
        return x * self.s.view(-1, *([1] * (x.dim() - 2)))


def scale_sampler(layer, params, a, g):
    return {"s": (g * a).flatten(2).sum(2)}


class Gated(nn.Module):
    """A layer no sampler knows: its own parameter and a child Linear (which has its sampler)."""

    def __init__(self, i: int, o: int):
        super().__init__()
        self.lin = nn.Linear(i, o)
        self.gate = nn.Parameter(torch.linspace(-1, 1, o))

    def forward(self, x):
        return self.lin(x) * torch.sigmoid(self.gate) + torch.tanh(x[:, :1]) * self.gate


def scale_net() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(2, 4, 3), Scale(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 5))


def gated_net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(20, 8), nn.ReLU(), Gated(8, 6), nn.ReLU(), nn.Linear(6, 3))


def grouped_conv_net() -> nn.Sequential:
    """A Conv2d instance its sampler declines (groups = 2): that layer alone takes the generic path."""
    return nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.Flatten(),
                         nn.Linear(64, 5))


# (id, module factory, input shape or None for flat, classes)
CASES = [("linear", lambda: mlp_module([20, 8, 6, 3]), None, 3),
         ("conv2d", small_cnn, (1, 28, 28), 10),
         ("conv2d_odd", odd_cnn, (2, 12, 12), 5),
         ("conv2d_gram", wide_conv, (3, 6, 6), 4),
         ("groupnorm", group_norm_net, (2, 8, 8), 5),
         ("layernorm", layer_norm_net, (2, 8, 8), 5),
         ("unknown_layer", gated_net, None, 3),
         ("declined_instance", grouped_conv_net, (2, 8, 8), 5)]


def setup(make, shape, classes, R=3, B=7, seed=0, dtype=D):
    m = TorchModel(make().to(dtype), shape)  # its rows come from TorchModel.init (seeded), not the module's own
    g = torch.Generator().manual_seed(seed)
    W = m.init(R, dtype, torch.device("cpu"), seed) + 0.3 * torch.randn(R, m.size, generator=g).to(dtype)
    d = 1
    for s in shape or (next(m.module.modules())[0].in_features,):
        d *= s
    X = torch.randn(R, B, d, generator=g).to(dtype)
    y = torch.randint(0, classes, (R, B), generator=g)
    return m, W, X, y


def autograd_per_sample(m: TorchModel, W, X, y) -> torch.Tensor:
    """(R, B, P): each sample's gradient by torch.autograd, one backward per sample."""
    out = []
    for r in range(W.shape[0]):
        rows = []
        for b in range(X.shape[1]):
            w = W[r].clone().requires_grad_(True)
            loss = m.loss(w, X[r, b:b + 1], y[r, b:b + 1])
            rows.append(torch.autograd.grad(loss, w, allow_unused=True, materialize_grads=True)[0])
        out.append(torch.stack(rows))
    return torch.stack(out)


def check(m, W, X, y, rtol=1e-10, book_keeping=True):
    per = autograd_per_sample(m, W, X, y)
    norms = torch.linalg.vector_norm(per, dim=2)
    if book_keeping:
        torch.testing.assert_close(ghost.per_sample_norms(m, W, X, y), norms, rtol=rtol, atol=rtol * 1e-3)
    median = norms.median().item()
    for clip in (median * 1e-3, median, median * 1e3):  # every sample clipped / about half / none
        ref = clip_per_sample(per, clip, "l2")
        got = m.grad(W, X, y, clip=clip)
        torch.testing.assert_close(got, ref, rtol=rtol, atol=rtol * ref.abs().max().item())  # to 1e-5 of the scale
    assert torch.equal(got, m.grad(W, X, y, clip=clip))  # deterministic
    assert 0 < (clip_factors(norms, median) < 1).sum() < norms.numel()


@pytest.mark.parametrize(("name", "make", "shape", "classes"), CASES, ids=[c[0] for c in CASES])
def test_norms_and_clipped_means_equal_autograds(name, make, shape, classes, monkeypatch):
    generic = []
    real = ghost._generic
    monkeypatch.setattr(ghost, "_generic", lambda model, n, *a: generic.append(n) or real(model, n, *a))
    monkeypatch.setattr(ghost, "_over_agents", _no_fallback(ghost._over_agents))
    m, W, X, y = setup(make, shape, classes)
    check(m, W, X, y)
    # the generic path ran for the layers no sampler takes, and for no other
    expected = {"unknown_layer": {"2"}, "declined_instance": {"0"}}.get(name, set())
    assert set(generic) == expected


def _no_fallback(over_agents):
    def strict(*a):
        got = over_agents(*a)
        assert got is not None, "book-keeping fell back to nested vmap"
        return got
    return strict


def vgg_like() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 4, 16), nn.LayerNorm(16), nn.Linear(16, 10))


def test_float32_within_1e_5_of_autograd():
    """In float32 both are off the float64 truth by round-off (~3e-7 here); they agree to 1e-5. (A GroupNorm
    of two entries per group amplifies round-off ~1/sigma: both then err by ~1e-4, so not that net.)"""
    m, W, X, y = setup(vgg_like, (3, 8, 8), 10, dtype=torch.float32)
    check(m, W, X, y, rtol=1e-5)


def test_a_plugin_registered_layer_uses_its_sampler(monkeypatch):
    monkeypatch.setattr(ghost, "SAMPLERS", dict(ghost.SAMPLERS))
    calls = []

    @ghost.register_norm_sampler(Scale)
    def sampler(layer, params, a, g):
        calls.append(layer)
        return scale_sampler(layer, params, a, g)

    monkeypatch.setattr(ghost, "_generic", lambda *a: pytest.fail("the generic path ran"))
    m, W, X, y = setup(scale_net, (2, 6, 6), 5)
    check(m, W, X, y)
    assert calls and all(isinstance(c, Scale) for c in calls)


def test_registry_rules(monkeypatch):
    monkeypatch.setattr(ghost, "SAMPLERS", dict(ghost.SAMPLERS))
    ghost.register_norm_sampler(Scale, scale_sampler)
    ghost.register_norm_sampler(Scale, scale_sampler)  # the same again: a no-op
    with pytest.raises(ValueError, match="norm sampler for Scale is already registered"):
        ghost.register_norm_sampler(Scale, lambda *a: None)
    with pytest.raises(ValueError, match="norm sampler for Linear is already registered"):
        ghost.register_norm_sampler(nn.Linear, scale_sampler)
    with pytest.raises(ValueError, match="nn.Module subclass"):
        ghost.register_norm_sampler(int, scale_sampler)


def test_vgg11_and_resnet18_take_book_keeping_for_every_layer():
    for net in (vgg11(), ResNet18()):
        layers = ghost._layers(net)
        assert layers and all(s is not None for _, _, s in layers)
        assert {type(m) for _, m, _ in layers} <= {nn.Conv2d, nn.Linear, nn.GroupNorm}


@pytest.mark.slow
def test_resnet18_equals_autograd_end_to_end():
    m, W, X, y = setup(ResNet18, (3, 32, 32), 10, R=1, B=3)
    check(m, W, X, y, rtol=1e-8)


def test_coordinate_clipping_and_disabled_book_keeping_take_nested_vmap(monkeypatch):
    called = []
    monkeypatch.setattr(ghost, "clipped_mean", lambda *a: called.append(1))
    m, W, X, y = setup(small_cnn, (1, 28, 28), 10)
    assert torch.equal(m.grad(W, X, y, clip=0.01, clip_kind="coordinate"),
                       clip_per_sample(m.per_sample_grads(W, X, y), 0.01, "coordinate"))
    m.ghost_clipping = False
    assert torch.equal(m.grad(W, X, y, clip=0.3), clip_per_sample(m.per_sample_grads(W, X, y), 0.3, "l2"))
    assert not called


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.relu(self.lin(torch.relu(self.lin(x)))))


def test_a_layer_called_twice_sends_the_model_to_nested_vmap():
    m, W, X, y = setup(Twice, (6,), 3)
    assert ghost.clipped_mean(m, W, X, y, 0.3) is None
    assert ghost.per_sample_norms(m, W, X, y) is None
    check(m, W, X, y, book_keeping=False)


def test_a_layer_too_large_for_its_per_sample_products_falls_back(monkeypatch):
    m, W, X, y = setup(small_cnn, (1, 28, 28), 10)
    monkeypatch.setattr(ghost, "MAX_LAYER_ENTRIES", 100)
    assert ghost.clipped_mean(m, W, X, y, 0.3) is None
    assert torch.allclose(m.grad(W, X, y, clip=0.3), clip_per_sample(m.per_sample_grads(W, X, y), 0.3, "l2"),
                          rtol=1e-12, atol=1e-15)


class Spare(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(5, 3)
        self.spare = nn.Linear(5, 2)

    def forward(self, x):
        return self.head(x)


def test_an_unused_layer_gets_a_zero_gradient():
    m, W, X, y = setup(Spare, (5,), 3)
    got = ghost.clipped_mean(m, W, X, y, 0.3)
    assert got is not None and torch.equal(got[:, -12:], torch.zeros(3, 12, dtype=D))
    torch.testing.assert_close(got, clip_per_sample(m.per_sample_grads(W, X, y), 0.3, "l2"), rtol=1e-12, atol=0)


def test_functional_call_matches_the_module():
    """The reference itself: autograd through functional_call is the module's own backward."""
    m, W, X, y = setup(group_norm_net, (2, 8, 8), 5, R=1, B=2)
    net = m.module
    for p, v in zip(net.parameters(), m.unflatten(W[0]).values(), strict=True):
        p.data.copy_(v)
    out = functional_call(net, m.unflatten(W[0]), (X[0].view(2, 2, 8, 8),))
    assert torch.equal(out, net(X[0].view(2, 2, 8, 8)))


@pytest.mark.parametrize("path", ["loop", "vmap"])
def test_both_agent_batchings_give_autograds_values(path):
    """Conv models on CPU loop over agents; vmap elsewhere (CUDA)."""
    m, W, X, y = setup(group_norm_net, (2, 8, 8), 5)
    if path == "vmap":
        m.loop_on_cpu = False
    check(m, W, X, y)
