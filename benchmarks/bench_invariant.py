"""What batch invariance costs: the logistic gradient's invariant path against its default path, and MKL settings.

    .venv/bin/python benchmarks/bench_invariant.py [--threads 1] [--repeat 15]

Part 1, in this process, interleaved (each figure the best of ``--repeat`` calls, ratios measured in one run): for
a few (agents R, batch B, features d) shapes, the default gradient (``model.batch_invariant = false``: 2-D ops for
one request, a batched ``bmm`` for many), the invariant gradient (elementwise products, ``compute.exact.row_sum``,
the sigmoid's scalar loop) and, as a reference, the invariant formula as it was with a batched ``bmm`` (not
batch-invariant on AVX-512 machines: a row alone rounded differently than in a batch of two).

Part 2, in fresh interpreters (MKL reads its settings once): the default gradient of an MLP 784-64-10 and a
logistic evaluation on 8,124 rows, with ``MKL_CBWR`` unset, ``AUTO`` and ``COMPATIBLE`` (the setting that gives
MKL the same bits on every x86 CPU), as ratios to unset.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as netsim/__init__.py does; before torch loads

import argparse
import json
import subprocess
import sys
import time

SHAPES = [(2000, 4, 112), (10000, 1, 112), (2000, 33, 123), (500, 64, 300), (1, 512, 112), (1, 1, 112)]


def best_ms(f, repeat: int) -> float:
    f()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def gradients(repeat: int) -> None:
    import torch

    from netsim.compute.models import LogisticRegression, _sigmoid_each

    def bmm_formula(m, W, X, y):  # the invariant path before compute.exact: sums by ``sum`` and ``bmm``
        d = m.d
        r = _sigmoid_each((X * W[:, :d].unsqueeze(1)).sum(2) + W[:, d:]) - y
        g = torch.empty_like(W)
        g[:, :d] = torch.bmm(r.unsqueeze(1), X).squeeze(1) / X.shape[1]
        g[:, d] = r.mean(1)
        return g

    print(f"{'R x B x d':>18} {'dtype':>8} {'default ms':>11} {'invariant ms':>13} {'bmm formula ms':>15} "
          f"{'inv/default':>12} {'inv/bmm':>8}")
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for R, B, d in SHAPES:
            X = torch.randn(R, B, d, generator=g).to(dtype)
            W = torch.randn(R, d + 1, generator=g).to(dtype)
            y = (torch.rand(R, B, generator=g) < 0.5).to(dtype)
            inv, dflt = LogisticRegression(d, batch_invariant=True), LogisticRegression(d)
            calls = {"default": lambda a=(W, X, y), m=dflt: m.grad(*a),
                     "invariant": lambda a=(W, X, y), m=inv: m.grad(*a),
                     "bmm": lambda a=(W, X, y), m=inv: bmm_formula(m, *a)}
            t: dict[str, list[float]] = {k: [] for k in calls}
            for _ in range(3):  # interleaved rounds: load on the machine hits all three alike
                for k, f in calls.items():
                    t[k].append(best_ms(f, repeat))
            m = {k: min(v) for k, v in t.items()}
            print(f"{f'{R} x {B} x {d}':>18} {str(dtype)[6:]:>8} {m['default']:11.3f} {m['invariant']:13.3f} "
                  f"{m['bmm']:15.3f} {m['invariant'] / m['default']:12.2f} {m['invariant'] / m['bmm']:8.2f}")


CHILD = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from netsim.compute.models import MLP, LogisticRegression
sys.path.insert(0, sys.argv[3])
from bench_invariant import best_ms
g = torch.Generator().manual_seed(0)
m = MLP(784, 10, (64,)); W = m.init(256, torch.float32, "cpu", 0)
X = torch.randn(256, 32, 784, generator=g); y = torch.randint(0, 10, (256, 32), generator=g)
lr = LogisticRegression(112); W2 = torch.randn(2000, 113, generator=g)
Xe = torch.randn(8124, 112, generator=g); ye = (torch.rand(8124, generator=g) < .5).float()
r = int(sys.argv[2])
print(json.dumps({"mlp_grad": best_ms(lambda: m.grad(W, X, y), r),
                  "logistic_eval": best_ms(lambda: lr.evaluate(W2, Xe, ye), r)}))
"""


def mkl(threads: int, repeat: int) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    got: dict[str, list[dict]] = {"unset": [], "AUTO": [], "COMPATIBLE": []}
    for _ in range(3):  # interleaved
        for setting in got:
            env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
            if setting != "unset":
                env["MKL_CBWR"] = setting
            out = subprocess.run([sys.executable, "-c", CHILD, str(threads), str(repeat), here], env=env,
                                 capture_output=True, text=True, check=True).stdout
            got[setting].append(json.loads(out))
    best = {s: {k: min(r[k] for r in rs) for k in rs[0]} for s, rs in got.items()}
    print(f"\n{'MKL_CBWR':>12} {'MLP grad ms':>12} {'ratio':>6} {'logistic eval ms':>17} {'ratio':>6}")
    for s, b in best.items():
        print(f"{s:>12} {b['mlp_grad']:12.2f} {b['mlp_grad'] / best['unset']['mlp_grad']:6.2f} "
              f"{b['logistic_eval']:17.2f} {b['logistic_eval'] / best['unset']['logistic_eval']:6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, kernels {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s)")
    gradients(args.repeat)
    mkl(args.threads, args.repeat)


if __name__ == "__main__":
    main()
