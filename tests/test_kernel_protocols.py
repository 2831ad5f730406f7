"""The round kernels' protocols: one kernel class per pattern (the hooks that pattern calls), per-row values kept on a
batch declared (``per_row``) rather than guessed from shapes, one refusal hook ``refusal(sim, path)`` for kernels and
patterns, and hooks that give every row the same bits in any batch (EventTriggered's private and lazy steps
included). The heavy-ball example kernel (examples/plugins/heavy_ball.py) runs on both engines byte for byte."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch

from netsim.algorithms import registry
from netsim.algorithms.dpsgd import DPSGD, DPSGDParams
from netsim.algorithms.event_triggered import EventTriggered, EventTriggeredParams
from netsim.rounds import LOOKAHEAD, ROUNDS, Batch, Pattern, RoundKernel, SyncKernel, SyncRounds
from netsim.rounds.broadcast import Broadcast, BroadcastKernel
from netsim.rounds.exactness import CHECK, check
from netsim.rounds.pairwise import Pairwise, PairwiseKernel
from netsim.rounds.push import PushGossip, PushKernel
from netsim.rounds.ticks import TickKernel, Ticks
from netsim.rounds.triggered import DeltasKernel, Triggered, TriggeredDeltas, TriggeredKernel
from tests.conftest import ROOT, cli_env


# one kernel class per pattern -----------------------------------------------------------------------------------
def test_each_pattern_names_its_kernel_class_and_every_builtin_kernel_derives_from_it():
    assert {SyncRounds: SyncKernel, PushGossip: PushKernel, Broadcast: BroadcastKernel, Triggered: TriggeredKernel,
            TriggeredDeltas: DeltasKernel, Pairwise: PairwiseKernel, Ticks: TickKernel} == {
        p: p.kernel for p in (SyncRounds, PushGossip, Broadcast, Triggered, TriggeredDeltas, Pairwise, Ticks)}
    assert [p.lookahead for p in (SyncRounds, PushGossip, Broadcast, Pairwise, Ticks)] == [True] * 5
    registry.names()
    kernels = [k for k, _ in registry.REGISTRY.values() if isinstance(k, RoundKernel)]
    assert len(kernels) >= 15
    for k in kernels:
        assert isinstance(k.pattern, Pattern) and isinstance(k, type(k.pattern).kernel), type(k).__name__
    for k in kernels:  # the triggered driver is the broadcast's: its broadcast hooks keep their defaults
        if isinstance(k, TriggeredKernel):
            assert all(getattr(type(k), h) is getattr(BroadcastKernel, h) for h in (
                "request", "start", "choose", "merge", "push", "payload", "extra_rows", "merge_first")), k


def test_a_kernel_of_another_patterns_class_or_an_old_refusal_spelling_is_refused_at_its_definition():
    with pytest.raises(TypeError, match="^Mixed: its pattern SyncRounds calls the hooks of a SyncKernel — derive it "
                                        "from netsim.rounds.sync.SyncKernel$"):
        type("Mixed", (PushKernel,), {"pattern": SyncRounds()})
    for old in ("needs", "windows_refusal", "lookahead_refusal"):
        with pytest.raises(TypeError, match=rf"^Old\.{old}: a kernel says why the windowed engine cannot play it in "
                                            r"one hook, refusal\(self, sim, path\)"):
            type("Old", (DPSGD,), {old: frozenset()})
    with pytest.raises(TypeError, match="per_row: a set of names"):
        type("Named", (DPSGD,), {"per_row": "v"})


# per-row values: declared, not guessed -------------------------------------------------------------------------
class _Agent:
    def __init__(self, i: int):
        self.id, self.round = i, 10 + i


def test_batch_row_cuts_only_the_values_the_kernel_declares_per_row():
    """A kept (3,) vector in a batch of 3 is not one value per agent unless declared: shapes say nothing."""
    x = torch.arange(6.0).reshape(3, 2)
    b = Batch([_Agent(0), _Agent(1), _Agent(2)], 4, x, None, None)
    b.v = x * 10.0                   # per agent
    b.scale = torch.tensor([1.0, 2.0, 3.0])  # one vector shared by every row (three coordinates, by chance)
    b.names = ["a", "b", "c"]        # per agent, a list
    b.none = None
    one = b.row(1, frozenset({"v", "names", "none"}))
    assert torch.equal(one.x, x[1:2]) and torch.equal(one.v, x[1:2] * 10.0) and one.names == ["b"]
    assert one.scale is b.scale and one.none is None
    assert b.rounds() == [10, 11, 12]
    with pytest.raises(TypeError, match=r"^b\.scale is declared per_row but holds a Tensor of shape \(3,\), not one "
                                        "row per agent of a batch of 2$"):
        Batch([_Agent(0), _Agent(1)], 0, x[:2], None, None, ).cut("scale", b.scale, 0, frozenset({"scale"}))


class Velocity(DPSGD):
    """D-PSGD with a heavy ball whose velocity ``b.v`` is kept on the batch without being declared ``per_row``."""

    def init(self, agents, p):
        return agents[0].shared_state("velocity")

    def local(self, b, p):
        idx = b.index()
        b.v = b.state.index_select(0, idx) * 0.5 + b.g
        b.state.index_copy_(0, idx, b.v)
        b.send(b.x)

    def combine(self, b, p, got):
        b.mix_into_params(b.x, got, step=b.v, lr=p.lr)


def test_netsim_check_names_a_per_row_value_left_undeclared_and_passes_it_declared():
    line = check("velocity", Velocity(), DPSGDParams(), CHECK[:1]).violation
    assert line is not None and "\n" not in line
    assert line.startswith("velocity (Velocity.local): b.v, kept on the batch, differs between a batch of 5 rows and "
                           "batches of one (float64, P = 4) (b.v (torch.float64 (5, 4) against torch.float64 (1, 4))"
                           "): a value with one row per agent must be named in Velocity.per_row"), line
    declared = type("Declared", (Velocity,), {"per_row": frozenset({"v"})})
    assert check("velocity", declared(), DPSGDParams(), CHECK[:1]).violation is None
    def local(self, b, p):
        b.v = 1.0
        b.send(b.x)

    wrong = type("Wrong", (Velocity,), {"per_row": frozenset({"v"}), "local": local})
    assert check("velocity", wrong(), DPSGDParams(), CHECK[:1]).violation == (
        "velocity (Wrong.per_row): b.v is declared per_row but holds a float, not one row per agent of a batch of 5")


# one refusal hook ----------------------------------------------------------------------------------------------
def test_kernels_and_patterns_share_one_refusal_hook():
    import inspect

    for cls in (RoundKernel, Pattern, SyncRounds, PushGossip, Broadcast, Triggered, Pairwise,
                *(type(k) for k, _ in registry.REGISTRY.values() if isinstance(k, RoundKernel))):
        assert list(inspect.signature(cls.refusal).parameters) == ["self", "sim", "path"], cls
        for old in ("needs", "windows_refusal", "lookahead_refusal"):
            assert not hasattr(cls, old), (cls, old)
    assert (ROUNDS, LOOKAHEAD) == ("rounds", "lookahead")


# EventTriggered's step in any batch ----------------------------------------------------------------------------
class FirstAgentsStep(EventTriggered):
    """The step as it was written for a batch of one: agent 0's release and activation count for every row."""

    def update(self, b, p, g):
        if p.noise_multiplier > 0 or p.lazy:
            g = self._released(b.agents[0], b.k, p, b.state, g[0])
            if g is None:
                return
        b.x = b.x - p.lr * g


@pytest.mark.parametrize("params", [
    EventTriggeredParams(noise_multiplier=1.0, batch=4),
    EventTriggeredParams(lazy=True, trigger="decaying", threshold=0.5, batch=4),
    EventTriggeredParams(lazy=True, noise_multiplier=0.5, trigger="relative", threshold=0.1, batch=4),
], ids=["dp", "lag", "dp-lag"])
def test_event_triggered_private_and_lazy_steps_give_each_row_its_bits_of_a_batch_of_one(params):
    assert check("event_triggered", EventTriggered(), params, CHECK[:2]).violation is None
    line = check("event_triggered", FirstAgentsStep(), params, CHECK[:1]).violation
    assert line is not None and line.startswith("event_triggered (FirstAgentsStep.update): "), line


# the heavy-ball example: both engines, byte for byte; momentum 0 is D-PSGD ----------------------------------------
PROBE = """
import hashlib, json, sys
import netsim
from netsim.algorithms.registry import load_plugin
from netsim.scenario import scenario_from_dict
from netsim.trace.io import read_trace
load_plugin(sys.argv[1])
sc, out, folder = json.loads(sys.argv[2]), {}, sys.argv[3]
runs = {"events": ("heavy_ball", 0.9, "events"), "windowed": ("heavy_ball", 0.9, "windowed"),
        "mu0": ("heavy_ball", 0.0, "windowed"), "dpsgd": ("dpsgd", None, "windowed")}
for key, (name, mu, engine) in runs.items():
    sc["algorithm"] = {"name": name, "lr": 0.4, "batch": 8, "round_timeout": 0.05,
                       **({"lr_decay": 0.0} if mu is None else {"momentum": mu})}
    built = []
    r = netsim.run(scenario_from_dict(sc), out=folder + "/" + key, setup=built.append, engine=engine)
    rows = read_trace(folder + "/" + key).table.to_pydict()
    out[key] = {"trace": hashlib.sha256(open(folder + "/" + key + "/trace.arrows", "rb").read()).hexdigest(),
                "rows": hashlib.sha256(repr(rows).encode()).hexdigest(), "sends": rows["kind"].count("send"),
                "metrics": open(folder + "/" + key + "/metrics.csv").read(), "engine": r.summary["engine"],
                "W": built[0].bank.W.flatten().tolist()}
print(json.dumps(out))
"""


def test_the_heavy_ball_example_runs_both_engines_byte_for_byte_and_is_dpsgd_at_momentum_zero(tmp_path):
    sc = {"name": "heavy_ball", "run": {"seed": 4, "rounds": 12, "until": 1.0e6},
          "agents": {"count": 8, "compute_time": {"kind": "constant", "value": 0.01},
                     "activation": {"kind": "periodic", "period": 0.1}},
          "topology": {"kind": "ring"}, "network": {"latency": {"kind": "constant", "value": 0.005}, "loss": 0.2},
          "data": {"kind": "synthetic", "samples": 240, "features": 5, "partition": "iid"},
          "model": {"kind": "logistic"}, "evaluation": {"every": 1.0e6, "metrics": ["loss", "accuracy"]}}
    r = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "examples/plugins/heavy_ball.py"), json.dumps(sc),
                        str(tmp_path)], env=cli_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    ev, win, mu0, dpsgd = got["events"], got["windowed"], got["mu0"], got["dpsgd"]
    assert (ev["engine"], win["engine"], mu0["engine"], dpsgd["engine"]) == ("events", "windowed", "windowed",
                                                                              "windowed")
    assert win["trace"] == ev["trace"] and win["metrics"] == ev["metrics"] and win["W"] == ev["W"]
    assert ev["sends"] == 8 * 2 * 12  # every agent to its two ring neighbours, every round
    # v = 0 v + g = g: D-PSGD's rows, metrics and models bit for bit (its trace's header names another algorithm)
    assert mu0["rows"] == dpsgd["rows"] and mu0["metrics"] == dpsgd["metrics"] and mu0["W"] == dpsgd["W"]
    assert mu0["trace"] != dpsgd["trace"] and win["W"] != mu0["W"]  # and the momentum moves the models
    assert hashlib.sha256(json.dumps(win["W"]).encode()).hexdigest() != hashlib.sha256(
        json.dumps(mu0["W"]).encode()).hexdigest()


def test_batch_renew_is_a_fresh_batch_of_one_without_views():
    """The events engine's one batch per agent: ``renew`` drops what the last round kept and hands the agent's own
    rows back where the kernel passes its x or g on unchanged (no view per round)."""
    import torch

    from netsim.rounds.kernel import Batch

    b = Batch([object()], 0, None, None, None)
    x, g = torch.arange(3.0), torch.ones(3)
    b.renew(4, x, g)
    assert b.k == 4 and b.x.shape == (1, 3) and b.g.shape == (1, 3) and b.out is None and b.s == 0
    assert torch.equal(b.x[0], x) and b.x.data_ptr() == x.data_ptr()  # a view of the agent's row, not a copy
    b.y = b.x * 2  # a kernel's kept value
    b.send(b.x)
    b.s = 1
    assert b.out[0] is x and b.sent is b.x and b.sizes is None
    assert b._row(b.g) is g and torch.equal(b._row(b.y), x * 2)
    b.renew(5, x, None)
    assert b.kept() == {} and b.g is None and b.out is None and b.s == 0 and b.k == 5 and b.sent is None


def test_a_batch_of_agents_looked_up_by_id_reads_as_the_list_of_them():
    """A windowed batch's ``agents`` as ``AgentsOf`` (the ids, each agent looked up when read) is what a kernel sees of
    the list of those agents: length, items, slices, iteration, ``ids``, ``rounds`` and ``part``."""
    from types import SimpleNamespace

    from netsim.rounds.kernel import AgentsOf

    everyone = [SimpleNamespace(id=i, round=10 + i) for i in range(6)]
    who = [4, 1, 5]
    listed = [everyone[i] for i in who]
    b = Batch(AgentsOf(everyone, who), 0, torch.arange(6.0).view(3, 2), None, None)
    assert len(b) == 3 and list(b.agents) == listed and b.agents[1] is everyone[1] and b.agents[-1] is everyone[5]
    assert b.agents[1:] == listed[1:] and b.ids == who and b.rounds() == [14, 11, 15]
    sub = b.part([2, 0])
    assert sub.ids == [5, 4] and torch.equal(sub.x, torch.tensor([[4.0, 5.0], [0.0, 1.0]]))
