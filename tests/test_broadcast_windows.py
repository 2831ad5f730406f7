"""The broadcast pattern (asynchronous push SGD, push-sum), event-triggered sends (event-triggered D-PSGD) and
pairwise exchanges with a lock (AD-PSGD) as lookahead windows (rounds/broadcast_windows.py, triggered_windows.py,
pairwise_windows.py): the windowed engine against the events engine, byte for byte (trace.arrows, metrics.csv,
final models)."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

import netsim
from netsim.privacy.ledger import ledgers
from netsim.scenario import scenario_from_dict
from tests.search import search
from tests.test_windowed import VARY, async_gossip, buildable, gossip, played_alike


def spread(sim) -> None:
    """Every agent starts from its own model (convex models start at 0 everywhere: merges would change nothing)."""
    W = sim.bank.W
    g = torch.Generator().manual_seed(sim.scenario.run.seed)
    W.copy_(torch.randn(W.shape, generator=g, dtype=torch.float64).to(W.dtype))


def both(tmp_path, sc: dict, keep=None) -> dict:
    """Both engines on ``sc`` from spread models: the same bytes, summary and models; the events run's summary."""
    out = {}
    for engine in ("events", "windowed"):
        built: list = []

        def setup(sim, built=built):
            spread(sim)
            built.append(sim)

        r = netsim.run(scenario_from_dict(sc), out=tmp_path / engine, setup=setup, engine=engine)
        folder = tmp_path / engine
        out[engine] = {"trace": hashlib.sha256((folder / "trace.arrows").read_bytes()).hexdigest(),
                       "metrics": (folder / "metrics.csv").read_text(), "W": built[0].bank.W.clone(),
                       "summary": {k: v for k, v in r.summary.items() if k not in VARY},
                       "engine": r.summary.get("engine", "events"), "windows": r.summary.get("windows"),
                       "ledgers": ledgers(built[0])}
    ev, win = out["events"], out["windowed"]
    for e in (ev, win):  # how the gradients were batched: the one thing the engines may differ in
        e["summary"] = {k: v for k, v in e["summary"].items() if k not in played_alike(sc)}
    assert win["engine"] == "windowed" and win["windows"]["windows"] > 0 and ev["windows"] is None
    assert win["trace"] == ev["trace"] and win["metrics"] == ev["metrics"] and win["summary"] == ev["summary"]
    assert torch.equal(win["W"], ev["W"])
    assert win["ledgers"] == ev["ledgers"]  # every agent's releases (time, round, noise, sampling), in order
    return {**ev["summary"], "W": ev["W"], "ledgers": ev["ledgers"]}


@st.composite
def broadcasting(draw, name: str) -> dict:
    """A scenario of the lookahead windows' admitted region (push gossip's: own clocks, drift, jitter, stragglers,
    random compute times and latencies, loss; bandwidth or uplinks, or not), asynchronous push SGD, push-sum,
    event-triggered D-PSGD (each trigger rule), SPARQ-SGD (each rule and compressor), AD-PSGD (with or without its
    lock, replies within or after their timeout) or randomized gossip (its step before the exchange, no lock), a
    directed graph or not."""
    sc = draw(async_gossip(unbounded=name not in ("event_triggered", "sparq")))  # (their sends are decided later)
    lr = draw(st.sampled_from([0.0, 0.5]))
    sc["algorithm"] = {"name": name, "lr": lr, "batch": draw(st.integers(0, 6))}
    if name in ("async_push", "pushsum", "adpsgd", "gossip") and draw(st.booleans()):  # sends wait to transmit
        sc["network"] = {**sc["network"], **draw(st.sampled_from([{"bandwidth": 2.0e3}, {"uplink": 4.0e3}]))}
    if name == "async_push":
        sc["algorithm"]["staleness_power"] = draw(st.sampled_from([0.0, 0.5, 2.0]))
    elif name == "event_triggered":
        trigger = draw(st.sampled_from(["always", "absolute", "relative", "decaying"]))
        levels = [0.05, 0.3] if trigger == "relative" else [0.0, 0.1, 1.0]
        sc["algorithm"] |= {"trigger": trigger, "decay": 0.9, "threshold": draw(st.sampled_from(levels))}
        if draw(st.booleans()):  # DP-SGD's releases (per-example clipping, each agent's noise), a budget cap or not
            sc["algorithm"] |= {"lr": 0.5, "noise_multiplier": draw(st.sampled_from([0.5, 2.0])),  # (lr 0: no step)
                                "clip": draw(st.sampled_from([0.1, 1.0]))}
            cap = draw(st.sampled_from([None, 2.0, 20.0]))
            sc["privacy"] = {"delta": 1e-5} if cap is None or sc["agents"]["activation"]["kind"] == "bernoulli" \
                else {"delta": 1e-5, "epsilon_cap": cap}
        else:  # or LAG: a fresh gradient only where the trigger fires on its change (else the last one, reused)
            sc["algorithm"]["lazy"] = draw(st.booleans())
    elif name == "sparq":
        trigger = draw(st.sampled_from(["always", "absolute", "relative", "decaying"]))
        sc["algorithm"] |= {"trigger": trigger, "threshold": draw(st.sampled_from([0.0, 0.05, 0.5])),
                            "compressor": draw(st.sampled_from(["none", "topk", "randk", "qsgd"])),
                            "ratio": draw(st.sampled_from([0.1, 0.5])), "bits": 2}
    elif name == "adpsgd":
        sc["algorithm"] |= {"reply_timeout": draw(st.sampled_from([0.02, 0.3, 2.0])), "atomic": draw(st.booleans())}
    elif name == "gossip":
        sc["algorithm"] |= {"reply_timeout": draw(st.sampled_from([0.02, 0.3, 2.0]))}
    if draw(st.booleans()):
        sc["topology"] = {"kind": "erdos_renyi", "p": 0.4, "directed": True}
    if draw(st.booleans()):
        sc["model"]["batch_invariant"] = True
    return sc


@pytest.mark.parametrize("name", ["async_push", "pushsum", "event_triggered", "sparq", "adpsgd", "gossip"])
@search(10, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_broadcast_windows_agree_with_the_engine_on_drawn_asynchronous_scenarios(tmp_path_factory, name, data):
    """With the tensor work of 1 to 32 windows done together for the broadcast and pairwise patterns (a merge, serve or
    reply then waits in lock step for a payload made in the same work; event-triggered sends: one window a work)."""
    from netsim.rounds import broadcast_windows, pairwise_windows

    sc = data.draw(broadcasting(name))
    buildable(sc)
    gathers = data.draw(st.sampled_from([1, 3, 32]))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(broadcast_windows._Driver, "gathers", gathers)
        m.setattr(pairwise_windows._Driver, "gathers", gathers)
        both(tmp_path_factory.mktemp("drawn"), sc)


TRIGGERED = {"name": "event_triggered", "lr": 0.5, "batch": 4, "trigger": "relative", "threshold": 0.1}
PAIRWISE = {"name": "adpsgd", "lr": 0.5, "batch": 4, "reply_timeout": 0.3}
GOSSIP = {"name": "gossip", "lr": 0.5, "batch": 4, "reply_timeout": 0.3}
DELTAS = {"name": "sparq", "lr": 0.5, "batch": 4, "compressor": "randk", "trigger": "absolute", "threshold": 0.05}


def poisson(algorithm: dict, **changes) -> dict:
    sc = gossip(agents={"activation": {"kind": "poisson", "rate": 3.0},
                        "clock_drift": {"kind": "uniform", "low": -0.02, "high": 0.02}},
                run={"rounds": None, "until": 5.0}, **changes)
    sc["run"] = {k: v for k, v in sc["run"].items() if v is not None}
    sc["algorithm"] = algorithm
    sc["evaluation"] = {"every": 1.5, "metrics": ["loss", "accuracy", "consensus", "agent_accuracy"]}
    return sc


@pytest.mark.parametrize("churn", [
    {"agents": {"churn": {"mean_online": 1.0, "mean_offline": 0.3}}},
    {"network": {"burst": {"p_enter": 0.3, "p_exit": 0.5, "loss_good": 0.0, "loss_bad": 0.9},
                 "outages": [{"start": 1.0, "end": 2.0, "src": 0}]}},
])
@pytest.mark.parametrize("algorithm", [{"name": "async_push", "lr": 0.5, "batch": 4, "staleness_power": 1.0},
                                       {"name": "pushsum", "lr": 0.3, "batch": 4}, TRIGGERED, DELTAS, PAIRWISE,
                                       GOSSIP])
def test_broadcast_windows_agree_when_agents_go_offline_and_links_fail(tmp_path, algorithm, churn):
    sc = poisson(algorithm)
    for key, value in churn.items():
        sc.setdefault(key, {}).update(value)
    summary = both(tmp_path, sc)
    assert summary["messages_dropped"] > 0 and summary["gradients"] > 0


def test_staleness_weights_are_applied_in_the_windows(tmp_path):
    """With staleness_power > 0 the windows merge with the engine's down-weighted weights (same bytes), and the
    models differ from the plain weights' run: the weights are applied, not dropped."""
    alg = {"name": "async_push", "lr": 0.5, "batch": 4}
    net = {"latency": {"kind": "uniform", "low": 0.05, "high": 0.8}}
    weighted = both(tmp_path / "a", poisson({**alg, "staleness_power": 2.0}, network=net))
    plain = both(tmp_path / "b", poisson({**alg, "staleness_power": 0.0}, network=net))
    assert weighted["push_staleness_max"] >= 2 and weighted["push_staleness_samples"] > 50
    assert weighted["push_staleness_samples"] == plain["push_staleness_samples"]  # the same messages and rounds
    assert not torch.equal(weighted["W"], plain["W"])


def test_pushsum_windows_conserve_mass(tmp_path, monkeypatch):
    """Pure push-sum averaging (lr = 0) under loss, played as windows: sum_i x_i plus the mass in flight (each
    in-neighbour's running sum not yet absorbed, sigma_j - rho_ij) is the initial sum, for x and for y; the bank
    holds x_i / y_i."""
    from netsim.rounds import broadcast_windows

    drivers = []
    play = broadcast_windows._Driver.run
    monkeypatch.setattr(broadcast_windows._Driver, "run", lambda self: (drivers.append(self), play(self))[1])
    sc = poisson({"name": "pushsum", "lr": 0.0}, network={"loss": 0.3})
    sc["topology"] = {"kind": "erdos_renyi", "p": 0.4, "directed": True}
    sc["model"] = {"kind": "logistic", "dtype": "float64"}
    summary = both(tmp_path, sc)
    assert summary["messages_dropped"] > 0
    d = drivers[0]
    n = len(d.ctx.agents)
    x0 = torch.randn(d.X.shape, generator=torch.Generator().manual_seed(sc["run"]["seed"]), dtype=torch.float64)
    held_x, held_y = d.X.sum(0), sum(own.y for own in d.own)
    flight_x, flight_y = torch.zeros_like(held_x), 0.0
    for i, a in enumerate(d.ctx.agents):
        for j in a.in_neighbors:
            last = d.own[i].rho.get(j)
            flight_x += d.extra["sigma"][j] - (0.0 if last is None else d.payloads.peek([last[1]])[0])
            flight_y += d.own[j].sigma_y - (0.0 if last is None else last[2])
    assert torch.allclose(held_x + flight_x, x0.sum(0), rtol=0, atol=1e-11)
    assert held_y + flight_y == pytest.approx(n, abs=1e-12)
    y = torch.tensor([own.y for own in d.own], dtype=torch.float64).unsqueeze(1)
    assert torch.allclose(summary["W"], d.X / y, rtol=1e-12, atol=0)  # z_i, written before the push's shares
    assert held_y < n - 0.1  # mass really is in flight (its check is not vacuous)


@pytest.mark.parametrize("changes", [{"bandwidth": 2.0e3}, {"uplink": 4.0e3},
                                     {"links": [{"src": 0, "dst": 1, "bandwidth": 1.0e3}]}])
@pytest.mark.parametrize("algorithm", [{"name": "async_push", "lr": 0.5, "batch": 4},
                                       {"name": "pushsum", "lr": 0.3, "batch": 4}, PAIRWISE, GOSSIP])
def test_broadcast_windows_play_transmission_times(tmp_path, algorithm, changes):
    """Bandwidth, node uplinks and one slow link: a broadcast holds its program until its longest transmission ends
    (``Agent.broadcast``'s Timeout), an exchange until its request's has, and links queue; the windows write the
    engine's bytes, and the waits are real (fewer gradients than without them)."""
    sc = poisson(algorithm)
    sc["network"] = {**sc.get("network", {}), **changes}
    slow = both(tmp_path / "slow", sc)
    if "links" not in changes:
        fast = both(tmp_path / "fast", poisson(algorithm))
        assert slow["gradients"] < fast["gradients"]


@pytest.mark.parametrize(("algorithm", "changes", "why"), [
    ({"name": "sparq"}, {"network": {"links": [{"src": 0, "dst": 1,
                                                "latency": {"kind": "uniform", "low": 0.0, "high": 0.1}}]}},
     r"the minimum network.links[0].latency is 0"),
    ({"name": "event_triggered"}, {"network": {"latency": {"kind": "exponential", "mean": 0.05}}},
     "no positive lower bound"),
    ({"name": "event_triggered", "lazy": True, "noise_multiplier": 1.0}, {},
     "lazy with noise_multiplier > 0: LAG's trigger decides from the gradient"),
    ({"name": "event_triggered"}, {"network": {"uplink": 1.0e6}},
     "bandwidth or uplinks: a triggered send waits for its transmission"),
])
def test_what_the_windows_cannot_play_is_refused_in_one_line_exit_2(tmp_path, algorithm, changes, why):
    import subprocess

    import tomli_w

    from tests.conftest import cli_env, netsim_cli

    sc = poisson(algorithm)
    for key, value in changes.items():
        sc[key] = value if key == "topology" else {**sc[key], **value}
    (tmp_path / "s.toml").write_text(tomli_w.dumps(sc))
    res = subprocess.run(netsim_cli("run", str(tmp_path / "s.toml"), "--engine", "windowed", "--out",
                                    str(tmp_path / "cli")), capture_output=True, text=True, env=cli_env())
    out = (res.stderr + res.stdout).strip()
    assert res.returncode == 2 and len(out.splitlines()) == 1
    assert "nor as lookahead windows" in out and why in out
    assert not (tmp_path / "cli").exists()


@pytest.mark.parametrize("changes", [
    {"topology": {"kind": "ring", "dynamic": {"kind": "one_peer_exponential"}}},
    {"topology": {"kind": "erdos_renyi", "p": 0.6, "dynamic": {"kind": "resample", "every": "period", "period": 0.8}}},
    {"network": {"links": [{"src": 0, "dst": 1, "latency": {"kind": "constant", "value": 0.004}, "both": True},
                           {"src": 2, "dst": 3, "loss": 0.6}]}},
])
@pytest.mark.parametrize("algorithm", [{"name": "async_push", "lr": 0.5, "batch": 4, "staleness_power": 1.0},
                                       {"name": "pushsum", "lr": 0.3, "batch": 4}, TRIGGERED, DELTAS, PAIRWISE])
def test_broadcast_windows_agree_on_changing_graphs_and_per_link_settings(tmp_path, algorithm, changes):
    """Each activation adopts its epoch's links (push SGD; push-sum refuses a changing graph before the run), and
    per-link latencies and losses come from the engine's link models; the lookahead is the smallest latency."""
    from netsim.errors import InputError

    sc = poisson(algorithm)
    for key, value in changes.items():
        sc[key] = value if key == "topology" else {**sc[key], **value}
    if algorithm["name"] in ("pushsum", "sparq") and "dynamic" in sc["topology"]:
        with pytest.raises(InputError, match=rf"topology.dynamic: algorithm '{algorithm['name']}' .* needs a fixed "
                                             r"topology"):
            netsim.run(scenario_from_dict(sc), out=tmp_path / "r", engine="windowed")
        return
    summary = both(tmp_path, sc)
    assert summary["messages_delivered"] > 0 and summary["gradients"] > 0
    lookahead = json.loads((tmp_path / "windowed" / "summary.json").read_text())["windows"]["lookahead_s"]
    assert lookahead == (0.004 if "network" in changes else 0.01)


def test_an_edit_to_the_kernel_changes_both_engines_identically(tmp_path, monkeypatch):
    """One definition: halve asynchronous push's step in its kernel, and both engines run the edited algorithm."""
    from netsim.algorithms.async_push import AsyncPushSGD

    sc = poisson({"name": "async_push", "lr": 0.5, "batch": 4, "staleness_power": 1.0})
    before = both(tmp_path / "before", sc)

    def halved(self, b, p, g):
        b.x = b.x - (0.5 * p.lr) * g

    monkeypatch.setattr(AsyncPushSGD, "update", halved)
    after = both(tmp_path / "after", sc)
    assert not torch.equal(after["W"], before["W"])


# a plugin written as a broadcast kernel runs windowed with no other code ------------------------------------------
def test_a_broadcast_kernel_plugin_runs_as_lookahead_windows_byte_for_byte(tmp_path):
    """examples/plugins/momentum_push.py (heavy-ball asynchronous push SGD) on Poisson clocks: the windows write the
    engine's bytes and models; with mu = 0 it is async_push's run exactly, and momentum changes the models."""
    from tests.test_round_kernels import probe

    names = ("heavy", "plain", "async")
    jobs = [(poisson(algorithm), tmp_path / name) for name, algorithm in zip(names, [
        {"name": "momentum_push", "lr": 0.3, "batch": 4, "momentum": 0.9},
        {"name": "momentum_push", "lr": 0.3, "batch": 4, "momentum": 0.0},
        {"name": "async_push", "lr": 0.3, "batch": 4}], strict=True)]
    runs = {}
    for name, got in zip(names, probe("momentum_push.py", jobs), strict=True):
        ev, win = got["events"], got["windowed"]
        assert win["engine"] == "windowed"
        assert win["trace"] == ev["trace"] and win["metrics"] == ev["metrics"] and win["W"] == ev["W"]
        runs[name] = ev
    assert runs["plain"]["W"] == runs["async"]["W"] and runs["plain"]["metrics"] == runs["async"]["metrics"]
    assert runs["heavy"]["W"] != runs["plain"]["W"]


def test_event_triggered_windows_decide_each_send_as_the_engine(tmp_path, monkeypatch):
    """Each (agent, out-neighbour) decision is the engine's: with a threshold no change reaches nothing is sent and
    every skip is counted; with the batched norms alone (no second look near the threshold) and with every decision
    taken again by the engine's call, the windows give the same bytes."""
    from netsim.rounds import triggered_windows

    silent = both(tmp_path / "silent", poisson({**TRIGGERED, "trigger": "absolute", "threshold": 1.0e9}))
    assert silent["messages_sent"] == 0 and silent["trigger_sent"] == 0
    assert silent["trigger_skipped"] == silent["activations"] * 4  # a random 4-regular graph
    sc = poisson({**TRIGGERED, "trigger": "decaying", "threshold": 2.0, "decay": 0.8})
    plain = both(tmp_path / "plain", sc)
    assert 0 < plain["trigger_sent"] and 0 < plain["trigger_skipped"]
    for close in (0.0, float("inf")):
        monkeypatch.setattr(triggered_windows, "_CLOSE", close)
        again = both(tmp_path / f"close{close}", sc)
        assert torch.equal(again["W"], plain["W"]) and again["trigger_sent"] == plain["trigger_sent"]



@pytest.mark.parametrize("cap", [None, 5.0])
def test_event_triggered_windows_release_dp_sgd_gradients_as_the_engine(tmp_path, cap):
    """DP-SGD's releases (Abadi et al.: per-example clipping, each agent's noise from its own generator) in the
    event-triggered windows: the engine's ledgers (each release's time, round, noise and sampling rate, in order),
    rows, models and ``netsim privacy`` report; with a budget cap reached mid-run, an agent's refusal at the same
    completion (its ``budget_exhausted`` row), after which it takes no gradient and only mixes and sends."""
    from typer.testing import CliRunner

    from netsim.cli import app

    sc = poisson({**TRIGGERED, "noise_multiplier": 1.0, "clip": 0.5})
    sc["run"]["until"] = 3.0
    sc["privacy"] = {"delta": 1e-5} if cap is None else {"delta": 1e-5, "epsilon_cap": cap}
    s = both(tmp_path, sc)
    released = sum(len(r) for r in s["ledgers"].values())
    assert released == s["privacy_releases"] > 0
    # std z C / B, sampling rate B / |D_i| (4 of each agent's 16 training rows)
    assert {(r.scale, r.q) for rs in s["ledgers"].values() for r in rs} == {(1.0 * 0.5 / 4, 0.25)}
    if cap is None:
        assert released == s["gradients"] == s["activations"] and s["privacy_exhausted"] == 0
    else:  # an agent refuses once (the release that would pass the cap), then stops asking
        assert 0 < s["privacy_exhausted"] and released + s["privacy_exhausted"] == s["gradients"]
        assert s["gradients"] < s["activations"] and s["privacy_epsilon_max"] <= cap
    reports = []
    for engine in ("events", "windowed"):
        r = CliRunner().invoke(app, ["privacy", str(tmp_path / engine)], env={"COLUMNS": "200"})
        assert r.exit_code == 0, r.output
        reports.append((tmp_path / engine / "privacy.json").read_text())
    assert reports[0] == reports[1] and json.loads(reports[0])["guarantee"] is True

def test_event_triggered_windows_play_lag_gradient_reuse(tmp_path):
    """LAG (lazy = true, no DP): the trigger on each fresh gradient's change, decided in the tensor work at the
    activation count of its completion, gives the engine's bytes; the reuse changes the models."""
    sc = poisson({**TRIGGERED, "trigger": "absolute", "threshold": 0.5})
    sc["run"]["until"] = 3.0
    fresh = both(tmp_path / "fresh", sc)
    lazy = both(tmp_path / "lazy", {**sc, "algorithm": {**sc["algorithm"], "lazy": True}})
    assert lazy["gradients"] == fresh["gradients"] and not torch.equal(lazy["W"], fresh["W"])

def test_adpsgd_windows_average_two_agents_to_their_mean(tmp_path):
    """Pure pairwise averaging (lr = 0) of two agents without loss, the paper's bipartite split (agent 0 initiates):
    the engine's bytes, and both models end at the mean of the two starting ones (each exchange leaves both at
    (x_0 + x_1) / 2, and a later one changes nothing)."""
    sc = poisson({"name": "adpsgd", "lr": 0.0, "reply_timeout": 2.0, "roles": "bipartite"},
                 network={"loss": 0.0, "latency": {"kind": "uniform", "low": 0.05, "high": 0.3}})
    sc["agents"]["count"] = 2
    sc["topology"] = {"kind": "complete"}
    sc["model"] = {"kind": "logistic", "dtype": "float64"}
    summary = both(tmp_path, sc)
    assert summary["gossip_exchanges"] >= 3
    start = torch.randn(summary["W"].shape, generator=torch.Generator().manual_seed(sc["run"]["seed"]),
                        dtype=torch.float64)
    mean = start.mean(0)
    assert (start[0] - mean).abs().max() > 0.1  # (not already there)
    for row in summary["W"]:
        assert torch.allclose(row, mean, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("algorithm", "kernel"), [(TRIGGERED, "event_triggered.EventTriggered"),
                                                  (PAIRWISE, "adpsgd.ADPSGD")])
def test_an_edit_to_an_asynchronous_kernel_changes_both_engines_identically(tmp_path, monkeypatch, algorithm, kernel):
    """One definition for the event-triggered and pairwise patterns too: halve the step in the kernel."""
    import importlib

    module, name = kernel.split(".")
    cls = getattr(importlib.import_module(f"netsim.algorithms.{module}"), name)
    sc = poisson(algorithm)
    before = both(tmp_path / "before", sc)
    monkeypatch.setattr(cls, "update", lambda self, b, p, g: setattr(b, "x", b.x - (0.5 * p.lr) * g))
    after = both(tmp_path / "after", sc)
    assert not torch.equal(before["W"], after["W"])
