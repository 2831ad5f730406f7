"""PDSL and DP-CGA (Wang, Yuan, Wang, Li; Esfandiari et al.) as barrier-round kernels: models out, the own and
cross-gradients as waves between two exchanges, each noised as its own release and sent back to its neighbour, PDSL's
coalition models valued in one batched request of every agent's, then the mix. On scenarios drawn from the fast
path's admitted region both engines write the same trace, metrics.csv and final models, and keep the same method
state (momentum) in the parameter bank; outside it the windows refuse in one line."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

from netsim.scenario import scenario_from_dict
from netsim.trace.io import read_trace
from tests.search import search
from tests.test_round_kernels import admitted_and_identical, assert_identical, base, run_both

STATE = {"pdsl": ("pdsl.u",), "dp_cga": ("cga.m",)}


def scenario(name: str, n: int = 5, rounds: int = 3, ct: float = 0.005, lat: float = 0.005, **algorithm) -> dict:
    sc = base(n=n, rounds=rounds)
    sc["agents"]["compute_time"]["value"] = ct
    sc["network"] = {"latency": {"kind": "constant", "value": lat}}
    sc["data"]["validation"] = 10
    sc["algorithm"] = {"name": name, "lr": 0.3, "batch": 4, "sigma": 0.05, "round_timeout": 0.09, **algorithm}
    return sc


@st.composite
def pdsl_scenarios(draw) -> dict:
    """PDSL and DP-CGA on drawn regular graphs, sizes, latencies, compute and Shapley times (0 included), clippings,
    noise, exact and Monte-Carlo Shapley with its options, both round tags, float32 and float64, a logistic model or
    an MLP (DP-CGA's projection per layer), and evaluations between the rounds."""
    name = draw(st.sampled_from(["pdsl", "dp_cga"]))
    ct = draw(st.sampled_from([0.0, 0.001, 0.005]))
    lat = draw(st.sampled_from([0.001, 0.005, 0.0301]))
    common = {"batch": draw(st.integers(1, 6)), "clip": draw(st.sampled_from([0.5, 5.0])),
              "clip_mode": draw(st.sampled_from(["batch", "per_example"])),
              "sigma": draw(st.sampled_from([None, 0.0, 0.05])), "lr": draw(st.sampled_from([0.05, 0.3])),
              "momentum": draw(st.sampled_from([0.0, 0.5]))}
    if name == "pdsl":
        common |= {"exact_max": draw(st.sampled_from([0, 2, 8])), "permutations": draw(st.sampled_from([None, 1, 5])),
                   "sampling": draw(st.sampled_from(["stratified", "plain"])),
                   "v_empty": draw(st.sampled_from(["zero", "prev_model_acc"])),
                   "utility": draw(st.sampled_from(["val_acc", "neg_val_loss"])),
                   "divide_by_omega": draw(st.booleans()), "share_floor": draw(st.sampled_from([0.0, 0.3])),
                   "shapley_cost": draw(st.sampled_from([0.0, 1.0, 2.5])),
                   "round_from": draw(st.sampled_from(["count", "clock"]))}
    else:
        common |= {"margin": draw(st.sampled_from([0.0, 0.5])), "qp_eps": draw(st.sampled_from([1e-12, 1e-3]))}
    sc = scenario(name, n=draw(st.integers(3, 7)), rounds=draw(st.integers(2, 4)), ct=ct, lat=lat, **common)
    sc["algorithm"]["round_timeout"] = round(lat + ct + draw(st.sampled_from([0.002, 0.01])), 6)
    sc["topology"] = draw(st.sampled_from([{"kind": "ring"}, {"kind": "complete"}]))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    sc["model"] = draw(st.sampled_from([{"kind": "logistic", "dtype": dtype},
                                        {"kind": "mlp", "hidden": [3], "dtype": dtype}]))
    sc["evaluation"]["every"] = draw(st.sampled_from([1.0e6, 0.2, 0.3]))
    return sc


@search(10, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=pdsl_scenarios())
def test_pdsl_and_dp_cga_run_fast_byte_for_byte(tmp_path_factory, sc):
    admitted_and_identical(tmp_path_factory.mktemp("pdsl"), sc, STATE[sc["algorithm"]["name"]])


def test_a_round_releases_each_gradient_as_it_completes_and_sends_each_reply_to_its_neighbour(tmp_path):
    """Per agent and round: g_ii then g_ij for each neighbour j in order (each its own compute, its release to j after
    it), the replies to j once all are done; then PDSL's Shapley time and three weights, then (u_hat, x_hat) out."""
    got = run_both(tmp_path, scenario("pdsl", rounds=2), STATE["pdsl"])
    assert_identical(got)
    t = read_trace(got["windowed"]["folder"]).table.to_pandas()
    a = t[(t.agent == 0) & (t.kind != "deliver")]
    first = a[(a.t >= 0.1) & (a.t < 0.2)]  # round 0 (activated at 0.1)
    kinds = [(k, int(p)) for k, p in zip(first.kind, first.peer, strict=True)]
    assert kinds == [("activate", -1), ("send", 1), ("send", 4),
                     ("compute_start", -1), ("compute_end", -1), ("release", -1),
                     ("compute_start", -1), ("compute_end", -1), ("release", 1),
                     ("compute_start", -1), ("compute_end", -1), ("release", 4), ("send", 1), ("send", 4),
                     ("compute_start", -1), ("compute_end", -1), ("shapley", 0), ("shapley", 1), ("shapley", 4),
                     ("send", 1), ("send", 4)]
    sends = first[first.kind == "send"]
    assert list(sends["round"]) == [0, 0, 1, 1, 2, 2] and set(sends.tag) == {"pdsl"}  # message rounds 3k + s
    assert list(sends["size"]) == [24, 24, 24, 24, 48, 48]  # x_i, ghat_ij, (u_hat, x_hat) of a 6-weight model


@pytest.mark.parametrize(("changes", "rule"), [
    ({"network": {"latency": {"kind": "constant", "value": 0.005}, "loss": 0.1}},
     "takes gradients between its exchanges: the lookahead windows do not play it — use periodic activation, one "
     "clock and compute time, a constant latency and no loss"),
    ({"agents": {"activation": {"kind": "bernoulli", "period": 0.1, "p": 0.8}}},
     "takes gradients between its exchanges: the lookahead windows do not play it"),
    ({"topology": {"kind": "erdos_renyi", "p": 0.6}}, "on a graph whose degrees differ"),
    ({"privacy": {"delta": 1e-5, "epsilon_cap": 5.0}}, "privacy.epsilon_cap"),
])
@pytest.mark.parametrize("name", ["pdsl", "dp_cga"])
def test_outside_the_admitted_region_the_windows_refuse_in_one_line(name, changes, rule):
    from netsim import api
    from netsim.rounds.windowed import reason

    sc = scenario(name)
    for k, v in changes.items():
        sc[k] = {**sc.get(k, {}), **v}
    why = reason(api.prepare(scenario_from_dict(sc)))
    assert why is not None and rule in why and " — " in why and "\n" not in why
