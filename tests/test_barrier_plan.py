"""Barrier rounds planned round by round (rounds/barrier_plan.py) against the events engine, byte for byte: drawn
scenarios of the plan's region, instants shared by many events (identical clocks, constant compute times and
latencies: simpy's insertion order decides), run.until on an activation's tick, and the runs it leaves to the
event-by-event control."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

from netsim.rounds import barrier_plan, barrier_windows
from tests.search import search
from tests.test_barrier_windows import barriers, same_records
from tests.test_broadcast_windows import both
from tests.test_windowed import buildable


def planned(tmp, sc: dict, made: dict | None = None) -> tuple[int, int]:
    """Both engines on ``sc``, the same bytes (``both``, and the privacy records); (runs the plan played, runs the
    control played). ``made`` counts them by name, and the planned tensor works in lock steps (``steps``: gradients
    not batch-invariant)."""
    made = {} if made is None else made
    made |= {"plan": 0, "control": 0, "steps": 0}
    with pytest.MonkeyPatch.context() as m:
        for name, cls, method in (("plan", barrier_plan.Replay, "__init__"),
                                  ("control", barrier_windows._Control, "__init__"),
                                  ("steps", barrier_plan.RoundWork, "_steps")):
            def counted(self, *a, name=name, orig=getattr(cls, method)):
                made[name] += 1
                return orig(self, *a)

            m.setattr(cls, method, counted)
        both(tmp, sc)
    same_records(tmp, sc)
    return made["plan"], made["control"]


def lean(sc: dict, limit: int | None = None) -> dict:
    """``sc`` in the plan's region: run.until (or a round limit alone), the lean links (no uplinks, no per-link
    settings)."""
    sc["run"] = {k: v for k, v in sc["run"].items() if k not in ("rounds", "until")} | (
        {"until": 3.0} if limit is None else {"rounds": limit})
    sc["network"] = {k: v for k, v in sc["network"].items() if k not in ("uplink", "links")}
    return sc


@search(10, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=barriers(names=("dpsgd", "dp_dpsgd", "muffliato"), records=(None, "mixing")),
       gathers=st.sampled_from([1, 8, 64]), limit=st.sampled_from([None, None, 1, 4]))
def test_planned_barrier_rounds_write_the_engines_bytes(tmp_path_factory, sc, gathers, limit):
    """Own clocks, drift, jitter, Bernoulli and Poisson activation, stragglers, any latency (lognormal and exponential
    too), loss, timeouts shorter than a round trip (stale rounds discarded at a gather and at an arrival), bandwidth,
    run.until or a round limit, several exchanges a round (Muffliato's gossip steps), the mixing record: the plan's
    trace, metrics, models and records are the engine's, whatever windows the tensor work takes together."""
    sc = lean(sc, limit)
    buildable(sc)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(barrier_windows._Driver, "gathers", gathers)
        plan, control = planned(tmp_path_factory.mktemp("planned"), sc)
    assert (plan, control) == (1, 0)


def tied(timeout: float = 0.25, latency: float = 0.0625, **net) -> dict:
    """Every agent on one clock with one compute time and one latency: most events share their instant with others."""
    return {"name": "tied", "run": {"seed": 3, "until": 4.0},
            "agents": {"count": 6, "activation": {"kind": "periodic", "period": 0.5},
                       "clock_offset": {"kind": "constant", "value": 0.0},
                       "compute_time": {"kind": "constant", "value": 0.125}},
            "topology": {"kind": "complete"},
            "network": {"latency": {"kind": "constant", "value": latency}, **net},
            "data": {"kind": "synthetic", "samples": 240, "features": 5, "partition": "iid"},
            "model": {"kind": "logistic"},
            "algorithm": {"name": "dpsgd", "lr": 0.3, "batch": 4, "round_timeout": timeout},
            "evaluation": {"every": 0.5, "metrics": ["loss", "accuracy"]}}


@pytest.mark.parametrize("name", ["dpsgd", "dp_dpsgd", "dpsgd invariant", "muffliato"])
@pytest.mark.parametrize("net", [{"bandwidth": 1920.0}, {"bandwidth": 960.0, "loss": 0.3},
                                 {"bandwidth": 1920.0, "timeout": 0.0625}, {"bandwidth": 1920.0, "latency": 0.0},
                                 {"bandwidth": 960.0, "loss": 0.3, "timeout": 0.0625}])
def test_simultaneous_events_follow_simpys_insertion_order(tmp_path, net, name):
    """Activations, completions, transmissions' ends, deliveries, timers and evaluations at shared instants (exact
    binary fractions), messages that arrive as their barrier's timer fires or as it gathers, run.until on a tick:
    the order is the engine's, decided by who scheduled each event when. With batch-invariant gradients the tensor
    work goes round by round, else in lock steps that keep the engine's gradient batches (``RoundWork._steps``).
    Muffliato: three exchanges a round, each barrier's completion sending the next one's messages, and the mixing
    record."""
    sc = tied(**net)
    if name == "muffliato":
        sc["algorithm"] |= {"name": name, "clip": 1.0, "sigma": 1.0, "gossip_steps": 3}
        sc["privacy"] = {"delta": 1e-5, "record": "mixing"}
    if name == "dp_dpsgd":  # (``local`` of the agents done at one instant together, each with its releases)
        sc["algorithm"] |= {"name": name, "clip": 1.0, "noise_multiplier": 1.0}
        sc["privacy"] = {"delta": 1e-5}
    if name == "dpsgd invariant":
        sc["model"]["batch_invariant"] = True
    made: dict = {}
    assert planned(tmp_path, sc, made) == (1, 0)
    assert bool(made["steps"]) == (name != "dpsgd invariant")


@pytest.mark.parametrize("net", [{"bandwidth": 1920.0}, {"bandwidth": 960.0, "loss": 0.3, "timeout": 0.0625},
                                 {"bandwidth": 1920.0, "latency": 0.0}, {"bandwidth": 1920.0, "straggler": 4.0}])
def test_a_round_limit_stops_the_plan_where_the_engine_stops(tmp_path, net):
    """Programs finishing at one instant after their last barriers (each its ``finish`` row there, no wake), and the
    run's stop after the last one: a straggler finishes last, with its last messages still in flight (never
    delivered)."""
    factor = net.pop("straggler", None)
    sc = tied(**net)
    sc["run"] = {"seed": 3, "rounds": 4}
    if factor:
        sc["agents"] |= {"stragglers": [0], "straggler_factor": factor}
    assert planned(tmp_path, sc) == (1, 0)


def test_runs_outside_the_plan_are_played_event_by_event(tmp_path):
    """A round limit with run.until (whichever stops first) is the event-by-event control's."""
    sc = tied(bandwidth=1920.0)
    sc["run"] = {"seed": 3, "rounds": 4, "until": 3.0}
    assert planned(tmp_path, sc) == (0, 1)


def test_a_plan_past_its_size_is_played_event_by_event(tmp_path, monkeypatch):
    """A run whose plan would hold more rows than ``ROWS_MAX`` (estimated from its clocks, agents and links) is the
    event-by-event control's: the plan is held whole."""
    monkeypatch.setattr(barrier_plan, "ROWS_MAX", (4.0 / 0.5 + 1) * (4 * 6 + 2 * 30) - 1)  # (6 agents, 30 links)
    assert planned(tmp_path, tied(bandwidth=1920.0)) == (0, 1)
    monkeypatch.setattr(barrier_plan, "ROWS_MAX", (4.0 / 0.5 + 1) * (4 * 6 + 2 * 30))
    assert planned(tmp_path / "fits", tied(bandwidth=1920.0)) == (1, 0)


def test_a_barrier_open_to_the_stop_discards_older_messages_at_their_arrival(tmp_path):
    """A straggler's round-2 messages reach agents whose round-4 barriers stay open to run.until (their timers would
    fire after it): each is delivered, then discarded as stale there and then (a search found this one)."""
    sc = {"name": "barrier", "run": {"seed": 2, "until": 3.0, "trace_flush_every": 7},
          "agents": {"count": 6, "activation": {"kind": "bernoulli", "period": 0.5, "p": 0.6},
                     "clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.3},
                     "compute_time": {"kind": "constant", "value": 0.05}, "stragglers": [0], "straggler_factor": 4.0},
          "topology": {"kind": "random_regular", "degree": 3},
          "network": {"latency": {"kind": "exponential", "mean": 0.02}},
          "data": {"kind": "synthetic", "samples": 240, "features": 5, "partition": "iid"},
          "model": {"kind": "logistic", "batch_invariant": False},
          "algorithm": {"name": "dp_dpsgd", "lr": 0.3, "batch": 6, "round_timeout": 0.3, "clip": 1.0,
                        "noise_multiplier": 1.0},
          "privacy": {"delta": 1e-5}}
    assert planned(tmp_path, sc) == (1, 0)


def test_older_messages_at_barriers_complete_at_their_gathers(tmp_path):
    """Muffliato's exchanges on exponential links with a straggler: older rounds' messages overtaken by newer ones
    reach barriers whose own round was complete before they gathered; those queued before the last of its round are
    discarded at the gather, the later ones stay queued (``Plan._older``, as arrays; a search found this one)."""
    sc = {"name": "barrier", "run": {"seed": 2, "rounds": 4},
          "agents": {"count": 6, "activation": {"kind": "periodic", "period": 0.5},
                     "clock_offset": {"kind": "uniform", "low": 0.0, "high": 0.3},
                     "compute_time": {"kind": "uniform", "low": 0.01, "high": 0.2}, "stragglers": [0],
                     "straggler_factor": 4.0},
          "topology": {"kind": "random_regular", "degree": 3},
          "network": {"latency": {"kind": "exponential", "mean": 0.1}, "loss": 0.2},
          "data": {"kind": "synthetic", "samples": 240, "features": 5, "partition": "iid"},
          "model": {"kind": "logistic"},
          "algorithm": {"name": "muffliato", "lr": 0.3, "batch": 4, "round_timeout": 0.05, "clip": 1.0, "sigma": 1.0,
                        "gossip_steps": 3},
          "evaluation": {"every": 0.5}}
    assert planned(tmp_path, sc) == (1, 0)
