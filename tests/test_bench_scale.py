"""benchmarks/bench_scale.py's limit line: the scenario's arithmetic as arrays, checked against the per-agent math."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_scale.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_scale", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_limit_round_is_dpsgd_on_a_ring(bench):
    """One round of the limit equals Lian et al.'s update agent by agent, in float64 NumPy: the logistic gradient
    of its mini-batch, the mean of its ring neighbourhood, the step."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    n, m, d, batch, lr = 5, 7, 3, 4, 0.5
    W = rng.normal(size=(n, d + 1))
    X, y = rng.normal(size=(n * m, d)), (rng.random(n * m) < 0.5).astype(float)
    rows = np.arange(n)[:, None] * m + rng.integers(0, m, (n, batch))
    got = bench.limit_round(torch.tensor(W), torch.tensor(X), torch.tensor(y), torch.tensor(rows), lr).numpy()
    for i in range(n):
        xb, yb = X[rows[i]], y[rows[i]]
        r = 1.0 / (1.0 + np.exp(-(xb @ W[i, :d] + W[i, d]))) - yb
        g = np.concatenate([r @ xb / batch, [r.mean()]])
        want = (W[i - 1] + W[i] + W[(i + 1) % n]) / 3.0 - lr * g
        np.testing.assert_allclose(got[i], want, rtol=1e-12, atol=1e-12)


def test_limit_learns_the_scenarios_task(bench):
    """100 rounds of the limit reach the accuracy the simulated scenario reaches (~0.97 on its synthetic data)."""
    pytest.importorskip("torch")
    r = bench.limit(40, 100, 1, device="cpu")
    assert r["accuracy"] > 0.9
    assert r["steps"] == 4000 and r["events"] == 0


def test_against_a_folder_that_is_no_checkout_is_refused_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), "--agents", "10", "--against", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert f"--against {tmp_path}: not a netsim checkout" in done.stderr.strip().splitlines()[-1]
