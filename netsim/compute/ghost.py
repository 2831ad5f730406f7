"""Per-sample L2 clipping of any Linear/Conv2d network without per-sample gradients of the whole model.

Book-keeping (Bu et al., "Differentially Private Optimization on Large Model at Small Cost", ICML 2023) on the
ghost-norm idea (Li et al., "Large Language Models Can Be Strong Differentially Private Learners", ICLR 2022):
for a Linear or Conv2d layer, sample b's weight gradient is G_bᵀ A_b, with A_b the layer's input (unfolded into
patches for a convolution, T positions) and G_b the gradient of sample b's loss at the layer's output (T, out).
One forward and one backward of the summed loss give every A and G; from them each sample's gradient norm
(layer by layer: ||G_b||² ||A_b||² when T = 1, else the norm of the small per-layer product) and the clipped
mean  sum_b c_b G_bᵀ A_b / B,  c_b = min(1, C / ||g_b||). No second backward, no (B, P) tensor, and the
per-sample machinery runs once per agent instead of once per sample (the nested-vmap path's cost).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from netsim.compute.models import clip_factors

MAX_LAYER_ENTRIES = 1 << 24  # per-sample weight gradients of one layer held at once (B x out x in·k²)


def supported(module: nn.Module) -> bool:
    """Every module holding parameters is a Linear or an ungrouped Conv2d with numeric padding."""
    for m in module.modules():
        if not any(True for _ in m.parameters(recurse=False)):
            continue
        if isinstance(m, nn.Linear):
            continue
        if isinstance(m, nn.Conv2d) and m.groups == 1 and not isinstance(m.padding, str) \
                and m.padding_mode == "zeros":
            continue
        return False
    return True


def _patches(m: nn.Module, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, G): the layer's input as (B, T, fan_in) and its output gradient as (B, T, out)."""
    if isinstance(m, nn.Conv2d):  # patches as strided views, one copy: 3-4x faster than F.unfold on CPU
        (kh, kw), (sh, sw), (dh, dw), (ph, pw) = m.kernel_size, m.stride, m.dilation, m.padding
        if ph or pw:
            a = F.pad(a, (pw, pw, ph, ph))
        P = a.unfold(2, (kh - 1) * dh + 1, sh).unfold(3, (kw - 1) * dw + 1, sw)[..., ::dh, ::dw]
        A = P.permute(0, 2, 3, 1, 4, 5).reshape(a.shape[0], -1, a.shape[1] * kh * kw)  # F.unfold's order
        return A, g.flatten(2).transpose(1, 2)
    return a.reshape(a.shape[0], -1, a.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])


def clipped_mean(model, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor, clip: float) -> torch.Tensor | None:
    """Mean of L2-clipped per-sample gradients (R, P) of ``model`` (a TorchModel) for every agent, or None
    when a layer's per-sample products would exceed ``MAX_LAYER_ENTRIES`` (the caller's path then). Batched
    over agents by vmap, except convolutions on CPU, which loop over agents (as the plain step does)."""
    from torch.func import vmap

    R, B = X.shape[:2]
    layers = [(name, m) for name, m in model.module.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    for _, m in layers:
        if B * m.weight.shape[0] * m.weight[0].numel() > MAX_LAYER_ENTRIES:
            return None
    shapes = _output_shapes(model, layers, W[0], X[0])

    def one(w: torch.Tensor, x: torch.Tensor, yy: torch.Tensor) -> torch.Tensor:
        return _one_agent(model, layers, shapes, clip, w, x, yy)

    if model.loop_on_cpu and W.device.type == "cpu":
        return torch.stack([one(W[r], X[r], y[r]) for r in range(R)])
    return vmap(one)(W, X, y)


def _hooked(model, layers, w: torch.Tensor, x: torch.Tensor, hook) -> torch.Tensor:
    """The logits of one agent with ``hook(name)`` on every Linear/Conv2d layer."""
    handles = [m.register_forward_hook(hook(name)) for name, m in layers]
    try:
        return model.logits(w, x)
    finally:
        for h in handles:
            h.remove()


def _output_shapes(model, layers, w: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Size]:
    shapes = {}

    def hook(name):
        def keep(_mod, _inp, out):
            shapes[name] = out.shape
        return keep

    with torch.no_grad():
        _hooked(model, layers, w, x, hook)
    return shapes


def _one_agent(model, layers, shapes, clip: float, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One agent's clipped mean: the gradient of the summed loss at zero probes added to every layer's output is
    each sample's output gradient G; the layers' inputs come back beside it."""
    from torch.func import grad

    B = x.shape[0]

    def loss(probes):
        inputs = {}

        def hook(name):
            def probe(_mod, inp, out):
                inputs[name] = inp[0]
                return out + probes[name]
            return probe

        z = _hooked(model, layers, w, x, hook)
        return F.cross_entropy(z, y, reduction="sum"), inputs

    zeros = {name: torch.zeros(shapes[name], dtype=w.dtype, device=w.device) for name, _ in layers}
    gs, inputs = grad(loss, has_aux=True)(zeros)
    parts, sq = [], torch.zeros(B, dtype=w.dtype, device=w.device)
    for name, m in layers:
        A, G = _patches(m, inputs[name], gs[name])
        if A.shape[1] == 1:  # one position: the ghost norm, nothing materialised
            sq = sq + (A * A).sum((1, 2)) * (G * G).sum((1, 2))
        else:
            sq = sq + torch.linalg.vector_norm(torch.bmm(G.mT, A), dim=(1, 2)) ** 2
        Gb = G.sum(1) if m.bias is not None else None
        if Gb is not None:
            sq = sq + (Gb * Gb).sum(1)
        parts.append((name, m, A, G, Gb))
    c = clip_factors(torch.sqrt(sq), clip) / B
    grads = {}
    for name, m, A, G, Gb in parts:
        Gc = G * c[:, None, None]
        grads[f"{name}.weight" if name else "weight"] = (Gc.flatten(0, 1).mT @ A.flatten(0, 1)).reshape(m.weight.shape)
        if Gb is not None:
            grads[f"{name}.bias" if name else "bias"] = (Gb * c[:, None]).sum(0)
    return torch.cat([grads[n].reshape(-1) for n in model.names])
