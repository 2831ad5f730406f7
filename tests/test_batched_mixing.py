"""Batched gossip averaging (compute/mixing.py, Agent.mix_into_params) against the per-agent arithmetic:
bit for bit, in float32 and float64, and the same trace."""

from __future__ import annotations

import hashlib

import pytest
import torch

import netsim
from netsim.compute.bank import ParameterBank
from netsim.compute.mixing import MixUpdate, evaluate
from netsim.scenario import scenario_from_dict
from netsim.sim.agent import Agent


def per_agent(u: MixUpdate) -> torch.Tensor:
    """What Agent.mix and a step compute, one agent at a time."""
    out = u.own * u.keep
    for w, x in zip(u.weights, u.models):
        out.add_(x, alpha=w)
    return out if u.step is None else out - u.lr * u.step


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [1, 7, 21, 100])
def test_batched_updates_equal_the_per_agent_ones(dtype, p):
    g = torch.Generator().manual_seed(p)
    r = lambda: torch.randn(p, generator=g, dtype=dtype)  # noqa: E731
    weights = [1 / 3, 0.25, 0.2, 1 / 7]
    updates = []
    for i in range(40):
        k = i % 4  # 0..3 models received
        ws = [weights[(i + s) % 4] if i % 5 else 1 / 3 for s in range(k)]
        step = None if i % 6 == 0 else r()
        updates.append(MixUpdate(i % 37, r(), 1.0 - sum(ws), ws, [r() for _ in ws], [0.5, 0.1 / 3][i % 2], step))
    rows, values = evaluate(updates, dtype)
    last = {u.row: u for u in updates}  # a row updated twice keeps the later update
    assert sorted(rows.tolist()) == sorted(last)
    for row, v in zip(rows.tolist(), values):
        assert torch.equal(v, per_agent(last[row])), row


@pytest.mark.parametrize("rows", ["all", "some", "alone"])
def test_steps_given_as_one_row_matrices_give_the_same_bits(rows):
    """A step given as a (1, P) row (a batch of one's gradient, as the gradient service answers it) is the same step as
    its 1-D row: every step so, some of them, or a lone update's."""
    g = torch.Generator().manual_seed(3)
    r = lambda: torch.randn(21, generator=g, dtype=torch.float32)  # noqa: E731
    updates = [MixUpdate(i, r(), 1 / 3, [1 / 3, 1 / 3], [r(), r()], [0.5, 0.1 / 3][i % 2], r()) for i in range(9)]
    if rows == "alone":
        updates = updates[:1]
    two = [MixUpdate(u.row, u.own, u.keep, u.weights, u.models, u.lr,
                     u.step[None] if rows != "some" or u.row % 2 else u.step) for u in updates]
    want, got = evaluate(updates, torch.float32), evaluate(two, torch.float32)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["uniform", "one_short", "one_weight_differs", "one_without_step", "one_lr_differs"])
def test_a_round_of_alike_updates_equals_the_per_agent_ones(dtype, case):
    """The common round (distinct rows, every agent the same weights and one step size: a regular graph) takes
    evaluate's one-group shortcuts; each way out of them (a row with fewer arrivals, another weight, no step, another
    step size) the general grouping. Either way: each row's per-agent bits, the rows in the updates' order."""
    g = torch.Generator().manual_seed(3)
    r = lambda: torch.randn(21, generator=g, dtype=dtype)  # noqa: E731
    updates = []
    for i in range(30):
        ws = [1 / 3, 1 / 3]
        if i == 17 and case == "one_short":
            ws = [1 / 3]
        if i == 17 and case == "one_weight_differs":
            ws = [1 / 3, 0.25]
        step = None if i == 17 and case == "one_without_step" else r()
        lr = 0.1 / 3 if i == 17 and case == "one_lr_differs" else 0.5
        updates.append(MixUpdate(29 - i, r(), 1.0 - sum(ws), ws, [r() for _ in ws], lr, step))
    rows, values = evaluate(updates, dtype)
    assert rows.tolist() == [u.row for u in updates]
    for u, v in zip(updates, values):
        assert torch.equal(v, per_agent(u)), u.row


def test_the_bank_applies_waiting_updates_before_any_read_or_write():
    bank = ParameterBank(torch.zeros(3, 2, dtype=torch.float64))
    one = torch.ones(2, dtype=torch.float64)
    bank.defer(MixUpdate(1, one, 0.5, [0.5], [3 * one], 1.0, None))
    assert bank.get(1).tolist() == [2.0, 2.0]
    bank.defer(MixUpdate(2, one, 1.0, [], [], 0.5, one))
    bank.set(2, bank.get(2) + 1)  # the waiting update first, then the write
    assert bank.W[2].tolist() == [1.5, 1.5]
    bank.defer(MixUpdate(0, one, 1.0, [], [], 1.0, None))
    assert bank.state_dict()["W"][0].tolist() == [1.0, 1.0]


def run(tmp_path, name: str, dtype: str, batched: bool, monkeypatch) -> tuple[torch.Tensor, str]:
    if not batched:  # the per-agent arithmetic the batched call replaces
        def one_by_one(self, own, got, step=None, lr=1.0):
            mixed = self.mix(own, got)
            self.params = mixed if step is None else mixed - lr * step
        monkeypatch.setattr(Agent, "mix_into_params", one_by_one)
    sc = scenario_from_dict({
        "name": "mixing", "run": {"seed": 4, "until": 3.0},
        "agents": {"count": 16, "activation": {"kind": "poisson", "rate": 4.0}},
        "topology": {"kind": "erdos_renyi", "p": 0.3},  # Metropolis weights: many distinct values
        "network": {"latency": {"kind": "exponential", "mean": 0.02}, "loss": 0.2},
        "data": {"kind": "synthetic", "samples": 640, "features": 9, "partition": "iid"},
        "model": {"kind": "logistic", "dtype": dtype},
        "algorithm": {"name": "dpsgd", "lr": 0.3, "batch": 8, "round_timeout": 0.1, "lr_decay": 0.05},
        "evaluation": {"every": 1.0}})
    built: list = []
    netsim.run(sc, out=tmp_path / name, setup=built.append)
    monkeypatch.undo()
    trace = hashlib.sha256((tmp_path / name / "trace.arrows").read_bytes()).hexdigest()
    return built[0].bank.W, trace


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dpsgd_runs_are_identical_batched_or_one_by_one(tmp_path, dtype, monkeypatch):
    W1, t1 = run(tmp_path, "one", dtype, False, monkeypatch)
    W2, t2 = run(tmp_path, "batched", dtype, True, monkeypatch)
    assert torch.equal(W1, W2) and t1 == t2
