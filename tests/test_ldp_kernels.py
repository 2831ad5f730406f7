"""Chen & Wang's Algorithm 1 and its baselines (DSGD, DOLA, PDOP) as barrier-round kernels: both engines give the
same bytes.

``ldp_online`` and ``ldp_dsgd`` stream each learner's data, release a Laplace-noised state (a ledger release from
step 1 on, noise only at step 0) and take a projected consensus and gradient step; ``dola`` and ``pdop`` mix the noisy
copies and take their gradient at the mixed point, after the exchange. The windowed engine plays every
learner of a round as one batch; these tests hold it to the events engine on scenarios drawn from the region it
admits (trace, metrics.csv, final models), and check the lines that keep the rest on the events engine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

import netsim
from netsim.algorithms.ldp_online import coupling_rows, received
from netsim.compute.noise import laplace_noise, laplace_noise_rows
from netsim.compute.streaming import HistoryStream
from netsim.rounds.kernel import Arrivals
from netsim.scenario import scenario_from_dict
from tests.search import search
from tests.test_round_kernels import assert_identical, run_both

ALG1 = {"check_conditions": False}  # Algorithm 1's and DSGD's own keys: schedules off the paper's A4


def online(n: int = 5, rounds: int = 4, **algorithm) -> dict:
    if algorithm.get("name", "ldp_online") in ("ldp_online", "ldp_dsgd"):
        algorithm = {**ALG1, **algorithm}
    return {"name": "ldp", "run": {"seed": 3, "rounds": rounds, "until": 1.0e6},
            "agents": {"count": n, "compute_time": {"kind": "constant", "value": 1 / 32},
                       "activation": {"kind": "periodic", "period": 0.25}},
            "topology": {"kind": "ring"},
            "network": {"latency": {"kind": "constant", "value": 1 / 64}},
            "data": {"kind": "synthetic", "samples": 40 * n, "features": 4, "partition": "label"},
            "model": {"kind": "logistic", "l2": 1.0, "dtype": "float64"},
            "algorithm": {"name": "ldp_online", "C": 2.0, "round_timeout": 0.125, **algorithm},
            "evaluation": {"every": 1.0e6, "metrics": ["loss", "accuracy", "tracking"]}}


@st.composite
def online_scenarios(draw, name: str) -> dict:
    """The four methods over the parameters that move their rows and releases: noise on or off, clipping, samples per
    step, projection (a radius the iterates reach), theta_0 drawn or the model's, self-weights shrunk by lost
    messages, DOLA's stepsize index, PDOP's polynomial and geometric steps, float32 and float64, odd row widths, no
    compute time and no delay (the papers' steps); evaluations (the tracking metric too) at round and dyadic times."""
    alg = {"name": name, "clip": draw(st.booleans()), "per_round": draw(st.integers(1, 3)),
           "radius": draw(st.sampled_from([1e5, 1.5, 0.4])), "init": draw(st.sampled_from(["normal", "model"])),
           "w": draw(st.sampled_from([0.3, 0.2]))}
    if name == "dola":  # noise on or off, DOLA's two stepsize indices
        alg |= {"noise0": draw(st.sampled_from([0.0, 0.35, 2.0])), "step_index": draw(st.sampled_from(["t+1", "t"])),
                "alpha0": draw(st.sampled_from([0.5, 1.0]))}
    elif name == "pdop":  # noise on or off, polynomial and geometric stepsizes
        alg |= {"M": draw(st.sampled_from([0.0, 0.5])), "p": draw(st.sampled_from([0.9, 0.98])),
                "step": draw(st.sampled_from(["polynomial", "geometric"])), "c": draw(st.sampled_from([0.5, 1.0])),
                "q": 0.8, "q_exp": draw(st.sampled_from([0.77, 0.5]))}
    else:
        alg |= {"noise": draw(st.booleans()), "sigma": draw(st.sampled_from([0.5, 2.0])),
                "varsigma0": draw(st.sampled_from([0.05, 0.1])), "L_acc": draw(st.sampled_from([0.0, 0.5])),
                "lam0": draw(st.sampled_from([0.5, 1.0]))}
    sc = online(n=draw(st.integers(3, 7)), rounds=draw(st.integers(2, 5)), **alg)
    sc["network"]["loss"] = draw(st.sampled_from([0.0, 0.3]))
    if draw(st.booleans()):  # the papers' synchronous steps: no compute time, no delay (one instant per step)
        sc["agents"]["compute_time"]["value"] = 0.0
        sc["network"]["latency"]["value"] = draw(st.sampled_from([0.0, 1 / 64]))
    sc["topology"] = draw(st.sampled_from([{"kind": "ring"}, {"kind": "complete"}]))
    sc["model"]["dtype"] = draw(st.sampled_from(["float32", "float64"]))
    sc["data"]["features"] = draw(st.sampled_from([4, 9]))
    # (gradients after the exchange: evaluations between the steps, after the first)
    every = [1.0e6, 0.5, 1.0] if name in ("dola", "pdop") else [1.0e6, 0.25, 0.5, 0.375]
    sc["evaluation"]["every"] = draw(st.sampled_from(every))
    if sc["topology"]["kind"] == "complete":
        sc["algorithm"]["w"] = 0.1  # self-weight 1 - w (n - 1) > 0
    return sc


@pytest.mark.parametrize("name", ["ldp_online", "ldp_dsgd", "dola", "pdop"])
@search(6, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_both_engines_agree_on_drawn_online_learning_runs(tmp_path_factory, name, data):
    sc = data.draw(online_scenarios(name))
    assert_identical(run_both(tmp_path_factory.mktemp("ldp"), sc))


NOISE = {"ldp_online": {"sigma": 1.0}, "ldp_dsgd": {"sigma": 1.0}, "dola": {"noise0": 1.0}, "pdop": {"M": 1.0}}


@pytest.mark.parametrize("name", list(NOISE))
def test_each_method_runs_windowed_byte_for_byte_with_releases_and_projection(tmp_path, name):
    sc = online(n=6, rounds=6, name=name, radius=1.0, **NOISE[name])
    sc["network"]["loss"] = 0.2
    sc["evaluation"]["every"] = 0.5
    got = run_both(tmp_path, sc)
    assert_identical(got)
    from netsim.privacy.ledger import releases_from_table
    from netsim.trace.io import read_trace

    rel = releases_from_table(read_trace(tmp_path / "windowed").table)
    assert {len(r) for r in rel.values()} == {5} and {x.mechanism for r in rel.values() for x in r} == {"laplace"}
    assert float(got["windowed"]["W"].norm(dim=1).max()) <= 1.0 + 1e-12  # projected


def test_laplace_rows_are_each_generators_own_draws():
    """Row k of the batched draw is laplace_noise from generator k, bit for bit (odd widths, both dtypes)."""
    for dtype in (torch.float32, torch.float64):
        for width in (1, 7, 113):
            scales = [0.5, 2.0, 1e-3]
            gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
            rows = laplace_noise_rows((width,), scales, gens, dtype)
            again = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
            one = torch.stack([laplace_noise((width,), c, g, dtype) for c, g in zip(scales, again, strict=True)])
            assert torch.equal(rows, one)


def test_one_row_stream_draws_are_the_bits_of_a_draw_of_size_one():
    """A stream of one new row a step (numpy's scalar draw) acquires what ``pool[rng.integers(0, n, 1)]`` does, and
    its history (past its first buffer) and generator state end the same."""
    for seed in range(5):
        for n in (1, 3, 113, 2**31 + 5):
            pool = np.arange(min(n, 1000)) * 7 if n < 2**31 else None
            stream = HistoryStream(pool if pool is not None else np.arange(10), np.random.default_rng(seed), 1)
            if pool is None:
                stream.pool = _Huge(n)
            rng = np.random.default_rng(seed)
            want = [int(stream.pool[rng.integers(0, n, 1)][0]) for _ in range(150)]
            got = [int(stream.next()[0]) for _ in range(150)]
            assert got == want and stream.history.tolist() == want
            assert stream.rng.bit_generator.state == rng.bit_generator.state


class _Huge:
    """A pool of n rows, row i being i itself (a range longer than 2**31 without its memory)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return np.arange(i.start, i.stop) if isinstance(i, slice) else np.asarray(i)


def test_coupling_reads_a_drivers_arrivals_as_the_dicts_give_them():
    """``coupling_rows`` and ``received`` on a windowed driver's arrivals (arrays, any arrival order, learners that
    got fewer copies or none) equal the same on the dicts, bit for bit."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        B, P = int(rng.integers(1, 9)), int(rng.integers(1, 6))
        pairs = [(r, s) for r in range(B) for s in range(B) if r != s and rng.random() < 0.6]
        rng.shuffle(pairs)
        recv = np.array([r for r, _ in pairs], np.int64)
        send = np.array([s for _, s in pairs], np.int64)
        ids = rng.permutation(100)[:B].tolist()
        sent = torch.as_tensor(rng.normal(size=(B, P)))
        got = Arrivals(ids, list(sent.unbind(0)), sent, recv, send, np.full(len(pairs), 0.3))
        dicts = [dict(g) for g in got]
        theta = torch.as_tensor(rng.normal(size=(B, P)))
        for start in (None, theta * 2):
            assert torch.equal(coupling_rows(theta, got, 0.3, start), coupling_rows(theta, dicts, 0.3, start))
        assert received(got) == [len(g) for g in dicts]


@pytest.mark.parametrize("name", list(NOISE))
def test_async_exchange_runs_on_the_events_engine_and_says_why(tmp_path, name):
    """The same algorithm with exchange = "async": its barrier-free loop on the events engine, and the windowed engine
    refused in one line that says what to change."""
    from netsim.errors import InputError

    sc = online(rounds=5, exchange="async", name=name)
    with pytest.raises(InputError, match="exchange 'async' mixes the latest copies with no barrier: .* — set "
                                         "algorithm.exchange = \"sync\""):
        netsim.run(scenario_from_dict(sc), out=tmp_path / "w", engine="windowed")
    r = netsim.run(scenario_from_dict(sc), out=tmp_path / "a")
    assert r.summary["engine"] == "events" and r.summary["windowed_refused"].startswith("exchange 'async'")
    assert r.summary["privacy_releases"] == 5 * 4


@pytest.mark.parametrize(("change", "why"), [
    ({"privacy": {"epsilon_cap": 50.0}}, "privacy.epsilon_cap"),
    ({"evaluation": {"every": 0.125, "metrics": ["loss", "tracking"]}}, "the 'tracking' metric with evaluations"),
])
def test_what_keeps_a_synchronous_run_on_the_events_engine(tmp_path, change, why):
    from netsim.api import prepare
    from netsim.rounds import windowed

    sc = online(rounds=3)
    for key, value in change.items():
        sc[key] = {**sc.get(key, {}), **value}
    sim = prepare(scenario_from_dict(sc))
    assert windowed.reason(sim).startswith(why) and " — " in windowed.reason(sim)
    sc["run"]["until"] = 1.0e6
    assert windowed.reason(prepare(scenario_from_dict(online(rounds=3)))) is None


@pytest.mark.parametrize(("name", "engine", "every"), [
    ("ldp_online", "windowed", 0.25), ("ldp_dsgd", "windowed", 0.25), ("ldp_online", "events", 0.25),
    ("dola", "windowed", 1.0e6),  # (its gradient after the exchange: no evaluation inside its rounds on the windows)
])
def test_a_run_killed_after_a_checkpoint_resumes_with_the_same_histories_and_tracking(tmp_path, name, engine, every):
    """Killed after its second checkpoint (round 6 of 12) and resumed, a run writes the uninterrupted run's trace,
    metrics.csv (the ``tracking`` metric each round), per-agent metrics and summary: the windows restore each learner's
    data history and sensitivity (the kernel's state), and both engines put the tracking oracle's warm start back,
    which moves the last bits of every later theta*_t."""
    from netsim import api
    from netsim.sim import checkpoint
    from tests.test_checkpoint_windowed import killed_at, same_outputs

    sc = online(rounds=12, name=name)
    sc["run"]["checkpoint_every_rounds"] = 3
    sc["evaluation"] = {"every": every, "metrics": ["loss", "accuracy", "agent_accuracy", "tracking"]}
    ref = netsim.run(scenario_from_dict(sc), out=tmp_path / "ref", engine=engine, interruptible=False)
    assert ref.summary["engine"] == engine
    out = killed_at(tmp_path, sc, 2, engine=engine)
    ck = checkpoint.load(checkpoint.checkpoints(out)[-1])
    if every < 1:
        assert ck.meta["tracking"]["newton_steps"] > 0 and len(ck.meta["metrics"]) < len(ref.metrics)
    if engine == "windowed":
        held = ck.meta["state"]["windowed"]["kernel"]["histories"]
        assert [len(h) for h in held] == [6] * 5  # one row a round (Algorithm 1's stream)
    res = api.resume(out, interruptible=False)
    assert res.summary["resumed_by"] == ("restore" if engine == "windowed" else "re-execution")
    same_outputs(out, ref.out, skip={"resumed_at_step"})


def test_a_checkpoint_whose_tracking_warm_start_is_not_the_models_is_refused(tmp_path):
    """A warm start of another length than the model's parameters: the resume says so in one line, exit 2."""
    import json

    from typer.testing import CliRunner

    from netsim.cli import app
    from netsim.sim import checkpoint
    from tests.test_checkpoint_windowed import killed_at

    sc = online(rounds=8, name="ldp_online")
    sc["run"]["checkpoint_every_rounds"] = 3
    sc["evaluation"] = {"every": 0.25, "metrics": ["loss", "tracking"]}
    out = killed_at(tmp_path, sc, 2)
    for ck in checkpoint.checkpoints(out):  # (the checksums made again: a consistent checkpoint, not a torn one)
        meta = json.loads((ck / "state.json").read_text())
        meta["tracking"]["theta"].append(0.5)
        (ck / "state.json").write_text(json.dumps(meta))
        sums = {n: checkpoint._sha(ck / n) for n in ("arrays.npz", "state.json")}
        (ck / "SHA256SUMS").write_text(json.dumps(sums))
    r = CliRunner().invoke(app, ["resume", str(out), "-q"])
    assert r.exit_code == 2 and "warm start has 6 values, the model 5 parameters" in r.output
