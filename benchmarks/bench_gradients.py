"""Per-agent autograd loop vs netsim's batched gradient service, in one run on this machine.

    .venv/bin/python benchmarks/bench_gradients.py [--agents 64] [--batch 32] [--threads N] [--device cpu]
                                                   [--clock wall|cpu] [--large-batch 2] [--no-large]

Rows (with their speed-up goals): logistic regression d=112 (>= 30x), MLP 784-64-10 (>= 4x), the small CNN
(agents folded into channels on CPU: >= 1x), and the DP step (per-sample L2 clipping inside the batched
service) against the non-private batched step (<= 3x). VGG-11 and ResNet-18 (GroupNorm, 32x32 inputs, batch
``--large-batch``) have DP and plain rows only (64 module copies would not fit beside other jobs): DP <= 2x.
The loop is what one writes without netsim: one nn.Module per agent, forward, ``loss.backward()``.
netsim's time includes submitting the N requests and the flush (stacking, indexing, one batched call).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as netsim/__init__.py does; before torch loads

import argparse
import statistics
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from netsim.compute import resolve_device
from netsim.compute.gradients import GradientService
from netsim.compute.models import MLP, LogisticRegression, ResNet18, TorchModel, mlp_module, small_cnn, vgg11

CLOCK = time.perf_counter


class _Shaped(nn.Module):
    """A CNN fed flat MNIST rows, as the loop baseline writes it."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x.view(-1, 1, 28, 28))


def calls_for(fn, min_time: float) -> int:
    fn()
    if min_time <= 0:  # slow steps: one warm-up call, then one call per round
        return 1
    t0 = CLOCK()
    fn()
    return max(1, int(min_time / max(CLOCK() - t0, 1e-7)))


def paired(a, b, repeat: int, min_time: float = 0.15) -> tuple[float, float, float]:
    """Median seconds per call of ``a`` and ``b`` and the median of their per-round ratio a/b, timed in
    alternating rounds so that load from other processes hits both alike."""
    na, nb = calls_for(a, min_time), calls_for(b, min_time)
    ta, tb = [], []
    for _ in range(repeat):
        for fn, n, out in ((a, na, ta), (b, nb, tb)):
            t0 = CLOCK()
            for _ in range(n):
                fn()
            out.append((CLOCK() - t0) / n)
    ratio = statistics.median(x / y for x, y in zip(ta, tb, strict=True))
    return statistics.median(ta), statistics.median(tb), ratio


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="cpu: process CPU time, robust when other jobs share the cores (CPU device only)")
    ap.add_argument("--large-batch", type=int, default=2, help="batch of the VGG-11 and ResNet-18 rows")
    ap.add_argument("--no-large", action="store_true", help="leave out the VGG-11 and ResNet-18 rows (minutes)")
    a = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if a.clock == "cpu" else time.perf_counter
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = resolve_device(a.device)
    N, B = a.agents, a.batch
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(0)
    rows = [rng.integers(0, 8000, B) for _ in range(N)]
    idx = [torch.from_numpy(r).to(dev) for r in rows]

    def data(d, classes):
        X = torch.randn(8000, d, generator=gen).to(dev)
        y = torch.randint(0, classes, (8000,), generator=gen).to(dev)
        return X, y

    def service_step(model, X, y, W, clip=None, rows=rows):
        svc = GradientService(model, X, y)

        def step():
            for i in range(N):
                svc.submit(i, W[i], rows[i], clip)
            svc.flush()
            sync(dev)
        return step

    def loop_step(nets, loss_fn, X, y):
        def step():
            out = []
            for i, net in enumerate(nets):
                net.zero_grad(set_to_none=True)
                loss_fn(net(X[idx[i]]), y[idx[i]]).backward()
                out.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
            sync(dev)
            return out
        return step

    results = []  # (name, loop s, netsim s, speed-up, goal, DP s, DP / non-DP)

    def row(name, model, nets, loss_fn, X, y, W, goal, repeat):
        fast = service_step(model, X, y, W)
        t_loop, t_fast, speed = paired(loop_step(nets, loss_fn, X, y), fast, repeat)
        t_dp, _, dp_ratio = paired(service_step(model, X, y, W, clip=1.0), fast, repeat)
        results.append((name, t_loop, t_fast, speed, goal, t_dp, dp_ratio))

    def bce(z, t):
        return F.binary_cross_entropy_with_logits(z.squeeze(-1), t.float())

    X, y = data(112, 2)  # logistic regression, d = 112 (mushrooms' dimension)
    lr = LogisticRegression(112)
    W = torch.randn(N, lr.size, generator=gen).to(dev) * 0.1
    row("logistic d=112", lr, [nn.Linear(112, 1).to(dev) for _ in range(N)], bce, X, y, W, 30.0, a.repeat)
    X, y = data(784, 10)  # MLP 784-64-10
    mlp = MLP(784, 10, (64,))
    W = mlp.init(N, torch.float32, dev, seed=0)
    nets = [mlp_module(mlp.dims).to(dev) for _ in range(N)]
    row("MLP 784-64-10", mlp, nets, F.cross_entropy, X, y, W, 4.0, a.repeat)
    generic = TorchModel(mlp_module(mlp.dims).to(dev))
    row("MLP, generic vmap path", generic, nets, F.cross_entropy, X, y, W, None, 3)
    cnn = TorchModel(small_cnn().to(dev), (1, 28, 28))  # DP: book-keeping clipping (compute/ghost.py)
    W = cnn.init(N, torch.float32, dev, seed=0)
    cnns = [small_cnn().to(dev) for _ in range(N)]
    row("small CNN, generic path", cnn, [_Shaped(c) for c in cnns], F.cross_entropy, X, y, W, 1.0, 3)
    del cnns
    if not a.no_large:  # DP against plain only; each step takes seconds on CPU
        big_rows = [rng.integers(0, 2000, a.large_batch) for _ in range(N)]
        X, y = data(3 * 32 * 32, 10)
        X, y = X[:2000], y[:2000]
        for name, net in (("VGG-11 (GroupNorm)", vgg11()), ("ResNet-18 (GroupNorm)", ResNet18())):
            big = TorchModel(net.to(dev), (3, 32, 32))
            W = big.init(N, torch.float32, dev, seed=0)
            t_dp, t_plain, dp_ratio = paired(service_step(big, X, y, W, clip=1.0, rows=big_rows),
                                             service_step(big, X, y, W, rows=big_rows), 2, min_time=0.0)
            results.append((f"{name}, B={a.large_batch}", None, t_plain, None, None, t_dp, dp_ratio))

    svc = GradientService(lr, *data(112, 2))  # one request at a time (asynchronous runs)
    w0 = torch.zeros(lr.size, device=dev)

    def single():
        svc.submit(0, w0, rows[0])
        svc.flush()
        sync(dev)
    t_single, _, _ = paired(single, single, 3)

    print(f"netsim gradient benchmark: N={N} agents, batch {B}, device {dev}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {a.clock} clock")
    width = max(24, *(len(r[0]) + 1 for r in results))
    head = (f"{'model':<{width}}{'loop ms':>9}{'netsim ms':>11}{'speed-up':>10}{'goal':>7}{'DP ms':>9}"
            f"{'DP/plain':>10}")
    print(head)
    print("-" * len(head))
    for name, tl, tf, speed, goal, td, dp in results:
        g = f">={goal:g}x" if goal else ""
        loop = f"{tl * 1e3:>9.2f}" if tl is not None else f"{'-':>9}"
        up = f"{speed:>9.2f}x" if speed is not None else f"{'-':>10}"
        print(f"{name:<{width}}{loop}{tf * 1e3:>11.1f}{up}{g:>7}{td * 1e3:>9.1f}{dp:>9.2f}x")
    print("DP goal: <= 3x the non-private batched step (VGG-11, ResNet-18: <= 2x). "
          f"One logistic request alone: {t_single * 1e6:.0f} us")
    print("(speed-up and DP/plain: medians of per-round ratios, rounds alternating between the two)")

if __name__ == "__main__":
    main()
