"""Batch-invariant logistic gradients (``model.batch_invariant``): a request's bits do not depend on which
requests share its call, so asynchronous windowed runs batch a whole step of a window and still write the
events engine's bytes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given
from hypothesis import strategies as st

import netsim
from netsim.compute.models import LogisticRegression
from netsim.scenario import scenario_from_dict
from tests.search import search
from tests.test_windowed import async_gossip, both_engines, identical


def invariant_pair(tmp_path, sc: dict) -> tuple[dict, dict, dict | None]:
    """Both engines; the events engine's summary after checking the bytes and models, the gradient calls of
    each (how the gradients were batched: the one thing the engines may differ in), the windows' summary."""
    got = both_engines(tmp_path, sc)
    return identical(got), {e: got[e]["calls"] for e in got}, got["windowed"]["windows"]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().numpy().tobytes()


@search(60)
@example(R=2, B=33, d=123, dtype=torch.float64, threads=1, bias=False, l2=0.0, clip=None, seed=33)  # MKL's bmm,
@example(R=2, B=33, d=123, dtype=torch.float32, threads=1, bias=False, l2=0.0, clip=None, seed=0)  # AVX-512 CPUs
@example(R=1, B=40000, d=1, dtype=torch.float64, threads=2, bias=True, l2=0.0, clip=None, seed=5)  # one output:
@example(R=2, B=3, d=40000, dtype=torch.float32, threads=2, bias=True, l2=0.0, clip=("l2", 0.5), seed=7)  # threads
@given(R=st.sampled_from([1, 2, 3, 17, 130, 600]), B=st.sampled_from([1, 2, 5, 7, 33]),
       d=st.sampled_from([1, 3, 16, 112, 123, 300]), dtype=st.sampled_from([torch.float32, torch.float64]),
       threads=st.sampled_from([1, 2]), bias=st.booleans(), l2=st.sampled_from([0.0, 0.01]),
       clip=st.sampled_from([None, ("l2", 0.5), ("coordinate", 0.1)]), seed=st.integers(0, 2**16))
def test_each_requests_bits_are_its_own_in_any_batch(R, B, d, dtype, threads, bias, l2, clip, seed):
    """Every row of a batched call equals the row evaluated alone and the row at another position (a permuted
    batch), bit for bit, at 1 or 2 threads; sparse rows (exact zeros, signed zero products) included."""
    g = torch.Generator().manual_seed(seed)
    X = (torch.randn(R, B, d, generator=g) * (torch.rand(R, B, d, generator=g) < 0.3)).to(dtype)
    W = (torch.randn(R, d + bias, generator=g) * 3).to(dtype)
    y = (torch.rand(R, B, generator=g) < 0.5).to(dtype)
    model = LogisticRegression(d, l2=l2, bias=bias, batch_invariant=True)
    kw = {} if clip is None else {"clip": clip[1], "clip_kind": clip[0]}
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        G = model.grad(W, X, y, **kw)
        perm = torch.randperm(R, generator=g)
        assert _bits(model.grad(W[perm], X[perm], y[perm], **kw)) == _bits(G[perm])
        for i in {0, R // 2, R - 1}:
            assert _bits(model.grad(W[i:i + 1], X[i:i + 1], y[i:i + 1], **kw)[0]) == _bits(G[i])
    finally:
        torch.set_num_threads(old)
    # and the same gradient as the default path, to round-off
    ref = LogisticRegression(d, l2=l2, bias=bias).grad(W, X, y, **kw)
    assert torch.allclose(G, ref, rtol=1e-4 if dtype == torch.float32 else 1e-10, atol=1e-6)


def _fold(v: list[float], dtype) -> float:
    """``row_sum``'s order written out over scalars of ``dtype`` (numpy rounds each addition as the CPU does)."""

    v = [dtype(x) for x in v]
    while len(v) > 1:
        n, h = len(v), len(v) // 2
        s = [v[i] + v[n - h + i] for i in range(h)]
        if n % 2:
            s[0] = s[0] + v[h]
        v = s
    return v[0] if v else dtype(0.0)


@search(40)
@given(n=st.integers(0, 70), rows=st.integers(1, 9), dtype=st.sampled_from([torch.float32, torch.float64]),
       seed=st.integers(0, 2**16), inplace=st.booleans())
def test_row_sum_adds_in_its_stated_order_whatever_the_batch(n, rows, dtype, seed, inplace):
    """Every row's ``row_sum`` is the fold written out with scalar additions, bit for bit, over either
    dimension, so it cannot depend on the other rows, the batch's size or a CPU's vector width."""
    import numpy as np

    from netsim.compute.exact import row_mean, row_sum

    g = torch.Generator().manual_seed(seed)
    X = (torch.randn(rows, n, 3, generator=g) * 10 ** torch.randint(-6, 6, (rows, n, 3), generator=g)).to(dtype)
    npd = np.float32 if dtype == torch.float32 else np.float64
    for dim in (1, 2):
        got = row_sum(X.clone() if inplace else X, dim, inplace=inplace)
        for r in range(rows):
            for c in range(got.shape[1]):
                v = (X[r, :, c] if dim == 1 else X[r, c, :]).tolist()
                assert got[r, c].item() == _fold(v, npd)
    if n:
        assert _bits(row_mean(X, 1)) == _bits(row_sum(X, 1) / n)


def test_the_default_path_is_not_batch_invariant():
    """Why the option exists: the same request alone and inside a batch rounds differently by default."""
    g = torch.Generator().manual_seed(3)
    R, B, d = 600, 5, 112
    X, W = torch.randn(R, B, d, generator=g), torch.randn(R, d + 1, generator=g)
    y = (torch.rand(R, B, generator=g) < 0.5).float()
    model = LogisticRegression(d)
    G = model.grad(W, X, y)
    alone = torch.stack([model.grad(W[i:i + 1], X[i:i + 1], y[i:i + 1])[0] for i in range(R)])
    assert not torch.equal(alone, G) and torch.allclose(alone, G, atol=1e-5)


@search(8, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=async_gossip())
def test_lookahead_windows_with_batch_invariant_gradients_write_the_engines_bytes(tmp_path_factory, sc):
    """Windows that evaluate every step's gradients in one call (not the engine's batches) still give the events
    engine's trace, metrics and final models."""
    from hypothesis import assume

    from netsim.api import prepare
    from netsim.errors import InputError

    sc["model"]["batch_invariant"] = True
    try:
        prepare(scenario_from_dict(sc))
    except InputError as e:
        assume("topology" not in str(e))
        raise
    summary, calls, _ = invariant_pair(tmp_path_factory.mktemp("inv"), sc)
    assert summary["gradients"] >= calls["events"]


def test_the_benchmark_job_batches_whole_steps(tmp_path):
    """The asynchronous benchmark's job, small, as a user writes it (no model option: "auto" resolves to the
    invariant gradient for agents on their own clocks): one gradient call per window step, far fewer than the
    engine's."""
    sc = {"name": "inv", "run": {"seed": 2, "until": 4.0},
          "agents": {"count": 300, "compute_time": {"kind": "constant", "value": 0.001},
                     "activation": {"kind": "poisson", "rate": 1.0},
                     "clock_drift": {"kind": "uniform", "low": -0.01, "high": 0.01}},
          "topology": {"kind": "random_regular", "degree": 4},
          "network": {"latency": {"kind": "uniform", "low": 0.05, "high": 0.5}, "loss": 0.1},
          "data": {"kind": "synthetic", "samples": 1500, "features": 20, "partition": "iid"},
          "model": {"kind": "logistic"},
          "algorithm": {"name": "push_gossip", "lr": 1.0, "batch": 0},
          "evaluation": {"every": 2.0, "metrics": ["accuracy", "agent_accuracy"]}}
    assert scenario_from_dict(sc).model.batch_invariant is True
    summary, calls, windows = invariant_pair(tmp_path, sc)
    assert windows["windows"] > 0 and summary["gradients"] > 100
    assert calls["windowed"] * 2 < calls["events"]


def test_batch_invariant_is_a_logistic_option(tmp_path):
    from netsim.errors import InputError

    sc = {"name": "x", "run": {"until": 1.0}, "agents": {"count": 4},
          "data": {"kind": "synthetic", "samples": 40, "features": 3},
          "model": {"kind": "mlp", "batch_invariant": True}, "algorithm": {"name": "push_gossip"}}
    with pytest.raises(InputError, match="batch_invariant"):
        netsim.run(scenario_from_dict(sc), out=tmp_path / "run")


@pytest.mark.parametrize("agents, model, resolved", [
    ({}, {}, False),  # periodic wakes on identical clocks: synchronous rounds batch every request already
    ({"activation": {"kind": "poisson", "rate": 1.0}}, {}, True),
    ({"activation": {"kind": "bernoulli", "period": 1.0, "p": 0.5}}, {}, False),  # those that wake, together
    ({"activation": {"kind": "bernoulli", "period": 1.0, "p": 0.5},
      "clock_drift": {"kind": "uniform", "low": -0.01, "high": 0.01}}, {}, True),
    ({"clock_drift": {"kind": "uniform", "low": -0.01, "high": 0.01}}, {}, True),
    ({"clock_offset": {"kind": "uniform", "low": 0.0, "high": 1.0}}, {}, True),
    ({"clock_jitter": {"kind": "uniform", "low": 0.0, "high": 0.1}}, {}, True),
    ({"compute_time": {"kind": "uniform", "low": 0.0, "high": 0.1}}, {}, False),  # asked for together all the same
    ({"activation": {"kind": "poisson", "rate": 1.0}}, {"batch_invariant": False}, False),  # what a user sets stays
    ({}, {"batch_invariant": True}, True),
    ({"activation": {"kind": "poisson", "rate": 1.0}}, {"kind": "mlp"}, "auto"),  # no invariant path: not resolved
])
def test_auto_is_resolved_from_how_the_agents_wake_and_written_in_the_resolved_text(agents, model, resolved):
    """``model.batch_invariant = "auto"`` (the default) is decided by the scenario, never by the engine: both
    engines build the same model. The resolved text says the value, and a synchronous scenario's text is what it
    was before "auto" (``batch_invariant = false``), so its sha256 and run folders are unchanged."""
    from netsim.scenario.load import to_toml

    sc = scenario_from_dict({"name": "x", "run": {"until": 1.0}, "agents": {"count": 4, **agents},
                             "data": {"kind": "synthetic", "samples": 40, "features": 3},
                             "model": {"kind": "logistic", **model}, "algorithm": {"name": "push_gossip"}})
    assert sc.model.batch_invariant == resolved and type(sc.model.batch_invariant) is type(resolved)
    text = to_toml(sc)
    if resolved != "auto":
        assert f"batch_invariant = {str(resolved).lower()}" in text
    else:
        assert "batch_invariant" not in text
    import tomllib

    assert scenario_from_dict(tomllib.loads(text)) == sc


def test_the_kept_buffers_give_each_call_its_own_bits():
    """The invariant path keeps its buffers between calls of one shape (its additions planned once): a call after
    others of the same and other shapes gives the bits of a fresh model's first call."""
    g = torch.Generator().manual_seed(4)
    model = LogisticRegression(7, l2=0.01, batch_invariant=True)
    for R, B in [(3, 2), (1, 5), (3, 2), (2, 3), (3, 2)]:
        X, W = torch.randn(R, B, 7, generator=g), torch.randn(R, 8, generator=g)
        y = (torch.rand(R, B, generator=g) < 0.5).float()
        for kw in ({}, {"clip": 0.5}):
            fresh = LogisticRegression(7, l2=0.01, batch_invariant=True).grad(W, X, y, **kw)
            assert _bits(model.grad(W, X, y, **kw)) == _bits(fresh)
    assert (3, 2, torch.float32, X.device) in model._work


def test_a_long_request_is_evaluated_alone_with_the_one_request_ops():
    """A request of at least ``ALONE_ELEMENTS`` values takes the 2-D ops a lone request takes by default (BLAS: ~4x
    faster than the fold there), alone whatever shares its call: the default's bits for it, in any batch."""
    g = torch.Generator().manual_seed(5)
    d, B = 64, LogisticRegression.ALONE_ELEMENTS // 64
    X, W = torch.randn(3, B, d, generator=g), torch.randn(3, d + 1, generator=g)
    y = (torch.rand(3, B, generator=g) < 0.5).float()
    inv, default = LogisticRegression(d, l2=0.01, batch_invariant=True), LogisticRegression(d, l2=0.01)
    for kw in ({}, {"clip": 0.5}):
        G = inv.grad(W, X, y, **kw)
        for i in range(3):
            assert _bits(G[i]) == _bits(default.grad(W[i:i + 1], X[i:i + 1], y[i:i + 1], **kw)[0])
    short = inv.grad(W[:, :], X[:, :B - 1], y[:, :B - 1])  # one row less: the fold, as close as round-off
    torch.testing.assert_close(short, default.grad(W, X[:, :B - 1], y[:, :B - 1]), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("d", [112, 123, 300])
def test_a_long_requests_bits_do_not_depend_on_where_its_rows_lie(d):
    """BLAS peels elements up to an aligned address, so its sums depend on where a request's w and x start; a
    request's rows sit at another offset in each batch (and in the bank), so each is read from aligned memory:
    a request at any position of any batch has the bits of the same request alone in fresh memory."""
    R, B = 5, LogisticRegression.ALONE_ELEMENTS // d + 7  # a long request (evaluated alone), rows of 452+ bytes
    model = LogisticRegression(d, l2=0.0, bias=True, batch_invariant=True)
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        X = (torch.rand(R, B, d, generator=g) < 0.2).float()  # mushrooms-like 0/1 features
        W = torch.randn(R, d + 1, generator=g) * 0.1
        y = (torch.rand(R, B, generator=g) < 0.5).float()
        G = model.grad(W, X, y)
        perm = torch.randperm(R, generator=g)
        assert _bits(model.grad(W[perm], X[perm], y[perm])) == _bits(G[perm])
        for i in range(R):
            alone = model.grad(W[i:i + 1].clone(), X[i:i + 1].clone(), y[i:i + 1].clone())[0]
            assert _bits(alone) == _bits(G[i]), (seed, i)


@search(30)
@given(rows=st.integers(1, 40), n=st.sampled_from([1, 3, 11, 64, 1000]), bound=st.sampled_from([0.1, 1.0, 2.5]),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16))
def test_a_batchs_clip_is_each_rows_clip_bit_for_bit(rows, n, bound, dtype, seed):
    """``Batch.clip`` of many rows (``clip_l2_rows``: their norms in one call) gives each row the bits of ``clip_l2`` on
    that row alone: the events engine's batch of one. Norms of many magnitudes, below and above the bound."""
    from netsim.privacy.mechanisms import clip_l2
    from netsim.rounds.kernel import Batch

    g = torch.Generator().manual_seed(seed)
    X = (torch.randn(rows, n, generator=g, dtype=torch.float64)
         * 10 ** torch.randint(-4, 3, (rows, 1), generator=g)).to(dtype)
    b = Batch([None] * rows, 0, X, None, None)
    assert _bits(b.clip(X, bound)) == _bits(torch.stack([clip_l2(r, bound) for r in X.unbind(0)]))
