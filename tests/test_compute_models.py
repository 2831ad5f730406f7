"""Every fast path of the model zoo against a per-agent autograd reference (float64, tight tolerance),
and per-sample clipping against the nested-vmap reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from netsim.compute.models import (
    MLP,
    LogisticRegression,
    ResNet18,
    TorchModel,
    build_model,
    clip_per_sample,
    mlp_module,
    small_cnn,
    vgg11,
)
from netsim.errors import InputError
from netsim.scenario.schema import ModelSpec

D = torch.float64
TOL = dict(rtol=1e-10, atol=1e-12)


def data(R=3, B=6, d=7, C=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(R, B, d, generator=g, dtype=D)
    y = torch.randint(0, C, (R, B), generator=g)
    return X, y


def rand_rows(model, R, seed=1, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(R, model.size, generator=g, dtype=D) * scale


def per_agent(loss_fn, W, X, y):
    """The plain reference: one autograd call per agent."""
    out = []
    for r in range(W.shape[0]):
        w = W[r].clone().requires_grad_(True)
        (g,) = torch.autograd.grad(loss_fn(w, X[r], y[r]), w)
        out.append(g)
    return torch.stack(out)


def logistic_loss(l2):
    def f(w, X, y):
        z = X @ w[:-1] + w[-1]
        return F.softplus(-(2 * y - 1).to(D) * z).mean() + l2 / 2 * (w[:-1] ** 2).sum()
    return f


def mlp_loss(dims, l2):
    def f(w, X, y):
        a, off = X, 0
        pen = 0.0
        for k, (i, o) in enumerate(zip(dims[:-1], dims[1:], strict=False)):
            Wk = w[off:off + o * i].view(o, i)
            b = w[off + o * i:off + o * i + o]
            off += o * i + o
            pen = pen + (Wk ** 2).sum()
            a = F.linear(a, Wk, b)
            if k < len(dims) - 2:
                a = torch.relu(a)
        return F.cross_entropy(a, y) + l2 / 2 * pen
    return f


def test_logistic_matches_autograd():
    X, y = data(C=2)
    m = LogisticRegression(7, l2=0.1)
    W = rand_rows(m, 3)
    ref = per_agent(logistic_loss(0.1), W, X, y)
    torch.testing.assert_close(m.grad(W, X, y), ref, **TOL)
    for r in range(3):  # the single-request path
        torch.testing.assert_close(m.grad(W[r:r + 1], X[r:r + 1], y[r:r + 1]), ref[r:r + 1], **TOL)


@pytest.mark.parametrize("hidden", [(), (5,), (6, 5)])
def test_mlp_and_multinomial_match_autograd(hidden):
    X, y = data()
    m = MLP(7, 4, hidden, l2=0.05)
    W = rand_rows(m, 3)
    ref = per_agent(mlp_loss(m.dims, 0.05), W, X, y)
    torch.testing.assert_close(m.grad(W, X, y), ref, **TOL)
    generic = TorchModel(mlp_module(m.dims).to(D), l2=0.05)
    assert generic.size == m.size
    torch.testing.assert_close(generic.grad(W, X, y), ref, **TOL)


def test_cnn_generic_path_matches_module_backward():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(2, 3, 16 * 16, generator=g, dtype=D)
    y = torch.randint(0, 10, (2, 3), generator=g)
    net = small_cnn(1, 10, 16).to(D)
    m = TorchModel(net, (1, 16, 16), l2=0.01)
    W = rand_rows(m, 2, scale=0.2)
    ref = []
    for r in range(2):
        params = m.unflatten(W[r].clone())
        for p in params.values():
            p.requires_grad_(True)
        loss = F.cross_entropy(functional_call(net, params, (X[r].view(-1, 1, 16, 16),)), y[r])
        loss = loss + 0.01 / 2 * sum((p ** 2).sum() for p in params.values() if p.dim() > 1)
        grads = torch.autograd.grad(loss, list(params.values()))
        ref.append(torch.cat([t.flatten() for t in grads]))
    assert m.loop_on_cpu
    torch.testing.assert_close(m.grad(W, X, y), torch.stack(ref), **TOL)
    m.loop_on_cpu = False  # the vmap path (CUDA's) gives the same
    torch.testing.assert_close(m.grad(W, X, y), torch.stack(ref), **TOL)
    per = m.per_sample_grads(W, X, y)  # and the nested-vmap per-sample gradients average to it
    torch.testing.assert_close(per.mean(1) + m.penalty_grad(W), torch.stack(ref), **TOL)


def test_logistic_clipping_matches_per_sample_loop():
    X, y = data(C=2, B=8)
    m = LogisticRegression(7, l2=0.1)
    W = rand_rows(m, 3, scale=2.0)
    per = torch.stack([torch.stack([per_agent(logistic_loss(0.0), W[r:r + 1], X[r:r + 1, b:b + 1],
                                              y[r:r + 1, b:b + 1])[0] for b in range(8)]) for r in range(3)])
    pen = torch.cat([0.1 * W[:, :-1], torch.zeros(3, 1, dtype=D)], 1)
    for kind, c in (("l2", 0.3), ("coordinate", 0.05)):
        ref = clip_per_sample(per, c, kind) + pen
        torch.testing.assert_close(m.grad(W, X, y, clip=c, clip_kind=kind), ref, **TOL)
        for r in range(3):  # the single-request path
            one = m.grad(W[r:r + 1], X[r:r + 1], y[r:r + 1], clip=c, clip_kind=kind)
            torch.testing.assert_close(one, ref[r:r + 1], **TOL)
    # a clip so large that nothing is clipped gives back the plain gradient
    torch.testing.assert_close(m.grad(W, X, y, clip=1e9), m.grad(W, X, y), **TOL)


@pytest.mark.parametrize("hidden", [(), (5,), (6, 5)])
@pytest.mark.parametrize("kind,c", [("l2", 0.2), ("coordinate", 0.01)])
def test_mlp_clipping_matches_nested_vmap(hidden, kind, c):
    X, y = data(B=8)
    m = MLP(7, 4, hidden, l2=0.05)
    W = rand_rows(m, 3)
    generic = TorchModel(mlp_module(m.dims).to(D), l2=0.05)
    per = generic.per_sample_grads(W, X, y)
    assert per.shape == (3, 8, m.size)
    # the nested-vmap per-sample gradients average back to the batch gradient
    torch.testing.assert_close(per.mean(1) + generic.penalty_grad(W), m.grad(W, X, y), **TOL)
    ref = clip_per_sample(per, c, kind) + generic.penalty_grad(W)
    got = m.grad(W, X, y, clip=c, clip_kind=kind)
    torch.testing.assert_close(got, ref, **TOL)
    torch.testing.assert_close(generic.grad(W, X, y, clip=c, clip_kind=kind), ref, **TOL)
    for cap in (2 * m.size * 8, 3 * m.size):  # memory-capped chunking: by agents, then by samples
        got_chunked = generic.clipped_mean(W, X, y, c, kind, max_entries=cap) + generic.penalty_grad(W)
        torch.testing.assert_close(got_chunked, ref, **TOL)
    # clipping really bites at this C: the result differs from the unclipped gradient
    assert not torch.allclose(got, m.grad(W, X, y))


def test_clipped_per_sample_norms_are_bounded():
    X, y = data(B=8)
    generic = TorchModel(mlp_module([7, 5, 4]).to(D))
    W = rand_rows(generic, 3)
    per = generic.per_sample_grads(W, X, y)
    s = (0.2 / per.norm(dim=2)).clamp(max=1)
    assert ((per * s.unsqueeze(-1)).norm(dim=2) <= 0.2 + 1e-12).all()


@pytest.mark.parametrize("hidden", [(), (5,), (6, 5)])
def test_evaluate_matches_per_agent_loss(hidden):
    X, y = data(R=1, B=50)
    m = MLP(7, 4, hidden, l2=0.05)
    W = rand_rows(m, 3)
    loss, acc = m.evaluate(W, X[0], y[0])
    ref = torch.stack([mlp_loss(m.dims, 0.05)(W[r], X[0], y[0]) for r in range(3)])
    torch.testing.assert_close(loss, ref, **TOL)
    logits = [mlp_module(m.dims).to(D) for _ in range(3)]
    for r, net in enumerate(logits):
        torch.nn.utils.vector_to_parameters(W[r], net.parameters())
    ref_acc = torch.stack([(net(X[0]).argmax(1) == y[0]).to(D).mean() for net in logits])
    torch.testing.assert_close(acc, ref_acc, **TOL)
    generic = TorchModel(mlp_module(m.dims).to(D), l2=0.05, eval_chunk=7)
    l2_, a2 = generic.evaluate(W, X[0], y[0])
    torch.testing.assert_close(l2_, ref, **TOL)
    torch.testing.assert_close(a2, acc, **TOL)


def test_init_is_seeded_and_identical_across_agents():
    m = MLP(7, 4, (5,))
    a = m.init(3, D, torch.device("cpu"), seed=5)
    assert torch.equal(a, m.init(3, D, torch.device("cpu"), seed=5))
    assert not torch.equal(a, m.init(3, D, torch.device("cpu"), seed=6))
    assert torch.equal(a[0], a[2]) and a.abs().max() <= 1 / 5 ** 0.5
    assert not MLP(7, 4).init(2, D, torch.device("cpu")).any()  # multinomial starts at 0


@pytest.mark.parametrize("net", [vgg11, ResNet18])
def test_cifar_models_construct_and_step(net):
    m = TorchModel(net(3, 10), (3, 32, 32))
    W = m.init(2, torch.float32, torch.device("cpu"), seed=0)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2, 2, 3 * 32 * 32, generator=g)
    y = torch.randint(0, 10, (2, 2), generator=g)
    G = m.grad(W, X, y)
    assert G.shape == W.shape and torch.isfinite(G).all() and G.abs().sum() > 0
    loss, acc = m.evaluate(W, X[0], y[0])
    assert loss.shape == (2,) and torch.isfinite(loss).all()


def test_build_model_errors():
    with pytest.raises(InputError, match="model.kind.*binary"):
        build_model(ModelSpec("logistic"), 5, 10)
    with pytest.raises(InputError, match="needs image data"):
        build_model(ModelSpec("cnn"), 5, 10)
    with pytest.raises(InputError, match="32x32 images"):
        build_model(ModelSpec("vgg11"), 784, 10, shape=(1, 28, 28))
    with pytest.raises(InputError, match="model.kind: unknown model 'nope'; registered: cnn, logistic"):
        build_model(ModelSpec("nope"), 5, 2)
    with pytest.raises(InputError, match="model.width: unknown key for model 'mlp'; allowed keys here: kind, "):
        build_model(ModelSpec("mlp", params={"width": 3}), 5, 2)
    assert build_model(ModelSpec("mlp", hidden=(64,)), 784, 10).size == 784 * 64 + 64 + 64 * 10 + 10


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias, l2", [(True, 0.0), (False, 0.01), (True, 0.1)])
def test_logistic_evaluate_is_the_formula_bit_for_bit(dtype, bias, l2):
    """The figures of every row (its loss and accuracy on the test rows) are the bits of the formula written out of
    place with ``compute.exact``'s fixed-order means, whatever the evaluation does in place; labels other than 0 and
    1 count as misses; one agent or many, test rows odd or even."""
    from netsim.compute.exact import row_mean, row_sum

    g = torch.Generator().manual_seed(3)
    m = LogisticRegression(9, l2=l2, bias=bias)
    for R, n in ((1, 13), (40, 64), (7, 257)):
        W = torch.randn(R, m.size, generator=g, dtype=dtype)
        X = torch.randn(n, 9, generator=g, dtype=dtype)
        y = (torch.rand(n, generator=g) > 0.5).to(dtype)
        y[0] = 0.5  # not a label: never predicted
        z = X @ W[:, :9].T + (W[:, 9] if bias else 0)
        s = (2 * y - 1).unsqueeze(1).to(dtype)
        loss = row_mean(F.softplus(-s * z), 0) + l2 / 2 * row_sum(W[:, :9] ** 2, 1)
        acc = row_mean(((z > 0).to(dtype) == y.unsqueeze(1)).to(dtype), 0)
        got = m.evaluate(W, X, y)
        assert torch.equal(got[0], loss) and torch.equal(got[1], acc)
        assert got[0].dtype == dtype and got[1].shape == (R,)
        assert float(acc.max()) <= (n - 1) / n  # row 0 is a miss for every agent
