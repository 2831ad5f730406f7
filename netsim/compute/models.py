"""Models with batched (agents x ...) forward, loss and gradient: the model zoo.

A model sees parameters as a flat row per agent, ``W: (R, P)``; it never knows about agents, time or
events (compute is a service). Every model has the same interface:

- ``size``: P; ``init(n, dtype, device, seed)``: (n, P) rows (all agents start from one draw);
- ``grad(W, X, y, clip=None, clip_kind="l2")``: the mean gradient over each row's batch,
  ``X (R, B, d)``, ``y (R, B)`` integer labels -> ``(R, P)``. With ``clip`` it is the mean of the
  per-sample gradients clipped to L2 norm ``clip`` (``"l2"``, as in DP-SGD, Abadi et al. 2016 Alg. 1)
  or to ``[-clip, clip]`` coordinate-wise (``"coordinate"``). The L2 penalty is data-independent and
  is added after clipping (it costs no privacy);
- ``evaluate(W, X, y)``: loss and accuracy of every row on one shared set ``X (n, d)``.

Fast paths: binary/multinomial logistic regression and the MLP have closed-form batched gradients
(``bmm``) and get per-sample L2 norms without materialising per-sample gradients: for a linear layer
``z = a W^T + b`` the sample-b gradient is ``delta_b a_b^T`` (and ``delta_b``), so its squared norm is
``(||a_b||^2 + 1) ||delta_b||^2`` ("ghost norms", Goodfellow 2015). ``TorchModel`` is the generic path
for any ``nn.Module`` through ``torch.func.functional_call`` + ``vmap(grad)``, with nested vmap for
per-sample gradients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from netsim.compute import model_registry
from netsim.compute.exact import fold, fold_plan, row_mean, row_sum
from netsim.compute.model_checks import ModelData
from netsim.compute.model_registry import (  # noqa: F401 - the registry's names, where plugins import them
    MODEL_PARAMS,
    MODELS,
    ModelFactory,
    model_args,
    model_names,
    register_model,
)
from netsim.errors import InputError
from netsim.scenario.schema import ModelSpec

CLIP_KINDS = ("l2", "coordinate")



def as_copied(t: torch.Tensor) -> bool:
    """Whether ``t`` is laid out as a fresh copy of it would be (contiguous, from a 64-byte boundary, as the CPU
    allocator places a tensor): vector loops, GEMMs and BLAS then meet its rows at the alignment a copy's have, so
    the bits of a call on ``t`` itself are those of a call on the copy."""
    return t.is_contiguous() and t.data_ptr() % 64 == 0


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy of it where it is not laid out as one (``as_copied``): so that a BLAS call reads it
    the same way wherever its rows were."""
    return t if as_copied(t) else t.clone(memory_format=torch.contiguous_format)

def clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """min(1, C / ||g_b||): the per-sample scale of L2 clipping (a zero gradient keeps factor 1)."""
    return (clip / norms.clamp_min(1e-12)).clamp(max=1.0)


def clip_per_sample(G: torch.Tensor, clip: float, kind: str) -> torch.Tensor:
    """Mean over dim 1 of clipped per-sample gradients ``G (R, B, P)`` -> (R, P) (the reference)."""
    if kind == "coordinate":
        return G.clamp(-clip, clip).mean(1)
    s = clip_factors(torch.linalg.vector_norm(G, dim=2), clip)
    return (G * s.unsqueeze(-1)).mean(1)


def _sigmoid_each(z: torch.Tensor) -> torch.Tensor:
    """``sigmoid(z)`` with every value through the same (scalar) loop: read through a strided view, which the
    CPU kernel never vectorises, so no value's bits depend on its position or on the tensor's length."""
    buf = torch.empty(2 * z.numel(), dtype=z.dtype, device=z.device)[::2]
    buf.copy_(z.reshape(-1))
    return torch.sigmoid(buf).view(z.shape)


class _Workspace:
    """The invariant gradient's buffers for one (R, B, d) shape, kept between calls: the products ``P`` with
    ``row_sum``'s additions over d and over B planned on it, the logits in a strided buffer (``_sigmoid_each``'s) and
    the residuals. A small call's cost is its Python calls, not its arithmetic: this halves them."""

    __slots__ = ("P", "over_d", "over_b", "sig", "z", "r", "over_r")

    def __init__(self, R: int, B: int, d: int, dtype: torch.dtype, device: torch.device):
        self.P = torch.empty(R, B, d, dtype=dtype, device=device)
        self.over_d, self.over_b = fold_plan(self.P, 2), fold_plan(self.P, 1)
        self.sig = torch.empty(2 * R * B, dtype=dtype, device=device)[::2]  # read strided: the scalar loop
        self.z = self.sig.view(R, B)
        self.r = torch.empty(R, B, dtype=dtype, device=device)
        self.over_r = fold_plan(self.r, 1)


def _init_rows(n: int, row: torch.Tensor) -> torch.Tensor:
    return row.unsqueeze(0).repeat(n, 1)


def _uniform(shape, fan_in: int, g: torch.Generator, dtype) -> torch.Tensor:
    """PyTorch's default Linear/Conv weight law, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from our generator."""
    b = 1.0 / math.sqrt(fan_in)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).mul_(b).to(dtype)


class LogisticRegression:
    """Binary logistic regression, parameters ``[w (d), b]`` (``bias=False``: ``w`` only, exactly d);
    gradient in closed form, batched.

    loss_i = mean_b log(1 + exp(-s_b z_b)) + l2/2 ||w||^2 with z = x.w (+ b) and s = 2y - 1.

    ``batch_invariant``: each request's gradient has the same bits whichever requests share its call (and in
    whatever position), at any thread count and on any CPU kernel torch dispatches to. The default path does not:
    one request takes 2-D ops (``addmv``), a batch broadcast products and a batched BLAS product whose blocking
    depends on the batch's shape, and ``sigmoid``'s vectorised loop and its scalar tail round differently, so a
    value's bits depend on where it falls in the batch. The invariant path uses only elementwise operations, the
    sigmoid's scalar loop for every value (``_sigmoid_each``) and reductions in a fixed order per row
    (``compute.exact.row_sum``). It is what lets asynchronous windowed runs evaluate a window's gradients in one
    call (rounds/lookahead.py).
    """

    def __init__(self, features: int, l2: float = 0.0, bias: bool = True, batch_invariant: bool = False):
        self.d = features
        self.l2 = l2
        self.bias = bias
        self.size = features + bias
        self.batch_invariant = batch_invariant
        self._work: dict[tuple, _Workspace] = {}  # the invariant path's buffers of small shapes

    WORK_KEPT = 64  # shapes whose buffers are kept (each at most WORK_ELEMENTS products)
    WORK_ELEMENTS = 1 << 16

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_work": {}}

    def _workspace(self, R: int, B: int, dtype: torch.dtype, device: torch.device) -> _Workspace:
        """The buffers of shape (R, B, d): kept for small shapes (called again and again: the engine's requests
        one by one, the windows' steps), made afresh for large ones (their arithmetic dominates)."""
        key = (R, B, dtype, device)
        ws = self._work.get(key)
        if ws is None:
            ws = _Workspace(R, B, self.d, dtype, device)
            if R * B * self.d <= self.WORK_ELEMENTS:
                if len(self._work) >= self.WORK_KEPT:
                    self._work.clear()
                self._work[key] = ws
        return ws

    def init(self, n: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
        return torch.zeros(n, self.size, dtype=dtype, device=device)

    def logits(self, W: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """W: (R, P); X: (R, B, d) -> (R, B). (A broadcast product and sum: CPU bmm of matrix-vector
        products is 3x slower.)"""
        z = (X * W[:, :self.d].unsqueeze(1)).sum(2)
        return z + W[:, self.d:] if self.bias else z

    def grad(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor, clip: float | None = None,
             clip_kind: str = "l2") -> torch.Tensor:
        """Mean gradient over each row's batch: W (R, P), X (R, B, d), y (R, B) in {0, 1} -> (R, P)."""
        if self.batch_invariant:
            return self._grad_each(W, X, y, clip, clip_kind)
        B, d, one = X.shape[1], self.d, float(self.bias)
        if W.shape[0] == 1 and clip_kind == "l2":  # one request: 2-D ops, ~2x faster
            return self._grad_alone(W[0], X[0], y[0], clip).unsqueeze(0)
        z = self.logits(W, X)
        r = torch.sigmoid(z) - y  # dloss/dz_b; sample b: r_b [x_b, 1]
        g = torch.empty_like(W)
        if clip is not None and clip_kind == "coordinate":
            G = r.unsqueeze(-1) * X
            if self.bias:
                G = torch.cat([G, r.unsqueeze(-1)], dim=2)
            g.copy_(G.clamp(-clip, clip).mean(1))
            g[:, :d] += self.l2 * W[:, :d]
            return g
        if clip is not None:
            r = r * clip_factors(r.abs() * torch.sqrt((X * X).sum(2) + one), clip)
        g[:, :d] = torch.bmm(r.unsqueeze(1), X).squeeze(1) / B
        if self.l2:
            g[:, :d] += self.l2 * W[:, :d]
        if self.bias:
            g[:, d] = r.mean(dim=1)
        return g

    def _grad_alone(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, clip: float | None) -> torch.Tensor:
        """One request's gradient with 2-D ops (``addmv``, BLAS products): w (P,), x (B, d), y (B,) -> (P,).
        BLAS's sums depend on where w and x lie (it peels elements to reach an aligned address), and a request's
        rows sit at another offset in each batch: both are read from 64-byte aligned memory, copied where needed."""
        w, x = aligned(w), aligned(x)
        d, B = self.d, x.shape[0]
        z = torch.addmv(w[d:], x, w[:d]) if self.bias else x @ w
        r = torch.sigmoid(z).sub_(y)
        if clip is not None:
            r = r * clip_factors(r.abs() * torch.sqrt((x * x).sum(1) + float(self.bias)), clip)
        gw = (r @ x).div_(B)
        if self.l2:
            gw += self.l2 * w[:d]
        return torch.cat([gw, r.mean().unsqueeze(0)]) if self.bias else gw

    ALONE_ELEMENTS = 1 << 15  # a request of at least this many B x d values: evaluated alone, with 2-D ops

    def _grad_each(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor, clip: float | None,
                   clip_kind: str) -> torch.Tensor:
        """``grad``'s batch-invariant path: the same formulas with elementwise operations and ``row_sum``, the
        (R, B, d) products folded in one buffer. A long request (B x d >= ``ALONE_ELEMENTS``, L2 clipping or
        none) is evaluated alone instead, each through ``_grad_alone``: its bits are its own as well (the choice
        depends on its shape only, never on the other requests), and BLAS streams a long batch ~4x faster than the
        fold, whose per-call cost only pays off for many short requests."""
        d, (R, B) = self.d, X.shape[:2]
        if B * d >= self.ALONE_ELEMENTS and clip_kind == "l2":
            return torch.stack([self._grad_alone(W[i], X[i], y[i], clip) for i in range(R)])
        ws = self._workspace(R, B, X.dtype, X.device)
        w = W[:, :d]
        P = torch.mul(X, w.unsqueeze(1), out=ws.P)
        z = fold(ws.over_d)
        if self.bias:
            torch.add(z, W[:, d:], out=ws.z)
        else:
            ws.z.copy_(z)
        r = torch.sub(torch.sigmoid(ws.sig).view(R, B), y, out=ws.r)  # ``_sigmoid_each``: every value alike
        g = torch.empty_like(W)
        gw = g[:, :d]
        if clip is not None and clip_kind == "coordinate":
            G = torch.mul(r.unsqueeze(-1), X, out=P)
            if self.bias:
                G = torch.cat([G, r.unsqueeze(-1)], dim=2)
            g.copy_(row_sum(G.clamp_(-clip, clip), 1, inplace=True) / B)
            gw += self.l2 * w
            return g
        if clip is not None:
            torch.mul(X, X, out=P)
            r = r * clip_factors(r.abs() * torch.sqrt(fold(ws.over_d) + float(self.bias)), clip)
        torch.mul(r.unsqueeze(-1), X, out=P)
        torch.div(fold(ws.over_b), B, out=gw)
        if self.l2:
            gw += self.l2 * w
        if self.bias:
            g[:, d] = fold(ws.over_r) / B if r is ws.r else row_mean(r, 1)
        return g

    def evaluate(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Loss and accuracy of every row of W on one shared set X (n, d): -> (R,), (R,). The (n, R) values are
        transformed in place (z, then -s z, then its softplus, then folded): the same operations on the same values,
        without a new (n, R) array at each step (at 10,000 agents on 2,000 test rows, 80 MB each)."""
        n = len(X)
        z = X @ W[:, :self.d].T  # (n, R)
        if self.bias:
            z += W[:, self.d]
        acc = row_sum(((z > 0).to(y.dtype) == y.unsqueeze(1)).to(z.dtype), 0, inplace=True) / n
        z *= -(2 * y - 1).unsqueeze(1).to(z.dtype)  # -s z, s = 2y - 1
        torch._C._nn.softplus(z, 1.0, 20.0, out=z)  # ``torch.nn.functional.softplus``'s defaults (beta 1, threshold 20)
        loss = row_sum(z, 0, inplace=True) / n + self.l2 / 2 * row_sum(W[:, :self.d] ** 2, 1)
        return loss, acc


INITS = ("torch", "zero_bias")


class MLP:
    """Fully connected ReLU network with softmax cross-entropy; ``hidden=()`` is multinomial logistic
    regression. Flat layout per layer: weight (out, in) row-major, then bias (out) -- the order of
    ``nn.Sequential(nn.Linear, nn.ReLU, ...).parameters()``, so rows are interchangeable with the
    generic path. ``bias=False``: no biases (exactly d x C parameters for the multinomial model).
    Loss: mean_b CE(z_b, y_b) + l2/2 sum ||weights||^2 (biases are not penalised).

    Gradient by hand-written batched backprop: delta_L = (softmax(z_L) - onehot(y)) / B,
    dW_l = delta_l^T a_{l-1}, db_l = sum_b delta_l, delta_{l-1} = (delta_l W_l) * 1[z_{l-1} > 0].
    """

    def __init__(self, features: int, classes: int, hidden: Sequence[int] = (), l2: float = 0.0,
                 bias: bool = True, init: str = "torch"):
        self.dims = [features, *hidden, classes]
        self.l2 = l2
        self.bias = bias
        self.init_kind = init
        self.slices: list[tuple[int, int, int, int]] = []  # (weight start, bias start, out, in)
        off = 0
        for i, o in zip(self.dims[:-1], self.dims[1:], strict=False):
            self.slices.append((off, off + o * i, o, i))
            off += o * i + o * bias
        self.size = off

    def init(self, n: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
        """Multinomial logistic regression starts at 0 (a convex problem). An MLP's weights are PyTorch's
        Linear default U(+-1/sqrt(fan_in)), drawn layer by layer from a generator seeded by the run; its
        biases the same law (``init = "torch"``) or 0 (``"zero_bias"``)."""
        g = torch.Generator().manual_seed(seed)
        row = torch.zeros(self.size, dtype=dtype)
        if len(self.dims) > 2:
            for w0, b0, o, i in self.slices:
                row[w0:b0] = _uniform((o * i,), i, g, dtype)
                if self.bias and self.init_kind == "torch":
                    row[b0:b0 + o] = _uniform((o,), i, g, dtype)
        return _init_rows(n, row).to(device)

    def layers(self, W: torch.Tensor):
        """Views (R, out, in) and (R, out) (None without biases) of every layer's weight and bias."""
        return [(W[:, w0:b0].unflatten(1, (o, i)), W[:, b0:b0 + o] if self.bias else None)
                for w0, b0, o, i in self.slices]

    def _forward(self, layers, X: torch.Tensor) -> list[torch.Tensor]:
        """Inputs of every layer then the logits: [a_0 = X, a_1, ..., z_L]; X (R, B, d)."""
        acts = [X]
        for k, (w, b) in enumerate(layers):
            z = torch.matmul(acts[-1], w.mT)  # bmm + in-place bias: no (R, B, out) bias copy
            if b is not None:
                z += b.unsqueeze(-2)
            acts.append(z if k == len(layers) - 1 else torch.relu_(z))
        return acts

    def grad(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor, clip: float | None = None,
             clip_kind: str = "l2") -> torch.Tensor:
        layers = self.layers(W)
        acts = self._forward(layers, X)
        B = X.shape[1]
        e = torch.softmax(acts[-1], dim=2)  # per-sample dloss_b/dz_L (not yet divided by B)
        e.scatter_add_(2, y.unsqueeze(-1), torch.full_like(e[..., :1], -1.0))
        deltas = [e]
        for k in range(len(layers) - 1, 0, -1):
            deltas.append(torch.bmm(deltas[-1], layers[k][0]) * (acts[k] > 0))
        deltas.reverse()  # deltas[k]: per-sample dloss/dz of layer k
        G = torch.empty_like(W)
        if clip is not None and clip_kind == "coordinate":
            self._coordinate(G, acts, deltas, clip)
        else:
            if clip is not None:
                one = float(self.bias)
                sq = sum(((a * a).sum(2) + one) * (d * d).sum(2) for a, d in zip(acts, deltas, strict=False))
                s = clip_factors(torch.sqrt(sq), clip).unsqueeze(-1) / B
            else:
                s = 1.0 / B
            for (w0, b0, o, _), a, d in zip(self.slices, acts, deltas, strict=False):
                d = d * s
                # into a fresh contiguous block, then copied into the row: bmm with a strided out= (or a
                # transposed left operand) runs one GEMM per agent, ~4x slower on CPU; the values are the same
                G[:, w0:b0] = torch.bmm(d.mT.contiguous(), a).flatten(1)
                if self.bias:
                    torch.sum(d, 1, out=G[:, b0:b0 + o])
        if self.l2:
            for w0, b0, _, _ in self.slices:
                G[:, w0:b0] += self.l2 * W[:, w0:b0]
        return G

    def _coordinate(self, G: torch.Tensor, acts, deltas, clip: float) -> None:
        """Coordinate-wise clipping needs every per-sample gradient: built layer by layer, in agent
        chunks of at most ~16M entries."""
        R, B = acts[0].shape[:2]
        for (w0, b0, o, i), a, d in zip(self.slices, acts, deltas, strict=False):
            step = max(1, (1 << 24) // (B * o * i))
            for r in range(0, R, step):
                per = d[r:r + step].unsqueeze(-1) * a[r:r + step].unsqueeze(2)  # (r, B, out, in)
                G[r:r + step, w0:b0] = per.clamp_(-clip, clip).mean(1).flatten(1)
            if self.bias:
                G[:, b0:b0 + o] = d.clamp(-clip, clip).mean(1)

    def evaluate(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        layers = self.layers(W)
        R, (o, i) = W.shape[0], self.slices[0][2:]
        # first layer for all agents as one (n, d) x (d, R*o) product: the shared X is never copied R times
        z = (X @ layers[0][0].reshape(R * o, i).T).view(-1, R, o).transpose(0, 1)
        if self.bias:
            z = z + layers[0][1].unsqueeze(1)
        if len(layers) > 1:
            z = self._forward(layers[1:], torch.relu(z))[-1]  # (R, n, C)
        loss = row_mean(F.cross_entropy(z.transpose(1, 2), y.unsqueeze(0).expand(W.shape[0], -1),
                                        reduction="none"), 1)
        if self.l2:
            loss = loss + self.l2 / 2 * sum(row_sum((w ** 2).flatten(1), 1) for w, _ in layers)
        acc = row_mean((z.argmax(2) == y).to(W.dtype), 1)
        return loss, acc


class TorchModel:
    """Any ``nn.Module`` (no buffers that change: use GroupNorm, not BatchNorm) through
    ``torch.func.functional_call``; gradients by ``vmap(grad)`` over agents, per-sample gradients by
    nested vmap. Inputs arrive flat (B, d) and are reshaped to ``shape`` (e.g. (1, 28, 28))."""

    def __init__(self, module: nn.Module, shape: Sequence[int] | None = None, l2: float = 0.0,
                 eval_chunk: int = 1024, init: str = "torch"):
        from torch.func import functional_call

        if any(True for _ in module.buffers()):
            raise ValueError("TorchModel needs a module without buffers (use GroupNorm, not BatchNorm)")
        self.module = module
        self.shape = tuple(shape) if shape else None
        self.l2 = l2
        self.eval_chunk = eval_chunk
        self.init_kind = init
        params = dict(module.named_parameters())
        self.names = list(params)
        self.shapes = [p.shape for p in params.values()]
        self.numels = [p.numel() for p in params.values()]
        self.size = sum(self.numels)
        mods = dict(module.named_modules())
        self.penalised = [p.dim() > 1 for p in params.values()]
        self._norm = [isinstance(mods[n.rsplit(".", 1)[0] if "." in n else ""], (nn.GroupNorm, nn.LayerNorm))
                      for n in self.names]
        self._call = functional_call
        # On CPU vmap over agents is slower than a loop for convolutions (small CNN, 16 agents, batch 32: loop
        # 293 ms, vmap 332 ms); agents folded into channels beat both (compute/folded.py); on CUDA, vmap.
        self.loop_on_cpu = any(isinstance(m, nn.Conv2d) for m in module.modules())
        self.fold: bool | None = None  # whether the folded forward fits this module (checked at first use)
        # L2 clipping by book-keeping (compute/ghost.py); False: nested vmap, the reference
        self.ghost_clipping = True

    def init(self, n: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
        """Weights U(+-1/sqrt(fan_in)) from a generator seeded by the run (PyTorch's Linear/Conv default);
        a layer's bias the same law with its weight's fan_in (``init = "torch"``) or 0 (``"zero_bias"``);
        norm layers' scales 1 and shifts 0."""
        g = torch.Generator().manual_seed(seed)
        parts, fan_in = [], 1
        for name, shape, numel, norm in zip(self.names, self.shapes, self.numels, self._norm, strict=False):
            if norm:
                parts.append(torch.full((numel,), 1.0 if name.endswith("weight") else 0.0, dtype=dtype))
            elif len(shape) > 1:
                fan_in = math.prod(shape[1:])
                parts.append(_uniform((numel,), fan_in, g, dtype))
            elif self.init_kind == "torch":
                parts.append(_uniform((numel,), fan_in, g, dtype))
            else:
                parts.append(torch.zeros(numel, dtype=dtype))
        return _init_rows(n, torch.cat(parts)).to(device)

    def unflatten(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = torch.split(w, self.numels)
        return {n: t.view(s) for n, t, s in zip(self.names, parts, self.shapes, strict=True)}

    def logits(self, w: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """One agent: w (P,), X (B, d) -> (B, C)."""
        if self.shape:
            X = X.reshape(X.shape[0], *self.shape)
        return self._call(self.module, self.unflatten(w), (X,))

    def loss(self, w: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(w, X), y)

    def _sample_loss(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(w, x.unsqueeze(0), y.unsqueeze(0))

    def penalty_grad(self, W: torch.Tensor) -> torch.Tensor:
        mask = torch.cat([torch.full((k,), float(p), dtype=W.dtype, device=W.device)
                          for k, p in zip(self.numels, self.penalised, strict=False)])
        return self.l2 * W * mask

    def per_sample_grads(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(R, B, P) by nested vmap: over agents, then over each agent's samples."""
        from torch.func import grad, vmap

        return vmap(vmap(grad(self._sample_loss), in_dims=(None, 0, 0)))(W, X, y)

    def grad(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor, clip: float | None = None,
             clip_kind: str = "l2") -> torch.Tensor:
        from torch.func import grad, vmap

        if clip is None and self.loop_on_cpu and W.device.type == "cpu":
            from netsim.compute import folded

            if self.folds(W, X):
                G = folded.grad(self, W, X, y)
            else:
                g = grad(self.loss)
                G = torch.stack([g(W[r], X[r], y[r]) for r in range(W.shape[0])])
        elif clip is None:
            G = vmap(grad(self.loss))(W, X, y)
        else:
            G = self.clipped_mean(W, X, y, clip, clip_kind)
        return G + self.penalty_grad(W) if self.l2 else G

    def folds(self, W: torch.Tensor, X: torch.Tensor) -> bool:
        """Whether this conv model runs folded on CPU (compute/folded.py), decided at the first call."""
        if self.fold is None:
            from netsim.compute import folded

            self.fold = folded.fits(self, W, X)
        return self.fold

    def clipped_mean(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor, clip: float, kind: str,
                     max_entries: int = 1 << 26) -> torch.Tensor:
        """Mean of clipped per-sample gradients. L2 clipping goes by book-keeping (compute/ghost.py: per-layer
        norm samplers, no per-sample gradients of the whole model) where it applies; otherwise nested vmap, in
        (agents x samples) chunks of at most ``max_entries`` per-sample gradient entries, so large models (VGG,
        ResNet) fit in memory."""
        if kind == "l2" and self.ghost_clipping:
            from netsim.compute import ghost

            G = ghost.clipped_mean(self, W, X, y, clip)
            if G is not None:
                return G
        R, B = X.shape[:2]
        per_agent = max(1, max_entries // (B * self.size))
        if per_agent >= R:
            return clip_per_sample(self.per_sample_grads(W, X, y), clip, kind)
        out = torch.zeros_like(W)
        if per_agent > 1:
            for r in range(0, R, per_agent):
                s = slice(r, r + per_agent)
                out[s] = clip_per_sample(self.per_sample_grads(W[s], X[s], y[s]), clip, kind)
            return out
        step = max(1, max_entries // self.size)
        for r in range(R):
            for b in range(0, B, step):
                s = slice(b, b + step)
                part = self.per_sample_grads(W[r:r + 1], X[r:r + 1, s], y[r:r + 1, s])
                out[r] += clip_per_sample(part, clip, kind)[0] * part.shape[1]
        return out / B

    def evaluate(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from torch.func import vmap

        loss = torch.zeros(W.shape[0], dtype=W.dtype, device=W.device)
        hits = torch.zeros_like(loss)
        f = vmap(self.logits, in_dims=(0, None))
        with torch.no_grad():
            for s in range(0, X.shape[0], self.eval_chunk):
                z = f(W, X[s:s + self.eval_chunk])  # (R, b, C)
                yy = y[s:s + self.eval_chunk]
                loss += row_sum(F.cross_entropy(z.transpose(1, 2), yy.unsqueeze(0).expand(W.shape[0], -1),
                                                reduction="none"), 1)
                hits += row_sum((z.argmax(2) == yy).to(W.dtype), 1)
        n = X.shape[0]
        loss = loss / n
        if self.l2:
            loss = loss + 0.5 * row_sum(self.penalty_grad(W) * W, 1)  # l2/2 ||weights||^2
        return loss, hits / n


# architectures ------------------------------------------------------------------------------------

def mlp_module(dims: Sequence[int], bias: bool = True) -> nn.Sequential:
    """The nn.Module twin of ``MLP`` (same flat layout), for the generic path and tests."""
    layers: list[nn.Module] = []
    for k, (i, o) in enumerate(zip(dims[:-1], dims[1:], strict=False)):
        layers.append(nn.Linear(i, o, bias=bias))
        if k < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def small_cnn(channels: int = 1, classes: int = 10, side: int = 28) -> nn.Sequential:
    """MNIST CNN: conv5(16)-relu-pool2-conv5(32)-relu-pool2-linear (~21k parameters at 28x28)."""
    s = ((side - 4) // 2 - 4) // 2
    return nn.Sequential(nn.Conv2d(channels, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * s * s, classes))


def _gn(c: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(32, c), c)


def vgg11(channels: int = 3, classes: int = 10) -> nn.Sequential:
    """VGG-11 (Simonyan & Zisserman 2015, config A) for 32x32 inputs, GroupNorm after every conv."""
    cfg = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]
    layers: list[nn.Module] = []
    c = channels
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(c, int(v), 3, padding=1), _gn(int(v)), nn.ReLU()]
            c = int(v)
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(512, classes))


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = _gn(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = _gn(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _gn(cout))
                      if stride != 1 or cin != cout else nn.Sequential())

    def forward(self, x):
        out = torch.relu(self.n1(self.c1(x)))
        return torch.relu(self.n2(self.c2(out)) + self.short(x))


class ResNet18(nn.Module):
    """ResNet-18 (He et al. 2016) in its CIFAR form (3x3 stem, no max-pool), GroupNorm for BatchNorm."""

    def __init__(self, channels: int = 3, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, 64, 3, 1, 1, bias=False), _gn(64), nn.ReLU())
        blocks, c = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [_Block(c, cout, stride), _Block(cout, cout, 1)]
            c = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(512, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# the model registry ---------------------------------------------------------------------------------

@runtime_checkable
class Model(Protocol):
    """The model protocol every run trains through (the closed forms above and ``TorchModel`` follow it):
    rows of flat parameters ``W (R, P)``, one row per agent; labels are integers in [0, classes)."""

    size: int

    def init(self, n: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
        """(n, P) starting rows, drawn from ``seed`` only."""

    def grad(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor, clip: float | None = None,
             clip_kind: str = "l2") -> torch.Tensor:
        """Mean gradient over each row's batch ``X (R, B, d)``, ``y (R, B)`` -> (R, P); with ``clip`` the mean
        of per-sample gradients clipped to L2 norm (``"l2"``) or coordinate-wise (``"coordinate"``)."""

    def evaluate(self, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss and accuracy of every row on one shared set ``X (n, d)`` -> (R,), (R,)."""


def build_model(spec: ModelSpec, features: int, classes: int, shape: Sequence[int] | None = None) -> Model:
    """The model of the scenario's ``[model]`` table for data of ``features`` columns and ``classes`` labels
    (``shape``: image data's (C, H, W)); built-in and plugin kinds alike go through the registry."""
    args = model_registry.model_args(spec)
    data = ModelData(features, classes, tuple(shape) if shape else None, spec)
    made = model_registry.MODELS[spec.kind](args, data)
    if isinstance(made, nn.Module):
        if not spec.bias:
            raise InputError("model.bias", f"only logistic, multinomial and mlp models can drop their biases, "
                                           f"not {spec.kind!r}")
        try:
            return TorchModel(made, data.shape, spec.l2, init=spec.init)
        except ValueError as e:
            raise InputError("model.kind", f"model {spec.kind!r}: {e}") from None
    if not isinstance(made, Model):
        raise InputError("model.kind", f"the factory of model {spec.kind!r} returned {type(made).__name__}, "
                                       "neither a torch.nn.Module nor a model (size, init, grad, evaluate)")
    return made
