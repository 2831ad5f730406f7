"""Barrier rounds whose one exchange carries several tagged messages per neighbour (``SyncRounds.more``): sent back to
back, gathered tag by tag; both engines write the same trace, metrics.csv and final models."""

from __future__ import annotations

import attrs
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

from netsim.algorithms.registry import register
from netsim.rounds import GradientRequest, SyncKernel, SyncRounds
from netsim.scenario import scenario_from_dict
from netsim.scenario.structure import at_least, field, positive
from tests.search import search
from tests.test_round_kernels import admitted_and_identical, base


@attrs.frozen
class ThreeParams:
    lr: float = field(0.3, check=positive, doc="step size")
    batch: int = field(4, check=at_least(1), doc="mini-batch size")
    round_timeout: float = field(0.05, check=positive, doc="seconds to wait for neighbours each round")


@register("test_three_messages", ThreeParams)
class Three(SyncKernel):
    """D-PSGD whose exchange sends x, g and x - lr g as three messages (sizes of their own): x <- (mix(x) + mix(x -
    lr g)) / 2 - lr mix(g) / 2 (a test kernel)."""

    pattern = SyncRounds(tag="t_x", more=("t_g", "t_h"))
    reads = frozenset({"lr", "batch"})

    def gradient(self, p, state, i):
        return GradientRequest.of(p.batch)

    def local(self, b, p):
        b.send(b.x)
        b.send(b.g, sizes=[8] * len(b), message=1)
        b.send(b.x - p.lr * b.g, message=2)

    def combine(self, b, p, got):
        gx, gg, gh = got
        b.set_params((b.mix(b.x, gx) + b.mix(b.x - p.lr * b.g, gh)) / 2 - p.lr * b.mix(b.g, gg) / 2)


@st.composite
def scenarios(draw) -> dict:
    ct = draw(st.sampled_from([0.0, 0.002, 0.01]))
    lat = draw(st.sampled_from([0.001, 0.005]))
    sc = base(n=draw(st.integers(3, 6)), rounds=draw(st.integers(1, 4)))
    sc["agents"]["compute_time"]["value"] = ct
    sc["network"] = {"latency": {"kind": "constant", "value": lat}}
    sc["algorithm"] = {"name": "test_three_messages", "lr": 0.2, "batch": draw(st.integers(1, 6)),
                       "round_timeout": 0.05}
    sc["topology"] = draw(st.sampled_from([{"kind": "ring"}, {"kind": "complete"},
                                           {"kind": "erdos_renyi", "p": 0.6}]))
    sc["evaluation"]["every"] = draw(st.sampled_from([1.0e6, 0.1, 0.25, 0.1005]))
    return sc


@search(6, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=scenarios())
def test_three_messages_an_exchange_byte_for_byte(tmp_path_factory, sc):
    admitted_and_identical(tmp_path_factory.mktemp("three"), sc)


def test_three_messages_in_send_order_one_barrier(tmp_path):
    """Per round each agent sends t_x, t_g, t_h to every neighbour in that order (t_g's declared size), and
    receives three messages from each."""
    import netsim
    from netsim.trace.io import read_trace

    sc = base(n=4, rounds=2)
    sc["algorithm"] = {"name": "test_three_messages", "lr": 0.2, "batch": 4, "round_timeout": 0.05}
    netsim.run(scenario_from_dict(sc), out=tmp_path / "a")
    t = read_trace(tmp_path / "a" / "trace.arrows").to_pandas()
    sends = t[t.kind == "send"]
    for _, rows in sends.groupby(["agent", "round"]):
        assert rows.tag.tolist() == ["t_x"] * 2 + ["t_g"] * 2 + ["t_h"] * 2  # ring: two neighbours
    assert set(sends[sends.tag == "t_g"]["size"]) == {8}
    assert (t.kind == "deliver").sum() == 4 * 2 * 3 * 2
