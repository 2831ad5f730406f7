"""The window-synchronous D-PSGD runner (``--engine windowed``) against the per-message engine: a differential
test, byte for byte."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, Phase, assume, given
from hypothesis import strategies as st

import netsim
from netsim.scenario import scenario_from_dict
from tests.search import search


def scenario(n: int = 12, rounds: int = 8) -> dict:
    return {"name": "windowed", "run": {"seed": 3, "rounds": rounds, "until": 1.0e6},
            "agents": {"count": n, "compute_time": {"kind": "constant", "value": 0.01},
                       "activation": {"kind": "periodic", "period": 0.1}},
            "topology": {"kind": "erdos_renyi", "p": 0.4},
            "network": {"latency": {"kind": "constant", "value": 0.005}},
            "data": {"kind": "synthetic", "samples": 40 * n, "features": 6, "partition": "iid"},
            "model": {"kind": "logistic"},
            "algorithm": {"name": "dpsgd", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "lr_decay": 0.1},
            "evaluation": {"every": 1.0e6}}


# the exact windowed runner (``netsim run --engine windowed``) against the engine: same bytes --------------
VARY = ("wall_time", "events_per_s", "engine", "windows")  # what a summary says of how the run was played
BATCHING = ("gradient_batches", "mean_gradient_batch")  # how a batch-invariant model's gradients were batched


def played_alike(sc_dict: dict) -> tuple[str, ...]:
    """The summary keys that say how a run was played: with a batch-invariant model (``model.batch_invariant``
    resolved: "auto" is true for agents that do not wake together) the lookahead windows batch the gradients their
    own way, the one thing the engines may differ in, so the gradient calls are left out too."""
    return VARY + BATCHING if scenario_from_dict(sc_dict).model.batch_invariant is True else VARY

def both_engines(tmp_path, sc_dict: dict) -> dict:
    import hashlib

    out = {}
    for engine in ("events", "windowed"):
        built: list = []
        r = netsim.run(scenario_from_dict(sc_dict), out=tmp_path / engine, setup=built.append, engine=engine)
        folder = tmp_path / engine
        out[engine] = {
            "trace": hashlib.sha256((folder / "trace.arrows").read_bytes()).hexdigest(),
            "metrics": (folder / "metrics.csv").read_text(),
            "summary": {k: v for k, v in r.summary.items() if k not in played_alike(sc_dict)},
            "W": built[0].bank.W.clone(), "engine": r.summary.get("engine", "events"),
            "windows": r.summary.get("windows"), "calls": r.summary["gradient_batches"]}
    return out


def nan_equal(a: dict, b: dict) -> bool:
    """Equal summaries, a diverged run's NaN metrics equal to each other."""
    same = {k for k in a if isinstance(a[k], float) and a[k] != a[k] and isinstance(b.get(k), float) and b[k] != b[k]}
    return a.keys() == b.keys() and all(a[k] == b[k] for k in a if k not in same)


def identical(got: dict) -> dict:
    """The engine's summary, after checking the windowed run wrote the same bytes and models."""
    ev, win = got["events"], got["windowed"]
    assert win["engine"] == "windowed"
    assert win["trace"] == ev["trace"] and win["metrics"] == ev["metrics"] and nan_equal(win["summary"], ev["summary"])
    torch.testing.assert_close(win["W"], ev["W"], rtol=0, atol=0, equal_nan=True)  # bit for bit (a diverged run's nan)
    return ev["summary"]


def exact(rounds: int = 9, n: int = 14, **changes) -> dict:
    sc = scenario(n=n, rounds=rounds)
    sc["evaluation"] = {"every": 1.0e6, "metrics": ["loss", "accuracy", "agent_accuracy"]}
    for key, value in changes.items():
        sc[key] = {k: v for k, v in {**sc.get(key, {}), **value}.items() if v is not None}
    return sc


@pytest.mark.parametrize("changes", [
    {},  # Metropolis weights on an Erdos-Renyi graph: many distinct weights, in-degrees 1..n-1
    {"topology": {"kind": "ring"}, "model": {"kind": "logistic", "dtype": "float64"},
     "run": {"trace_flush_every": 37}},  # trace batches cut inside rounds, at the same rows
    {"algorithm": {"batch": 0, "lr_decay": 0.0}, "data": {"sampling": "without_replacement"}},
    {"network": {"loss": 0.15}},  # barriers time out: the timed-out agents wake after the others
    {"network": {"loss": 0.4}, "topology": {"kind": "ring"}, "run": {"rounds": 12}},
    {"model": {"kind": "mlp", "hidden": [6]}, "algorithm": {"batch": 5},
     "network": {"latency": {"kind": "constant", "value": 0.0301}}},
    {"network": {"loss": 0.15}, "evaluation": {"every": 0.03}},  # learning curves: evaluations inside rounds
])
def test_windowed_runs_write_the_engines_trace_byte_for_byte(tmp_path, changes):
    summary = identical(both_engines(tmp_path, exact(**changes)))
    assert summary["stop_reason"] == "rounds" and summary["messages_sent"] > 0
    lossy = changes.get("network", {}).get("loss", 0.0) > 0
    assert (summary["round_timeouts"] > 0) == lossy and (summary["messages_dropped"] > 0) == lossy


@pytest.mark.parametrize(("changes", "why"), [
    # what synchronous rounds refuse is played by the lookahead windows (tests/test_barrier_windows.py) unless they
    # refuse it too
    ({"agents": {"activation": {"kind": "poisson", "rate": 10.0}},
      "algorithm": {"name": "muffliato", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "lr_decay": None,
                    "sigma": 0.01, "gossip_steps": 3}, "privacy": {"delta": 1e-5, "epsilon_cap": 8.0}},
     "nor as lookahead windows: privacy.epsilon_cap: a release's budget check"),
    ({"network": {"latency": {"kind": "uniform", "low": 0.0, "high": 0.004}},
      "algorithm": {"name": "dfedsam", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "lr_decay": None,
                    "local_steps": 2}},
     "nor as lookahead windows: dfedsam chooses its own routes"),
    ({"agents": {"clock_jitter": {"kind": "uniform", "low": 0.0, "high": 0.01}}, "network": {"bandwidth": 1.0e6},
      "algorithm": {"name": "choco", "lr": 0.3, "batch": 8, "round_timeout": 0.05, "lr_decay": None}},
     "nor as lookahead windows: bandwidth or uplinks with choco: a payload's size depends on its values"),
    ({"agents": {"compute_time": {"kind": "constant", "value": 0.06}}, "run": {"checkpoint_every_rounds": 3},
      "topology": {"kind": "ring", "dynamic": {"kind": "one_peer_exponential"}}},
     "nor as lookahead windows: the topology changes over time: a barrier waits for the in-neighbours of its round"),
    ({"algorithm": {"name": "fedavg", "lr": 0.01, "batch": 8, "lr_decay": None}},
     "coroutine program, not a round kernel"),
    ({"algorithm": {"name": "choco", "lr": 0.0, "batch": 8, "round_timeout": 0.05, "lr_decay": None}},
     "takes no gradients"),
])
def test_windowed_refuses_what_it_cannot_run_exactly(tmp_path, changes, why):
    from typer.testing import CliRunner

    from netsim.cli import app
    from netsim.errors import InputError

    sc = exact(**changes)
    with pytest.raises(InputError, match=why):
        netsim.run(scenario_from_dict(sc), out=tmp_path / "run", engine="windowed")
    assert not (tmp_path / "run").exists()  # refused before any output
    import tomli_w

    (tmp_path / "s.toml").write_text(tomli_w.dumps(sc))
    res = CliRunner().invoke(app, ["run", str(tmp_path / "s.toml"), "--engine", "windowed", "--out",
                                   str(tmp_path / "cli")])
    assert res.exit_code == 2 and why in res.output and "--engine" in res.output
    assert not (tmp_path / "cli").exists()


def gossip(**changes) -> dict:
    sc = {"name": "gossip", "run": {"seed": 2, "rounds": 12, "until": 1.0e6},
          "agents": {"count": 30, "compute_time": {"kind": "constant", "value": 0.001},
                     "activation": {"kind": "periodic", "period": 1.0}},
          "topology": {"kind": "random_regular", "degree": 4},
          "network": {"latency": {"kind": "uniform", "low": 0.01, "high": 0.5}, "loss": 0.1},
          "data": {"kind": "synthetic", "samples": 600, "features": 7, "partition": "iid"},
          "model": {"kind": "logistic"},
          "algorithm": {"name": "push_gossip", "lr": 0.5, "batch": 0},
          "evaluation": {"every": 1.0e6, "metrics": ["accuracy", "agent_accuracy"]}}
    for key, value in changes.items():
        sc[key] = {**sc.get(key, {}), **value}
    return sc


@pytest.mark.parametrize("changes", [
    {},  # the gossip-learning benchmark's setting, small
    {"network": {"latency": {"kind": "constant", "value": 0.2}, "loss": 0.0}, "model": {"dtype": "float64"},
     "algorithm": {"batch": 4, "lr_decay": 0.3}},
    {"algorithm": {"lr": 0.0}, "run": {"trace_flush_every": 29}},  # pure gossip averaging, no gradients
    {"algorithm": {"update": "per_round", "lr_decay": 0.2}},  # one update after all of a round's merges
    {"agents": {"compute_time": {"kind": "constant", "value": 0.0024}}, "run": {"trace_flush_every": 7}},
])
def test_windowed_push_gossip_writes_the_engines_trace_byte_for_byte(tmp_path, changes):
    summary = identical(both_engines(tmp_path, gossip(**changes)))
    assert summary["messages_delivered"] > 0 and summary["stop_reason"] == "rounds"


@pytest.mark.parametrize("changes", [
    {"network": {"latency": {"kind": "exponential", "mean": 0.1}}},
    {"network": {"latency": {"kind": "uniform", "low": 0.0, "high": 0.5}}},
    {"agents": {"activation": {"kind": "poisson", "rate": 1.0}},
     "network": {"latency": {"kind": "lognormal", "mean": 0.1, "sigma": 0.5}}},
])
def test_push_gossip_with_no_lookahead_merges_each_model_a_lock_step_after_its_push(tmp_path, changes):
    """Latencies with no positive minimum (not synchronous ticks either: no upper bound, or sooner than the
    gradients): a model may be pushed and merged inside one window, played in dependency order."""
    sc = gossip(**changes)
    sc["run"] = {k: v for k, v in sc["run"].items() if v is not None}
    assert lookahead_run(tmp_path, sc)["messages_delivered"] > 0


@pytest.mark.parametrize(("changes", "why"), [
    ({"privacy": {"delta": 1e-5, "record": "mixing"}},
     "lookahead windows: privacy.record = 'mixing'"),
])
def test_windowed_push_gossip_refuses_what_it_cannot_run_exactly(tmp_path, changes, why):
    from netsim.errors import InputError

    sc = gossip(**changes)
    sc["run"] = {k: v for k, v in sc["run"].items() if v is not None}
    with pytest.raises(InputError, match=why):
        netsim.run(scenario_from_dict(sc), out=tmp_path / "run", engine="windowed")
    assert not (tmp_path / "run").exists()


# asynchronous push gossip as conservative lookahead windows (rounds/lookahead.py) -----------------------------
def lookahead_run(tmp_path, sc: dict, windows: bool = True) -> dict:
    """Both engines; the windowed one played lookahead windows (the summary says how), or, for a drawn scenario
    whose clocks happen to be simultaneous (``windows=False``), maybe synchronous rounds."""
    got = both_engines(tmp_path, sc)
    summary = identical(got)
    w = got["windowed"]["windows"]
    assert (w is None and not windows) or w["windows"] > 0
    assert got["events"]["windows"] is None
    return summary


@pytest.mark.parametrize("changes", [
    {"network": {"latency": {"kind": "uniform", "low": 0.01, "high": 1.0}}},  # pushes cross the next tick
    {"agents": {"compute_time": {"kind": "constant", "value": 0.003}}},  # gradient chains meet the pushes
    {"agents": {"activation": {"kind": "poisson", "rate": 1.0},
                "clock_drift": {"kind": "uniform", "low": -0.01, "high": 0.01}},
     "run": {"rounds": None, "until": 15.0}},  # the benchmark's job, small: the run stops at run.until
    {"agents": {"activation": {"kind": "poisson", "rate": 2.0}}, "run": {"rounds": 9, "until": None},
     "evaluation": {"every": 1.5, "metrics": ["loss", "accuracy"]}},  # no run.until: it stops at the last finish
    {"agents": {"activation": {"kind": "poisson", "rate": 2.0}}, "run": {"rounds": None, "until": 6.0},
     "evaluation": {"every": 1.5, "metrics": ["loss", "accuracy", "consensus", "agent_accuracy"]}},  # evaluations
])
def test_windowed_push_gossip_plays_lookahead_windows_byte_for_byte(tmp_path, changes):
    sc = gossip(**changes)
    sc["run"] = {k: v for k, v in sc["run"].items() if v is not None}
    summary = lookahead_run(tmp_path, sc)
    assert summary["messages_delivered"] > 0 and summary["gradients"] > 0


def test_the_summary_says_how_the_windows_went(tmp_path):
    sc = gossip(agents={"activation": {"kind": "poisson", "rate": 2.0}}, run={"rounds": None, "until": 8.0})
    sc["run"] = {k: v for k, v in sc["run"].items() if v is not None}
    r = netsim.run(scenario_from_dict(sc), out=tmp_path / "run", engine="windowed")
    w = r.summary["windows"]
    assert r.summary["engine"] == "windowed" and r.summary["stop_reason"] == "until"
    assert w["lookahead_s"] == 0.01  # the latency's lower bound
    # every traced event is a window's, but the evaluations at the start and the end
    assert w["windows"] * w["events_per_window_mean"] == pytest.approx(r.summary["events"] - 2)
    assert 1 <= w["events_per_window_min"] <= w["events_per_window_mean"]
    assert w["windows"] >= 8.0 / 0.5  # 60 agents' activations a second: windows of 0.01 s are often empty
    assert 0.0 < w["tensor_share"] < 1.0
    assert 0.0 < w["control_cpu_s"] <= r.summary["wall_time"] * 1.1  # one thread's CPU: at most its wall time
    # the CLI's summary table shows them, so a user sees why the run is (or is not) fast
    from rich.console import Console

    from netsim.cli import _summary_table

    con = Console(record=True, width=100)
    con.print(_summary_table(r.summary))
    text = con.export_text()
    assert f"{w['windows']:,} of 0.01 s" in text
    assert f"{w['events_per_window_min']:,}" in text.split("events per window (mean, min)")[1].splitlines()[0]
    assert f"{100 * w['tensor_share']:.0f}% (gradients" in text
    assert "control CPU" in text


@pytest.mark.parametrize("changes", [
    {},
    {"network": {"latency": {"kind": "constant", "value": 0.2}, "loss": 0.0}, "model": {"dtype": "float64"},
     "algorithm": {"batch": 4, "lr_decay": 0.3}},
    {"algorithm": {"update": "per_round", "lr_decay": 0.2}},
])
def test_lookahead_windows_keep_the_ties_of_synchronous_rounds(tmp_path, monkeypatch, changes):
    """Forced onto the lookahead driver, synchronous rounds (every agent wakes at the same tick, pushes of one
    round land together) give the engine's bytes too: simultaneous events keep simpy's order."""
    from netsim.rounds import windowed

    monkeypatch.setattr(windowed, "rounds_refusal", lambda sim, kernel, alternative=False: "forced")
    got = both_engines(tmp_path, gossip(**changes))
    identical(got)


@pytest.mark.parametrize("algorithm", [
    {"name": "dp_dpsgd", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "clip": 1.0, "noise_multiplier": 1.0},
    {"name": "dp_dpsgd", "lr": 0.3, "batch": 8, "round_timeout": 0.05, "clip": 0.5, "sigma": 0.2,
     "clip_mode": "batch", "lr_decay": 0.1},
])
def test_windowed_dp_dpsgd_writes_the_engines_trace_and_releases(tmp_path, algorithm):
    sc = exact(network={"loss": 0.15})
    sc["algorithm"] = algorithm
    sc["privacy"] = {"delta": 1e-5}
    summary = identical(both_engines(tmp_path, sc))
    assert summary["privacy_releases"] == 14 * 9 and summary["round_timeouts"] > 0
    assert summary["privacy_epsilon_max"] > 0


def test_windowed_dp_dpsgd_refuses_a_budget_cap(tmp_path):
    from netsim.errors import InputError

    sc = exact()
    sc["algorithm"] = {"name": "dp_dpsgd", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "clip": 1.0,
                       "noise_multiplier": 1.0}
    sc["privacy"] = {"delta": 1e-5, "epsilon_cap": 5.0}
    with pytest.raises(InputError, match="epsilon_cap"):
        netsim.run(scenario_from_dict(sc), out=tmp_path / "run", engine="windowed")


@pytest.mark.parametrize("changes", [
    {},  # top-k on an Erdos-Renyi graph with Metropolis weights: many distinct consensus scalars
    {"algorithm": {"compressor": "randk", "unbiased": True}, "network": {"loss": 0.15}},  # copies drift
    {"algorithm": {"compressor": "qsgd", "bits": 3}, "topology": {"kind": "ring"}, "model": {"dtype": "float64"},
     "run": {"trace_flush_every": 23}},
    {"algorithm": {"compressor": "none", "gamma": 1.0}, "network": {"loss": 0.4}, "topology": {"kind": "ring"}},
])
def test_windowed_choco_writes_the_engines_trace_byte_for_byte(tmp_path, changes):
    """CHOCO-SGD (compressed differences, public copies) played as windows: every agent's compression, copies
    and consensus batched over the round, the engine's bytes."""
    sc = exact(**{k: v for k, v in changes.items() if k != "algorithm"})
    sc["algorithm"] = {"name": "choco", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "gamma": 0.4,
                       "compressor": "topk", "ratio": 0.3, **changes.get("algorithm", {})}
    summary = identical(both_engines(tmp_path, sc))
    assert summary["stop_reason"] == "rounds" and summary["messages_delivered"] > 0


@pytest.mark.parametrize("ratio", [0.3, 0.5, 1.0])
def test_windowed_topk_keeps_each_rows_own_set_ties_included(ratio):
    """The batched top-k (``Compressor.topk_rows``, which the windowed CHOCO uses) decodes every row as the
    compressor does one row at a time: rows without a tie at the k-th magnitude have one kept set; rows with one
    (zeros, equal magnitudes of opposite sign) go one by one."""
    from netsim.comm.compression import Compressor

    g = torch.Generator().manual_seed(5)
    d = torch.randn(6, 10, generator=g)
    d[1, 5:] = 0.0  # ties among zeros
    d[2, :4] = torch.tensor([3.0, -3.0, 3.0, -3.0])  # ties of opposite sign at the top
    d[3] = torch.tensor([1.0, -1.0] * 5)  # all equal magnitudes
    comp = Compressor("topk", ratio)
    dense = comp.topk_rows(d)
    want = torch.stack([comp(v).decode() for v in d])
    assert torch.equal(dense, want)
    assert comp.encoded_size(10, d.element_size()) == comp(d[0]).size_bytes  # the sizes the runner traces


@st.composite
def async_gossip(draw, unbounded: bool = True) -> dict:
    """A scenario of the lookahead windows' admitted region: own clocks, random times, lossy links; ``unbounded``:
    latencies with no positive minimum too (exponential, lognormal, uniform from 0: messages sent and delivered inside
    one window), for the patterns whose tensor work waits for the payloads it reads."""
    n = draw(st.integers(4, 12))
    act = draw(st.sampled_from([{"kind": "poisson", "rate": 1.0}, {"kind": "poisson", "rate": 4.0},
                                {"kind": "periodic", "period": 0.5}, {"kind": "periodic", "period": 1.0},
                                {"kind": "bernoulli", "period": 0.5, "p": 0.6}]))
    u = {"kind": "uniform"}
    agents = {"count": n, "activation": act,
              "clock_offset": draw(st.sampled_from([{"kind": "constant", "value": 0.0},
                                                    {**u, "low": 0.0, "high": 1.0}])),
              "clock_drift": draw(st.sampled_from([{"kind": "constant", "value": 0.0},
                                                   {**u, "low": -0.05, "high": 0.05}])),
              "compute_time": draw(st.sampled_from([{"kind": "constant", "value": 0.001},
                                                    {"kind": "constant", "value": 0.05},
                                                    {**u, "low": 0.0, "high": 0.08}]))}
    if draw(st.booleans()):
        agents["clock_jitter"] = {**u, "low": 0.0, "high": 0.05}
    if draw(st.booleans()):
        agents.update(stragglers=[0, n - 1], straggler_factor=3.0)
    low = draw(st.sampled_from([0.02, 0.1, 0.2]))
    lat = draw(st.sampled_from([{"kind": "constant", "value": low},
                                {**u, "low": low, "high": low + draw(st.sampled_from([0.05, 0.5]))}]
                               + [{"kind": "exponential", "mean": low},
                                  {"kind": "lognormal", "mean": low, "sigma": 1.0},
                                  {**u, "low": 0.0, "high": 2 * low}] * unbounded))
    run = dict(draw(st.sampled_from([{"until": 4.0}, {"until": 7.5},
                                     {"rounds": draw(st.integers(2, 6)), "until": 1.0e6},
                                     {"rounds": draw(st.integers(2, 6))}])))  # the run ends at the last finish
    run["trace_flush_every"] = draw(st.sampled_from([7, 1000]))  # trace batches cut inside windows, at the same rows
    return {"name": "async", "run": {"seed": draw(st.integers(0, 50)), **run}, "agents": agents,
            "topology": {"kind": "random_regular", "degree": draw(st.sampled_from([2, 3, 4]))},
            "network": {"latency": lat, "loss": draw(st.sampled_from([0.0, 0.1, 0.3]))},
            "data": {"kind": "synthetic", "samples": 40 * n, "features": 5, "partition": "iid"},
            "model": {"kind": "logistic", "dtype": draw(st.sampled_from(["float32", "float64"])),
                      # "auto" (true where agents do not wake together: each step's gradients in one call) or the
                      # default gradient, which the windows evaluate in the engine's own batches
                      "batch_invariant": draw(st.sampled_from(["auto", False]))},
            "algorithm": {"name": "push_gossip", "lr": draw(st.sampled_from([0.0, 0.5])),
                          "batch": draw(st.integers(0, 6)), "lr_decay": draw(st.sampled_from([0.0, 0.2])),
                          "update": draw(st.sampled_from(["per_receipt", "per_round"]))},
            "evaluation": {"every": draw(st.sampled_from([1.0e6, 0.7, 2.0])),
                           "metrics": ["loss", "accuracy", "agent_accuracy"]}}


def buildable(sc: dict) -> None:
    """A drawn scenario whose graph cannot be built (an odd degree sum) is not one: Hypothesis draws another; any
    other refusal fails the test."""
    from netsim.api import prepare
    from netsim.errors import InputError

    try:
        prepare(scenario_from_dict(sc))
    except InputError as e:
        assume("topology" not in str(e))
        raise


@search(14, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=async_gossip())
def test_lookahead_windows_agree_with_the_engine_on_drawn_asynchronous_scenarios(tmp_path_factory, sc):
    buildable(sc)
    lookahead_run(tmp_path_factory.mktemp("drawn"), sc, windows=False)


def test_engine_auto_takes_the_windows_where_they_are_exact_and_says_why_not_elsewhere(tmp_path):
    """--engine auto: a scenario the windows play exactly runs windowed (the engine's bytes); one they refuse runs on
    the events engine, its summary naming the reason (the windows' own refusal line)."""
    sc = gossip(agents={"activation": {"kind": "poisson", "rate": 2.0}}, run={"rounds": None, "until": 4.0})
    sc["run"] = {k: v for k, v in sc["run"].items() if v is not None}
    fast = netsim.run(scenario_from_dict(sc), out=tmp_path / "auto", engine="auto")
    events = netsim.run(scenario_from_dict(sc), out=tmp_path / "events", engine="events")
    assert fast.summary["engine"] == "windowed" and fast.summary["windows"]["windows"] > 0
    assert (tmp_path / "auto" / "trace.arrows").read_bytes() == (tmp_path / "events" / "trace.arrows").read_bytes()
    sc["privacy"] = {"delta": 1e-5, "record": "mixing"}
    slow = netsim.run(scenario_from_dict(sc), out=tmp_path / "slow", engine="auto")
    assert slow.summary["engine"] == "events" and "windows" not in slow.summary
    assert "push_gossip's lookahead windows do not write the mixing record" in slow.summary["windowed_refused"]
    assert "windowed_refused" not in events.summary and events.summary["engine"] == "events"


def test_a_diverged_run_is_found_and_stopped_alike_on_both_engines(tmp_path):
    """lr l2 = 100 makes the weights grow a hundredfold a step: the evaluations of the lookahead windows and the
    end's of synchronous rounds find the run diverged where the engine does, with the same summary, trace and
    metrics; run.stop_on_divergence stops both at that evaluation."""
    sc = gossip(agents={"activation": {"kind": "poisson", "rate": 2.0}}, run={"rounds": None, "until": 6.0},
                evaluation={"every": 1.5, "metrics": ["loss", "accuracy", "consensus"]}, algorithm={"lr": 1e4},
                model={"l2": 0.01})
    sc["run"] = {k: v for k, v in sc["run"].items() if v is not None}
    sc["run"]["stop_on_divergence"] = True
    got = both_engines(tmp_path / "stop", sc)
    stopped = identical(got)
    d = stopped["diverged"]
    assert (d["t"], d["after"]) == (3.0, 1.5) and 0 <= d["agent"] < 30
    assert stopped["stop_reason"] == "diverged" and stopped["simulated_time"] == 3.0
    sync = identical(both_engines(tmp_path / "sync", exact(algorithm={"lr": 1e6}, model={"kind": "logistic",
                                                                                           "l2": 0.01})))
    assert sync["diverged"]["t"] == sync["simulated_time"] and sync["diverged"]["after"] == 0.0


# --engine auto, the default: which engine ran, and why not the windows in one line with what to change ----------
DP = {"name": "dp_dpsgd", "lr": 0.5, "batch": 8, "round_timeout": 0.05, "clip": 1.0, "noise_multiplier": 1.0}


def _async(**changes) -> dict:
    sc = gossip(agents={"activation": {"kind": "poisson", "rate": 2.0}}, run={"rounds": None, "until": 4.0})
    for key, value in changes.items():
        sc[key] = {**sc.get(key, {}), **value}
    sc["run"] = {k: v for k, v in sc["run"].items() if v is not None}
    return sc


@pytest.mark.parametrize(("sc", "rule", "fix"), [
    (exact(agents={"activation": {"kind": "bernoulli", "period": 0.1, "p": 0.5}}), "activation 'bernoulli'",
     'set agents.activation.kind = "periodic"'),
    (exact(agents={"clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.01}}), "clock offsets, drift or jitter",
     "remove agents.clock_offset, clock_drift and clock_jitter"),
    (exact(agents={"compute_time": {"kind": "lognormal", "mean": 0.01, "sigma": 0.3}}), "compute times differ",
     "set agents.compute_time to a constant"),
    (exact(agents={"offline": [{"agent": 1, "start": 0.2, "end": 0.4}]}), "agents go offline",
     "remove agents.offline"),
    (exact(network={"burst": {"p_enter": 0.1, "p_exit": 0.5}}), "links are not Bernoulli-lossy",
     "remove network.burst"),
    (exact(network={"bandwidth": 1.0e6}), "bandwidth-limited links: synchronous rounds do not model transmission",
     "remove network.bandwidth and network.uplink"),  # (the lookahead windows play it)
    (exact(run={"rounds": None}), "run.rounds is not set", "set run.rounds"),
    (exact(run={"until": 0.5}), "run.until = 0.5 may stop the run inside a round", "remove run.until"),
    (exact(evaluation={"every": 0.3}, run={"stop_on_divergence": True}),
     "run.stop_on_divergence with evaluations inside the run", "remove run.stop_on_divergence"),
    (exact(network={"latency": {"kind": "uniform", "low": 0.001, "high": 0.004}}), "one constant latency",
     "set network.latency to a constant"),
    (exact(agents={"compute_time": {"kind": "constant", "value": 0.06}}), "miss the barrier",
     "raise algorithm.round_timeout above 0.065 s"),
    (exact(algorithm={"name": "choco", "lr": 0.0, "lr_decay": None}), "takes no gradients", "algorithm.lr > 0"),
    (exact(algorithm={"name": "fedavg", "lr": 0.01, "batch": 8, "lr_decay": None}),
     "algorithm 'fedavg' is a coroutine program, not a round kernel: fedavg has no fast path yet",
     "written as a round kernel"),
    (exact(algorithm=DP, privacy={"delta": 1e-5, "epsilon_cap": 5.0}), "privacy.epsilon_cap",
     "remove privacy.epsilon_cap"),
    (exact(algorithm={"name": "dfedsam", "lr": 0.1, "batch": 8, "local_steps": 2, "random_neighbors": 2,
                      "lr_decay": None}), "random in-neighbours", "set algorithm.random_neighbors = 0"),
    # asynchronous algorithms: the lookahead windows' reason (they play any clock), not the rounds'
    (_async(algorithm={"name": "event_triggered", "lr": 0.3, "batch": 8},
            network={"latency": {"kind": "exponential", "mean": 0.1}}),
     "latency 'exponential' has no positive lower bound", "a uniform latency with low > 0 (or a constant) runs fast"),
    (_async(algorithm={"name": "sparq", "lr": 0.3, "batch": 8},
            network={"latency": {"kind": "uniform", "low": 0.0, "high": 0.1}}), "the minimum latency is 0",
     "give latency a minimum > 0"),
    (_async(privacy={"delta": 1e-5, "record": "mixing"}),
     "privacy.record = 'mixing': push_gossip's lookahead windows do not write the mixing record",
     "remove privacy.record, or use an algorithm of barrier rounds"),
    (_async(run={"checkpoint_every": 2.0}, algorithm={"name": "dpsgd", "lr": 0.3, "batch": 8},
            topology={"kind": "ring", "dynamic": {"kind": "one_peer_exponential"}}),
     "the topology changes over time: a barrier waits for the in-neighbours of its round", "remove topology.dynamic"),
    (_async(algorithm={"name": "event_triggered", "lr": 0.3, "batch": 8}, network={"bandwidth": 1.0e6}),
     "a triggered send waits for its transmission", "remove network.bandwidth"),
    (_async(algorithm={"name": "event_triggered", "lr": 0.3, "batch": 8, "clip": 1.0, "noise_multiplier": 1.0,
                       "lazy": True}, privacy={"delta": 1e-5}), "lazy with noise_multiplier > 0: LAG's trigger",
     "set algorithm.lazy = false or algorithm.noise_multiplier = 0"),
])
def test_engine_auto_refusals_name_the_rule_and_what_to_change(sc, rule, fix):
    """Each reason the fast path is refused, as ``--engine auto`` reports it: one line, the rule, then after " — "
    what to change. It is the lookahead windows' reason (they play any clock); where they play the run (barrier
    rounds on jittery clocks), the synchronous rounds' reason, which ``--engine windowed`` no longer needs."""
    from netsim.api import prepare
    from netsim.rounds import windowed

    sim = prepare(scenario_from_dict(sc))
    line = windowed.reason(sim) or windowed.rounds_refusal(sim, sim.program)
    assert line is not None and "\n" not in line and line.count(" — ") == 1, line
    said, change = line.split(" — ")
    assert rule in said and fix in change, line


def test_engine_auto_is_the_default_and_says_which_engine_ran(tmp_path):
    """No --engine (CLI) and no engine= (API): auto. An exact scenario runs windowed with the events engine's bytes
    (trace.arrows, metrics.csv); a refused one runs on the events engine, its summary and table giving the reason."""
    import json

    import tomli_w
    from rich.console import Console
    from typer.testing import CliRunner

    from netsim.cli import _summary_table, app

    (tmp_path / "s.toml").write_text(tomli_w.dumps(exact()))
    runner = CliRunner()
    got = {}
    for name, flags in (("default", []), ("events", ["--engine", "events"])):
        res = runner.invoke(app, ["run", str(tmp_path / "s.toml"), "--out", str(tmp_path / name), *flags])
        assert res.exit_code == 0, res.output
        got[name] = (json.loads((tmp_path / name / "summary.json").read_text()), res.output)
    assert got["default"][0]["engine"] == "windowed" and got["events"][0]["engine"] == "events"
    assert "windowed_refused" not in got["default"][0] and "windowed_refused" not in got["events"][0]
    for f in ("trace.arrows", "metrics.csv"):
        assert (tmp_path / "default" / f).read_bytes() == (tmp_path / "events" / f).read_bytes()
    slow = netsim.run(scenario_from_dict(exact(agents={"clock_drift": {"kind": "normal", "mean": 0.0,
                                                                        "sigma": 0.001}},
                                               algorithm={"name": "dfedsam", "lr": 0.5, "batch": 8,
                                                          "round_timeout": 0.05, "lr_decay": None,
                                                          "local_steps": 2})),
                      out=tmp_path / "slow")
    assert slow.summary["engine"] == "events"
    assert slow.summary["windowed_refused"].startswith("dfedsam chooses its own routes each exchange (not played by "
                                                       "the lookahead windows) — synchronous rounds play it")
    console = Console(width=400, record=True)
    console.print(_summary_table(slow.summary))
    text = console.export_text()
    assert "why not windowed" in text and slow.summary["windowed_refused"] in text
