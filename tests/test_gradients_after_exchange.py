"""Barrier rounds whose gradients come after the exchange (``SyncKernel.combine`` as a generator of gradient waves):
both engines write the same trace, metrics.csv and final models (DPDO, DP-DDA, and a kernel with gradients before
and after the exchange), runs stopped by run.until, and the refusals of what the synchronous windows do not play."""

from __future__ import annotations

import math

import attrs
import pytest
import torch
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

from netsim.algorithms.registry import register
from netsim.rounds import GradientRequest, SyncKernel, SyncRounds
from netsim.scenario import scenario_from_dict
from netsim.scenario.structure import at_least, field, positive
from netsim.trace.events import records
from netsim.trace.io import TraceWriter
from tests.search import search
from tests.test_round_kernels import admitted_and_identical, assert_identical, base, run_both


@attrs.frozen
class MixedPointParams:
    lr: float = field(0.3, check=positive, doc="step size")
    batch: int = field(4, check=at_least(1), doc="mini-batch size")
    waves: int = field(1, check=at_least(1), doc="gradients at the mixed point per round")
    round_timeout: float = field(0.05, check=positive, doc="seconds to wait for neighbours each round")


@register("test_mixed_point", MixedPointParams)
class MixedPoint(SyncKernel):
    """D-PSGD with gradients before the exchange and ``waves`` more at the mixed point, each released with Gaussian
    noise: x <- v - lr (g(x) + sum_w g_w(v_w)) / (1 + waves), v_{w+1} = v_w - lr g_w(v_w) (a test kernel)."""

    pattern = SyncRounds(tag="model")
    reads = frozenset({"lr", "batch", "waves"})

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch)

    def local(self, b, p):
        b.send(b.x)

    def combine(self, b, p, got):
        v = b.mix(b.x, got)
        total = b.g.clone()
        for _ in range(p.waves):
            g = yield b.gradients(v, b.sample_rows(p.batch))
            noisy = b.stack(b.privatize(g, [0.01] * len(b), [1.0] * len(b), [1.0] * len(b), what="mixed"))
            total = total + noisy
            v = v - p.lr * noisy
        b.set_params(v - p.lr * total / (1 + p.waves))


def dpdo(n: int = 6, rounds: int = 4, **alg) -> dict:
    sc = base(n=n, rounds=rounds)
    sc["algorithm"] = {"name": "dpdo", "epsilon": 1.0, "lr": 0.1, "batch": 4, "round_timeout": 0.05, **alg}
    return sc


@st.composite
def after_scenarios(draw) -> dict:
    """DPDO, DP-DDA and the test kernel on drawn graphs, latencies, compute times, lossy links (timeouts), evaluations
    between the rounds and run.until at an activation or between two rounds."""
    ct = draw(st.sampled_from([0.001, 0.01, 0.02]))
    lat = draw(st.sampled_from([0.001, 0.005, 0.0301]))
    name = draw(st.sampled_from(["dpdo", "dp_dda", "test_mixed_point"]))
    sc = base(n=draw(st.integers(3, 7)), rounds=draw(st.integers(2, 5)))
    timeout = round(ct + lat + draw(st.sampled_from([0.005, 0.02])), 6)  # > compute time + latency
    if name == "dpdo":
        sc["algorithm"] = {"name": "dpdo", "epsilon": draw(st.sampled_from([0.5, 5.0])), "lr": 0.1,
                           "batch": draw(st.integers(1, 6)), "round_timeout": timeout}
    elif name == "dp_dda":  # node sampling: only some agents ask for a gradient; T its own horizon
        sc["algorithm"] = {"name": name, "rounds": draw(st.integers(2, 7)),
                           "sample_p": draw(st.sampled_from([0.4, 1.0])), "sigma": draw(st.sampled_from([0.0, 0.5])),
                           "lam": draw(st.sampled_from([0.0, 0.1])), "round_timeout": timeout}
    else:
        sc["algorithm"] = {"name": name, "lr": 0.3, "batch": draw(st.integers(1, 6)), "round_timeout": timeout,
                           "waves": draw(st.integers(1, 2))}
    loss = draw(st.sampled_from([0.0, 0.1, 0.3]))
    if name == "test_mixed_point" and sc["algorithm"]["waves"] > 1:  # both waves before the timeouts, in the period
        ct = min(ct, 0.01)
        sc["algorithm"]["round_timeout"] = round(3 * ct + lat + 0.005, 6)
    sc["agents"]["compute_time"]["value"] = ct
    sc["network"] = {"latency": {"kind": "constant", "value": lat}, "loss": loss}
    sc["topology"] = draw(st.sampled_from([{"kind": "ring"}, {"kind": "erdos_renyi", "p": 0.6},
                                           {"kind": "complete"}]))
    sc["model"] = {"kind": "logistic", "dtype": draw(st.sampled_from(["float32", "float64"]))}
    sc["evaluation"]["every"] = draw(st.sampled_from([1.0e6, 0.2, 0.3]))  # at an activation (before it) or between
    if draw(st.booleans()):  # run.until, at an activation or between two rounds
        del sc["run"]["rounds"]
        sc["run"]["until"] = draw(st.sampled_from([0.3, 0.5, 0.395, 0.595]))
    return sc


@search(8, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=after_scenarios())
def test_gradients_after_the_exchange_agree_with_the_engine(tmp_path_factory, sc):
    admitted_and_identical(tmp_path_factory.mktemp("after"), sc)


def test_the_mixed_point_gradient_is_asked_at_the_barrier_and_the_next_wake_after_it(tmp_path):
    """Lossy ring: each agent's post-exchange compute_start is at its barrier's completion (its last delivery) or
    its timeout, its compute_end a compute time later, and its next activation at the next tick after that."""
    sc = dpdo(n=5, rounds=5)
    sc["network"]["loss"] = 0.3
    got = run_both(tmp_path, sc)
    assert_identical(got)
    events: list = []
    from netsim import api

    sim = api.prepare(scenario_from_dict(sc), TraceWriter(None, {}, on_batch=lambda c: events.extend(records(c))))
    sim.run()
    ct, lat, timeout = 0.01, 0.005, 0.05
    starts = [e for e in events if e.kind == "compute_start"]
    timeouts = {(e.agent, e.round) for e in events if e.kind == "timeout"}
    acts = [e for e in events if e.kind == "activate"]
    assert timeouts and len(starts) == 5 * 5
    for e in starts:
        k = math.floor(e.t / 0.1 + 1e-9) - 1  # round k activates at (k + 1) * period
        sent = (k + 1) * 0.1
        assert e.t == pytest.approx(sent + (timeout if (e.agent, k) in timeouts else lat), abs=1e-12)
    ends = sorted((e.agent, e.t) for e in events if e.kind == "compute_end")
    assert [t for _, t in ends] == pytest.approx(sorted_starts_plus(starts, ct), abs=1e-12)
    for a in range(5):  # each next activation after the agent's compute end
        mine_acts = [e.t for e in acts if e.agent == a]
        mine_ends = [t for i, t in ends if i == a]
        assert all(end < nxt for end, nxt in zip(mine_ends, mine_acts[1:], strict=False))


def sorted_starts_plus(starts, ct):
    return [t + ct for _, t in sorted((e.agent, e.t) for e in starts)]


def test_run_until_at_an_activation_stops_after_its_sends(tmp_path):
    """run.until at an activation tick: both engines write the round's activations, releases and sends, no
    delivery (DPDO's shipped scenarios end so)."""
    sc = dpdo(n=4, rounds=4)
    del sc["run"]["rounds"]
    sc["run"]["until"] = 0.4
    got = run_both(tmp_path, sc)
    assert_identical(got)
    from netsim.trace.io import read_trace

    t = read_trace(tmp_path / "windowed" / "trace.arrows").to_pandas()
    last = t[t.t == 0.4]
    assert set(last.kind) == {"activate", "release", "send", "eval"} and (last.kind == "activate").sum() == 4


@pytest.mark.parametrize(("change", "says"), [
    ({"evaluation": {"every": 0.21}}, "evaluation.every = 0.21: the evaluation at 0.21 falls inside round 1"),
    ({"run": {"seed": 5, "until": 0.205}}, "run.until = 0.205 falls inside round 1"),
    ({"privacy": {"record": "mixing"}}, "privacy.record with gradients after the exchange"),
])
def test_what_the_windows_do_not_play_is_refused_in_one_line(change, says):
    from netsim import api
    from netsim.rounds.windowed import refusal

    sc = dpdo()
    for key, value in change.items():
        sc[key] = {**sc.get(key, {}), **value} if key != "run" else value
    line = refusal(api.prepare(scenario_from_dict(sc)))  # the synchronous rounds', then the lookahead windows'
    assert says in line and "; nor as lookahead windows: " in line and "\n" not in line


def test_the_lookahead_windows_refuse_gradients_after_the_exchange():
    from netsim import api
    from netsim.rounds.windowed import reason

    sc = dpdo()
    sc["agents"]["compute_time"] = {"kind": "uniform", "low": 0.005, "high": 0.01}  # not synchronous rounds
    assert reason(api.prepare(scenario_from_dict(sc))).startswith(
        "dpdo takes gradients after the exchange or ends at its own round count (not played by the lookahead windows)")


def test_a_budget_cap_stops_dpdo_exchanging_on_the_events_engine():
    """An agent out of budget sends nothing more (no send rows after its refused release) and keeps stepping from
    its own state; the windows refuse the cap."""
    from netsim import api
    from netsim.rounds.windowed import refusal

    events: list = []
    sc = dpdo(n=4, rounds=6, epsilon=1.0, rho_s=0.5, rho_n=0.9)
    sc["privacy"] = {"epsilon_cap": 0.5}
    sim = api.prepare(scenario_from_dict(sc), TraceWriter(None, {}, on_batch=lambda c: events.extend(records(c))))
    assert "privacy.epsilon_cap" in refusal(sim)
    sim.run()
    out = {e.agent: e.t for e in events if e.kind == "budget_exhausted"}
    assert out and len([e for e in events if e.kind == "compute_end"]) == 4 * 6
    assert not [e for e in events if e.kind == "send" and e.agent in out and e.t >= out[e.agent]]
    assert torch.isfinite(sim.bank.W).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_laplace_noise_rows_are_each_generators_own_draws_bit_for_bit(dtype):
    """A batch's Laplace releases (``Batch.privatize``, mechanism "laplace"): each row its agent's own release."""
    from netsim.compute.noise import laplace_noise, laplace_noise_rows, noise_generator

    scales = [0.3, 848.528137, 1e-3]
    rows = laplace_noise_rows((41,), scales, [noise_generator(s) for s in (1, 2, 3)], dtype)
    one = torch.stack([laplace_noise((41,), b, noise_generator(s), dtype) for s, b in zip((1, 2, 3), scales)])
    assert rows.dtype == dtype and torch.equal(rows, one)


@pytest.mark.parametrize("until", [0.4, 0.45])
def test_dpsgd_stops_at_run_until_on_the_fast_path_byte_for_byte(tmp_path, until):
    """A kernel with its gradient before the exchange and no run.rounds: until at an activation (the round's
    activations and gradient requests only) or between two rounds, with evaluations inside the run."""
    sc = base(n=5, rounds=4)
    del sc["run"]["rounds"]
    sc["run"]["until"] = until
    sc["evaluation"]["every"] = 0.13
    assert_identical(run_both(tmp_path, sc))


@pytest.mark.parametrize("alg", [{"name": "dpdo", "epsilon": 1.0, "lr": 0.1, "batch": 4, "round_timeout": 0.05},
                                 {"name": "dp_dda", "rounds": 30, "sample_p": 0.4, "sigma": 0.5,
                                  "round_timeout": 0.05}])
def test_a_windowed_checkpoint_of_gradients_after_the_exchange_resumes_by_restore(tmp_path, alg):
    """Killed after a checkpoint between two rounds, the run resumes by restore, byte-identical to one not killed
    (agents that woke from their gradients' completions, DP-DDA's sampling and its dual variables in the bank)."""
    from netsim import api
    from tests.test_checkpoint_windowed import killed_at, same_outputs, scenario

    sc = scenario(n=30, rounds=30, every=10, algorithm=alg)
    sc["algorithm"] = alg
    sc["privacy"] = {"delta": 1e-5}
    ref = api.run(scenario_from_dict(sc), out=tmp_path / "ref", engine="windowed", interruptible=False)
    out = killed_at(tmp_path, sc, 2)
    res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == "restore" and res.summary["resumed_at_step"] == 20
    same_outputs(out, ref.out)
