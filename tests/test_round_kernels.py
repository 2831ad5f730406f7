"""Round kernels (netsim/rounds): one definition per algorithm, run by both engines.

The windowed engine plays a kernel's rounds as batches through its pattern's driver; the events engine runs the
same kernel as each agent's generator over a batch of one. These tests hold the two to each other: an edit to a
kernel moves both engines the same way, every Params field is one the kernel or its pattern declares it reads,
and scenarios drawn from the windowed engine's admitted region give byte-identical traces, metrics and models.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch
from hypothesis import HealthCheck, Phase, assume, given
from hypothesis import strategies as st

import netsim
from netsim.algorithms import registry
from netsim.algorithms.dpsgd import DPSGD
from netsim.rounds import RoundKernel
from netsim.scenario import scenario_from_dict
from tests.search import search

ROOT = Path(__file__).resolve().parent.parent


def base(n: int = 6, rounds: int = 4, **algorithm) -> dict:
    return {"name": "kernels", "run": {"seed": 5, "rounds": rounds, "until": 1.0e6},
            "agents": {"count": n, "compute_time": {"kind": "constant", "value": 0.01},
                       "activation": {"kind": "periodic", "period": 0.1}},
            "topology": {"kind": "ring"},
            "network": {"latency": {"kind": "constant", "value": 0.005}},
            "data": {"kind": "synthetic", "samples": 30 * n, "features": 5, "partition": "iid"},
            "model": {"kind": "logistic"},
            "algorithm": {"name": "dpsgd", "lr": 0.5, "batch": 8, "round_timeout": 0.05, **algorithm},
            "evaluation": {"every": 1.0e6, "metrics": ["loss", "accuracy", "agent_accuracy"]}}


def run_both(tmp_path: Path, sc: dict, states: tuple[str, ...] = (), records: tuple[str, ...] = ()) -> dict:
    """Each engine's run: the trace's sha256, metrics, per-agent metrics, the final models, the named state banks,
    the sha256 of each named record file (None: not written), the folder and which engine ran."""
    out = {}
    for engine in ("events", "windowed"):
        built: list = []
        r = netsim.run(scenario_from_dict(sc), out=tmp_path / engine, setup=built.append, engine=engine)
        folder, bank = tmp_path / engine, built[0].bank
        per_agent = folder / "agent_metrics.csv"
        out[engine] = {"trace": hashlib.sha256((folder / "trace.arrows").read_bytes()).hexdigest(),
                       "metrics": (folder / "metrics.csv").read_text(), "W": bank.W.clone(),
                       "agent_metrics": per_agent.read_text() if per_agent.exists() else None,
                       "state": [bank.state(s).clone() for s in states],
                       "files": {f: hashlib.sha256((folder / f).read_bytes()).hexdigest()
                                 if (folder / f).exists() else None for f in records},
                       "loss": r.summary.get("loss"), "engine": r.summary.get("engine"), "folder": folder}
    return out


def admitted_and_identical(tmp_path: Path, sc: dict, states: tuple[str, ...] = ()) -> dict:
    """A drawn scenario is in the fast path's admitted region (``windowed.reason`` is None), and both engines run it
    byte for byte (``run_both``, ``assert_identical``); returns the runs."""
    from netsim import api
    from netsim.rounds.windowed import reason

    assert reason(api.prepare(scenario_from_dict(sc))) is None  # the drawn region is the admitted one
    got = run_both(tmp_path, sc, states)
    assert_identical(got)
    return got


def assert_identical(got: dict) -> None:
    ev, win = got["events"], got["windowed"]
    assert win["engine"] == "windowed" and ev["engine"] == "events"
    assert win["trace"] == ev["trace"] and win["metrics"] == ev["metrics"]
    assert win["agent_metrics"] == ev["agent_metrics"] and win["files"] == ev["files"]
    assert torch.equal(win["W"], ev["W"])
    assert all(torch.equal(a, b) for a, b in zip(win["state"], ev["state"], strict=True))


def test_an_edit_to_a_kernel_changes_both_engines_identically(tmp_path, monkeypatch):
    """The probe: halve D-PSGD's step in its one definition; both engines run the edited algorithm."""
    sc = base()
    before = run_both(tmp_path / "before", sc)
    assert_identical(before)

    def halved(self, b, p, got):  # DPSGD.combine with lr=0.5 * lr
        lr = p.lr / (1.0 + p.lr_decay * b.k)
        b.mix_into_params(b.x, got, step=b.g, lr=0.5 * lr)

    monkeypatch.setattr(DPSGD, "combine", halved)
    after = run_both(tmp_path / "after", sc)
    assert_identical(after)
    assert after["events"]["loss"] != before["events"]["loss"]
    assert not torch.equal(after["events"]["W"], before["events"]["W"])


def test_the_mix_and_step_loop_is_the_generic_programs_bits(tmp_path, monkeypatch):
    """D-PSGD is a ``MixStepKernel``: the events engine runs it as one plain loop per agent. With a decaying step, lossy
    links, jittered latencies and compute times (timeouts, stale messages, arrivals out of order), that loop gives the
    bits of the generic program that calls its ``local`` and ``combine`` on a batch of one."""
    from netsim.rounds import sync

    sc = base(n=7, rounds=6, lr_decay=0.3, round_timeout=0.03)
    sc["network"] = {"latency": {"kind": "lognormal", "mean": 0.012, "sigma": 0.6}, "loss": 0.15}
    sc["agents"]["compute_time"] = {"kind": "uniform", "low": 0.005, "high": 0.02}
    runs, used, mix_step = {}, [], sync._mix_step
    for plain in (True, False):
        monkeypatch.setattr(sync, "_mix_step", lambda kernel, plain=plain: used.append(plain and mix_step(kernel))
                            or used[-1])
        built: list = []
        r = netsim.run(scenario_from_dict(sc), out=tmp_path / str(plain), setup=built.append, engine="events")
        folder = tmp_path / str(plain)
        runs[plain] = ((folder / "trace.arrows").read_bytes(), (folder / "metrics.csv").read_text(),
                       built[0].bank.W.clone(), r.summary["events"])
        monkeypatch.undo()
    assert used == [True] * 7 + [False] * 7  # each agent's program: the plain loop, then the generic
    (t1, m1, w1, e1), (t2, m2, w2, e2) = runs[True], runs[False]
    assert t1 == t2 and m1 == m2 and e1 == e2 and torch.equal(w1, w2)
    from netsim.trace.io import read_trace

    kinds = read_trace(tmp_path / "True" / "trace.arrows").table.column("kind").to_pylist()
    assert {"drop", "timeout"} <= set(kinds)  # the lossy paths were taken


def kernels() -> list[tuple[str, RoundKernel, type]]:
    registry.names()  # the built-ins registered
    return [(name, prog, params) for name, (prog, params) in sorted(registry.REGISTRY.items())
            if isinstance(prog, RoundKernel)]


def test_at_least_four_builtin_kernels():
    assert {"dpsgd", "dp_dpsgd", "choco", "push_gossip"} <= {name for name, *_ in kernels()}


@pytest.mark.parametrize(("name", "kernel", "params"), kernels(), ids=[k[0] for k in kernels()])
def test_every_params_field_is_one_the_kernel_or_its_pattern_reads(name, kernel, params):
    """A new Params field that no kernel reads would be silently ignored: declare it (``reads``) or drop it."""
    fields = {f.name for f in attrs.fields(params)}
    declared = set(kernel.reads) | set(kernel.pattern.reads)
    assert fields == declared, f"{name}: undeclared {sorted(fields - declared)}, unknown {sorted(declared - fields)}"


# a differential test over the windowed engine's admitted region ----------------------------------------------
SYNC = st.sampled_from(["dpsgd", "dp_dpsgd", "choco"])


@st.composite
def sync_scenarios(draw) -> dict:
    n = draw(st.integers(3, 9))
    ct = draw(st.sampled_from([0.001, 0.01, 0.02]))
    lat = draw(st.sampled_from([0.001, 0.005, 0.0301]))
    name = draw(SYNC)
    alg = {"name": name, "lr": draw(st.sampled_from([0.1, 0.5])), "batch": draw(st.integers(1, 8)),
           "round_timeout": round(ct + lat + draw(st.sampled_from([0.005, 0.02])), 6)}
    if name != "choco":
        alg["lr_decay"] = draw(st.sampled_from([0.0, 0.3]))
    if name == "choco":
        alg["compressor"] = draw(st.sampled_from(["topk", "randk", "qsgd", "none"]))
    if name == "dp_dpsgd":
        alg["clip_mode"] = draw(st.sampled_from(["per_example", "batch"]))
    sc = base(n=n, rounds=draw(st.integers(2, 6)))
    sc["algorithm"] = alg
    sc["agents"]["compute_time"]["value"] = ct
    sc["network"] = {"latency": {"kind": "constant", "value": lat}, "loss": draw(st.sampled_from([0.0, 0.1, 0.3]))}
    sc["topology"] = draw(st.sampled_from([{"kind": "ring"}, {"kind": "erdos_renyi", "p": 0.6},
                                           {"kind": "complete"}]))
    sc["model"] = {"kind": "logistic", "dtype": draw(st.sampled_from(["float32", "float64"]))}
    # evaluations inside the run (learning curves) or only at its start and end; some at a compute end's time
    sc["evaluation"]["every"] = draw(st.sampled_from([1.0e6, 0.05, 0.13, ct, round(0.1 + ct, 6)]))
    return sc


@st.composite
def curve_scenarios(draw) -> dict:
    """Synchronous rounds whose times are dyadic fractions, so that evaluations fall at the very times of the rounds'
    activations, gradient completions, deliveries, barrier completions and timeouts (the ties simpy breaks by the
    order the events were set); every kernel of the pattern: one exchange or several, local steps, releases."""
    ct, lat = draw(st.sampled_from([1 / 32, 1 / 16])), draw(st.sampled_from([1 / 64, 1 / 32]))
    timeout = ct + lat + draw(st.sampled_from([1 / 32, 1 / 8]))
    name = draw(st.sampled_from(["dpsgd", "dp_dpsgd", "choco", "muffliato", "dfedsam"]))
    alg = {"name": name, "lr": 0.3, "batch": draw(st.integers(1, 6)), "round_timeout": timeout}
    loss = draw(st.sampled_from([0.0, 0.3]))
    if name == "muffliato":
        alg.update(sigma=0.01, gossip_steps=draw(st.integers(1, 3)), clip_mode="batch")
        loss = 0.0 if alg["gossip_steps"] > 1 else loss
    if name == "dfedsam":
        alg.update(local_steps=draw(st.integers(1, 2)), rho=0.05)
        ct = 1 / 64  # two gradients a local step
    sc = base(n=draw(st.integers(3, 7)), rounds=draw(st.integers(2, 4)))
    sc["agents"]["compute_time"]["value"] = ct
    sc["agents"]["activation"]["period"] = 0.25
    sc["algorithm"] = alg
    sc["network"] = {"latency": {"kind": "constant", "value": lat}, "loss": loss}
    sc["topology"] = draw(st.sampled_from([{"kind": "ring"}, {"kind": "complete"}]))
    sc["evaluation"]["every"] = draw(st.sampled_from([ct, lat, ct + lat, 1 / 64, 0.125, 0.25, timeout, 0.375]))
    return sc


@search(8, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=curve_scenarios())
def test_learning_curves_agree_with_the_engine_ties_included(tmp_path_factory, sc):
    """Evaluations inside a run of synchronous rounds, at every kind of the rounds' event times: the same trace
    (each evaluation's row among the round's rows), metrics.csv, agent_metrics.csv and final models as the engine."""
    assert_identical(run_both(tmp_path_factory.mktemp("curves"), sc))


@st.composite
def gossip_scenarios(draw) -> dict:
    sc = base(n=draw(st.integers(4, 12)), rounds=draw(st.integers(2, 8)))
    sc["agents"]["activation"]["period"] = 1.0
    sc["agents"]["compute_time"]["value"] = draw(st.sampled_from([0.001, 0.01]))
    low = draw(st.sampled_from([0.1, 0.2]))
    sc["network"] = {"latency": {"kind": "uniform", "low": low, "high": low + draw(st.sampled_from([0.0, 0.3]))},
                     "loss": draw(st.sampled_from([0.0, 0.2]))}
    sc["topology"] = {"kind": "random_regular", "degree": draw(st.sampled_from([2, 3, 4]))}
    sc["model"] = {"kind": "logistic", "dtype": draw(st.sampled_from(["float32", "float64"]))}
    sc["algorithm"] = {"name": "push_gossip", "lr": draw(st.sampled_from([0.0, 0.5])), "batch": draw(st.integers(0, 6)),
                       "lr_decay": draw(st.sampled_from([0.0, 0.2])),
                       "update": draw(st.sampled_from(["per_receipt", "per_round"]))}
    return sc


@search(12, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=st.one_of(sync_scenarios(), gossip_scenarios()))
def test_both_engines_agree_on_scenarios_drawn_from_the_admitted_region(tmp_path_factory, sc):
    from netsim.api import prepare
    from netsim.errors import InputError

    lat = sc["network"]["latency"]
    if lat["kind"] == "uniform":  # gossip: every push lands after the round's chain of gradients, before the tick
        assume(sc["topology"]["degree"] * sc["agents"]["compute_time"]["value"] + lat["high"] < 1.0)
    try:
        prepare(scenario_from_dict(sc))
    except InputError as e:  # a drawn graph that cannot be built (odd degree sum, disconnected): not a scenario
        assume("topology" not in str(e))
        raise
    assert_identical(run_both(tmp_path_factory.mktemp("drawn"), sc))


# a plugin written as a kernel runs windowed with no other code -------------------------------------------------
PROBE = """
import hashlib, json, sys
import torch
import netsim
from netsim.algorithms.registry import load_plugin
from netsim.scenario import scenario_from_dict
load_plugin(sys.argv[1])
got = []
for sc, folder in json.loads(sys.argv[2]):
    out = {}
    for engine in ("events", "windowed"):
        built = []
        r = netsim.run(scenario_from_dict(sc), out=folder + "/" + engine, setup=built.append, engine=engine)
        W = built[0].bank.W
        out[engine] = {"trace": hashlib.sha256(open(folder + "/" + engine + "/trace.arrows", "rb").read()).hexdigest(),
                       "metrics": open(folder + "/" + engine + "/metrics.csv").read(), "W": W.flatten().tolist(),
                       "spread": float((W - W.mean(0)).norm()), "engine": r.summary.get("engine", "events")}
    got.append(out)
print(json.dumps(got))
"""


def probe(plugin: str, jobs: list[tuple[dict, Path]]) -> list[dict]:
    """Each (scenario, folder) on both engines in one fresh process with examples/plugins/``plugin`` loaded (its
    registrations stay out of this one; the process starts once for all the jobs): per job and engine, the trace's
    sha256, metrics, final models, their spread and the engine that ran."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "examples/plugins" / plugin),
                        json.dumps([[sc, str(folder)] for sc, folder in jobs])], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_kernel_plugin_runs_windowed_byte_for_byte(tmp_path):
    jobs = []
    for loss in (0.0, 0.2):
        sc = base(n=8, rounds=30, name="gradient_tracking", lr=0.5)
        sc["algorithm"] = {"name": "gradient_tracking", "lr": 0.5, "batch": 0, "round_timeout": 0.05}
        sc["network"]["loss"] = loss
        jobs.append((sc, tmp_path / str(loss)))
    for loss, got in zip((0.0, 0.2), probe("gradient_tracking.py", jobs), strict=True):
        ev, win = got["events"], got["windowed"]
        assert win["engine"] == "windowed"
        assert win["trace"] == ev["trace"] and win["metrics"] == ev["metrics"] and win["W"] == ev["W"]
        if loss == 0.0:  # the trackers remove D-PSGD's disagreement (same as D-PSGD: spread ~0.25 at 30-100 rounds)
            assert ev["spread"] < 0.05


# Muffliato: several barrier exchanges a round (its K_g gossip steps) ---------------------------------------------
@pytest.mark.parametrize("algorithm", [
    {"acceleration": "none", "clip_mode": "batch"},
    {"acceleration": "chebyshev", "clip_mode": "per_example", "gossip_steps": 4},
    {"acceleration": "chebyshev", "clip_mode": "batch", "calibration": "per_message_gaussian"},
])
def test_muffliato_runs_windowed_byte_for_byte(tmp_path, algorithm):
    sc = base(n=10, rounds=5)
    sc["topology"] = {"kind": "erdos_renyi", "p": 0.5}
    sc["algorithm"] = {"name": "muffliato", "lr": 0.2, "batch": 6, "round_timeout": 0.05, "sigma": 0.01, **algorithm}
    if algorithm.get("calibration"):
        del sc["algorithm"]["sigma"]
    got = run_both(tmp_path, sc)
    assert_identical(got)


def test_muffliato_with_lossy_links_runs_on_the_barrier_windows(tmp_path):
    """Synchronous rounds refuse several exchanges a round on lossy links (each exchange's barriers time out at
    different times); the barrier windows play them, each exchange's barrier with its own timeout."""
    from netsim.api import prepare
    from netsim.rounds import windowed

    sc = base(n=6, rounds=3)
    sc["algorithm"] = {"name": "muffliato", "lr": 0.2, "batch": 6, "round_timeout": 0.05, "gossip_steps": 2}
    sc["network"]["loss"] = 0.1
    sim = prepare(scenario_from_dict(sc))
    assert "several exchanges a round with lossy links" in windowed.rounds_refusal(sim, sim.program)
    assert windowed.reason(sim) is None
    got = run_both(tmp_path, sc)
    assert_identical(got)


# DFedSAM and its baselines: local steps (waves of gradients) and Q gossip exchanges ------------------------------
@pytest.mark.parametrize(("name", "algorithm"), [
    ("dfedavg", {"local_steps": 3}),
    ("dfedsam", {"local_steps": 2, "rho": 0.05, "lr_decay": 0.9}),
    ("dfedsam_mgs", {"local_steps": 2, "gossip_steps": 3, "momentum": 0.5}),
    ("dfedavgm", {"local_epochs": 1, "batch": 7, "round_from": "clock"}),
    ("dfedavg", {"local_steps": 2, "noise_multiplier": 1.0, "clip": 0.5}),
])
def test_dfedsam_family_runs_windowed_byte_for_byte(tmp_path, name, algorithm):
    sc = base(n=8, rounds=4)
    sc["agents"]["activation"]["period"] = 0.5
    sc["algorithm"] = {"name": name, "lr": 0.3, "batch": 5, "round_timeout": 0.05, **algorithm}
    if algorithm.get("gossip_steps", 1) == 1:
        sc["network"]["loss"] = 0.2
    assert_identical(run_both(tmp_path, sc))


def test_a_batch_of_one_hands_over_the_current_rows_not_the_ones_it_was_made_with():
    """The events engine's batch of one passes the agent's own 1-D x and g where a kernel hands over b.x or b.g
    unchanged, and the kernel's own new rows when it replaced them (Muffliato's x^{t+1/2})."""
    from netsim.rounds.kernel import Batch

    x1, g1 = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.5])
    b = Batch([object()], 0, x1.unsqueeze(0), g1.unsqueeze(0), None, rows=((x1,), (g1,)))
    assert b._row(b.x) is x1 and b._row(b.g) is g1
    b.x = b.x - b.g
    assert torch.equal(b._row(b.x), torch.tensor([0.5, 1.5]))
