"""``netsim check``: a round kernel's exactness rule (each row the same bits in a batch of B rows as in B batches of
one) and its declared ``reads``, checked by running its hooks (netsim/rounds/exactness.py); and the same check
before a windowed run of a plugin kernel, which refuses the windows with the check's line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import attrs
import pytest
from typer.testing import CliRunner

from netsim.algorithms import registry
from netsim.algorithms.async_push import AsyncPushParams, AsyncPushSGD
from netsim.algorithms.dpsgd import DPSGD, DPSGDParams
from netsim.algorithms.event_triggered import EventTriggered, EventTriggeredParams
from netsim.algorithms.gossip import Gossip, GossipParams
from netsim.algorithms.push_gossip import GossipLearning, PushGossipParams
from netsim.cli import app
from netsim.compute.exact import row_sum
from netsim.rounds import RoundKernel
from netsim.rounds.broadcast import BroadcastKernel
from netsim.rounds.exactness import CHECK, Probe, Recording, check
from netsim.rounds.pairwise import PairwiseKernel
from netsim.rounds.push import PushGossip
from netsim.rounds.sync import SyncRounds
from netsim.rounds.ticks import TickKernel
from netsim.rounds.triggered import TriggeredKernel
from netsim.scenario.structure import field, nonneg
from tests.conftest import ROOT, cli_env

runner = CliRunner()


def builtin_kernels() -> list[tuple[str, RoundKernel, type]]:
    registry.names()
    return [(n, prog, params) for n, (prog, params) in sorted(registry.REGISTRY.items())
            if isinstance(prog, RoundKernel) and type(prog).__module__.startswith("netsim.")]


def tensor_hooks(kernel: RoundKernel) -> set[str]:
    """The hooks a pattern hands rows to, which the check must have compared."""
    if isinstance(kernel.pattern, SyncRounds):
        return {"local", "combine"}
    if isinstance(kernel.pattern, PushGossip):
        return {"combine", "update"}
    if isinstance(kernel, (TriggeredKernel, PairwiseKernel)):
        return {"update"}
    if isinstance(kernel, TickKernel):
        return {"sleep", "step"}
    assert isinstance(kernel, BroadcastKernel)
    return {"merge", "gradient_at", "update", "params", "push"}


# what a kernel's defaults leave to the scenario (DO-ADP, DP-DDA: sigma, or epsilon for eq. (7); PrivSGP's K = K*
# of eq. (12) needs the problem's constants)
GIVEN = {"do_adp": {"sigma": 0.5}, "dp_dda": {"sigma": 0.5}, "privsgp": {"iterations": 3},
         "privsgp_vr": {"iterations": 3}, "dp2_sgd": {"iterations": 3}}


@pytest.mark.parametrize(("name", "kernel", "params"), builtin_kernels(), ids=[k[0] for k in builtin_kernels()])
def test_every_builtin_kernel_passes_the_check(name, kernel, params):
    out = check(name, kernel, params(**GIVEN.get(name, {})))
    assert out.violation is None, out.violation
    assert tensor_hooks(kernel) <= set(out.compared)
    assert {p.dtype for p in out.probes} == {"float32", "float64"} and len({p.batch for p in out.probes}) > 1
    assert out.read and set(out.read) <= set(out.declared)
    assert out.summary().startswith(f"ok: {name} ({type(kernel).__name__}): ")


def test_the_cli_checks_a_builtin_kernel_and_refuses_bad_input_in_one_line():
    res = runner.invoke(app, ["check", "dpsgd"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("ok: dpsgd (DPSGD): local, combine give every row the same bits in a batch of 5 and 4 "
                                 "rows as in batches of one (float32 and float64; P = 4 and 41; 2 rounds each)")
    assert ("params read by init, refusal, any_round, gradient, local, exchanges, combine: batch, lr, lr_decay, "
            "all declared") in res.output
    for args, line in [
        (["check", "nope"], "error: check: unknown algorithm 'nope'; registered: adp2_sgd, "),
        (["check"], "error: check: name a round-kernel algorithm (netsim check NAME), or give --plugin files "),
        (["check", "dpsgd", "--set", "lr=-1"], "error: algorithm.lr: must be >= 0, got -1.0"),
        (["check", "fedavg"], "error: check: algorithm 'fedavg' is a coroutine program, not a round kernel"),
    ]:
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and res.output.startswith(line) and res.output.count("\n") == 1, res.output


# planted violations: a cross-row reduction in each pattern's hooks ----------------------------------------------------
class MeanPayload(DPSGD):
    def local(self, b, p):
        b.send(b.x - b.x.mean(0))                           # the batch's mean: every row depends on the others


class NormalizedStep(DPSGD):
    def combine(self, b, p, got):
        b.mix_into_params(b.x, got, step=b.g / b.g.norm(), lr=p.lr)  # the norm of the whole batch


class ScaledMerge(GossipLearning):
    def combine(self, b, p, received):
        b.x.add_(received).mul_(0.5 / float(b.x.abs().max()))


class SummedStep(AsyncPushSGD):
    def update(self, b, p, g):
        b.x = b.x - p.lr * g / g.abs().sum()


class CenteredTriggered(EventTriggered):
    def update(self, b, p, g):
        b.x = b.x - p.lr * (g - g.mean(0))


class CenteredGossip(Gossip):
    def update(self, b, p, g):
        b.x = b.x - p.lr * (g - g.mean(0))


@pytest.mark.parametrize(("kernel", "params", "hook", "what"), [
    (MeanPayload, DPSGDParams, "local", "the payload"),
    (NormalizedStep, DPSGDParams, "combine", "the bank's parameter rows, agent "),
    (ScaledMerge, PushGossipParams, "combine (receipt 1)", "the row kept"),
    (SummedStep, AsyncPushParams, "update", "b.x"),
    (CenteredTriggered, EventTriggeredParams, "update", "the row after it"),
    (CenteredGossip, GossipParams, "update", "the row after it"),
], ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_a_planted_cross_row_reduction_is_named_in_one_line(kernel, params, hook, what):
    out = check("planted", kernel(), params())
    line = out.violation
    assert line is not None and "\n" not in line
    assert line.startswith(f"planted ({kernel.__name__}.{hook}): {what}"), line
    assert "differs between a batch of " in line and "rows and batches of one (float64, P = 4)" in line
    assert "a row's bits must not depend on the other rows" in line


class RowSums(DPSGD):
    """Per-row reductions: ``row_sum``'s bits never depend on the batch; the check compares bits, forbids nothing."""

    def combine(self, b, p, got):
        scale = 1.0 / (1.0 + row_sum(b.g * b.g, 1)).unsqueeze(1)
        b.mix_into_params(b.x, got, step=b.g * scale, lr=p.lr)


def test_per_row_reductions_pass():
    out = check("row_sums", RowSums(), DPSGDParams())
    assert out.violation is None, out.violation


class Asserting(DPSGD):
    def local(self, b, p):
        assert len(b) == 1, "one agent at a time"
        b.send(b.x)


def test_a_hook_that_raises_on_a_batch_is_named():
    line = check("solo", Asserting(), DPSGDParams()).violation
    assert line == ("solo (Asserting.local): raised AssertionError: one agent at a time (in a batch of 5 rows, "
                    "float64, P = 4, on drawn inputs)")


# reads ----------------------------------------------------------------------------------------------------------------
@attrs.frozen
class HeavyBallParams(AsyncPushParams):
    momentum: float = field(0.9, check=nonneg, doc="mu")


class HeavyBall(AsyncPushSGD):
    """Push SGD with a heavy ball (examples/plugins/momentum_push.py) whose ``reads`` leaves ``momentum`` out."""

    reads = frozenset({"lr", "batch", "staleness_power"})
    extra_rows = ("velocity",)

    def update(self, b, p, g):
        v = b.rows["velocity"] * p.momentum + g
        b.rows["velocity"] = v
        b.x = b.x - p.lr * v


def test_an_undeclared_read_is_named_with_its_hook():
    line = check("heavy_ball", HeavyBall(), HeavyBallParams()).violation
    assert line == ("heavy_ball (HeavyBall.update): reads params.momentum, which reads does not declare (reads: batch, "
                    "lr, staleness_power; the pattern's: none)")
    declared = type("Declared", (HeavyBall,), {"reads": HeavyBall.reads | {"momentum"}})
    assert check("heavy_ball", declared(), HeavyBallParams()).violation is None


def test_reads_must_name_fields_and_cover_them():
    typo = type("Typo", (HeavyBall,), {"reads": HeavyBall.reads | {"momentm"}})
    assert check("t", typo(), HeavyBallParams(), CHECK[:1]).violation.startswith(
        "t (Typo.reads): declares momentm, not fields of HeavyBallParams (its fields: batch, lr, momentum, ")
    lazy = type("Lazy", (AsyncPushSGD,), {})  # reads nothing of HeavyBallParams.momentum, declares nothing of it
    assert check("l", lazy(), HeavyBallParams(), CHECK[:1]).violation == (
        "l (Lazy.reads): HeavyBallParams.momentum is neither in reads nor the pattern's: a value set for it would be "
        "ignored unnoticed (declare it in reads, or drop the field)")


def test_the_recording_params_are_the_params_and_note_only_what_hooks_read():
    rec = Recording(DPSGDParams(lr=0.3))
    p = rec.params
    assert isinstance(p, DPSGDParams) and p == rec.params and hash(p) == hash(rec.params) and "lr=0.3" in repr(p)
    assert rec.log == {}
    rec.hook = "K.local"
    assert p.lr == 0.3 and attrs.evolve(p, batch=4).batch == 4
    assert rec.log["lr"] == "K.local"


def test_a_probe_with_one_dtype_checks_only_it():
    out = check("dpsgd", DPSGD(), DPSGDParams(), (Probe("float32", 3, 2, 3),))
    assert out.violation is None and [p.dtype for p in out.probes] == ["float32"]


# through --plugin: netsim check, and the windowed engine refused ------------------------------------------------------
PLUGIN = '''
import attrs

from netsim.algorithms.async_push import AsyncPushParams, AsyncPushSGD
from netsim.algorithms.dpsgd import DPSGD, DPSGDParams
from netsim.algorithms.registry import register
from netsim.scenario.structure import field, nonneg


@attrs.frozen
class HeavyBallParams(AsyncPushParams):
    momentum: float = field(0.9, check=nonneg, doc="mu")


@register("heavy_ball", HeavyBallParams)
class HeavyBall(AsyncPushSGD):
    reads = frozenset({"lr", "batch", "staleness_power"})  # momentum left out
    extra_rows = ("velocity",)

    def update(self, b, p, g):
        v = b.rows["velocity"] * p.momentum + g
        b.rows["velocity"] = v
        b.x = b.x - p.lr * v


@register("centered", DPSGDParams)
class Centered(DPSGD):
    def local(self, b, p):
        b.send(b.x - b.x.mean(0))


@register("velocity", DPSGDParams)
class Velocity(DPSGD):  # b.v holds a row per agent, not declared in per_row
    def init(self, agents, p):
        return agents[0].shared_state("velocity")

    def local(self, b, p):
        b.v = b.state.index_select(0, b.index()) * 0.5 + b.g
        b.state.index_copy_(0, b.index(), b.v)
        b.send(b.x)

    def combine(self, b, p, got):
        b.mix_into_params(b.x, got, step=b.v, lr=p.lr)
'''

SCRIPT = """
import json, sys
from typer.testing import CliRunner
from netsim.cli import app
plugin, folder = sys.argv[1], sys.argv[2]
r = CliRunner()
c = r.invoke(app, ["check", "--plugin", plugin])
out = {"check": [c.exit_code, c.output]}
base = ["run", "examples/momentum_push.toml", "--plugin", plugin, "-q", "--set", "algorithm.name=heavy_ball",
        "--set", "agents.count=12", "--set", "run.until=2.0"]
w = r.invoke(app, base + ["--engine", "windowed", "--out", folder + "/w"])
out["windowed"] = [w.exit_code, w.output]
a = r.invoke(app, base + ["--engine", "auto", "--out", folder + "/a"])
out["auto"] = [a.exit_code, json.load(open(folder + "/a/summary.json"))]
print(json.dumps(out))
"""

HEAVY = ("heavy_ball (HeavyBall.update): reads params.momentum, which reads does not declare (reads: batch, lr, "
         "staleness_power; the pattern's: none)")


def test_a_plugins_violations_are_caught_by_check_and_refuse_the_windowed_engine(tmp_path):
    plugin = tmp_path / "planted.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(plugin), str(tmp_path)], cwd=ROOT, env=cli_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    code, text = got["check"]
    lines = text.splitlines()
    assert code == 1 and len(lines) == 3, text  # one line per kernel that breaks the rule
    assert lines[0].startswith("error: centered (Centered.local): the payload of agent ")
    assert lines[0].endswith("a row's bits must not depend on the other rows")
    assert lines[1] == "error: " + HEAVY
    assert lines[2].startswith("error: velocity (Velocity.local): b.v, kept on the batch, differs between a batch of ")
    assert lines[2].endswith("a value with one row per agent must be named in Velocity.per_row (Batch.row cuts those "
                             "to an agent's row; anything else is shared by the batch's rows)")
    code, text = got["windowed"]
    fix = " — fix the hook it names (netsim check heavy_ball --plugin FILE)"
    assert code == 2 and text.endswith(f"--engine: windowed cannot run this scenario exactly: the kernel fails netsim "
                                       f"check: {HEAVY}{fix}; --engine auto (the default) runs it on the events "
                                       "engine\n")
    assert not (tmp_path / "w").exists()
    code, summary = got["auto"]
    assert code == 0 and summary["engine"] == "events" and summary["windowed_refused"] == \
        "the kernel fails netsim check: " + HEAVY + fix
