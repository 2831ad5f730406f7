"""Per-agent evaluation in slices: a (test rows x agents) block larger than ``evaluate.BLOCK`` is computed a slice
of agents at a time (10^5 agents on 10^5 test rows would need a 75 GiB logits matrix), with the figures of one call."""

import torch

from netsim.compute import evaluate
from netsim.compute.models import MLP, LogisticRegression


def _data(n=300, d=7, agents=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) > 0.5).to(torch.float64)
    return X, y, g


def test_large_blocks_are_sliced_with_the_same_figures(monkeypatch):
    X, y, g = _data()
    model = LogisticRegression(7, l2=0.01)
    W = torch.randn(50, 8, generator=g, dtype=torch.float64)
    whole = evaluate.evaluate_bank(model, W, X, y, ("accuracy", "agent_accuracy"), per_agent=(one := {}))
    calls = []
    real = model.evaluate
    monkeypatch.setattr(model, "evaluate", lambda W_, X_, y_: calls.append(len(W_)) or real(W_, X_, y_))
    monkeypatch.setattr(evaluate, "BLOCK", 300 * 8)  # 8 agents a slice
    sliced = evaluate.evaluate_bank(model, W, X, y, ("accuracy", "agent_accuracy"), per_agent=(two := {}))
    assert calls == [1] + [8] * 6 + [2]  # the average model, then 50 agents in slices of 8
    assert sliced.keys() == whole.keys()
    for k in whole:
        assert abs(sliced[k] - whole[k]) < 1e-12, k
    for k in ("loss", "accuracy"):
        assert two[k].shape == (50,)
        assert abs(two[k] - one[k]).max() < 1e-12


def test_small_runs_take_one_call_for_every_model():
    X, y, g = _data(n=40, agents=5)
    y = y.long()
    model = MLP(7, 2, hidden=(4,))
    W = torch.randn(5, model.size, generator=g, dtype=torch.float64)
    loss, acc = evaluate.evaluate_rows(model, W, X, y)
    ref_loss, ref_acc = model.evaluate(W, X, y)
    assert torch.equal(loss, ref_loss) and torch.equal(acc, ref_acc)


def _figures(threads: int, model, W, X, y, metrics) -> dict:
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = evaluate.evaluate_bank(model, W, X, y, metrics, per_agent=(rows := {}))
    finally:
        torch.set_num_threads(old)
    return {**out, **{f"agent_{k}": v.tobytes() for k, v in rows.items()}}


def test_the_figures_do_not_depend_on_the_thread_count():
    """A run's metrics are the same bits at any torch thread count (a 2-core laptop, a 64-core server): the
    evaluation's sums over test rows and agents have a fixed order (``compute.exact``), not the threads' split.
    The sizes are past torch's grain (32,768 elements), where a library sum splits across threads."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(70_000, 5, generator=g)
    y = (torch.rand(70_000, generator=g) > 0.5).to(torch.float32)
    W = torch.randn(40_000, 6, generator=g)  # the average over 40,000 agents and the consensus over them
    metrics = ("loss", "accuracy", "consensus")
    logistic = LogisticRegression(5, l2=0.01)
    one = _figures(1, logistic, W, X, y, metrics)
    assert one == _figures(4, logistic, W, X, y, metrics)
    mlp = MLP(5, 3, hidden=(4,), l2=0.01)
    Wm = torch.randn(3, mlp.size, generator=g)
    ym = torch.randint(0, 3, (70_000,), generator=g)
    one = _figures(1, mlp, Wm, X, ym, ("loss", "accuracy", "agent_accuracy"))
    assert one == _figures(4, mlp, Wm, X, ym, ("loss", "accuracy", "agent_accuracy"))
